"""Pure-PyTorch DeltaFormer references: token-by-token (the oracle) and chunk-wise (the torch backend).

Both forms take the arguments of ``deltaformer_attn`` and are differentiable by autograd. The
``*_stage1_*`` helpers return the stage-1 output U alone, for testing kernels stage by stage.
"""

from titan_delta.ops.deltaformer.chunked import deltaformer_attn_chunked, deltaformer_stage1_chunked
from titan_delta.ops.deltaformer.kappa import KERNELS
from titan_delta.ops.deltaformer.recurrent import deltaformer_attn_recurrent, deltaformer_stage1_recurrent

__all__ = [
    "KERNELS",
    "deltaformer_attn_chunked",
    "deltaformer_attn_recurrent",
    "deltaformer_stage1_chunked",
    "deltaformer_stage1_recurrent",
]
