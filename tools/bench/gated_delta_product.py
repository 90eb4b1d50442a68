"""Benchmark: our Triton Gated DeltaProduct (each opt-in variant) vs flash-linear-attention, one process.

    python tools/bench/gated_delta_product.py --breakdown 4x4096x16x128x2 --variants plain,default+fastwy
    python tools/bench/gated_delta_product.py --nh 2,1,3 --variants default,default+lowp
    python tools/bench/gated_delta_product.py --model 4x4096x16x128x2      # cost model only, no GPU
    python tools/bench/gated_delta_product.py --no-table --sweep --breakdown 4x4096x16x128x2 --sweep-base lowp

Order: the per-stage breakdown of ours first (``--breakdown``; with ``--sweep`` instead a launch-config sweep,
each configuration in its own process so one that crashes the CUDA context cannot take the rest), then
the table (median ``triton.testing.do_bench`` times of the forward and of forward+backward; FLA's
chunk_gated_delta_product and, for n_h = 1, its Gated DeltaNet, unless ``--no-fla``; one row per variant,
FLA timed once). Breakdown lines: each stage's time, its GB/s and TFLOP/s by ``cost.py``'s model (an
estimate), and for the state passes the time per chunk step. Variants: '+'-joined, see options.py.
Inputs are fresh, bf16, unit-norm keys, β = sigmoid(·), g = logsigmoid(·); gradients reset every repetition.
FLA refuses its gated backward on Triton < 3.7.1 (a guard for a Hopper miscompile); timing only, we lift it.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F
import triton

from titan_delta_kernels.gated_delta_product import api, cost
from titan_delta_kernels.gated_delta_product.options import GdpOptions, parse_options

ALL_VARIANTS = ("plain,save_states,default (= save_states+fastwy+lowp_safe+bf16x3+kslice+wyseries+dkp16+w16"
                "+sflean+sfs16+sbw16+otrans+wyhoist),lowp,default+lowp")


def make_inputs(B, T, H, D, n_h, device):
    bf = torch.bfloat16
    q = torch.randn(B, T, H, D, device=device, dtype=bf)
    k = F.normalize(torch.randn(B, T * n_h, H, D, device=device), dim=-1).to(bf)
    v = torch.randn(B, T * n_h, H, D, device=device, dtype=bf)
    beta = torch.randn(B, T * n_h, H, device=device).sigmoid().to(bf)
    g = F.logsigmoid(torch.randn(B, T, H, device=device))
    return [x.requires_grad_() for x in (q, k, v, g, beta)]


def time_fwd_bwd(fn, inputs, d_out):
    from triton.testing import do_bench

    def fwd():
        with torch.no_grad():
            return fn(*inputs)[0]

    def fwd_bwd():
        fn(*inputs)[0].backward(d_out)

    return (do_bench(fwd, warmup=25, rep=100, return_mode="median"),
            do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=inputs, return_mode="median"))  # fmt: skip


def ours(n_h: int, variant: str):
    from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

    api.parse_variant(variant)

    def run(q, k, v, g, beta):
        return gated_delta_product_triton(q, k, v, g, beta, num_householder=n_h, variant=variant)

    return run


def stage_line(name: str, ms: float | None, c: cost.StageCost, note: str = "") -> str:
    if ms is None:
        return f"- {name}: failed {note}"
    line = (f"- {name}: {ms:.3f} ms | model {c.bytes / 1e9:.2f} GB -> {c.bytes / ms / 1e6:.0f} GB/s"
            f" | {c.flops / 1e9:.1f} GFLOP -> {c.flops / ms / 1e9:.0f} TFLOP/s"
            f" | {c.programs} programs")  # fmt: skip
    if c.sequential_chunks:
        line += f" x {c.sequential_chunks} chunks in order: {1e3 * ms / c.sequential_chunks:.2f} µs/chunk"
    return line + (f" {note}" if note else "")


def bench(fn) -> tuple[float | None, str]:
    from triton.testing import do_bench

    try:
        return do_bench(fn, warmup=10, rep=50, return_mode="median"), ""
    except Exception as err:  # a failing launch config (e.g. out of shared memory) must not end the sweep
        return None, f"({type(err).__name__}: {str(err).splitlines()[0][:120]})"


def stage_inputs(B: int, T: int, H: int, D: int, n_h: int, opts: GdpOptions) -> SimpleNamespace:
    """Realistic inputs of every stage: the previous stages run once, their outputs feed the next (W, U in
    the input dtype with lowp; δ and the local ∂L/∂δ also with lowp_safe, as chunk.py stores them)."""
    from titan_delta_kernels.gated_delta_product import chunk, grads, output, state, wy_fwd
    from titan_delta_kernels.gated_delta_product._common import (
        chunk_geometry,
        row_scaled_f16,
        sequence_layout,
    )

    torch.manual_seed(n_h)
    t = SimpleNamespace()
    t.q, t.k, t.v, t.g, t.beta = (x.detach() for x in make_inputs(B, T, H, D, n_h, "cuda"))
    t.d_out, t.scale = torch.randn_like(t.q), D**-0.5
    t.geo = chunk_geometry(n_h)
    t.seqs = sequence_layout(B, T, None, t.geo, t.q.device)
    t.inter = t.q.dtype if opts.lowp else torch.float32
    t.small = t.q.dtype if opts.lowp or opts.lowp_safe else torch.float32
    t.t_inv, t.w, t.u = wy_fwd.wy_fwd(t.k, t.v, t.beta, t.g, t.geo, t.seqs, t.inter)
    t.planes = chunk._planes(t.k, opts.lowp, opts)  # the custom op's own storage rules
    t.w = state.split_planes(t.w) if t.planes else t.w
    t.row_scaled = chunk._row_scaled(t.k, opts.lowp, opts)
    t.scales = {}
    if t.row_scaled:
        (t.w, w_scale), (t.u, u_scale) = row_scaled_f16(t.w), row_scaled_f16(t.u)
        t.scales = dict(w_scale=w_scale, u_scale=u_scale)
    t.bwd_scale = {"w_scale": t.scales["w_scale"]} if t.scales else {}
    t.hs, t.vn, _ = state.state_fwd(t.k, t.w, t.u, t.g, None, t.geo, t.seqs, delta_dtype=t.small, **t.scales)
    t.dvl = output.dv_local(t.q, t.k, t.g, t.d_out, t.scale, t.geo, t.seqs, t.small)
    t.dhs, t.dd, _ = state.state_bwd(t.q, t.k, t.w, t.g, t.d_out, None, t.dvl, t.scale, t.geo, t.seqs,
                                     **t.bwd_scale)  # fmt: skip
    _, t.dkp, t.dw, t.dgs, t.dgt = grads.dqkw(t.q, t.k, t.g, t.vn, t.hs, t.dhs, t.dd, t.d_out, t.scale,
                                              t.geo, t.seqs, dk_part_dtype=t.q.dtype if opts.dkp16 else None)
    return t


def stage_calls(t: SimpleNamespace, opts: GdpOptions) -> dict[str, Callable[[], object]]:
    """One callable per kernel stage, with the variant's algorithm (fastwy) and launch overrides."""
    from titan_delta_kernels.gated_delta_product import (
        chunk,
        grads,
        grads_sliced,
        output,
        state,
        wy_fast,
        wy_fwd,
        wy_series,
    )

    fwd_at, bwd_at = chunk._state_launch(opts, forward=True), chunk._state_launch(opts, forward=False)
    nw = opts.grad_warps
    transform = wy_fast.wy_fwd_fast if opts.fastwy else wy_fwd.wy_fwd
    transform = wy_series.wy_fwd_series if opts.wyseries else transform
    # the gradient stages of the variant: K-sliced kernels (with their register cap) under kslice
    gmod, gkw = (grads, {})
    if opts.kslice:
        gmod, gkw = grads_sliced, dict(max_registers=opts.grad_max_registers, num_stages=opts.wy_bwd_stages,
                                       block_k=opts.wy_bwd_block_k, hoisted=opts.wyhoist)
    dq_cap = opts.grad_max_registers if opts.dqkw_max_registers is None else opts.dqkw_max_registers
    dqkw_kw = dict(max_registers=dq_cap, block_k=opts.dqkw_block_k) if opts.kslice else {}
    q, k, v, g, b, geo, seqs, scale = t.q, t.k, t.v, t.g, t.beta, t.geo, t.seqs, t.scale
    wy_kw: dict[str, bool] = {}
    if opts.wyseries:
        wy_kw = dict(w_planes=t.planes, row_scaled=t.row_scaled)
    return {
        "wy_fwd": lambda: transform(k, v, b, g, geo, seqs, t.inter, opts.wy_warps, **wy_kw),
        "state_fwd": lambda: state.state_fwd(k, t.w, t.u, g, None, geo, seqs, **fwd_at, delta_dtype=t.small,
                                             fwd16=opts.fwd16(), **t.scales),
        "output_fwd": lambda: output.output_fwd(q, k, g, t.vn, t.hs, scale, geo, seqs, opts.output_block_k,
                                                opts.output_block_v, transposed=opts.otrans),
        "dv_local": lambda: output.dv_local(q, k, g, t.d_out, scale, geo, seqs, t.small,
                                            opts.dv_local_block_v),
        "state_bwd": lambda: state.state_bwd(q, k, t.w, g, t.d_out, None, t.dvl, scale, geo, seqs, **bwd_at,
                                             wt_mode=opts.wt_mode(), **t.bwd_scale),
        "dqkw": lambda: gmod.dqkw(q, k, g, t.vn, t.hs, t.dhs, t.dd, t.d_out, scale, geo, seqs, nw, **dqkw_kw,
                                  dk_part_dtype=t.dkp.dtype),
        "wy_bwd": lambda: gmod.wy_bwd(k, v, g, b, t.t_inv, t.dd, t.dkp, t.dw, t.dgs, t.dgt, geo, seqs, nw,
                                      **gkw),
    }


def stage_variants(variants: list[str]) -> list[GdpOptions]:
    """The distinct per-stage configurations (save_states changes no stage, only which ones run)."""
    seen: dict[GdpOptions, None] = {}
    for v in variants:
        seen.setdefault(dataclasses.replace(parse_options(v), save_states=False))
    return list(seen)


def breakdown(B: int, T: int, H: int, D: int, n_h: int, variants: list[str], stages: list[str] | None,
              ) -> None:  # fmt: skip
    """Each kernel stage of ours, timed alone, with the cost model beside it; then stage sums."""
    for opts in stage_variants(variants):
        t = stage_inputs(B, T, H, D, n_h, opts)
        costs = cost.stage_costs(B, T, H, D, D, n_h, lowp=opts.lowp, state_block_v=opts.state_block_v,
                                 w_planes=t.planes, w16=t.row_scaled, lowp_safe=opts.lowp_safe,
                                 dkp16=opts.dkp16)  # fmt: skip
        print(f"\n# stage breakdown [{B}, {T}, {H}, {D}] n_h={n_h} {opts.text()} "
              "(GB, GFLOP: cost-model estimates)", flush=True)  # fmt: skip
        times = {}
        for name, fn in stage_calls(t, opts).items():
            if stages and name not in stages:
                continue
            times[name], note = bench(fn)
            print(stage_line(f"{name} [{opts.text()}]" if stages else name, times[name], costs[name], note),
                  flush=True)  # fmt: skip
        if not stages:
            recompute = [n for n in cost.BACKWARD_STAGES if n != "state_fwd"]
            sums = {"forward": cost.FORWARD_STAGES, "backward (recomputes state_fwd)": cost.BACKWARD_STAGES,
                    "backward with saved states": recompute}  # fmt: skip
            for label, names in sums.items():
                ms = sum(float("nan") if times[n] is None else times[n] for n in names)
                nbytes = sum(costs[n].bytes for n in names)
                print(f"- sum {label}: {ms:.3f} ms | model {nbytes / 1e9:.2f} GB"
                      f" -> {nbytes / ms / 1e6:.0f} GB/s")  # fmt: skip
        del t
        torch.cuda.empty_cache()


# (tokens added to the sweep's base variant, stages timed), most informative first; one process each.
SWEEP = [
    ("sbv=64", "state_fwd,state_bwd"), ("fastwy+wywarps=2", "wy_fwd"), ("gwarps=4", "dqkw,wy_bwd"),
    ("sbv=64+sstages=1", "state_fwd,state_bwd"), ("fastwy+wywarps=1", "wy_fwd"),
    ("fastwy+wywarps=8", "wy_fwd"), ("sstages=2", "state_fwd,state_bwd"),
    ("sbv=64+swarps=8", "state_fwd,state_bwd"), ("wywarps=8", "wy_fwd"), ("sstages=3", "state_fwd,state_bwd"),
    ("sbv=32+swarps=8", "state_fwd,state_bwd"),
]  # fmt: skip


def parse_sweep_entries(text: str) -> list[tuple[str, str]]:
    """``--sweep-entries`` text, e.g. ``'sbv=16:state_fwd,state_bwd|gwarps=8:dqkw,wy_bwd'``, as a list of
    (tokens, stages)."""
    entries = []
    for item in filter(None, (part.strip() for part in text.split("|"))):
        tokens, sep, stages = item.partition(":")
        if not sep or not tokens or not stages:
            raise ValueError(f"--sweep-entries: expected 'tokens:stage,stage', got {item!r}")
        entries.append((tokens, stages))
    return entries


def launch_sweep(spec: str, base: str, timeout_s: float,
                 entries: list[tuple[str, str]] | None = None) -> None:  # fmt: skip
    """Each configuration in a fresh process: one that crashes the CUDA context (an illegal memory access
    poisons every later launch) or hangs only loses its own line. Refused combinations are skipped."""
    print(f"\n# launch sweep {spec}, base variant {base} (each entry its own process, {timeout_s:.0f} s max)")
    for extra, stages in entries or SWEEP:
        variant = f"{base}+{extra}"
        try:
            parse_options(variant)
        except ValueError as err:
            print(f"- {variant}: skipped ({err})", flush=True)
            continue
        cmd = [sys.executable, __file__, "--no-table", "--breakdown", spec, "--variants", variant,
               "--stages", stages]  # fmt: skip
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"- {variant}: timed out after {timeout_s:.0f} s", flush=True)
            continue
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith("- ")]
        tail = (run.stderr.strip().splitlines() or ["?"])[-1][:200]
        lines += [f"- {variant}: exit {run.returncode} ({tail})"] if run.returncode else []
        print("\n".join(lines) or f"- {variant}: no result", flush=True)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def table(shapes: str, nh: str, variants: list[str], use_fla: bool) -> None:
    """One row per (shape, n_h, variant); FLA timed once per (shape, n_h), before ours."""
    fla_gdp = fla_gdn = None
    if use_fla:
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.gated_delta_product import chunk_gated_delta_product as fla_gdp
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

        fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # timing only: lift FLA's guard (see module docstring)
    device = torch.cuda.get_device_name(0)
    print(f"\n# {device}, torch {torch.__version__}, triton {triton.__version__}, bf16")
    print("| shape [B,T,H,D] | n_h | ours fwd | ours fwd+bwd | FLA GDP fwd | FLA GDP fwd+bwd | speed-up "
          "fwd+bwd | FLA GDN fwd+bwd | ours TFLOP/s fwd | o vs FLA (rel RMS) | variant | vs first variant: "
          "o, worst grad (rel RMS) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in shapes.split(","):
        B, T, H, D = (int(x) for x in shape.split("x"))
        for n_h in (int(x) for x in nh.split(",")):
            torch.manual_seed(1000 * n_h + T)
            inputs = make_inputs(B, T, H, D, n_h, "cuda")
            d_out = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
            fla_cells, gdn_cell, o_fla = ["–", "–"], "–", None
            if fla_gdp is not None:
                def theirs(q, k, v, g, beta, n_h=n_h):
                    return fla_gdp(q, k, v, g, beta, num_householder=n_h)

                f_fwd, f_all = time_fwd_bwd(theirs, inputs, d_out)
                fla_cells = [f"{f_fwd:.3f} ms", f"{f_all:.3f} ms"]
                with torch.no_grad():
                    o_fla = theirs(*inputs)[0]
                if n_h == 1:
                    _, gdn_all = time_fwd_bwd(lambda *x: fla_gdn(*x), inputs, d_out)
            base = None
            for variant in variants:
                fn = ours(n_h, variant)
                t_fwd, t_all = time_fwd_bwd(fn, inputs, d_out)
                o = fn(*inputs)[0]
                result = (o.detach(), *torch.autograd.grad(o, inputs, d_out))
                vs = "–" if base is None else f"{rel(result[0], base[0]):.1e}, " + \
                    f"{max(rel(a, b) for a, b in zip(result[1:], base[1:], strict=True)):.1e}"  # fmt: skip
                base = base or result
                speed = f"{f_all / t_all:.2f}×" if o_fla is not None else "–"
                if n_h == 1 and o_fla is not None:
                    gdn_cell = f"{gdn_all:.3f} ms (ours {gdn_all / t_all:.2f}×)"
                o_vs = f"{rel(result[0], o_fla):.2e}" if o_fla is not None else "–"
                tflops = cost.flops_estimate(B, T, H, D, n_h) / (t_fwd * 1e-3) / 1e12
                row = [f"[{B}, {T}, {H}, {D}]", str(n_h), f"{t_fwd:.3f} ms", f"{t_all:.3f} ms", *fla_cells,
                       speed, gdn_cell, f"{tflops:.1f}", o_vs, variant, vs]  # fmt: skip
                print("| " + " | ".join(row) + " |", flush=True)
                del o, result
            del inputs, d_out, base, o_fla
            torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4x4096x16x128,8x2048x16x64", help="BxTxHxD list")
    parser.add_argument("--nh", default="1,2,3", help="num_householder values, in the order to run")
    parser.add_argument("--variants", default="default",
                        help=f"comma list of '+'-joined variant strings, e.g. {ALL_VARIANTS}")  # fmt: skip
    parser.add_argument("--no-fla", "--ours-only", action="store_true", help="time ours only")
    parser.add_argument("--no-table", action="store_true", help="breakdown only")
    parser.add_argument("--breakdown", default="", help="BxTxHxDxNH list: time each stage of ours first")
    parser.add_argument("--sweep", action="store_true", help="sweep launch configs (first --breakdown spec)")
    parser.add_argument("--sweep-base", default="lowp", help="variant the sweep's entries are added to")
    parser.add_argument("--sweep-timeout", type=float, default=60.0, help="seconds per sweep entry")
    parser.add_argument("--sweep-entries", default="",
                        help="'|' list of 'tokens:stage,stage' replacing the built-in sweep list")
    parser.add_argument("--stages", default="", help="breakdown: comma list of stages to time (no sums)")
    parser.add_argument("--model", default="", help="BxTxHxDxNH list: print the cost model and exit")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        api.parse_variant(v)  # fail before any GPU work on a typo
    if args.model:
        for spec in args.model.split(","):
            cost.print_model(*(int(x) for x in spec.split("x")))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    specs = [s for s in args.breakdown.split(",") if s]
    stages = [s for s in args.stages.split(",") if s] or None
    if not args.sweep:
        for spec in specs:
            breakdown(*(int(x) for x in spec.split("x")), variants, stages)
    elif specs:
        launch_sweep(specs[0], args.sweep_base, args.sweep_timeout, parse_sweep_entries(args.sweep_entries))
    if not args.no_table:
        table(args.shapes, args.nh, variants, not args.no_fla)
    return 0


if __name__ == "__main__":
    sys.exit(main())
