"""Several projections of one input as a single GEMM.

A mixer projects the same x to q, k, v and small per-head signals (β, the decay's dt, an output gate). As
separate ``nn.Linear`` calls each reads x forward and each adds a full [tokens, dim] input gradient in the
backward; the narrow ones (4–32 outputs) run GEMMs far below the GPU's rate. Concatenating their weights
(and biases) for one ``F.linear`` pays a copy of the weights per call instead, which is small next to the
activations at training shapes. The modules keep their own parameters, so state dicts, checkpoints, export
and initialisation are unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def fused_linear(x: torch.Tensor, *linears: nn.Linear) -> tuple[torch.Tensor, ...]:
    """(linear(x) for linear in linears), computed by one GEMM; the results are views of its output along
    the last dimension (not contiguous when there are several)."""
    if len(linears) == 1:
        return (linears[0](x),)
    weight = torch.cat([linear.weight for linear in linears])
    bias = None
    if any(linear.bias is not None for linear in linears):
        bias = torch.cat(
            [
                linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
                for linear in linears
            ]
        )
    out = F.linear(x, weight, bias)
    return tuple(out.split([linear.out_features for linear in linears], dim=-1))
