"""Registers, spills and shared memory of our Triton kernels compiled for a GPU this machine does not have.

Why: every GPU minute is budgeted, and whether a change lowers a kernel's registers (and so raises the
blocks per SM) can be read from an offline sm_90a compile. Run the public entry points on CPU tensors
with a stand-in driver whose target is the GPU given: every launch compiles through Triton's own path
(binder, specialisation, NVIDIA backend, ptxas) and is then skipped. Per kernel and configuration it
prints what ``cuobjdump -res-usage`` reports for the cubin. The numbers follow the installed Triton; the
device image has Triton 3.6, so install that one elsewhere and put it first on PYTHONPATH.

    PYTHONPATH=<triton-3.6 site>:. python tools/bench/kernel_resources.py deltaformer --shape 8x2048x16x64
    PYTHONPATH=<triton-3.6 site>:. python tools/bench/kernel_resources.py gdp --shape 8x2048x16x64 --nh 2 \
        [--dtype fp32] [--value-dim 256]
    PYTHONPATH=<triton-3.6 site>:. python tools/bench/kernel_resources.py short_conv --shape 16x2048x16x128

Outputs are garbage (no kernel runs): the report is about the compiled code only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)
os.environ["TITAN_DELTA_TRITON_LAUNCH"] = "jit"  # Triton's own path: it compiles on every new key
# an empty cache, so every kernel compiles and its compile time is the cold one a user meets first
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernel_resources_")

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import CompiledKernel
from triton.runtime import driver as _driver
from triton.runtime.jit import JITFunction


class _OfflineDriver:
    """Just enough of a driver for ``JITFunction.run`` to compile for ``target``."""

    def __init__(self, target: GPUTarget) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


_SEEN: list[tuple[str, dict, CompiledKernel, float]] = []


def _install(target: GPUTarget) -> None:
    _driver.set_active(_OfflineDriver(target))
    original = JITFunction._do_compile

    def record(self, key, signature, device, constexprs, options, attrs, warmup):
        start = time.perf_counter()
        kernel = original(self, key, signature, device, constexprs, options, attrs, warmup)
        seconds = time.perf_counter() - start
        shown = {self.arg_names[p[0]]: v for p, v in constexprs.items() if len(p) == 1}
        shown.update(num_warps=options.num_warps, num_stages=options.num_stages)
        if getattr(options, "maxnreg", None):
            shown["maxnreg"] = options.maxnreg
        _SEEN.append((self.fn.__name__, shown, kernel, seconds))
        return kernel

    JITFunction._do_compile = record
    CompiledKernel.launch_metadata = lambda self, *a, **k: None
    CompiledKernel.run = property(lambda self: (lambda *a, **k: None))


def _usage(kernel: CompiledKernel, cuobjdump: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if not m:
        return out.strip()
    regs, stack, shared, local = (int(x) for x in m.groups())
    shared = max(shared, kernel.metadata.shared)
    threads = 32 * kernel.metadata.num_warps
    by_regs = 65536 // (threads * ((regs + 7) // 8 * 8))
    by_smem = 233472 // shared if shared else 32
    return (f"regs {regs:3d} stack {stack:4d} local {local:4d} shared {shared:6d} "
            f"blocks/SM {min(by_regs, by_smem, 2048 // threads)} (regs {by_regs}, smem {by_smem})")


def _dump(kernel: CompiledKernel, stem: str, cuobjdump: str) -> None:
    """Writes the kernel's TTGIR, PTX and SASS next to ``stem`` (to read what a change did to the loop)."""
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    for kind in ("ttgir", "ptx"):
        with open(f"{stem}.{kind}", "w") as f:
            f.write(kernel.asm[kind])
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
    with open(f"{stem}.sass", "w") as f:
        f.write(sass)


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shape: expected BxTxHxD such as 8x2048x16x64, got {text!r}") from None


def _deltaformer(shape: tuple[int, ...], dtype: torch.dtype, backward: bool) -> None:
    from titan_delta_kernels.deltaformer.op import deltaformer_attn_triton

    B, T, H, D = shape
    q, k, v = (torch.randn(B, T, H, D, dtype=dtype, requires_grad=backward) for _ in range(3))
    beta = torch.rand(B, T, H, dtype=dtype, requires_grad=backward)
    o = deltaformer_attn_triton(q, k, v, beta, scale=D**-0.5)
    if backward:
        o.sum().backward()


def _gdp(shape: tuple[int, ...], nh: int, dtype: torch.dtype, backward: bool, value_dim: int | None) -> None:
    import torch.nn.functional as F

    from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

    B, T, H, D = shape
    q = torch.randn(B, T, H, D, dtype=dtype)
    k = F.normalize(torch.randn(B, T * nh, H, D), dim=-1).to(dtype)
    v = torch.randn(B, T * nh, H, value_dim or D, dtype=dtype)
    beta = torch.rand(B, T * nh, H).to(dtype)
    g = F.logsigmoid(torch.randn(B, T, H))
    inputs = [x.requires_grad_(backward) for x in (q, k, v, g, beta)]
    with torch.set_grad_enabled(backward):
        o = gated_delta_product_triton(*inputs, num_householder=nh)[0]
    if backward:
        o.float().sum().backward()


def _short_conv(shape: tuple[int, ...], dtype: torch.dtype, backward: bool) -> None:
    from titan_delta_kernels.short_conv import short_causal_conv

    B, T, H, D = shape
    x = torch.randn(B, T, H * D, dtype=dtype, requires_grad=backward)
    weight = torch.randn(H * D, 1, 4, requires_grad=backward)
    seq_pos = torch.arange(T).expand(B, T)
    with torch.set_grad_enabled(backward):
        y = short_causal_conv(x, weight, seq_pos)
    if backward:
        y.float().sum().backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=["deltaformer", "gdp", "short_conv"])
    parser.add_argument("--shape", type=_shape, default=(8, 2048, 16, 64), help="BxTxHxD")
    parser.add_argument("--nh", type=int, default=2, help="GDP: Householder steps per token")
    parser.add_argument("--value-dim", type=int, default=None, help="GDP: the value head V (default D)")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16", help="input dtype")
    parser.add_argument("--forward-only", action="store_true")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for sm_90a")
    parser.add_argument("--dump", default="", help="folder to write each kernel's TTGIR, PTX and SASS into")
    args = parser.parse_args()
    if len(args.shape) != 4:
        raise SystemExit(f"--shape: expected four sizes BxTxHxD, got {args.shape}")
    _install(GPUTarget("cuda", args.arch, 32))
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    torch.manual_seed(0)
    print(f"triton {triton.__version__}, sm_{args.arch}, {args.family} {args.shape} {args.dtype}", flush=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if args.family == "deltaformer":
        _deltaformer(args.shape, dtype, not args.forward_only)
    elif args.family == "short_conv":  # channels = H·D
        _short_conv(args.shape, dtype, not args.forward_only)
    else:
        _gdp(args.shape, args.nh, dtype, not args.forward_only, args.value_dim)
    seen = set()
    for name, constexprs, kernel, seconds in _SEEN:
        key = (name, tuple(sorted(constexprs.items())))
        if key in seen:
            continue
        seen.add(key)
        flags = " ".join(f"{k}={v}" for k, v in constexprs.items() if not isinstance(v, str) or len(v) < 12)
        print(f"{name:28s} {_usage(kernel, cuobjdump)} compile {seconds:5.1f} s\n    {flags}", flush=True)
        if args.dump:
            _dump(kernel, os.path.join(args.dump, f"{name}_{len(seen)}"), cuobjdump)
    print(f"compile total {sum(s for *_, s in _SEEN):.1f} s over {len(_SEEN)} kernels "
          f"(this CPU, one thread; Triton's whole path: frontend, LLVM, ptxas)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
