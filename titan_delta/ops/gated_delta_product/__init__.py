"""Gated DeltaProduct: per token a forget gate then n_h Householder-like delta-rule steps on the state."""

from titan_delta.ops.gated_delta_product.api import gated_delta_product

__all__ = ["gated_delta_product"]
