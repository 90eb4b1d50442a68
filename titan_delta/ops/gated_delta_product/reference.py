"""Pure-PyTorch references of Gated DeltaProduct: the recurrent oracle, the chunked form, the decode step."""

from titan_delta.ops.gated_delta_product.chunked import gated_delta_product_chunked
from titan_delta.ops.gated_delta_product.recurrent import (
    gated_delta_product_recurrent,
    gated_delta_product_step,
)

__all__ = ["gated_delta_product_chunked", "gated_delta_product_recurrent", "gated_delta_product_step"]
