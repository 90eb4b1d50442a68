"""Compiling a kernel set at once (``titan_delta_kernels._precompile``).

CPU: ``recording()`` collects launches without running them, on this thread only, and ``precompile`` does
nothing off a GPU. GPU (in a fresh process with an empty Triton cache, so every kernel really compiles): the
first Gated DeltaProduct forward and backward compile every kernel on the pool threads, none on the calling
thread (nor on autograd's backward thread), and give the same outputs and gradients, bitwise, as a process
without precompilation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading

import pytest
import torch

from titan_delta_kernels import _launch, _precompile
from titan_delta_kernels.gated_delta_product import gated_delta_product_triton


def _inputs(device: str, dtype=torch.float32, T: int = 70, n_h: int = 2, K: int = 32):
    """fp32 inputs of one small gated call (the GPU child process draws the same kind of inputs)."""
    gen = torch.Generator(device=device).manual_seed(0)
    B, H = 1, 2

    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(dtype)

    k = torch.nn.functional.normalize(rand(B, T * n_h, H, K).float(), dim=-1).to(dtype)
    beta = torch.rand(B, T * n_h, H, device=device, generator=gen).to(dtype) * 2
    g = -torch.rand(B, T, H, device=device, generator=gen) * 0.5
    return [rand(B, T, H, K), k, rand(B, T * n_h, H, K), g, beta]


def test_recording_collects_launches_and_runs_none():
    # Where the kernels really run: the interpreter on CPU (tests/conftest.py), the GPU otherwise.
    q, k, v, g, beta = _inputs("cuda" if torch.cuda.is_available() else "cpu")
    with _launch.recording() as launches:
        o, _ = gated_delta_product_triton(q, k, v, g, beta, num_householder=2)
    names = [kernel.fn.__name__ for kernel, *_ in launches]
    assert names[0].startswith("wy_") and len(names) == 3, names  # UT transform, state pass, outputs
    assert all(isinstance(grid, tuple) and kwargs for _, grid, _, kwargs in launches)
    seen_elsewhere: list = []

    def look() -> None:
        seen_elsewhere.append(getattr(_launch._RECORDING, "launches", None))

    thread = threading.Thread(target=look)
    with _launch.recording():
        thread.start()
        thread.join()
    assert seen_elsewhere == [None]  # another thread keeps launching for real
    ran, _ = gated_delta_product_triton(q, k, v, g, beta, num_householder=2)
    # the recorded call's output was allocated, never written
    assert torch.isfinite(ran).all() and not torch.equal(ran, o)


def test_precompile_is_a_no_op_off_a_gpu():
    calls = []
    _precompile.precompile(("test", "cpu"), lambda: calls.append(1), torch.device("cpu"))
    assert calls == [] and ("test", "cpu") not in {key for key, _ in _precompile._DONE}


_CHILD = r"""
import json, sys, threading, torch
import triton.compiler
from titan_delta_kernels import _precompile
from titan_delta_kernels.gated_delta_product import gated_delta_product_triton
_precompile.set_enabled(sys.argv[1] == "on")
threads = []
original = triton.compiler.compile  # what each kernel's binder calls to compile (on a pool thread, or not)
def spy(src, *args, **kwargs):
    threads.append((src.fn.__name__, threading.current_thread().name.startswith("ThreadPoolExecutor")))
    return original(src, *args, **kwargs)
triton.compiler.compile = spy
gen = torch.Generator(device="cuda").manual_seed(0)
B, T, H, K, n_h = 1, 70, 2, 32, 2
q = torch.randn(B, T, H, K, device="cuda", generator=gen)
v = torch.randn(B, T * n_h, H, K, device="cuda", generator=gen)
k = torch.nn.functional.normalize(torch.randn(B, T * n_h, H, K, device="cuda", generator=gen), dim=-1)
beta = torch.rand(B, T * n_h, H, device="cuda", generator=gen) * 2
g = -torch.rand(B, T, H, device="cuda", generator=gen) * 0.5
leaves = [x.requires_grad_() for x in (q, k, v, g, beta)]
o, _ = gated_delta_product_triton(*leaves, num_householder=2)
o.backward(torch.ones_like(o))
torch.cuda.synchronize()
out = [o.detach()] + [x.grad for x in leaves]
print(json.dumps({"compiles": threads, "values": [x.double().cpu().flatten().tolist() for x in out]}))
"""


def _child(mode: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        env.pop("TRITON_INTERPRET", None)
        proc = subprocess.run([sys.executable, "-c", _CHILD, mode], env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_gpu_first_call_compiles_every_kernel_on_the_pool():
    on, off = _child("on"), _child("off")
    assert len(on["compiles"]) == 7, on["compiles"]  # 3 forward kernels, 4 backward kernels
    # (the backward runs on autograd's device thread: not the main thread, but not a pool thread either)
    assert all(pool for _, pool in on["compiles"]), on["compiles"]
    assert not any(pool for _, pool in off["compiles"]), off["compiles"]
    assert sorted(n for n, _ in on["compiles"]) == sorted(n for n, _ in off["compiles"])
    assert on["values"] == off["values"]
