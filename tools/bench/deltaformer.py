"""Benchmark of the DeltaFormer Triton kernels against SDPA causal attention and FLA's DeltaFormer.

Prints, per shape [B,T,H,D] (bf16, w = q), the median time (triton.testing.do_bench) of forward and of
forward+backward for ours, SDPA causal (the same flash-attention cost model) and FLA 0.6.0 when ``fla``
imports (its ``flash_attn`` dependency is stood in for by SDPA). All are measured in the same process on
fresh random inputs; a row that fails prints its error and is skipped. ``--profile`` adds a per-kernel
breakdown of one forward+backward of ours.

    python tools/bench/deltaformer.py                  # 2x8192x32x128 and 8x2048x16x64
    python tools/bench/deltaformer.py --shapes 1x4096x16x128 --no-fla --profile
"""

from __future__ import annotations

import argparse
import importlib.machinery
import sys
import types

import torch
import torch.nn.functional as F
import triton.testing

DEFAULT_SHAPES = ("2x8192x32x128", "8x2048x16x64")


def _sdpa_bthd(q, k, v, *, causal: bool, scale: float | None) -> torch.Tensor:
    """SDPA on [B, T, H, D] tensors (it wants [B, H, T, D])."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal, scale=scale)
    return out.transpose(1, 2)


def _fla_deltaformer():
    """FLA's DeltaFormer, with an SDPA-backed ``flash_attn`` stand-in for its stage 2; None if missing."""
    if "flash_attn" not in sys.modules:
        shim = types.ModuleType("flash_attn")
        shim.__spec__ = importlib.machinery.ModuleSpec("flash_attn", loader=None)
        def flash_attn_func(q, k, v, causal=True, **_ignored):
            return _sdpa_bthd(q, k, v, causal=causal, scale=None)

        shim.flash_attn_func = flash_attn_func
        sys.modules["flash_attn"] = shim
    try:
        from fla.ops.deltaformer import deltaformer_attn
    except Exception as err:
        print(f"# FLA not measured: {type(err).__name__}: {err}")
        return None
    return deltaformer_attn


def _parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise SystemExit(f"--shapes entries must look like BxTxHxD (e.g. 2x8192x32x128), got {text!r}")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def _inputs(shape, dtype, device):
    B, T, H, D = shape
    q, k, v = (torch.randn(B, T, H, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    beta = torch.rand(B, T, H, device=device, dtype=dtype, requires_grad=True)
    return [q, k, v, beta], torch.randn(B, T, H, D, device=device, dtype=dtype)


def _bench_pair(forward, inputs: list[torch.Tensor], d_out: torch.Tensor) -> tuple[float, float]:
    """(fwd ms, fwd+bwd ms) of ``forward(*inputs)``."""
    with torch.no_grad():
        t_fwd = triton.testing.do_bench(lambda: forward(*inputs), warmup=25, rep=100, return_mode="median")

    def step():
        forward(*inputs).backward(d_out)

    t_both = triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=inputs, return_mode="median")
    return t_fwd, t_both


def _bench_shape(shape, dtype, device, fla) -> None:
    """One table row per implementation, SDPA first (the ratios' reference)."""
    from titan_delta_kernels.deltaformer import deltaformer_attn_triton

    leaves, d_out = _inputs(shape, dtype, device)
    scale = shape[-1] ** -0.5
    sdpa_fwd, sdpa_both = _bench_pair(lambda q, k, v, beta: _sdpa_bthd(q, k, v, causal=True, scale=scale),
                                      leaves, d_out)
    print(f"| {list(shape)} | SDPA causal | {sdpa_fwd:.3f} | {sdpa_both:.3f} | 1.00x | 1.00x |", flush=True)
    rows = [("titan-delta", lambda q, k, v, beta: deltaformer_attn_triton(q, k, v, beta, scale=scale))]
    if fla is not None:
        rows.append(("FLA 0.6.0", lambda q, k, v, beta: fla(q, k, v, beta)))
    for name, forward in rows:
        try:
            t_fwd, t_both = _bench_pair(forward, leaves, d_out)
        except Exception as err:  # one failing row must not cost the rest of the table
            print(f"# {name} failed on {list(shape)}: {type(err).__name__}: {str(err)[:300]}", flush=True)
            torch.cuda.synchronize()
            continue
        print(f"| {list(shape)} | {name} | {t_fwd:.3f} | {t_both:.3f} | {t_fwd / sdpa_fwd:.2f}x "
              f"| {t_both / sdpa_both:.2f}x |", flush=True)


def _profile(shape, dtype, device) -> None:
    """Per-kernel CUDA time of one fwd+bwd of ours (after two untimed ones)."""
    from titan_delta_kernels.deltaformer import deltaformer_attn_triton

    leaves, d_out = _inputs(shape, dtype, device)
    scale = shape[-1] ** -0.5
    for _ in range(2):
        deltaformer_attn_triton(*leaves, scale=scale).backward(d_out)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        deltaformer_attn_triton(*leaves, scale=scale).backward(d_out)
        torch.cuda.synchronize()
    print(f"# per-kernel CUDA time of one fwd+bwd, shape {list(shape)}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=48))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma list of BxTxHxD")
    parser.add_argument("--no-fla", action="store_true", help="skip FLA")
    parser.add_argument("--profile", action="store_true", help="per-kernel breakdown of ours")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tools/bench/deltaformer.py needs a CUDA GPU")
    device, dtype = "cuda", torch.bfloat16
    fla = None if args.no_fla else _fla_deltaformer()
    shapes = [_parse_shape(text) for text in args.shapes.split(",")]
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}, bf16")
    print("| shape [B,T,H,D] | impl | fwd ms | fwd+bwd ms | fwd / SDPA fwd | fwd+bwd / SDPA fwd+bwd |")
    print("|---|---|---|---|---|---|", flush=True)
    for shape in shapes:
        _bench_shape(shape, dtype, device, fla)
        torch.cuda.empty_cache()
    if args.profile:
        for shape in shapes:
            _profile(shape, dtype, device)


if __name__ == "__main__":
    main()
