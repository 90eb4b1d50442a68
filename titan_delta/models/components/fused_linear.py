"""Several projections of one input as a single GEMM.

A mixer projects the same x to q, k, v and small per-head signals (β, the decay's dt, an output gate). As
separate ``nn.Linear`` calls each reads x forward and each adds a full [tokens, dim] input gradient in the
backward; the narrow ones (4–32 outputs) run GEMMs far below the GPU's rate. Concatenating their weights
(and biases) for one ``F.linear`` pays a copy of the weights per call instead, which is small next to the
activations at training shapes. The modules keep their own parameters, so state dicts, checkpoints, export
and initialisation are unchanged.

The concatenated output is padded with zero rows of weight to a multiple of ``ALIGN`` columns: every GEMM
of the forward and backward then sees 16-byte aligned rows in bf16. With a width such as 1036 (β, dt and
an output gate of 1024) cuBLAS fell back to much slower kernels for 2-byte alignment (docs/models.md,
"Where a training step's time goes").

The backward of a split output is a concatenation of the pieces' gradients, which inductor emits as one flat
pointwise kernel computing every piece's gradient in place of its copy: what the transformer's q and k want
(RoPE's backward fused into it). Where a piece's gradient is expensive to recompute per element, keep it out
of the split: Gated DeltaProduct's output gate has a GEMM of its own, and its β and dt columns pass through
the short-conv op with q, k and v (``fused_linear_joined(..., padded=True)``), whose backward writes the
whole gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ALIGN = 8  # output columns: 16 bytes in bf16


def fused_linear(x: torch.Tensor, *linears: nn.Linear) -> tuple[torch.Tensor, ...]:
    """(linear(x) for linear in linears), computed by one GEMM; the results are views of its output along
    the last dimension (not contiguous when there are several)."""
    if len(linears) == 1:
        return (linears[0](x),)
    widths = [linear.out_features for linear in linears]
    out = _padded_output(x, linears)
    widths.append(out.shape[-1] - sum(widths))
    return tuple(out.split(widths, dim=-1)[: len(linears)])


def fused_linear_joined(x: torch.Tensor, *linears: nn.Linear, padded: bool = False) -> torch.Tensor:
    """torch.cat([linear(x) for linear in linears], -1), computed by one GEMM: contiguous unless padding
    columns were cut off (then a view of the padded output). ``padded``: the GEMM's output itself, contiguous,
    with the zero padding columns (up to a multiple of ALIGN) after the projections'."""
    out = _padded_output(x, linears)
    width = sum(linear.out_features for linear in linears)
    return out if padded or out.shape[-1] == width else out[..., :width]


def _padded_output(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """The one GEMM over the concatenated weights (and biases), zero columns padding it to ALIGN."""
    widths = [linear.out_features for linear in linears]
    pad = -sum(widths) % ALIGN
    weights = [linear.weight for linear in linears]
    if pad:
        weights.append(weights[0].new_zeros(pad, weights[0].shape[1]))
    bias = None
    if any(linear.bias is not None for linear in linears):
        biases = [
            linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
            for linear in linears
        ]
        bias = torch.cat(biases + ([biases[0].new_zeros(pad)] if pad else []))
    return F.linear(x, torch.cat(weights) if len(weights) > 1 else weights[0], bias)
