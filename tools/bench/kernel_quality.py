"""Accuracy and compile time of the Triton kernels per op, head dim and dtype (the kernel docs' tables).

    python tools/bench/kernel_quality.py                       # every case below, one process each
    python tools/bench/kernel_quality.py --ops deltaformer --dims 96 --dtypes float32

Each case runs in a fresh process with an empty Triton cache, so its first forward+backward includes every
compile of that kernel set: "compile s" is that first call's time minus a steady call's. Accuracy is the
relative RMS error (‖x − ref‖ / ‖ref‖) against the op's pure-PyTorch reference computed in float64 from the
same inputs (rounded to the case's dtype first, so the error is the kernel's, not the inputs'), for the
output, the final state (Gated DeltaProduct) and every input gradient. Shapes: B = 2, T = 1100 (not a
multiple of any chunk), H = 2; Gated DeltaProduct with n_h = 2, a gate and an initial state.

``--kernels`` also prints, per case, each kernel's compile seconds (frontend, LLVM, ptxas) and the seconds
spent building its C launcher (Triton builds one per kernel signature with the host compiler), to see which
kernels a compile-time budget goes to.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CASE_TIMEOUT_S = 300


def _inputs(op: str, dim: int, dtype, device):
    import torch

    torch.manual_seed(0)
    B, T, H = 2, 1100, 2

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, dtype=torch.float64) * scale).requires_grad_()

    if op == "deltaformer":
        q, k, v = leaf(B, T, H, dim), leaf(B, T, H, dim), leaf(B, T, H, dim)
        beta = torch.rand(B, T, H, device=device, dtype=torch.float64).requires_grad_()
        return {"q": q, "k": k, "v": v, "beta": beta}
    n_h = 2
    q = leaf(B, T, H, dim)
    k = torch.nn.functional.normalize(
        torch.randn(B, T * n_h, H, dim, device=device, dtype=torch.float64), dim=-1
    )
    k.requires_grad_()
    v = leaf(B, T * n_h, H, dim)
    g = (-torch.rand(B, T, H, device=device, dtype=torch.float64) * 0.1).requires_grad_()
    beta = (torch.rand(B, T * n_h, H, device=device, dtype=torch.float64) * 2).requires_grad_()
    h0 = leaf(B, H, dim, dim, scale=0.1)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": h0}


def _run(op: str, inputs: dict, dtype, backend: str):
    """(outputs, gradients) of one forward+backward with the inputs rounded to ``dtype``: the Triton kernels
    compute in that dtype, the reference in float64 from the same rounded values."""
    import torch

    from titan_delta.ops import deltaformer_attn, gated_delta_product

    rounded = {name: x.detach().to(dtype if name != "initial_state" else torch.float32)
               for name, x in inputs.items()}  # fmt: skip
    if backend == "torch":
        rounded = {name: x.double() for name, x in rounded.items()}
    leaves = {name: x.requires_grad_() for name, x in rounded.items()}
    if op == "deltaformer":
        outs = [deltaformer_attn(leaves["q"], leaves["k"], leaves["v"], leaves["beta"], backend=backend)]
    else:
        o, state = gated_delta_product(
            leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], num_householder=2,
            initial_state=leaves["initial_state"], output_final_state=True, backend=backend,
        )  # fmt: skip
        outs = [o, state]
    torch.manual_seed(1)
    # torch.randn over the shape, not randn_like: that keeps the output's strides, which differ by backend
    loss = sum(
        (out.double() * torch.randn(out.shape, dtype=torch.float64, device=out.device)).sum() for out in outs
    )
    loss.backward()
    return outs, {name: x.grad for name, x in leaves.items()}


def _time_compiles() -> list[tuple[str, str, float]]:
    """Records (kernel, "compile" or "launcher", seconds) for every compile and launcher build after this."""
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction

    seen: list[tuple[str, str, float]] = []
    compile_, init_handles = JITFunction._do_compile, CompiledKernel._init_handles

    def timed_compile(self, *args, **kwargs):
        start = time.perf_counter()
        kernel = compile_(self, *args, **kwargs)
        seen.append((self.fn.__name__, "compile", time.perf_counter() - start))
        return kernel

    def timed_init(self):
        start, had = time.perf_counter(), self.module is not None
        init_handles(self)
        if not had:
            seen.append((self.name, "launcher", time.perf_counter() - start))

    JITFunction._do_compile, CompiledKernel._init_handles = timed_compile, timed_init
    return seen


def _case(op: str, dim: int, dtype_name: str, per_kernel: bool = False) -> dict:
    import torch

    dtype = getattr(torch, dtype_name)
    device = torch.device("cuda")
    inputs = _inputs(op, dim, dtype, device)
    compiles = _time_compiles() if per_kernel else []
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs, grads = _run(op, inputs, dtype, "triton")
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    start = time.perf_counter()
    _run(op, inputs, dtype, "triton")
    torch.cuda.synchronize()
    steady = time.perf_counter() - start
    ref_outs, ref_grads = _run(op, inputs, dtype, "torch")

    def rel(x, ref):
        return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))

    errors = {"o": rel(outs[0], ref_outs[0])}
    if len(outs) > 1:
        errors["state"] = rel(outs[1], ref_outs[1])
    errors |= {f"d{name}": rel(grads[name], ref_grads[name]) for name in grads}
    return {"op": op, "dim": dim, "dtype": dtype_name, "compile_s": first - steady, "errors": errors,
            "kernels": compiles}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", nargs="+", default=["deltaformer", "gated_delta_product"])
    parser.add_argument("--dims", nargs="+", type=int, default=[64, 96, 128])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--case-timeout", type=float, default=CASE_TIMEOUT_S, help="seconds per case")
    parser.add_argument("--kernels", action="store_true", help="per-kernel compile and launcher seconds")
    parser.add_argument("--case", nargs=3, metavar=("OP", "DIM", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(_case(args.case[0], int(args.case[1]), args.case[2], args.kernels)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("kernel_quality.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"kernel_quality: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    print("| op | head dim | dtype | compile s | relative RMS error vs float64 reference |")
    print("|---|---|---|---|---|")
    status = 0
    for op in args.ops:
        for dim in args.dims:
            for dtype in args.dtypes:
                with tempfile.TemporaryDirectory() as cache:
                    env = dict(os.environ, TRITON_CACHE_DIR=cache)
                    cmd = [sys.executable, __file__, "--case", op, str(dim), dtype]
                    cmd += ["--kernels"] if args.kernels else []
                    try:
                        proc = subprocess.run(
                            cmd, env=env, capture_output=True, text=True, timeout=args.case_timeout
                        )
                    except subprocess.TimeoutExpired:
                        print(
                            f"| {op} | {dim} | {dtype} | > {args.case_timeout:.0f} (timed out) | |",
                            flush=True,
                        )
                        status = 1
                        continue
                if proc.returncode != 0:
                    last = (proc.stderr.strip().splitlines() or ["?"])[-1]
                    print(f"| {op} | {dim} | {dtype} | failed | {last[:150]} |", flush=True)
                    status = 1
                    continue
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                errors = ", ".join(f"{name} {value:.1e}" for name, value in result["errors"].items())
                print(f"| {op} | {dim} | {dtype} | {result['compile_s']:.1f} | {errors} |", flush=True)
                for name, what, seconds in result["kernels"]:
                    print(f"|   {name} | | | {what} {seconds:.2f} | |", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
