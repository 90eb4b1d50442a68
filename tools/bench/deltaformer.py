"""Benchmark of the DeltaFormer Triton kernels against SDPA causal attention and FLA's DeltaFormer.

Prints, per shape [B,T,H,D] (bf16), the median time (triton.testing.do_bench) of forward and of
forward+backward for: ours, SDPA causal (the same flash-attention cost model), and FLA 0.6.0 when
``fla`` imports (its ``flash_attn`` dependency is stood in for by SDPA, see ``_install_flash_attn_shim``).
All three are measured in the same process on fresh random inputs. ``--profile`` adds a per-kernel
breakdown of one forward+backward of ours (``--profile-variant`` picks the variants profiled);
``--superblock``/``--vsplit``/``--tiles``/``--inv-prec`` sweep our launch settings and ``--variant`` our
opt-in kernel variants ('|'-separated specs as in ``TITAN_DELTA_DF_VARIANT``; an empty spec = defaults).
Rows are printed as soon as they are measured, and a row that fails prints its error and is skipped.

    python tools/bench/deltaformer.py                    # the issue's two shapes
    python tools/bench/deltaformer.py --shapes 1x4096x16x128 --superblock 512,1024,100000 --profile
    python tools/bench/deltaformer.py --no-fla --variant "|fused,keepinv|overlap,keepinv,sb=256"
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import statistics
import sys
import time
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
                "TITAN_DELTA_DF_INV_PREC", "TITAN_DELTA_DF_VARIANT"):
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


def _host_ms(fn, reps: int = 30) -> float:
    """Median host time to enqueue ``fn`` from an idle GPU: when it exceeds the GPU time, the host (Python
    and launch overhead) sets the pace that do_bench measures."""
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return 1e3 * statistics.median(times)


def _graph_ms(fn) -> float:
    """GPU time alone: ``fn`` captured in a CUDA graph, its replays timed by do_bench."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=10, rep=100, return_mode="median")


def _host_row(shape, name: str, forward, inputs, d_out) -> None:
    """Host enqueue times of fwd and fwd+bwd, and the forward's GPU time without the host (CUDA graph)."""
    def step():
        forward(*inputs).backward(d_out)

    try:
        with torch.no_grad():
            fwd_host = _host_ms(lambda: forward(*inputs))
            fwd_graph = _graph_ms(lambda: forward(*inputs))
        both_host = _host_ms(step)
    except Exception as err:
        print(f"# host timing of {name} failed on {list(shape)}: {type(err).__name__}: {str(err)[:300]}",
              flush=True)
        return
    print(f"| {list(shape)} | {name} | {fwd_host:.3f} | {both_host:.3f} | {fwd_graph:.3f} |", flush=True)


def _host_profile(shape, dtype, device, variant: str = "", calls: int = 20) -> None:
    """cProfile of the host side of ``calls`` forwards (no grad) and of ``calls`` fwd+bwd of ours: where
    the Python and launch time goes (the GPU runs behind; one synchronisation at the end)."""
    import cProfile
    import pstats

    from titan_delta_kernels.deltaformer import deltaformer_attn_triton

    q, k, v, beta, d_out = _inputs(shape, dtype, device)
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    scale = shape[-1] ** -0.5
    deltaformer_attn_triton(*leaves, scale=scale, variant=variant).backward(d_out)
    torch.cuda.synchronize()
    for name, grad in (("forward, no grad", False), ("fwd+bwd", True)):
        profiler = cProfile.Profile()
        with torch.set_grad_enabled(grad):
            profiler.enable()
            for _ in range(calls):
                out = deltaformer_attn_triton(*leaves, scale=scale, variant=variant)
                if grad:
                    out.backward(d_out)
            profiler.disable()
        torch.cuda.synchronize()
        print(f"# host profile, {calls} calls of {name}, shape {list(shape)}, "
              f"variant {variant or 'defaults'!r}")
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(18)


def _inputs(shape, dtype, device):
    B, T, H, D = shape
    q, k, v = (torch.randn(B, T, H, D, device=device, dtype=dtype) for _ in range(3))
    beta = torch.rand(B, T, H, device=device, dtype=dtype)
    d_out = torch.randn(B, T, H, D, device=device, dtype=dtype)
    return q, k, v, beta, d_out


def _profile(shape, dtype, device, variant: str = "") -> None:
    from titan_delta_kernels.deltaformer import deltaformer_attn_triton

    q, k, v, beta, d_out = _inputs(shape, dtype, device)
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    scale = shape[-1] ** -0.5
    for _ in range(2):
        deltaformer_attn_triton(*leaves, scale=scale, variant=variant).backward(d_out)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        deltaformer_attn_triton(*leaves, scale=scale, variant=variant).backward(d_out)
        torch.cuda.synchronize()
    print(f"# per-kernel CUDA time of one fwd+bwd, shape {list(shape)}, variant {variant or 'defaults'!r}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=48))


def _warm(shape, dtype, device, sweeps) -> None:
    """One fwd and one fwd+bwd per sweep entry, untimed: fills Triton's on-disk kernel cache, so that
    several of these processes can compile in parallel before a timed run
    (tools/bench/proof_deltaformer.sh)."""
    from titan_delta_kernels.deltaformer import deltaformer_attn_triton

    q, k, v, beta, d_out = _inputs(shape, dtype, device)
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    for env in sweeps:
        _set_env(env)
        try:
            with torch.no_grad():
                deltaformer_attn_triton(*leaves, scale=shape[-1] ** -0.5)
            deltaformer_attn_triton(*leaves, scale=shape[-1] ** -0.5).backward(d_out)
            torch.cuda.synchronize()
            print(f"# warmed {list(shape)} {env}", flush=True)
        except Exception as err:
            print(f"# warm-up failed {list(shape)} {env}: {type(err).__name__}: {str(err)[:300]}", flush=True)
    _set_env({})


def _bench_shape(shape, dtype, device, sweeps, separate_w: bool, fla, host: bool = False) -> None:
    """Print one table row per implementation for one shape, SDPA first (the ratios' reference); with
    ``host``, then one row of host and CUDA-graph times per variant of ours."""
    from titan_delta_kernels.deltaformer import deltaformer_attn_triton

    q, k, v, beta, d_out = _inputs(shape, dtype, device)
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    scale = shape[-1] ** -0.5

    def sdpa(q, k, v, beta):
        return _sdpa_bthd(q, k, v, causal=True, scale=scale)

    def ours(q, k, v, beta, w=None):
        return deltaformer_attn_triton(q, k, v, beta, w=w, scale=scale)

    sdpa_fwd, sdpa_both = _bench_pair(sdpa, leaves, d_out)

    def row(name: str, forward, inputs) -> None:
        try:
            t_fwd, t_both = _bench_pair(forward, inputs, d_out)
        except Exception as err:  # one failing variant must not cost the rest of the table
            print(f"# {name} failed on {list(shape)}: {type(err).__name__}: {str(err)[:300]}", flush=True)
            torch.cuda.synchronize()
            return
        print(f"| {list(shape)} | {name} | {t_fwd:.3f} | {t_both:.3f} | {t_fwd / sdpa_fwd:.2f}x "
              f"| {t_both / sdpa_both:.2f}x |", flush=True)

    print(f"| {list(shape)} | SDPA causal | {sdpa_fwd:.3f} | {sdpa_both:.3f} | 1.00x | 1.00x |", flush=True)
    for env in sweeps:
        _set_env(env)
        settings = [f"{key.split('_')[-1].lower()}={val}" for key, val in env.items() if val]
        row(" ".join(["titan-delta", *settings]), ours, leaves)
    _set_env({})
    if separate_w:
        row("titan-delta, separate w", ours, [*leaves, torch.randn_like(q).requires_grad_(True)])
    if fla is not None:
        row("FLA 0.6.0", lambda q, k, v, beta: fla(q, k, v, beta), leaves)
    if not host:
        return
    print("\n| shape [B,T,H,D] | impl | fwd host ms | fwd+bwd host ms | fwd GPU ms (CUDA graph) |")
    print("|---|---|---|---|---|", flush=True)
    _host_row(shape, "SDPA causal", sdpa, leaves, d_out)
    for env in sweeps:
        _set_env(env)
        settings = [f"{key.split('_')[-1].lower()}={val}" for key, val in env.items() if val]
        _host_row(shape, " ".join(["titan-delta", *settings]), ours, leaves, d_out)
    _set_env({})
    print("\n| shape [B,T,H,D] | impl | fwd ms | fwd+bwd ms | fwd / SDPA fwd | fwd+bwd / SDPA fwd+bwd |")
    print("|---|---|---|---|---|---|", flush=True)


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
    parser.add_argument("--variant", default="",
                        help="'|' list of kernel variant specs, e.g. '|fused,keepinv' ('' = defaults)")
    parser.add_argument("--warm", action="store_true", help="only compile (run each sweep entry once)")
    parser.add_argument("--profile", action="store_true", help="per-kernel breakdown of ours")
    parser.add_argument("--host-profile", action="store_true",
                        help="cProfile of the host side of ours, per --profile-variant")
    parser.add_argument("--host", action="store_true",
                        help="also host enqueue times and the forward's GPU time under a CUDA graph")
    parser.add_argument("--profile-variant", default="",
                        help="'|' list of variant specs to profile with --profile ('' = defaults)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_deltaformer needs a CUDA GPU")
    device, dtype = "cuda", torch.bfloat16
    fla = None if args.no_fla or args.warm else _fla_deltaformer()
    sweeps = [{"TITAN_DELTA_DF_SUPERBLOCK": sb, "TITAN_DELTA_DF_VSPLIT": vs, "TITAN_DELTA_DF_TILES": tl}
              for sb in (args.superblock.split(",") if args.superblock else [""])
              for vs in (args.vsplit.split(",") if args.vsplit else [""])
              for tl in (args.tiles.split("|") if args.tiles else [""])]
    sweeps = [{**env, "TITAN_DELTA_DF_INV_PREC": prec} for env in sweeps
              for prec in (args.inv_prec.split(",") if args.inv_prec else [""])]
    sweeps = [{**env, "TITAN_DELTA_DF_VARIANT": spec} for env in sweeps
              for spec in (args.variant.split("|") if args.variant else [""])]
    if args.warm:
        for text in args.shapes.split(","):
            _warm(_parse_shape(text), dtype, device, sweeps)
        return
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}, bf16")
    print("| shape [B,T,H,D] | impl | fwd ms | fwd+bwd ms | fwd / SDPA fwd | fwd+bwd / SDPA fwd+bwd |")
    print("|---|---|---|---|---|---|", flush=True)
    for text in args.shapes.split(","):
        _bench_shape(_parse_shape(text), dtype, device, sweeps, args.separate_w, fla, args.host)
        torch.cuda.empty_cache()
    if args.host_profile:
        for text in args.shapes.split(","):
            for spec in args.profile_variant.split("|") if args.profile_variant else [""]:
                _host_profile(_parse_shape(text), dtype, device, spec)
    if args.profile:
        for text in args.shapes.split(","):
            for spec in args.profile_variant.split("|") if args.profile_variant else [""]:
                try:
                    _profile(_parse_shape(text), dtype, device, spec)
                except Exception as err:
                    print(f"# profile of {spec!r} failed: {type(err).__name__}: {str(err)[:300]}", flush=True)


if __name__ == "__main__":
    main()
