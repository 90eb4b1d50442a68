"""Benchmark: our Triton Gated DeltaProduct vs flash-linear-attention (same process, same inputs).

    python tools/bench_gated_delta_product.py [--shapes 4x4096x16x128,8x2048x16x64] [--nh 1,2,3]

Prints, per shape and n_h, the median time (triton.testing.do_bench) of the forward and of forward+backward
for ours, FLA's chunk_gated_delta_product and, for n_h = 1, FLA's chunk_gated_delta_rule (Gated DeltaNet),
plus the speed-up and the relative RMS difference of our output against FLA's. Inputs are fresh, bf16,
unit-norm keys, β = sigmoid(·), g = logsigmoid(·); gradients are reset between repetitions.
FLA refuses its gated backward on Triton < 3.7.1 (a guard for a Hopper miscompile); timing only, we lift it.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
import triton


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


def breakdown(B: int, T: int, H: int, D: int, n_h: int) -> None:
    """Median time of each kernel stage of ours (forward stages, then the backward ones)."""
    from triton.testing import do_bench

    from titan_delta_kernels.gated_delta_product._common import chunk_geometry, sequence_layout
    from titan_delta_kernels.gated_delta_product.grads import chunk_grads
    from titan_delta_kernels.gated_delta_product.output import dv_local, output_fwd
    from titan_delta_kernels.gated_delta_product.state import state_bwd, state_fwd
    from titan_delta_kernels.gated_delta_product.wy_fwd import wy_fwd

    q, k, v, g, beta = (x.detach() for x in make_inputs(B, T, H, D, n_h, "cuda"))
    d_out = torch.randn_like(q)
    geo = chunk_geometry(n_h)
    seqs = sequence_layout(B, T, None, geo, q.device)
    scale = D**-0.5
    t_inv, w, u = wy_fwd(k, v, beta, g, geo, seqs)
    hs, vn, _ = state_fwd(k, w, u, g, None, geo, seqs)
    dvl = dv_local(q, k, g, d_out, scale, geo, seqs)
    dhs, dd, _ = state_bwd(q, k, w, g, d_out, None, dvl, scale, geo, seqs)
    stages = {
        "wy_fwd (UT transform)": lambda: wy_fwd(k, v, beta, g, geo, seqs),
        "state_fwd": lambda: state_fwd(k, w, u, g, None, geo, seqs),
        "output_fwd": lambda: output_fwd(q, k, g, vn, hs, scale, geo, seqs),
        "dv_local": lambda: dv_local(q, k, g, d_out, scale, geo, seqs),
        "state_bwd": lambda: state_bwd(q, k, w, g, d_out, None, dvl, scale, geo, seqs),
        "chunk_grads (dqkw + wy_bwd)": lambda: chunk_grads(
            q, k, v, g, beta, t_inv, vn, hs, dhs, dd, d_out, scale, geo, seqs
        ),
    }
    for bv in (32, 64):
        for nw in (4, 8):
            stages[f"state_fwd BV={bv} warps={nw}"] = lambda bv=bv, nw=nw: state_fwd(
                k, w, u, g, None, geo, seqs, block_v=bv, num_warps=nw
            )
            stages[f"state_bwd BV={bv} warps={nw}"] = lambda bv=bv, nw=nw: state_bwd(
                q, k, w, g, d_out, None, dvl, scale, geo, seqs, block_v=bv, num_warps=nw
            )
    for nw in (4, 8):
        stages[f"chunk_grads warps={nw}"] = lambda nw=nw: chunk_grads(
            q, k, v, g, beta, t_inv, vn, hs, dhs, dd, d_out, scale, geo, seqs, num_warps=nw
        )
    print(f"\n# stage breakdown [{B}, {T}, {H}, {D}] n_h={n_h}")
    for name, fn in stages.items():
        print(f"- {name}: {do_bench(fn, warmup=10, rep=50, return_mode='median'):.3f} ms", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4x4096x16x128,8x2048x16x64", help="BxTxHxD list")
    parser.add_argument("--nh", default="1,2,3", help="num_householder values")
    parser.add_argument("--no-fla", action="store_true", help="time ours only")
    parser.add_argument("--breakdown", default="", help="BxTxHxDxNH: also time each of our kernel stages")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

    fla_gdp = fla_gdn = None
    if not args.no_fla:
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.gated_delta_product import chunk_gated_delta_product as fla_gdp
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

        fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # timing only: lift FLA's guard (see module docstring)
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}, bf16")
    print("| shape [B,T,H,D] | n_h | ours fwd | ours fwd+bwd | FLA GDP fwd | FLA GDP fwd+bwd | speed-up "
          "fwd+bwd | FLA GDN fwd+bwd | ours TFLOP/s fwd | o vs FLA (rel RMS) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        B, T, H, D = (int(x) for x in shape.split("x"))
        for n_h in (int(x) for x in args.nh.split(",")):
            torch.manual_seed(1000 * n_h + T)
            inputs = make_inputs(B, T, H, D, n_h, "cuda")
            d_out = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)

            def ours(q, k, v, g, beta, n_h=n_h):
                return gated_delta_product_triton(q, k, v, g, beta, num_householder=n_h)

            t_fwd, t_all = time_fwd_bwd(ours, inputs, d_out)
            row = [f"[{B}, {T}, {H}, {D}]", str(n_h), f"{t_fwd:.3f} ms", f"{t_all:.3f} ms"]
            gdn_cell = "–"
            if fla_gdp is not None:

                def theirs(q, k, v, g, beta, n_h=n_h):
                    return fla_gdp(q, k, v, g, beta, num_householder=n_h)

                f_fwd, f_all = time_fwd_bwd(theirs, inputs, d_out)
                with torch.no_grad():
                    diff = (ours(*inputs)[0].float() - theirs(*inputs)[0].float()).norm()
                    rel = (diff / theirs(*inputs)[0].float().norm()).item()
                row += [f"{f_fwd:.3f} ms", f"{f_all:.3f} ms", f"{f_all / t_all:.2f}×"]
                if n_h == 1:
                    _, g_all = time_fwd_bwd(lambda q, k, v, g, beta: fla_gdn(q, k, v, g, beta), inputs, d_out)
                    gdn_cell = f"{g_all:.3f} ms (ours {g_all / t_all:.2f}×)"
            else:
                row += ["–", "–", "–"]
                rel = float("nan")
            tflops = flops_estimate(B, T, H, D, n_h) / (t_fwd * 1e-3) / 1e12
            row += [gdn_cell, f"{tflops:.1f}", f"{rel:.2e}"]
            print("| " + " | ".join(row) + " |", flush=True)
            del inputs, d_out
            torch.cuda.empty_cache()
    if args.breakdown:
        breakdown(*(int(x) for x in args.breakdown.split("x")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
