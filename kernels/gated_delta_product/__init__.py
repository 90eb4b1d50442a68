"""Triton kernels of Gated DeltaProduct: token-aligned chunked forward/backward, recurrent decode path."""

from titan_delta_kernels.gated_delta_product.api import (
    gated_delta_product_recurrent_triton,
    gated_delta_product_triton,
)

__all__ = ["gated_delta_product_recurrent_triton", "gated_delta_product_triton"]
