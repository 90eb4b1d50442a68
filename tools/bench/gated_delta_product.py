"""Benchmark: our Triton Gated DeltaProduct vs flash-linear-attention's, one process, bf16.

    python tools/bench/gated_delta_product.py                      # the default table
    python tools/bench/gated_delta_product.py --profile 4x4096x16x128x2,8x2048x16x64x3

The table: median ``triton.testing.do_bench`` times of the forward and of forward+backward for ours and
FLA's ``chunk_gated_delta_product`` (and, for n_h = 1, its Gated DeltaNet), per shape and n_h.
``--profile BxTxHxDxNH[xV],...``: the per-kernel (per-stage) GPU time of one fwd+bwd step, ours and FLA's side
by side (V, the value head, defaults to D): ``--iters`` steps under ``torch.profiler`` after a warm-up, every
CUDA kernel's summed device time per step, largest first, after the total (kernels run back to back on one
stream, so the total is close to a step's GPU time; host-bound gaps are not counted).
Inputs are fresh, bf16, unit-norm keys, β = sigmoid(·), g = logsigmoid(·); gradients reset every repetition.
FLA refuses its gated backward on Triton < 3.7.1 (a guard for a Hopper miscompile); timing only, we lift it.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F


def make_inputs(B, T, H, D, n_h, device, V=None):
    """q, k, v, g, β with key dim D and value dim V (D when not given), requiring gradients."""
    bf = torch.bfloat16
    q = torch.randn(B, T, H, D, device=device, dtype=bf)
    k = F.normalize(torch.randn(B, T * n_h, H, D, device=device), dim=-1).to(bf)
    v = torch.randn(B, T * n_h, H, V or D, device=device, dtype=bf)
    beta = torch.randn(B, T * n_h, H, device=device).sigmoid().to(bf)
    g = F.logsigmoid(torch.randn(B, T, H, device=device))
    return [x.requires_grad_() for x in (q, k, v, g, beta)]


def ours(n_h: int):
    from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

    def run(q, k, v, g, beta):
        return gated_delta_product_triton(q, k, v, g, beta, num_householder=n_h)

    return run


def fla(n_h: int, gated_delta_net: bool = False):
    import fla.ops.common.chunk_o as fla_chunk_o
    from fla.ops.gated_delta_product import chunk_gated_delta_product
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # timing only: lift FLA's guard (see module docstring)
    if gated_delta_net:
        return lambda q, k, v, g, beta: chunk_gated_delta_rule(q, k, v, g, beta)
    return lambda q, k, v, g, beta: chunk_gated_delta_product(q, k, v, g, beta, num_householder=n_h)


def time_fwd_bwd(fn, inputs, d_out) -> tuple[float, float]:
    from triton.testing import do_bench

    def fwd():
        with torch.no_grad():
            return fn(*inputs)[0]

    def fwd_bwd():
        fn(*inputs)[0].backward(d_out)

    return (do_bench(fwd, warmup=25, rep=100, return_mode="median"),
            do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=inputs, return_mode="median"))  # fmt: skip


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def table(shapes: str, nh: str, use_fla: bool) -> None:
    import triton

    device = torch.cuda.get_device_name(0)
    print(f"\n# {device}, torch {torch.__version__}, triton {triton.__version__}, bf16")
    print("| shape [B,T,H,D] | n_h | ours fwd | ours fwd+bwd | FLA GDP fwd | FLA GDP fwd+bwd "
          "| speed-up fwd+bwd | FLA GDN fwd+bwd | o vs FLA (rel RMS) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in shapes.split(","):
        B, T, H, D = (int(x) for x in shape.split("x"))
        for n_h in (int(x) for x in nh.split(",")):
            torch.manual_seed(1000 * n_h + T)
            inputs = make_inputs(B, T, H, D, n_h, "cuda")
            d_out = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
            t_fwd, t_all = time_fwd_bwd(ours(n_h), inputs, d_out)
            cells = ["–"] * 5
            if use_fla:
                f_fwd, f_all = time_fwd_bwd(fla(n_h), inputs, d_out)
                with torch.no_grad():
                    o_vs = rel(ours(n_h)(*inputs)[0], fla(n_h)(*inputs)[0])
                cells = [f"{f_fwd:.3f} ms", f"{f_all:.3f} ms", f"{f_all / t_all:.2f}×", "–", f"{o_vs:.2e}"]
                if n_h == 1:
                    _, gdn_all = time_fwd_bwd(fla(1, gated_delta_net=True), inputs, d_out)
                    cells[3] = f"{gdn_all:.3f} ms (ours {gdn_all / t_all:.2f}×)"
            row = [f"[{B}, {T}, {H}, {D}]", str(n_h), f"{t_fwd:.3f} ms", f"{t_all:.3f} ms", *cells]
            print("| " + " | ".join(row) + " |", flush=True)
            del inputs, d_out
            torch.cuda.empty_cache()


def kernel_times(fn, inputs, d_out, iters: int) -> list[tuple[str, float, float]]:
    """[(kernel name, ms per step, launches per step)], largest time first."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(*inputs)[0].backward(d_out)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            for x in inputs:
                x.grad = None
            fn(*inputs)[0].backward(d_out)
        torch.cuda.synchronize()
    total_us: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total_us[event.name] += event.device_time
            count[event.name] += 1
    rows = [(name, us / iters / 1e3, count[name] / iters) for name, us in total_us.items()]
    return sorted(rows, key=lambda r: -r[1])


def report(label: str, rows: list[tuple[str, float, float]]) -> None:
    """The kernel table of one implementation: every kernel counts in the total, those of 2 µs or more a step
    are listed (names cut to 60 characters)."""
    print(f"\n{label}: {sum(r[1] for r in rows):.3f} ms of kernel time per fwd+bwd step")
    print("| kernel | ms / step | launches / step |")
    print("|---|---|---|")
    for name, ms, n in rows:
        if ms >= 0.002:
            print(f"| `{name if len(name) <= 60 else name[:59] + '…'}` | {ms:.3f} | {n:g} |")


def profile_specs(specs: str, use_fla: bool, iters: int) -> None:
    print(f"\n# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, bf16, {iters} steps profiled")
    for spec in specs.split(","):
        B, T, H, D, n_h, *wide = (int(x) for x in spec.split("x"))
        V = wide[0] if wide else D
        torch.manual_seed(n_h + T)
        inputs = make_inputs(B, T, H, D, n_h, "cuda", V=V)
        d_out = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
        print(f"\n## [{B},{T},{H},{D}], V = {V}, n_h = {n_h}")
        report("ours", kernel_times(ours(n_h), inputs, d_out, iters))
        if use_fla:
            report("FLA chunk_gated_delta_product", kernel_times(fla(n_h), inputs, d_out, iters))
        del inputs, d_out
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4x4096x16x128,8x2048x16x64", help="BxTxHxD list")
    parser.add_argument("--nh", default="1,2,3", help="num_householder values, in the order to run")
    parser.add_argument("--no-fla", "--ours-only", action="store_true", help="time ours only")
    parser.add_argument("--profile", default="",
                        help="BxTxHxDxNH[xV] list: per-kernel times, not the table (V defaults to D)")
    parser.add_argument("--iters", type=int, default=5, help="--profile: fwd+bwd steps profiled")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.profile:
        profile_specs(args.profile, not args.no_fla, args.iters)
    else:
        table(args.shapes, args.nh, not args.no_fla)
    return 0


if __name__ == "__main__":
    sys.exit(main())
