"""Per-kernel GPU time of a Gated DeltaProduct fwd+bwd step: ours (each variant) and FLA's, same inputs.

    python tools/bench/profile_gdp_kernels.py --specs 4x4096x16x128x2,8x2048x16x64x3 --variants default

The benchmark (``bench_gated_delta_product.py``) says how far apart the totals are; this says where: in one
process each implementation runs ``--iters`` fwd+bwd steps under ``torch.profiler`` after a warm-up, and
every CUDA kernel's summed device time is printed per step (ms) with its launches per step, largest first,
after the total of kernel time per step. Kernels run back to back on one stream, so the total is close to a
step's GPU time; gaps between kernels (host-bound launches) are not counted.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import torch
from bench_gated_delta_product import make_inputs, ours  # tools/ is on sys.path


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


def short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def report(label: str, rows: list[tuple[str, float, float]]) -> None:
    print(f"\n{label}: {sum(r[1] for r in rows):.3f} ms of kernel time per fwd+bwd step")
    print("| kernel | ms / step | launches / step |")
    print("|---|---|---|")
    for name, ms, n in rows:
        if ms >= 0.002:
            print(f"| `{short(name)}` | {ms:.3f} | {n:g} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default="4x4096x16x128x2", help="BxTxHxDxNH list")
    parser.add_argument("--variants", default="default", help="comma list of our variant strings")
    parser.add_argument("--no-fla", action="store_true", help="profile ours only")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, bf16, {args.iters} steps profiled")
    for spec in args.specs.split(","):
        B, T, H, D, n_h = (int(x) for x in spec.split("x"))
        torch.manual_seed(n_h + T)
        inputs = make_inputs(B, T, H, D, n_h, "cuda")
        d_out = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
        print(f"\n## [{B},{T},{H},{D}], n_h = {n_h}")
        for variant in variants:
            report(f"ours `{variant}`", kernel_times(ours(n_h, variant), inputs, d_out, args.iters))
        if not args.no_fla:
            import fla.ops.common.chunk_o as fla_chunk_o
            from fla.ops.gated_delta_product import chunk_gated_delta_product

            fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # timing only, as in the benchmark

            def theirs(q, k, v, g, beta, n_h=n_h):
                return chunk_gated_delta_product(q, k, v, g, beta, num_householder=n_h)

            report("FLA chunk_gated_delta_product", kernel_times(theirs, inputs, d_out, args.iters))
        del inputs, d_out
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
