"""Benchmark: the Triton short causal conv vs the PyTorch path of ``ShortCausalConv`` under torch.compile.

    python tools/bench/short_conv.py                       # x [16, 2048, C] bf16, C = 512, 1024, 2048
    python tools/bench/short_conv.py --shapes 8x4096x1536 --kernel-size 3 --documents 1
    python tools/bench/short_conv.py --ops --shapes 16x2048x512,16x2048x1024,16x2048x2048,16x2048x4096
    python tools/bench/short_conv.py --shapes 16x2048x512,16x2048x1024 --l2-group 128

The table: median ``triton.testing.do_bench`` times of the forward and of forward+backward, per shape, for
(a) ``ShortCausalConv.forward_torch`` compiled with torch.compile (inductor, what the model ran before the
op) and (b) the Triton op, both on the same bf16 x, an fp32 weight [C, 1, K] (gradients of x and weight) and
seq_pos with ``--documents`` documents of random lengths per row. GB/s effective counts the bytes a fused
implementation cannot avoid: x read and y written (forward), x and dy read and dx written (backward).
The last columns compare the two paths' y, dx and dw (relative RMS, and max |difference| of y).

``--l2-group G`` normalises every G channels of the output (a head, as Gated DeltaProduct's q and k): the
PyTorch path then ends with ``l2_normalize_groups`` and the table adds (c) the Triton conv followed by that
normalisation compiled on its own (the model's path before the normalisation was fused into the op).

``--ops`` times the Triton op's two custom ops called directly (``short_conv_fwd``; ``short_conv_bwd``: the
backward kernel per segment and the dw partial sums' reduction), without autograd and the module, whose host
work hides the kernels at small shapes. Run it under an older checkout's PYTHONPATH to compare kernels on one
GPU.

``--split C:G,C:G,... --dim D`` times a mixer's input side, x [B, T, D] bf16 -> convolved q, k, v, forward
and forward+backward through autograd (gradients of x, the projections' and the convs' weights): (a) one
``nn.Linear`` and one conv per segment of C channels (L2 groups G, 0 for none), and (b) one GEMM over the
concatenated projection weights and one op over its output (``short_causal_conv_split``); ``--shapes`` gives
B and T (its C is ignored).
"""

from __future__ import annotations

import argparse
import sys

import torch


def make_inputs(B: int, T: int, C: int, K: int, documents: int, device: str):
    x = torch.randn(B, T, C, device=device, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.nn.Parameter((torch.rand(C, 1, K, device=device) * 2 - 1) * K**-0.5)  # nn.Conv1d's init
    rows = []
    for _ in range(B):
        cuts = torch.sort(torch.randperm(T - 1, device=device)[: documents - 1] + 1).values
        starts = torch.zeros(T, dtype=torch.long, device=device)
        starts[cuts] = cuts
        rows.append(torch.arange(T, device=device) - starts.cummax(0).values)
    dy = torch.randn_like(x)
    return x, weight, torch.stack(rows), dy


def time_fwd_bwd(fn, x, weight, seq_pos, dy) -> tuple[float, float]:
    from triton.testing import do_bench

    def fwd():
        with torch.no_grad():
            fn(x, weight, seq_pos)

    def fwd_bwd():
        fn(x, weight, seq_pos).backward(dy)

    fwd_ms = do_bench(fwd, warmup=25, rep=200, return_mode="median")
    return fwd_ms, do_bench(fwd_bwd, warmup=25, rep=200, grad_to_none=[x, weight], return_mode="median")


def outputs(fn, x, weight, seq_pos, dy) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y = fn(x, weight, seq_pos)
    dx, dw = torch.autograd.grad(y, (x, weight), dy)
    return y.detach(), dx, dw


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def table(shapes: str, K: int, documents: int, activation: bool, l2_group: int) -> None:
    import triton

    from titan_delta.models.components.short_conv import ShortCausalConv, l2_normalize_groups
    from titan_delta_kernels.short_conv import short_causal_conv

    print(
        f"\n# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}, "
        f"bf16 x, fp32 weight, K = {K}, {documents} documents per row, SiLU {activation}, "
        f"L2 groups of {l2_group or 'none'}"
    )
    separate = " | Triton conv + compiled normalisation fwd | fwd+bwd" if l2_group else ""
    print("| x [B, T, C] | compiled PyTorch fwd | fwd+bwd | GB/s | Triton fwd | fwd+bwd | GB/s | speed-up "
          f"fwd+bwd | y / dx / dw rel RMS | y max abs{separate} |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if l2_group else ""))
    compiled_normalize = torch.compile(l2_normalize_groups)
    for shape in shapes.split(","):
        B, T, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(B * T + C)
        conv = ShortCausalConv(C, K, activation, l2_group).cuda()

        x, weight, seq_pos, dy = make_inputs(B, T, C, K, documents, "cuda")
        conv.weight = weight  # one leaf for both paths
        compiled = torch.compile(conv.forward_torch)

        def pytorch(x, weight, seq_pos, compiled=compiled):
            return compiled(x, seq_pos)

        def fused(x, weight, seq_pos):
            return short_causal_conv(x, weight, seq_pos, activation, l2_group)

        def conv_then_normalize(x, weight, seq_pos, normalize=compiled_normalize):
            return normalize(short_causal_conv(x, weight, seq_pos, activation), l2_group)

        t_fwd, t_all = time_fwd_bwd(pytorch, x, weight, seq_pos, dy)
        k_fwd, k_all = time_fwd_bwd(fused, x, weight, seq_pos, dy)
        if l2_group:
            s_fwd, s_all = time_fwd_bwd(conv_then_normalize, x, weight, seq_pos, dy)
        expected, got = outputs(pytorch, x, weight, seq_pos, dy), outputs(fused, x, weight, seq_pos, dy)
        errors = " / ".join(f"{rel(a, e):.1e}" for a, e in zip(got, expected, strict=True))
        max_abs = (got[0].float() - expected[0].float()).abs().max().item()
        gigabytes = 5 * x.numel() * x.element_size() / 1e9  # x, y forward; x, dy, dx backward
        row = [f"[{B}, {T}, {C}]", f"{t_fwd:.3f} ms", f"{t_all:.3f} ms", f"{gigabytes / t_all * 1e3:.0f}",
               f"{k_fwd:.3f} ms", f"{k_all:.3f} ms", f"{gigabytes / k_all * 1e3:.0f}",
               f"{t_all / k_all:.2f}×", errors, f"{max_abs:.1e}"]  # fmt: skip
        row += [f"{s_fwd:.3f} ms", f"{s_all:.3f} ms"] if l2_group else []
        print("| " + " | ".join(row) + " |", flush=True)
        del x, weight, seq_pos, dy, conv, compiled, expected, got
        torch.cuda.empty_cache()


def _backward_tiling(conv, l2_group: int):
    """The backward tiling of the kernels on the path (older trees named it after their dpre kernel)."""
    if hasattr(conv, "backward_tiling"):
        return conv.backward_tiling(l2_group)
    return getattr(conv, "DPRE_TILING", "shared with the other kernels")


def ops_table(shapes: str, K: int, documents: int, activation: bool, l2_group: int) -> None:
    import triton

    from titan_delta_kernels.short_conv import conv

    print(
        f"\n# {torch.cuda.get_device_name(0)}, triton {triton.__version__}, backward tiling "
        f"{_backward_tiling(conv, l2_group)}, bf16 x, fp32 weight, K = {K}, "
        f"{documents} documents per row, SiLU {activation}, L2 groups of {l2_group or 'none'}"
    )
    # kernels from before the normalisation was an argument take none; before the split op, no lists
    group = (l2_group,) if hasattr(conv, "check_l2_group") else ()
    if l2_group and not group:
        raise SystemExit("--l2-group: these kernels have no normalisation")
    listed = hasattr(conv, "short_causal_conv_split")
    print("| x [B, T, C] | forward op | GB/s (x, y) | backward op | GB/s (x, dy, dx) |")
    print("|---|---:|---:|---:|---:|")
    for shape in shapes.split(","):
        B, T, C = (int(v) for v in shape.split("x"))
        torch.manual_seed(B * T + C)
        x, weight, seq_pos, dy = make_inputs(B, T, C, K, documents, "cuda")
        x, weight = x.detach(), weight.detach()
        if listed:
            fwd_args = (x, [weight], seq_pos, activation, [l2_group], 0)
            bwd_args = ([dy], x, [weight], seq_pos, activation, [l2_group])
        else:
            fwd_args = (x, weight, seq_pos, activation, *group)
            bwd_args = (dy, x, weight, seq_pos, activation, *group)
        fwd = do_bench_median(lambda: conv.short_conv_fwd(*fwd_args))  # noqa: B023
        bwd = do_bench_median(lambda: conv.short_conv_bwd(*bwd_args))  # noqa: B023
        nbytes = x.numel() * x.element_size()
        print(f"| [{B}, {T}, {C}] | {fwd:.3f} ms | {2 * nbytes / fwd / 1e6:.0f} | {bwd:.3f} ms | "
              f"{3 * nbytes / bwd / 1e6:.0f} |", flush=True)  # fmt: skip


def split_table(shapes: str, segments: str, dim: int, K: int, documents: int) -> None:
    """(a) a projection and a conv per segment against (b) one GEMM and the split op, through autograd."""
    import triton

    pairs = [tuple(int(v) for v in part.split(":")) for part in segments.split(",")]
    print(f"\n# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}, "
          f"bf16, dim {dim}, segments {segments} (channels:L2 group), K = {K}, {documents} documents per row")
    print("| x [B, T, dim] | separate fwd | fwd+bwd | one GEMM + split op fwd | fwd+bwd | speed-up fwd+bwd | "
          "outputs / dx rel RMS |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|")
    for shape in shapes.split(","):
        B, T, _ = (int(v) for v in shape.split("x"))
        print(split_row(B, T, pairs, dim, K, documents), flush=True)
        torch.cuda.empty_cache()


def split_row(B: int, T: int, pairs: list[tuple[int, ...]], dim: int, K: int, documents: int) -> str:
    from triton.testing import do_bench

    from titan_delta_kernels.short_conv import short_causal_conv, short_causal_conv_split

    torch.manual_seed(B * T)
    seq_pos = make_inputs(1, T, 1, K, documents, "cuda")[2].expand(B, T)
    x = torch.randn(B, T, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    projections = [torch.nn.Linear(dim, c, bias=False, **bf16) for c, _ in pairs]
    taps = [make_inputs(1, 1, c, K, 1, "cuda")[1] for c, _ in pairs]
    groups = [g for _, g in pairs]
    dys = [torch.randn(B, T, c, **bf16) for c, _ in pairs]
    leaves = [x, *taps, *(p.weight for p in projections)]

    def separate():
        segments = zip(projections, taps, groups, strict=True)
        return [short_causal_conv(p(x), w, seq_pos, True, g) for p, w, g in segments]

    def fused():
        joined = torch.nn.functional.linear(x, torch.cat([p.weight for p in projections]))
        return short_causal_conv_split(joined, taps, seq_pos, True, groups)

    def timed(fn):
        def fwd():
            with torch.no_grad():
                fn()

        def fwd_bwd():
            torch.autograd.backward(fn(), dys)

        fwd_ms = do_bench(fwd, warmup=25, rep=200, return_mode="median")
        return fwd_ms, do_bench(fwd_bwd, warmup=25, rep=200, grad_to_none=leaves, return_mode="median")

    s_fwd, s_all = timed(separate)
    f_fwd, f_all = timed(fused)
    ys_s, ys_f = separate(), fused()
    dx_s, dx_f = (torch.autograd.grad(ys, x, dys)[0] for ys in (ys_s, ys_f))
    out_err = max(rel(a, b) for a, b in zip(ys_f, ys_s, strict=True))
    return (f"| [{B}, {T}, {dim}] | {s_fwd:.3f} ms | {s_all:.3f} ms | {f_fwd:.3f} ms | {f_all:.3f} ms | "
            f"{s_all / f_all:.2f}× | {out_err:.1e} / {rel(dx_f, dx_s):.1e} |")  # fmt: skip


def do_bench_median(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="16x2048x512,16x2048x1024,16x2048x2048", help="BxTxC list")
    parser.add_argument("--kernel-size", type=int, default=4, help="K, the filter width (1..8)")
    parser.add_argument("--documents", type=int, default=4, help="documents per row (1: seq_pos all t)")
    parser.add_argument("--no-activation", action="store_true", help="identity instead of SiLU")
    parser.add_argument("--ops", action="store_true", help="time the custom ops directly (see above)")
    parser.add_argument("--l2-group", type=int, default=0, help="channels per L2-normalised group (0: none)")
    parser.add_argument("--split", default="", help="C:G,C:G,...: time the split op's input side (see above)")
    parser.add_argument("--dim", type=int, default=1024, help="--split: the projections' input width")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    documents, activation = max(1, args.documents), not args.no_activation
    if args.split:
        split_table(args.shapes, args.split, args.dim, args.kernel_size, documents)
        return 0
    if args.ops:
        ops_table(args.shapes, args.kernel_size, documents, activation, args.l2_group)
        return 0
    table(args.shapes, args.kernel_size, documents, activation, args.l2_group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
