"""Benchmark of the DeltaFormer Triton kernels against SDPA causal attention and FLA's DeltaFormer.

Prints, per shape [B,T,H,D] (bf16), the median time (triton.testing.do_bench) of forward and of
forward+backward for: ours, SDPA causal (the same flash-attention cost model), and FLA 0.6.0 when
``fla`` imports (its ``flash_attn`` dependency is stood in for by SDPA, see ``_install_flash_attn_shim``).
All three are measured in the same process on fresh random inputs. ``--profile`` adds a per-kernel
breakdown of one forward+backward of ours; ``--superblock``/``--vsplit`` sweep our launch settings.

    python tools/bench_deltaformer.py                    # the issue's two shapes
    python tools/bench_deltaformer.py --shapes 1x4096x16x128 --superblock 512,1024,100000 --profile
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import sys
import types

import torch
import torch.nn.functional as F
import triton.testing

DEFAULT_SHAPES = ("2x8192x32x128", "8x2048x16x64")


def _install_flash_attn_shim() -> None:
    """FLA's DeltaFormer imports ``flash_attn`` for its stage 2; register an SDPA-backed stand-in."""
    if "flash_attn" in sys.modules:
        return

    def flash_attn_func(q, k, v, causal=True, **_ignored):
        return _sdpa_bthd(q, k, v, causal=causal, scale=None)

    def flash_attn_varlen_func(*_args, **_kwargs):
        raise NotImplementedError("the benchmark's flash_attn stand-in has no varlen path")

    shim = types.ModuleType("flash_attn")
    shim.__spec__ = importlib.machinery.ModuleSpec("flash_attn", loader=None)
    shim.flash_attn_func = flash_attn_func
    shim.flash_attn_varlen_func = flash_attn_varlen_func
    sys.modules["flash_attn"] = shim


def _fla_deltaformer():
    _install_flash_attn_shim()
    try:
        from fla.ops.deltaformer import deltaformer_attn
    except Exception as err:
        print(f"# FLA not measured: {type(err).__name__}: {err}")
        return None
    return deltaformer_attn


def _set_env(env: dict[str, str]) -> None:
    """Our launch settings are read from the environment at each call (see ``default_config``)."""
    for key in ("TITAN_DELTA_DF_SUPERBLOCK", "TITAN_DELTA_DF_VSPLIT", "TITAN_DELTA_DF_TILES",
                "TITAN_DELTA_DF_INV_PREC"):
        os.environ.pop(key, None)
        if env.get(key):
            os.environ[key] = env[key]


def _sdpa_bthd(q, k, v, *, causal: bool, scale: float | None) -> torch.Tensor:
    """SDPA on [B, T, H, D] tensors (it wants [B, H, T, D])."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal, scale=scale)
    return out.transpose(1, 2)


def _parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise SystemExit(f"--shapes entries must look like BxTxHxD (e.g. 2x8192x32x128), got {text!r}")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def _time(fn, grads_of: list[torch.Tensor]) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grads_of, return_mode="median")


def _bench_pair(forward, inputs: list[torch.Tensor], d_out: torch.Tensor) -> tuple[float, float]:
    """(fwd ms, fwd+bwd ms) of ``forward(*inputs)``."""
    with torch.no_grad():
        t_fwd = _time(lambda: forward(*inputs), [])

    def step():
        out = forward(*inputs)
        out.backward(d_out)

    return t_fwd, _time(step, inputs)


def _inputs(shape, dtype, device):
    B, T, H, D = shape
    q, k, v = (torch.randn(B, T, H, D, device=device, dtype=dtype) for _ in range(3))
    beta = torch.rand(B, T, H, device=device, dtype=dtype)
    d_out = torch.randn(B, T, H, D, device=device, dtype=dtype)
    return q, k, v, beta, d_out


def _profile(shape, dtype, device) -> None:
    from titan_delta_kernels.deltaformer import deltaformer_attn_triton

    q, k, v, beta, d_out = _inputs(shape, dtype, device)
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    scale = shape[-1] ** -0.5
    for _ in range(2):
        deltaformer_attn_triton(*leaves, scale=scale).backward(d_out)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        deltaformer_attn_triton(*leaves, scale=scale).backward(d_out)
        torch.cuda.synchronize()
    print(f"# per-kernel CUDA time of one fwd+bwd, shape {list(shape)}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=48))


def _bench_shape(shape, dtype, device, sweeps, separate_w: bool, fla) -> list[tuple[str, float, float]]:
    """(name, fwd ms, fwd+bwd ms) rows for one shape, SDPA first."""
    from titan_delta_kernels.deltaformer import deltaformer_attn_triton

    q, k, v, beta, d_out = _inputs(shape, dtype, device)
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    scale = shape[-1] ** -0.5

    def sdpa(q, k, v, beta):
        return _sdpa_bthd(q, k, v, causal=True, scale=scale)

    def ours(q, k, v, beta, w=None):
        return deltaformer_attn_triton(q, k, v, beta, w=w, scale=scale)

    rows = [("SDPA causal", *_bench_pair(sdpa, leaves, d_out))]
    for env in sweeps:
        _set_env(env)
        settings = [f"{key.split('_')[-1].lower()}={val}" for key, val in env.items() if val]
        rows.append((" ".join(["titan-delta", *settings]), *_bench_pair(ours, leaves, d_out)))
    _set_env({})
    if separate_w:
        probe = torch.randn_like(q).requires_grad_(True)
        rows.append(("titan-delta, separate w", *_bench_pair(ours, [*leaves, probe], d_out)))
    if fla is not None:
        try:
            rows.append(("FLA 0.6.0", *_bench_pair(lambda q, k, v, beta: fla(q, k, v, beta), leaves, d_out)))
        except Exception as err:
            print(f"# FLA failed on {shape}: {type(err).__name__}: {err}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma list of BxTxHxD")
    parser.add_argument("--superblock", default="", help="comma list of superblock sizes to sweep")
    parser.add_argument("--vsplit", default="", help="comma list of value splits to sweep")
    parser.add_argument("--tiles", default="",
                        help="'|' list of 'rows,keys,warps,stages;keys,rows,warps,stages'")
    parser.add_argument("--inv-prec", default="",
                        help="comma list of diagonal-inverse precisions (tf32x3,tf32)")
    parser.add_argument("--separate-w", action="store_true", help="also time ours with a separate probe w")
    parser.add_argument("--no-fla", action="store_true", help="skip FLA")
    parser.add_argument("--profile", action="store_true", help="per-kernel breakdown of ours")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_deltaformer needs a CUDA GPU")
    device, dtype = "cuda", torch.bfloat16
    fla = None if args.no_fla else _fla_deltaformer()
    sweeps = [{"TITAN_DELTA_DF_SUPERBLOCK": sb, "TITAN_DELTA_DF_VSPLIT": vs, "TITAN_DELTA_DF_TILES": tl}
              for sb in (args.superblock.split(",") if args.superblock else [""])
              for vs in (args.vsplit.split(",") if args.vsplit else [""])
              for tl in (args.tiles.split("|") if args.tiles else [""])]
    sweeps = [{**env, "TITAN_DELTA_DF_INV_PREC": prec} for env in sweeps
              for prec in (args.inv_prec.split(",") if args.inv_prec else [""])]
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}, bf16")
    print("| shape [B,T,H,D] | impl | fwd ms | fwd+bwd ms | fwd / SDPA fwd | fwd+bwd / SDPA fwd+bwd |")
    print("|---|---|---|---|---|---|")
    for text in args.shapes.split(","):
        shape = _parse_shape(text)
        rows = _bench_shape(shape, dtype, device, sweeps, args.separate_w, fla)
        sdpa_fwd, sdpa_both = rows[0][1], rows[0][2]
        for name, t_fwd, t_both in rows:
            print(f"| {list(shape)} | {name} | {t_fwd:.3f} | {t_both:.3f} | {t_fwd / sdpa_fwd:.2f}x "
                  f"| {t_both / sdpa_both:.2f}x |")
        torch.cuda.empty_cache()
    if args.profile:
        for text in args.shapes.split(","):
            _profile(_parse_shape(text), dtype, device)


if __name__ == "__main__":
    main()
