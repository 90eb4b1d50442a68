"""Short causal depthwise convolution (kernel 4 + SiLU) that never mixes tokens of different documents,
optionally L2-normalising each head of its output (Gated DeltaProduct's queries and keys).

Written as K shifted multiply-adds rather than ``F.conv1d``: with packed documents each shifted copy is
masked where it would reach back past the start of the current document, using the position-in-document
ids the model already derives from ``cu_seqlens``. That is branch-free (compiles with fullgraph=True) and
costs K fused elementwise passes, which is what a depthwise conv of width 4 costs anyway.

On CUDA ``forward`` runs the Triton op ``titan_delta_kernels.short_conv`` instead (same maths: taps rounded
to x's dtype, fp32 accumulation, the normalisation in fp32): one pass forward, two backward, with the
weight gradient as per-block partial sums rather than inductor's reductions over B·T per tap; the
normalisation rides in the same passes instead of a pass of its own each way. ``short_convs`` runs several
convs over channel ranges of one tensor (q, k and v from one projection GEMM) as one op. ``forward_torch``
keeps the PyTorch code: the op's reference, the CPU path, and decoding's (``forward_with_history``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def _kernel_applies(x: torch.Tensor, weight: torch.Tensor, l2_group: int) -> bool:
    """Where the Triton op runs for a conv of ``weight`` over x (or over a channel range of x): CUDA tensors
    of the dtypes, widths and groups it takes, by the op's own limits (tests patch this to run it on CPU
    under TRITON_INTERPRET=1)."""
    if not x.is_cuda:
        return False
    try:
        from titan_delta_kernels.short_conv.conv import KERNEL_DTYPES, MAX_KERNEL_SIZE, check_l2_group
    except ImportError:
        return False
    try:
        check_l2_group(l2_group, weight.shape[0])
    except ValueError:
        return False
    supported = x.dtype in KERNEL_DTYPES and weight.dtype in KERNEL_DTYPES
    return supported and weight.shape[-1] <= MAX_KERNEL_SIZE


def _load_triton_conv():
    """The Triton op, imported lazily (the model must work where Triton is unavailable); None without it."""
    try:
        from titan_delta_kernels.short_conv import short_causal_conv
    except ImportError:
        return None
    return short_causal_conv


def _load_triton_conv_split():
    """The Triton op over several channel ranges (``short_causal_conv_split``), or None, as above."""
    try:
        from titan_delta_kernels.short_conv import short_causal_conv_split
    except ImportError:
        return None
    return short_causal_conv_split


def short_convs(
    x: torch.Tensor, convs: Sequence[ShortCausalConv], seq_pos: torch.Tensor | None = None,
    passthrough: int = 0,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """(conv(range) for each conv), the convs applied to consecutive channel ranges of x [B, T, ΣC +
    passthrough] (one GEMM's output for their projections), then, with ``passthrough`` > 0, x's last
    ``passthrough`` channels as they are (other signals from the same GEMM). One Triton op where the kernels
    apply to every conv (one filter width and activation): the backward then returns one gradient for x
    instead of one per range, which the GEMM needs. Else each conv on its range (views of x)."""
    channels = [conv.channels for conv in convs]
    if sum(channels) + passthrough != x.shape[-1]:
        raise ValueError(f"the convs' channels {channels} and {passthrough} passthrough must add up to x's "
                         f"{x.shape[-1]}")  # fmt: skip
    first = convs[0]
    alike = all(c.kernel_size == first.kernel_size and c.activation == first.activation for c in convs)
    kernel = None
    if alike and all(_kernel_applies(x, c.weight, c.l2_group) for c in convs):
        kernel = _load_triton_conv_split()
    if kernel is not None:
        weights = [conv.weight for conv in convs]
        return kernel(x, weights, seq_pos, first.activation, [conv.l2_group for conv in convs], passthrough)
    ranges = x.split(channels + ([passthrough] if passthrough else []), dim=-1)
    convolved = tuple(conv(part, seq_pos) for conv, part in zip(convs, ranges, strict=False))
    return convolved + ranges[len(convs) :]


def l2_normalize_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., C] with every ``group`` consecutive channels divided by max(their L2 norm, 1e-12), computed in
    (at least) fp32 and returned in x's dtype."""
    compute = torch.promote_types(x.dtype, torch.float32)
    groups = x.to(compute).unflatten(-1, (-1, group))
    return F.normalize(groups, p=2.0, dim=-1).flatten(-2).to(x.dtype)


class ShortCausalConv(nn.Module):
    """y_t = SiLU(Σ_{j<K} weight[:, 0, K-1-j] · x_{t-j}), taps before the document start read as zero;
    with ``l2_group`` = G > 0, every G consecutive output channels (a head) are then divided by their L2 norm
    (``F.normalize``, computed in fp32).

    ``weight`` has nn.Conv1d's depthwise layout [C, 1, K] so checkpoints map one-to-one.
    """

    def __init__(
        self, channels: int, kernel_size: int = 4, activation: bool = True, l2_group: int = 0
    ) -> None:
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"conv kernel_size must be >= 1, got {kernel_size}")
        if l2_group < 0 or (l2_group and channels % l2_group):
            raise ValueError(f"conv l2_group must be 0 or divide the {channels} channels, got {l2_group}")
        self.channels = channels
        self.kernel_size = kernel_size
        self.activation = activation
        self.l2_group = l2_group
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.kernel_size)  # nn.Conv1d's default for a depthwise filter
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor, seq_pos: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, C]; ``seq_pos`` [B, T] position of each token inside its document, or None when every
        row is a single document starting at t = 0."""
        kernel = _load_triton_conv() if _kernel_applies(x, self.weight, self.l2_group) else None
        if kernel is not None:
            return kernel(x, self.weight, seq_pos, self.activation, self.l2_group)
        return self.forward_torch(x, seq_pos)

    def forward_torch(self, x: torch.Tensor, seq_pos: torch.Tensor | None = None) -> torch.Tensor:
        """``forward`` in PyTorch: the reference of the Triton op, and the path on CPU."""
        T = x.shape[1]
        taps = self.weight.squeeze(1).to(x.dtype)  # [C, K]
        out = x * taps[:, -1]
        for shift in range(1, min(self.kernel_size, T)):
            shifted = F.pad(x[:, : T - shift], (0, 0, shift, 0))
            if seq_pos is not None:
                shifted = shifted * (seq_pos >= shift).unsqueeze(-1).to(x.dtype)
            out = out + shifted * taps[:, -1 - shift]
        out = F.silu(out) if self.activation else out
        return out if not self.l2_group else l2_normalize_groups(out, self.l2_group)

    def forward_with_history(
        self, x: torch.Tensor, history: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoding: x [B, T, C] continues a sequence whose last K−1 inputs are ``history`` [B, K−1, C]
        (None at the start: zeros, exactly the taps ``forward`` reads before t = 0).
        Returns (y, new history)."""
        keep = self.kernel_size - 1
        if history is None:
            history = x.new_zeros(x.shape[0], keep, x.shape[2])
        full = torch.cat((history.to(x.dtype), x), dim=1)
        return self.forward_torch(full)[:, keep:], full[:, full.shape[1] - keep :]
