"""The Triton short causal conv against the PyTorch path of ``ShortCausalConv`` computed in fp64.

CPU (TRITON_INTERPRET=1, set by tests/conftest.py): tiny shapes that cross the kernels' row tiles (8 to 32
rows, 128 per forward program, 128 rows per backward program with its halo past the last; fewer rows
patched in to cross many backward programs) and channel blocks (64 forward, 128 backward), odd
and short T, K = 1..8, SiLU on and off, several documents per row with boundaries inside tiles and on tile
edges, B > 1 (flat rows cross batch rows inside a tile), heads L2-normalised after the conv (groups of 16–64
channels, an all-zero head), several convs over channel ranges of one input; fp32 inputs at 1e-5,
bf16/fp16 at 1e-2. Every kernel-allocated buffer is NaN-poisoned, so an element a
kernel forgets to write fails. Also: the model's module wired to the op, its torch.compile(fullgraph=True)
trace, ``opcheck`` of the custom ops. GPU (``gpu`` marker): the 340M shapes in bf16 against fp64 and against
the PyTorch bf16 path, compiled module, deterministic dw.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from titan_delta.models.components import short_conv as short_conv_module
from titan_delta.models.components.short_conv import ShortCausalConv
from titan_delta.testing import assert_rel_close, rel_rms_error
from titan_delta_kernels.short_conv import conv as conv_ops
from titan_delta_kernels.short_conv import short_causal_conv, short_causal_conv_split

LOW_PRECISION_TOL = 1e-2


@pytest.fixture(autouse=True)
def _poison_kernel_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITAN_DELTA_POISON", "1")


def positions(lengths_per_row: list[list[int]], device="cpu") -> torch.Tensor:
    """seq_pos [B, T] of rows packed with documents of the given lengths."""
    rows = [torch.cat([torch.arange(n) for n in lengths]) for lengths in lengths_per_row]
    return torch.stack(rows).to(device)


def reference(x, weight, seq_pos, activation, dy, l2_group=0):
    """(y, dx, dw) of the PyTorch path in fp64."""
    conv = ShortCausalConv(x.shape[-1], weight.shape[-1], activation, l2_group).double().to(x.device)
    with torch.no_grad():
        conv.weight.copy_(weight)
    x = x.detach().double().requires_grad_()
    y = conv.forward_torch(x, seq_pos)
    dx, dw = torch.autograd.grad(y, (x, conv.weight), dy.double())
    return y, dx, dw


def kernel(x, weight, seq_pos, activation, dy, l2_group=0):
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    y = short_causal_conv(x, weight, seq_pos, activation, l2_group)
    dx, dw = torch.autograd.grad(y, (x, weight), dy)
    return y, dx, dw


def check(B, T, C, K, activation, seq_pos, dtype=torch.float32, tol=1e-5, device="cpu", l2_group=0, x=None):
    """Kernel vs fp64 reference on the same (dtype-rounded) x and dy; the weight is an fp32 parameter."""
    x = torch.randn(B, T, C, device=device).to(dtype) if x is None else x
    weight = torch.randn(C, 1, K, device=device)
    dy = torch.randn(B, T, C, device=device).to(dtype)
    got = kernel(x, weight, seq_pos, activation, dy, l2_group)
    expected = reference(x, weight, seq_pos, activation, dy, l2_group)
    assert got[0].dtype == dtype and got[1].dtype == dtype and got[2].dtype == torch.float32
    for name, a, e in zip(("y", "dx", "dw"), got, expected, strict=True):
        assert_rel_close(a, e, tol, f"{name} (B={B}, T={T}, C={C}, K={K}, activation={activation}, "
                                    f"l2_group={l2_group})")  # fmt: skip


# ---------------------------------------------------------------- CPU (interpreter) tests, tiny shapes
@pytest.mark.parametrize(
    ("B", "T", "C", "K", "activation", "documents"),
    [
        (1, 1, 7, 4, True, None),  # one token: only the last tap
        (2, 3, 5, 4, False, None),  # T < K
        (2, 70, 64, 4, True, None),  # no documents: the second batch row starts inside a tile
        (3, 37, 100, 3, True, [[10, 1, 26], [37], [2, 35]]),  # batch rows change inside a tile
        (2, 130, 100, 4, True, [[32, 32, 1, 63, 2], [64, 3, 61, 2]]),  # starts on tile and program edges
        (1, 130, 300, 1, False, [[5, 125]]),  # five channel blocks, the last partial
        (2, 37, 20, 8, True, [[7, 1, 8, 21], [20, 17]]),  # the widest filter
        (2, 9, 10, 2, True, None),  # each width has its own weight-gradient accumulators
        (1, 40, 24, 6, True, [[3, 37]]),
        (1, 300, 16, 4, True, [[100, 156, 44]]),  # three 128-row forward programs, the last short
    ],
)
def test_matches_reference_fp32(B, T, C, K, activation, documents):
    check(B, T, C, K, activation, None if documents is None else positions(documents))


@pytest.mark.parametrize(
    ("B", "T", "C", "K", "activation", "documents", "l2_group"),
    [
        (2, 70, 64, 4, True, [[3, 64, 3], [70]], 32),  # two heads per row, 64-row tiles
        (3, 37, 96, 3, True, [[10, 1, 26], [37], [2, 35]], 32),  # three heads, batch rows inside a tile
        (1, 150, 64, 4, False, [[40, 110]], 64),  # no activation: the normalisation alone, two programs
        (2, 9, 48, 1, True, None, 16),  # one tap, 128-row tiles
        (1, 40, 24, 8, True, [[3, 37]], 8),  # the widest filter
    ],
)
def test_l2_normalised_heads_match_reference(B, T, C, K, activation, documents, l2_group):
    seq_pos = None if documents is None else positions(documents)
    check(B, T, C, K, activation, seq_pos, l2_group=l2_group)


@pytest.mark.parametrize(
    ("rows", "K", "l2_group", "documents"),
    [
        (16, 4, 0, [[16, 16, 1, 31, 2], [32, 3, 29, 2]]),  # starts on program edges and next to them
        (3, 5, 0, [[7, 1, 8, 21, 29], [20, 46]]),  # the halo spans more than the next program
        (1, 8, 0, None),  # one row per program: its dx needs the next seven programs' rows
        (16, 4, 16, [[16, 17, 33], [66]]),  # normalised heads
        (8, 3, 8, [[5, 60, 1], [66]]),
    ],
)
def test_backward_across_program_edges(monkeypatch, rows, K, l2_group, documents):
    """The backward with few rows per program, so that rows span many programs: each program's last rows take
    their dx from the next program's first rows (the halo it recomputes), its first rows' taps reach into
    the program before, and dw sums the partials of many programs. B = 2, T = 66: the second batch row
    starts inside a program; 48 channels: a block of 32 and a partial one (without normalisation)."""
    small = conv_ops.Tiling(rows=1, channels=32, tiles=rows, num_warps=1)
    monkeypatch.setattr(conv_ops, "BACKWARD_TILING", small)
    seq_pos = None if documents is None else positions(documents)
    check(2, 66, 48, K, True, seq_pos, l2_group=l2_group)


def test_l2_normalised_zero_head():
    """A head whose conv output is zero (no activation, one tap, x = 0 there): y = 0 and the gradient passes
    as dy / eps (the norm clamped at eps, its own gradient zero), as F.normalize's autograd gives; the other
    heads and rows are compared on their own, away from those huge values."""
    x = torch.randn(1, 20, 32)
    x[:, 5:9, 16:] = 0.0
    zero = torch.zeros_like(x, dtype=torch.bool)
    zero[:, 5:9, 16:] = True
    weight, dy = torch.randn(32, 1, 1), torch.randn(1, 20, 32)
    got = kernel(x, weight, None, False, dy, 16)
    expected = reference(x, weight, None, False, dy, 16)
    assert not got[0][zero].any()
    assert_rel_close(got[1][zero], expected[1][zero], 1e-5, "dx of the zero head")
    assert_rel_close(got[1][~zero], expected[1][~zero], 1e-5, "dx elsewhere")
    assert_rel_close(got[2], expected[2], 1e-5, "dw")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matches_reference_16_bit(dtype):
    check(2, 70, 100, 4, True, positions([[3, 64, 3], [70]]), dtype=dtype, tol=LOW_PRECISION_TOL)


@pytest.mark.parametrize(
    ("dtype", "mantissa_bits"),
    # the interpreter truncates fp32 -> bf16 (a GPU rounds to nearest): bf16 runs on a GPU only
    [(torch.float16, 11), pytest.param(torch.bfloat16, 8, marks=pytest.mark.gpu)],
)
def test_taps_are_rounded_to_the_input_dtype(dtype, mantissa_bits):
    """As in the PyTorch path (``weight.to(x.dtype)``): an fp32 weight acts as its rounding to nearest in x's
    dtype, exactly. The weights sit 3/4 of a step above a representable value: truncating would differ."""
    device = "cuda" if dtype == torch.bfloat16 else "cpu"
    x = torch.randn(1, 40, 24, device=device).to(dtype)
    below = torch.randn(24, 1, 4, device=device).to(dtype).float()
    step = torch.ldexp(torch.ones_like(below), torch.frexp(below).exponent - mantissa_bits)
    weight = below + 0.75 * step * below.sign()
    rounded = weight.to(dtype).float()
    assert not torch.equal(rounded, below)
    assert torch.equal(short_causal_conv(x, weight), short_causal_conv(x, rounded))


def test_documents_change_the_result():
    """Guards the tests above: ignoring the document starts is far outside the tolerance."""
    x, weight = torch.randn(1, 40, 8), torch.randn(8, 1, 4)
    seq_pos = positions([[13, 27]])
    assert rel_rms_error(short_causal_conv(x, weight, seq_pos), short_causal_conv(x, weight)) > 1e-2


def test_strided_input_and_broadcast_positions():
    """x a transposed view (copied inside), seq_pos [1, T] shared by every row, int32."""
    x = torch.randn(2, 24, 45).transpose(1, 2)  # [2, 45, 24]
    weight = torch.randn(24, 1, 4)
    seq_pos = positions([[9, 30, 6]]).to(torch.int32)
    dy = torch.randn(2, 45, 24)
    got = kernel(x, weight, seq_pos, True, dy)
    expected = reference(x, weight, seq_pos.expand(2, 45), True, dy)
    for name, a, e in zip(("y", "dx", "dw"), got, expected, strict=True):
        assert_rel_close(a, e, 1e-5, name)


def test_rejects_unsupported_arguments():
    x = torch.randn(1, 8, 4)
    with pytest.raises(ValueError, match="1 <= K <= 8"):
        short_causal_conv(x, torch.randn(4, 1, 9))
    with pytest.raises(ValueError, match="weight must have shape"):
        short_causal_conv(x, torch.randn(5, 1, 4))
    with pytest.raises(TypeError, match="seq_pos"):
        short_causal_conv(x, torch.randn(4, 1, 4), torch.zeros(1, 8))
    x, weight = torch.randn(1, 8, 24), torch.randn(24, 1, 4)
    for group in (3, 16, 512):  # not a power of two, not dividing C = 24, too wide
        with pytest.raises(ValueError, match="l2_group must be 0 or a power of two"):
            short_causal_conv(x, weight, l2_group=group)
    assert short_causal_conv(x, weight, l2_group=8).shape == x.shape


@pytest.mark.parametrize(
    ("widths", "l2_groups", "K", "activation", "documents"),
    [
        ([32, 64, 100], [16, 32, 0], 4, True, [[3, 64, 3], [70]]),  # q, k, v: normalised heads, then not
        ([24, 40], [0, 0], 3, False, None),  # no activation or normalisation: dpre is dy
        ([8, 8, 8, 8], [8, 0, 8, 0], 8, True, [[31, 39], [70]]),  # segments narrower than a channel block
    ],
)
def test_split_matches_a_conv_per_segment(widths, l2_groups, K, activation, documents):
    """One op over consecutive channel ranges of x against each range's own conv in fp64: outputs, the
    weights' gradients, and x's gradient assembled from the ranges' (x a [B, T, ΣC] GEMM output)."""
    B, T = 2, 70
    seq_pos = None if documents is None else positions(documents)
    x = torch.randn(B, T, sum(widths), requires_grad=True)
    weights = [torch.randn(C, 1, K, requires_grad=True) for C in widths]
    dys = [torch.randn(B, T, C) for C in widths]
    ys = short_causal_conv_split(x, weights, seq_pos, activation, l2_groups)
    grads = torch.autograd.grad(ys, (x, *weights), dys)
    edges = [0, *itertools.accumulate(widths)]
    expected_dx = []
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        assert ys[i].shape == (B, T, hi - lo) and ys[i].is_contiguous()
        y, dx, dw = reference(x[..., lo:hi], weights[i], seq_pos, activation, dys[i], l2_groups[i])
        assert_rel_close(ys[i], y, 1e-5, f"y of segment {i}")
        assert_rel_close(grads[1 + i], dw, 1e-5, f"dw of segment {i}")
        expected_dx.append(dx)
    assert_rel_close(grads[0], torch.cat(expected_dx, -1), 1e-5, "dx")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_split_is_bitwise_the_separate_ops(dtype):
    """Each segment runs the kernels of its own conv (x read in place, dx written into its channels of one
    gradient), so outputs and gradients equal the separate ops' exactly."""
    widths, groups = [16, 32, 48], [16, 16, 0]
    x = torch.randn(2, 45, sum(widths)).to(dtype).requires_grad_()
    weights = [torch.randn(C, 1, 4, requires_grad=True) for C in widths]
    seq_pos = positions([[20, 25], [45]])
    dys = [torch.randn(2, 45, C).to(dtype) for C in widths]
    joined = short_causal_conv_split(x, weights, seq_pos, True, groups)
    joined_grads = torch.autograd.grad(joined, (x, *weights), dys)
    parts = [short_causal_conv(p, w, seq_pos, True, g)
             for p, w, g in zip(x.split(widths, -1), weights, groups, strict=True)]  # fmt: skip
    part_grads = torch.autograd.grad(parts, (x, *weights), dys)
    for a, b in zip((*joined, *joined_grads), (*parts, *part_grads), strict=True):
        assert torch.equal(a, b)


def test_split_with_an_unused_output():
    """A segment whose output gets no gradient (autograd passes zeros): its part of dx and its dw are zero."""
    x = torch.randn(1, 20, 24, requires_grad=True)
    weights = [torch.randn(8, 1, 4, requires_grad=True), torch.randn(16, 1, 4, requires_grad=True)]
    _, second = short_causal_conv_split(x, weights, l2_groups=[8, 0])
    dx, dw_first, dw_second = torch.autograd.grad(second.square().sum(), (x, *weights))
    _, expected_dx, expected_dw = reference(x[..., 8:], weights[1], None, True, 2 * second.detach())
    assert not dx[..., :8].any() and not dw_first.any()
    assert_rel_close(dx[..., 8:], expected_dx, 1e-5, "dx")
    assert_rel_close(dw_second, expected_dw, 1e-5, "dw")


@pytest.mark.parametrize("used", [(True, True, True), (True, False, True), (False, True, False)])
def test_split_passes_trailing_channels_through(used):
    """Channels after the segments (``passthrough``) come back unchanged as one more output; dx holds their
    gradient (zero where an output gets none) beside the segments': one gradient for the whole GEMM output."""
    widths, groups, passthrough = [8, 16], [8, 0], 5
    x = torch.randn(2, 23, sum(widths) + passthrough, requires_grad=True)
    weights = [torch.randn(C, 1, 4, requires_grad=True) for C in widths]
    seq_pos = positions([[9, 14], [23]])
    *ys, tail = short_causal_conv_split(x, weights, seq_pos, True, groups, passthrough=passthrough)
    assert tail.shape == (2, 23, passthrough) and tail.is_contiguous()
    assert torch.equal(tail, x[..., sum(widths):])
    outputs = [out for out, use in zip((*ys, tail), used, strict=True) if use]
    dys = [torch.randn_like(out) for out in outputs]
    dx, *dws = torch.autograd.grad(outputs, (x, *weights), dys, allow_unused=True, materialize_grads=True)
    expected_dx = torch.zeros_like(x)
    edges = [0, *itertools.accumulate(widths)]
    given = iter(dys)
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        if not used[i]:
            assert not dws[i].any()
            continue
        _, seg_dx, seg_dw = reference(x[..., lo:hi], weights[i], seq_pos, True, next(given), groups[i])
        expected_dx[..., lo:hi] = seg_dx
        assert_rel_close(dws[i], seg_dw, 1e-5, f"dw of segment {i}")
    if used[-1]:
        expected_dx[..., edges[-1]:] = next(given)
    assert_rel_close(dx, expected_dx, 1e-5, "dx")


@pytest.mark.parametrize(("B", "T"), [(2, 23), (1, 9), (3, 1)])
def test_ops_read_padded_rows_in_place(B, T):
    """x with rows wider than its channels (a GEMM output whose rows inductor padded to 128 bytes): the ops
    read it in place (they carry the tag that lets inductor pass it so) and give exactly what they give on a
    contiguous copy; x with unevenly spaced rows is copied."""
    widths, groups, passthrough = [8, 16], [8, 0], 3
    width = sum(widths) + passthrough
    padded = torch.randn(B, T, width + 5)[..., :width]
    assert conv_ops._rows(padded) == (padded, width + 5)
    if B > 1 and T > 1:  # sequences further apart than T rows: copied
        copy, stride = conv_ops._rows(torch.randn(B, T + 1, width)[:, :T])
        assert copy.is_contiguous() and stride == width
    weights = [torch.randn(C, 1, 4) for C in widths]
    seq_pos = positions([[T // 2, T - T // 2]] * B) if T > 1 else None
    fwd, bwd = conv_ops.short_conv_fwd, conv_ops.short_conv_bwd
    for op in (fwd, bwd):
        assert torch.Tag.needs_fixed_stride_order in op._opoverload.tags
    outputs = [fwd(x, weights, seq_pos, True, groups, passthrough) for x in (padded, padded.contiguous())]
    dys = [torch.randn_like(out) for out in outputs[0]]
    grads = [bwd(dys, x, weights, seq_pos, True, groups) for x in (padded, padded.contiguous())]
    for a, b in zip((*outputs[0], *grads[0]), (*outputs[1], *grads[1]), strict=True):
        assert a.is_contiguous() and torch.equal(a, b)


def test_split_rejects_mismatched_arguments():
    x, weights = torch.randn(1, 8, 24), [torch.randn(8, 1, 4), torch.randn(16, 1, 4)]
    with pytest.raises(ValueError, match=r"adding up to 24 .*got channels \[8, 8\]"):
        short_causal_conv_split(x, [weights[0], weights[0]])
    with pytest.raises(ValueError, match="one K for every weight"):
        short_causal_conv_split(x, [weights[0], torch.randn(16, 1, 3)])
    with pytest.raises(ValueError, match="one entry per weight"):
        short_causal_conv_split(x, weights, l2_groups=[8])
    with pytest.raises(ValueError, match=r"l2_group must be 0 or a power of two .* 16 channels, got 32"):
        short_causal_conv_split(x, weights, l2_groups=[8, 32])
    with pytest.raises(ValueError, match="at least one"):
        short_causal_conv_split(x, [])
    with pytest.raises(ValueError, match=r"C_i adding up to 20 \(x's channels less 4 passthrough\)"):
        short_causal_conv_split(x, weights, passthrough=4)
    with pytest.raises(ValueError, match=r"passthrough must be in \[0, 24\)"):
        short_causal_conv_split(x, weights, passthrough=24)


def _force_kernel(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Makes ``ShortCausalConv.forward`` take the Triton op on CPU; returns a list counting its loads."""
    loads = []
    load = short_conv_module._load_triton_conv

    def counting_load():
        loads.append(1)
        return load()

    monkeypatch.setattr(short_conv_module, "_kernel_applies", lambda x, weight, l2_group: True)
    monkeypatch.setattr(short_conv_module, "_load_triton_conv", counting_load)
    return loads


@pytest.mark.parametrize("l2_group", [0, 8])
def test_module_runs_the_op_when_it_applies(monkeypatch, l2_group):
    conv = ShortCausalConv(40, kernel_size=4, l2_group=l2_group)
    x = torch.randn(2, 19, 40, requires_grad=True)
    seq_pos = positions([[4, 15], [19]])
    dy = torch.randn(2, 19, 40)  # not 2y: the squares of normalised heads sum to a constant
    expected = conv.forward_torch(x, seq_pos)
    expected_grads = torch.autograd.grad(expected, (x, conv.weight), dy)
    loads = _force_kernel(monkeypatch)
    got = conv(x, seq_pos)
    grads = torch.autograd.grad(got, (x, conv.weight), dy)
    assert loads, "the module did not take the Triton path"
    assert_rel_close(got, expected, 1e-5, "y")
    for name, a, e in zip(("dx", "dw"), grads, expected_grads, strict=True):
        assert_rel_close(a, e, 1e-5, name)
    history = torch.randn(2, 3, 40)
    y_step, _ = conv.forward_with_history(x[:, :1], history)  # decoding stays on the PyTorch path
    assert len(loads) == 1 and y_step.shape == (2, 1, 40)


def test_short_convs_take_one_op_when_every_conv_applies(monkeypatch):
    """q, k and v convs over one GEMM's output: one call of the split op (forced on CPU), the same values
    and gradients as each conv's PyTorch path on its range; mixed filter widths fall back to the convs."""
    convs = [ShortCausalConv(16, l2_group=8), ShortCausalConv(16, l2_group=8), ShortCausalConv(24)]
    x = torch.randn(2, 19, 56, requires_grad=True)
    seq_pos = positions([[4, 15], [19]])
    dys = [torch.randn(2, 19, c.channels) for c in convs]
    params = [x, *(c.weight for c in convs)]
    ranges = x.split([16, 16, 24], -1)
    expected = [c.forward_torch(r, seq_pos) for c, r in zip(convs, ranges, strict=True)]
    expected_grads = torch.autograd.grad(expected, params, dys)
    _force_kernel(monkeypatch)
    calls = []
    split = short_conv_module._load_triton_conv_split()
    monkeypatch.setattr(short_conv_module, "_load_triton_conv_split", lambda: calls.append(1) or split)
    got = short_conv_module.short_convs(x, convs, seq_pos)
    assert calls == [1]
    for a, e, name in zip((*got, *torch.autograd.grad(got, params, dys)), (*expected, *expected_grads),
                          ("q", "k", "v", "dx", "dw_q", "dw_k", "dw_v"), strict=True):  # fmt: skip
        assert_rel_close(a, e, 1e-5, name)
    mixed = [ShortCausalConv(16), ShortCausalConv(40, kernel_size=3)]
    assert len(short_conv_module.short_convs(x, mixed, seq_pos)) == 2 and calls == [1]
    with pytest.raises(ValueError, match=r"channels \[16, 16\] and 0 passthrough must add up to x's 56"):
        short_conv_module.short_convs(x, convs[:2], seq_pos)


def test_short_convs_pass_trailing_channels_through(monkeypatch):
    """The op's passthrough channels and the fallback's view of them: the same tail and the same gradient
    of the whole GEMM output."""
    convs = [ShortCausalConv(16, l2_group=8), ShortCausalConv(24)]
    x = torch.randn(2, 19, 43, requires_grad=True)
    seq_pos = positions([[4, 15], [19]])
    dys = [torch.randn(2, 19, width) for width in (16, 24, 3)]
    fallback = short_conv_module.short_convs(x, [convs[0], ShortCausalConv(24, kernel_size=3)], seq_pos, 3)
    assert len(fallback) == 3 and torch.equal(fallback[-1], x[..., 40:])
    ranges = x[..., :40].split([16, 24], -1)
    expected = [c.forward_torch(r, seq_pos) for c, r in zip(convs, ranges, strict=True)]
    expected_grads = torch.autograd.grad((*expected, x[..., 40:]), (x, *(c.weight for c in convs)), dys)
    _force_kernel(monkeypatch)
    got = short_conv_module.short_convs(x, convs, seq_pos, passthrough=3)
    assert torch.equal(got[-1], x[..., 40:])
    got_grads = torch.autograd.grad(got, (x, *(c.weight for c in convs)), dys)
    for a, e, name in zip((*got, *got_grads), (*expected, x[..., 40:], *expected_grads),
                          ("q", "v", "tail", "dx", "dw_q", "dw_v"), strict=True):  # fmt: skip
        assert_rel_close(a, e, 1e-5, name)


def test_module_compiles_fullgraph_with_the_op(monkeypatch):
    """torch.compile(fullgraph=True) traces the module through the custom op's fake kernel and autograd rule
    (aot_eager: the graph is what inductor would get; inductor's CPU codegen adds nothing here)."""
    _force_kernel(monkeypatch)
    targets: set[str] = set()
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def recording_backend(gm, example_inputs):
        targets.update(str(node.target) for node in gm.graph.nodes)
        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    conv = ShortCausalConv(24, kernel_size=4)
    x = torch.randn(1, 21, 24, requires_grad=True)
    seq_pos = positions([[6, 15]])
    y = torch.compile(conv, fullgraph=True, backend=recording_backend)(x, seq_pos)
    y.square().sum().backward()
    assert "titan_delta.short_conv_fwd.default" in targets, sorted(targets)
    expected = conv.forward_torch(x, seq_pos)
    assert_rel_close(y, expected, 1e-5, "compiled y")
    grads = torch.autograd.grad(expected.square().sum(), (x, conv.weight))
    assert_rel_close(x.grad, grads[0], 1e-5, "compiled dx")
    assert_rel_close(conv.weight.grad, grads[1], 1e-5, "compiled dw")


@pytest.mark.parametrize("with_documents", [True, False])
def test_custom_ops_pass_opcheck(with_documents):
    seq_pos = positions([[4, 5]]) if with_documents else None
    cases = (([6], [0], 0), ([6], [2], 0), ([4, 6], [2, 0], 0), ([4, 6], [2, 0], 3))
    for widths, l2_groups, passthrough in cases:
        x = torch.randn(1, 9, sum(widths) + passthrough, requires_grad=True)
        weights = [torch.randn(C, 1, 3, requires_grad=True) for C in widths]
        torch.library.opcheck(conv_ops.short_conv_fwd, (x, weights, seq_pos, True, l2_groups, passthrough))
        dys = [torch.randn(1, 9, C) for C in widths + ([passthrough] if passthrough else [])]
        args = (dys, x.detach(), [w.detach() for w in weights], seq_pos, False, l2_groups)
        torch.library.opcheck(conv_ops.short_conv_bwd, args)


# ---------------------------------------------------------------- GPU tests, the 340M shapes
def _packed_positions(B: int, T: int, device) -> torch.Tensor:
    """seq_pos [B, T] with a few documents per row of random lengths (the trainer packs documents)."""
    rows = []
    for _ in range(B):
        cuts = torch.sort(torch.randint(1, T, (3,))).values.tolist()
        bounds = [0, *cuts, T]
        rows.append([end - start for start, end in itertools.pairwise(bounds)])
    return positions(rows, device)


@pytest.mark.gpu
@pytest.mark.parametrize(("C", "l2_group"), [(512, 0), (1024, 0), (2048, 0), (512, 128), (1024, 128)])
def test_gpu_340m_shapes_bf16(C, l2_group):
    """Triton vs fp64 at 1e-2, and no less accurate than the PyTorch path on the same bf16 inputs
    (gated_deltaproduct 340M's q, k and v; q and k with their heads normalised)."""
    B, T, K = 16, 2048, 4
    x = torch.randn(B, T, C, device="cuda").to(torch.bfloat16)
    weight = torch.randn(C, 1, K, device="cuda") * 0.5
    dy = torch.randn(B, T, C, device="cuda").to(torch.bfloat16)
    seq_pos = _packed_positions(B, T, "cuda")
    got = kernel(x, weight, seq_pos, True, dy, l2_group)
    expected = reference(x, weight, seq_pos, True, dy, l2_group)
    conv = ShortCausalConv(C, K, l2_group=l2_group).cuda()
    with torch.no_grad():
        conv.weight.copy_(weight)
    xt = x.detach().requires_grad_()
    yt = conv.forward_torch(xt, seq_pos)
    torch_path = (yt, *torch.autograd.grad(yt, (xt, conv.weight), dy))
    for name, a, t, e in zip(("y", "dx", "dw"), got, torch_path, expected, strict=True):
        err, torch_err = rel_rms_error(a, e), rel_rms_error(t, e)
        assert err <= LOW_PRECISION_TOL, f"{name}: relative RMS error {err:.3e} > {LOW_PRECISION_TOL}"
        assert err <= 1.1 * torch_err + 1e-6, f"{name}: Triton {err:.3e} vs PyTorch path {torch_err:.3e}"


@pytest.mark.gpu
def test_gpu_split_at_340m_is_bitwise_the_separate_ops():
    """gated_deltaproduct 340M's q, k (heads of 128 normalised) and v as one op over a [16, 2048, 3584]
    projection output: exactly the three separate ops' outputs and gradients."""
    widths, groups = [512, 1024, 2048], [128, 128, 0]
    x = torch.randn(16, 2048, sum(widths), device="cuda").to(torch.bfloat16).requires_grad_()
    weights = [(torch.randn(C, 1, 4, device="cuda") * 0.5).requires_grad_() for C in widths]
    seq_pos = _packed_positions(16, 2048, "cuda")
    dys = [torch.randn(16, 2048, C, device="cuda").to(torch.bfloat16) for C in widths]
    joined = short_causal_conv_split(x, weights, seq_pos, True, groups)
    joined_grads = torch.autograd.grad(joined, (x, *weights), dys)
    parts = [short_causal_conv(p, w, seq_pos, True, g)
             for p, w, g in zip(x.split(widths, -1), weights, groups, strict=True)]  # fmt: skip
    part_grads = torch.autograd.grad(parts, (x, *weights), dys)
    names = ("q", "k", "v", "dx", "dw_q", "dw_k", "dw_v")
    for name, a, b in zip(names, (*joined, *joined_grads), (*parts, *part_grads), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.gpu
def test_gpu_fp32_and_deterministic_weight_gradient():
    check(4, 1000, 300, 4, True, _packed_positions(4, 1000, "cuda"), device="cuda")
    x = torch.randn(2, 4096, 1024, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(1024, 1, 4, device="cuda")
    dy = torch.randn_like(x)
    seq_pos = _packed_positions(2, 4096, "cuda")
    first, second = kernel(x, weight, seq_pos, True, dy), kernel(x, weight, seq_pos, True, dy)
    for name, a, b in zip(("y", "dx", "dw"), first, second, strict=True):
        assert torch.equal(a, b), f"{name} differs between identical runs"


@pytest.mark.gpu
def test_gpu_module_compiled_uses_the_op():
    conv = ShortCausalConv(1024, kernel_size=4).cuda()
    x = torch.randn(2, 512, 1024, device="cuda", requires_grad=True)
    seq_pos = _packed_positions(2, 512, "cuda")
    torch._dynamo.reset()
    compiled = torch.compile(conv, fullgraph=True)
    y = compiled(x, seq_pos)
    y.square().sum().backward()
    expected = conv.forward_torch(x, seq_pos)
    grads = torch.autograd.grad(expected.square().sum(), (x, conv.weight))
    assert_rel_close(y, expected, 1e-5, "compiled y")
    assert_rel_close(x.grad, grads[0], 1e-5, "compiled dx")
    assert_rel_close(conv.weight.grad, grads[1], 1e-5, "compiled dw")
