"""Benchmark: our Triton Gated DeltaProduct (each opt-in variant) vs flash-linear-attention, one process.

    python tools/bench_gated_delta_product.py --breakdown 4x4096x16x128x2 --variants default,lowp --no-fla
    python tools/bench_gated_delta_product.py --nh 2,1,3 --variants default,save_states,lowp,save_states+lowp
    python tools/bench_gated_delta_product.py --model 4x4096x16x128x2      # cost model only, no GPU

Order: the per-stage breakdown of ours first (``--breakdown``, optional launch-config ``--sweep``), then
the table (median ``triton.testing.do_bench`` times of the forward and of forward+backward; FLA's
chunk_gated_delta_product and, for n_h = 1, its Gated DeltaNet, unless ``--no-fla``; one row per variant,
FLA timed once). Breakdown lines give each stage's time and, from ``cost.py``'s analytic model (an
estimate), its implied GB/s and TFLOP/s, and for the sequential state passes the time per chunk step.
Inputs are fresh, bf16, unit-norm keys, β = sigmoid(·), g = logsigmoid(·); gradients reset every repetition.
FLA refuses its gated backward on Triton < 3.7.1 (a guard for a Hopper miscompile); timing only, we lift it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F
import triton

from titan_delta_kernels.gated_delta_product import api, cost

ALL_VARIANTS = "default,save_states,lowp,save_states+lowp"


def flops_estimate(B: int, T: int, H: int, D: int, n_h: int, chunk_steps: int = 64) -> float:
    """Matmul FLOPs of one chunked forward (K = V = D): UT transform, state pass, outputs (C rows/chunk)."""
    steps = T * n_h
    per_step = 2 * chunk_steps * D * 3 + chunk_steps**2 / 3 + 2 * D * D * 2  # A, W, U; inverse; δ, S update
    per_token = 2 * D * D + 2 * chunk_steps * D * 2  # q S₀, scores, scores·δ (one query row per token)
    return B * H * (steps * per_step + T * per_token)


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

    t_fwd = do_bench(fwd, warmup=25, rep=100, return_mode="median")
    t_all = do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=inputs, return_mode="median")
    return t_fwd, t_all


def ours(n_h: int, variant: str):
    from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

    on = api.parse_variant(variant)

    def run(q, k, v, g, beta):
        return gated_delta_product_triton(q, k, v, g, beta, num_householder=n_h,
                                          save_states="save_states" in on, lowp="lowp" in on)  # fmt: skip

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


def stage_inputs(B: int, T: int, H: int, D: int, n_h: int, lowp: bool) -> SimpleNamespace:
    """Realistic inputs of every stage: the previous stages run once, their outputs feed the next."""
    from titan_delta_kernels.gated_delta_product import grads, output, state, wy_fwd
    from titan_delta_kernels.gated_delta_product._common import chunk_geometry, sequence_layout

    torch.manual_seed(n_h)
    t = SimpleNamespace()
    t.q, t.k, t.v, t.g, t.beta = (x.detach() for x in make_inputs(B, T, H, D, n_h, "cuda"))
    t.d_out, t.scale = torch.randn_like(t.q), D**-0.5
    t.geo = chunk_geometry(n_h)
    t.seqs = sequence_layout(B, T, None, t.geo, t.q.device)
    t.inter = t.q.dtype if lowp else torch.float32
    t.t_inv, t.w, t.u = wy_fwd.wy_fwd(t.k, t.v, t.beta, t.g, t.geo, t.seqs, t.inter)
    t.hs, t.vn, _ = state.state_fwd(t.k, t.w, t.u, t.g, None, t.geo, t.seqs)
    t.dvl = output.dv_local(t.q, t.k, t.g, t.d_out, t.scale, t.geo, t.seqs, t.inter)
    t.dhs, t.dd, _ = state.state_bwd(t.q, t.k, t.w, t.g, t.d_out, None, t.dvl, t.scale, t.geo, t.seqs)
    _, t.dkp, t.dw, t.dgs, t.dgt = grads.dqkw(t.q, t.k, t.g, t.vn, t.hs, t.dhs, t.dd, t.d_out, t.scale,
                                              t.geo, t.seqs)  # fmt: skip
    return t


def stage_calls(t: SimpleNamespace, **launch) -> dict[str, Callable[[], object]]:
    """One callable per kernel stage; ``launch`` (block_v/num_warps/num_stages) goes to the state passes,
    its num_warps alone to the gradient kernels."""
    from titan_delta_kernels.gated_delta_product import grads, output, state, wy_fwd

    nw = launch.get("num_warps")
    q, k, v, g, b, geo, seqs, scale = t.q, t.k, t.v, t.g, t.beta, t.geo, t.seqs, t.scale
    return {
        "wy_fwd": lambda: wy_fwd.wy_fwd(k, v, b, g, geo, seqs, t.inter),
        "state_fwd": lambda: state.state_fwd(k, t.w, t.u, g, None, geo, seqs, **launch),
        "output_fwd": lambda: output.output_fwd(q, k, g, t.vn, t.hs, scale, geo, seqs),
        "dv_local": lambda: output.dv_local(q, k, g, t.d_out, scale, geo, seqs, t.inter),
        "state_bwd": lambda: state.state_bwd(q, k, t.w, g, t.d_out, None, t.dvl, scale, geo, seqs, **launch),
        "dqkw": lambda: grads.dqkw(q, k, g, t.vn, t.hs, t.dhs, t.dd, t.d_out, scale, geo, seqs, nw),
        "wy_bwd": lambda: grads.wy_bwd(k, v, g, b, t.t_inv, t.dd, t.dkp, t.dw, t.dgs, t.dgt, geo, seqs, nw),
    }


def breakdown(B: int, T: int, H: int, D: int, n_h: int, lowp_options: list[bool], sweep: bool) -> None:
    """Each kernel stage of ours, timed alone, with the cost model beside it; then stage sums."""
    for lowp in lowp_options:
        t = stage_inputs(B, T, H, D, n_h, lowp)
        costs = cost.stage_costs(B, T, H, D, D, n_h, lowp=lowp)
        print(f"\n# stage breakdown [{B}, {T}, {H}, {D}] n_h={n_h} {'lowp' if lowp else 'default'} "
              "(GB, GFLOP: cost-model estimates)")  # fmt: skip
        times = {}
        for name, fn in stage_calls(t).items():
            times[name], note = bench(fn)
            print(stage_line(name, times[name], costs[name], note), flush=True)
        recompute = [n for n in cost.BACKWARD_STAGES if n != "state_fwd"]
        sums = {"forward": cost.FORWARD_STAGES, "backward (recomputes state_fwd)": cost.BACKWARD_STAGES,
                "backward with saved states": recompute}  # fmt: skip
        for label, names in sums.items():
            ms = sum(float("nan") if times[n] is None else times[n] for n in names)
            nbytes = sum(costs[n].bytes for n in names)
            print(f"- sum {label}: {ms:.3f} ms | model {nbytes / 1e9:.2f} GB -> {nbytes / ms / 1e6:.0f} GB/s")
        if sweep:
            launch_sweep(t, B, T, H, D, n_h, lowp)
        del t
        torch.cuda.empty_cache()


def launch_sweep(t: SimpleNamespace, B: int, T: int, H: int, D: int, n_h: int, lowp: bool) -> None:
    """State passes: 1 pipeline stage (fits two programs per SM), V-tile 64 (half the programs, one wave),
    8 warps, 3 stages — each against the default BV=32/4 warps/2 stages; 4 vs 8 warps for the gradients."""
    for bv, nw, ns in [(32, 4, 1), (64, 4, None), (64, 8, None), (32, 8, None), (32, 4, 3)]:
        costs = cost.stage_costs(B, T, H, D, D, n_h, lowp=lowp, state_block_v=bv)
        calls = stage_calls(t, block_v=bv, num_warps=nw, num_stages=ns)
        for name in ("state_fwd", "state_bwd"):
            ms, note = bench(calls[name])
            print(stage_line(f"{name} BV={bv} warps={nw} stages={ns or 'dflt'}", ms, costs[name], note))
    costs = cost.stage_costs(B, T, H, D, D, n_h, lowp=lowp)
    for nw in (4, 8):
        calls = stage_calls(t, num_warps=nw)
        for name in ("dqkw", "wy_bwd"):
            ms, note = bench(calls[name])
            print(stage_line(f"{name} warps={nw}", ms, costs[name], note), flush=True)


def print_model(B: int, T: int, H: int, D: int, n_h: int) -> None:
    """The cost model alone (no GPU): per-stage GB and GFLOP, default vs lowp, and the totals."""
    for lowp in (False, True):
        costs = cost.stage_costs(B, T, H, D, D, n_h, lowp=lowp)
        print(f"\n# cost model [{B}, {T}, {H}, {D}] n_h={n_h} {'lowp' if lowp else 'default'} (estimates)")
        for c in costs.values():
            walk = f", {c.sequential_chunks} chunks in order" if c.sequential_chunks else ""
            print(f"- {c.name}: {c.bytes / 1e9:.3f} GB, {c.flops / 1e9:.1f} GFLOP (duplicated "
                  f"{c.duplicated_flops / 1e9:.1f}), {c.programs} programs{walk}")  # fmt: skip
        for save_states in (False, True):
            for label, (nbytes, flops) in cost.totals(costs, save_states=save_states).items():
                print(f"- {label}{' (save_states)' if save_states else ''}: {nbytes / 1e9:.3f} GB, "
                      f"{flops / 1e9:.1f} GFLOP")  # fmt: skip


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
          "fwd+bwd | FLA GDN fwd+bwd | ours TFLOP/s fwd | o vs FLA (rel RMS) | variant | vs default: o, "
          "worst grad (rel RMS) |")  # fmt: skip
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
                tflops = flops_estimate(B, T, H, D, n_h) / (t_fwd * 1e-3) / 1e12
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
    parser.add_argument("--variants", default="default", help=f"comma list of: {ALL_VARIANTS}")
    parser.add_argument("--no-fla", "--ours-only", action="store_true", help="time ours only")
    parser.add_argument("--no-table", action="store_true", help="breakdown only")
    parser.add_argument("--breakdown", default="", help="BxTxHxDxNH list: time each stage of ours first")
    parser.add_argument("--sweep", action="store_true", help="breakdown also sweeps launch configs")
    parser.add_argument("--model", default="", help="BxTxHxDxNH list: print the cost model and exit")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        api.parse_variant(v)  # fail before any GPU work on a typo
    if args.model:
        for spec in args.model.split(","):
            print_model(*(int(x) for x in spec.split("x")))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    lowp_options = sorted({"lowp" in api.parse_variant(v) for v in variants})
    for i, spec in enumerate(s for s in args.breakdown.split(",") if s):
        breakdown(*(int(x) for x in spec.split("x")), lowp_options, args.sweep and i == 0)
    if not args.no_table:
        table(args.shapes, args.nh, variants, not args.no_fla)
    return 0


if __name__ == "__main__":
    sys.exit(main())
