"""One GDP state pass with an explicit launch configuration against its default, on one GPU.

Why: the variant strings refuse launch combinations that once crashed (``options.KNOWN_BAD``), and the
benchmark's sweep sets both state passes at once. This probe calls ``state.state_bwd`` or
``state.state_fwd`` directly with the V tile, pipelining stages and warps given, compares its outputs with
the default launch's (relative RMS difference; ``nan`` means the launch wrote NaN) and times both. Run each
configuration in its own process: a launch that hits an illegal address poisons the CUDA context.

    for cfg in "32 2 4" "64 2 4"; do python tools/probe_gdp_state.py 4x4096x16x128x1 $cfg bwd; done
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gated_delta_product import stage_inputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="BxTxHxDxNH, e.g. 4x4096x16x128x1")
    parser.add_argument("block_v", type=int)
    parser.add_argument("stages", type=int)
    parser.add_argument("warps", type=int)
    parser.add_argument("which", nargs="?", default="bwd", choices=["bwd", "fwd"])
    args = parser.parse_args()
    try:
        B, T, H, D, NH = (int(x) for x in args.spec.split("x"))
    except ValueError:
        parser.error(f"spec: expected BxTxHxDxNH such as 4x4096x16x128x1, got {args.spec!r}")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from titan_delta_kernels.gated_delta_product import state
    from titan_delta_kernels.gated_delta_product.options import parse_options

    opts = parse_options("default")
    t = stage_inputs(B, T, H, D, NH, opts)
    if args.which == "bwd":
        fn = state.state_bwd
        call = (t.q, t.k, t.w, t.g, t.d_out, None, t.dvl, t.scale, t.geo, t.seqs)
        kw: dict = dict(wt_mode=opts.wt_mode())
    else:
        fn = state.state_fwd
        call = (t.k, t.w, t.u, t.g, None, t.geo, t.seqs)
        kw = dict(delta_dtype=t.small)
    launch = dict(block_v=args.block_v, num_stages=args.stages, num_warps=args.warps)
    ref = fn(*call, **kw)
    out = fn(*call, **kw, **launch)
    torch.cuda.synchronize()
    diffs = [((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
             for a, b in zip(out, ref, strict=True)]  # fmt: skip
    ms_ref = do_bench(lambda: fn(*call, **kw), warmup=10, rep=50, return_mode="median")
    ms = do_bench(lambda: fn(*call, **kw, **launch), warmup=10, rep=50, return_mode="median")
    print(f"- state_{args.which} {args.spec} BV={args.block_v} stages={args.stages} warps={args.warps}: "
          f"{ms:.3f} ms (default {ms_ref:.3f} ms); rel diff to default "
          f"{', '.join(f'{d:.1e}' for d in diffs)}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
