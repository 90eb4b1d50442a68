"""Kernel launches without Triton's per-call Python: ``launch(kernel, grid, *args, **kwargs)``.

Why: ``kernel[grid](...)`` binds every argument, builds its cache key (including ``str`` of the options dict)
and checks the kernel's globals on every call, several times the cost of the compiled launcher itself; at
small shapes, where a forward's GPU time is a fraction of a millisecond, that host time sets the pace
(the DeltaFormer benchmark's ``--host`` rows measure it).

``launch`` keeps, per kernel, the ``CompiledKernel`` Triton returned for a key made of

* Triton's own specialisation of every positional argument (``native_specialize_impl``, exactly as the
  kernel's binder calls it: dtype and 16-byte alignment of pointers; ints equal to 1, divisible by 16, or
  their width), so a hit runs the very kernel Triton would have picked;
* the keyword arguments (constexprs and launch options) as given;
* the current device.

A miss launches through Triton (which compiles or finds the kernel) and records it. Triton's path is used
whenever the shortcut could differ from it: under the CPU interpreter, with launch hooks installed
(profilers), for kernels with pre-run hooks, before CUDA is initialised, when a runtime argument comes by
keyword, or with ``TITAN_DELTA_TRITON_LAUNCH=jit`` (read at import; ``set_enabled`` switches it for tests).
Call sites pass every runtime (non-constexpr) argument positionally and the rest by keyword.

Inside ``recording()`` launches are collected instead of issued (``_precompile`` compiles them all at once).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

try:  # Triton >= 3.3
    from triton._C.libtriton import native_specialize_impl
except ImportError:  # pragma: no cover - older Triton: always take Triton's own path
    native_specialize_impl = None
try:
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - Triton without knobs: hooks cannot be checked, so never cache
    _knobs = None

_ENABLED = native_specialize_impl is not None and os.environ.get("TITAN_DELTA_TRITON_LAUNCH") != "jit"
_RECORDING = threading.local()  # .launches: this thread's recorded launches while recording()


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[Any, tuple, tuple, dict]]]:
    """Within it, this thread's ``launch`` calls append (kernel, grid, args, kwargs) and launch nothing."""
    previous = getattr(_RECORDING, "launches", None)
    _RECORDING.launches = launches = []
    try:
        yield launches
    finally:
        _RECORDING.launches = previous


def set_enabled(enabled: bool) -> bool:
    """Turns the cached path on or off (tests compare both); returns the previous setting."""
    global _ENABLED
    previous, _ENABLED = _ENABLED, bool(enabled) and native_specialize_impl is not None
    return previous


class _KernelCache:
    """Per-kernel state: how its binder specialises each positional parameter, and the compiled kernels."""

    __slots__ = ("entries", "flags", "hits", "usable")

    def __init__(self, kernel: Any) -> None:
        params = getattr(kernel, "params", None)
        constexpr = [p.is_constexpr for p in params or ()]
        self.usable = (
            params is not None
            and not getattr(kernel, "pre_run_hooks", None)
            and constexpr == sorted(constexpr)  # runtime parameters first: positional args map onto them
            and all(not p.annotation_type or p.is_constexpr for p in params)  # annotated: bound differently
        )
        self.flags = [] if params is None else [
            (p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment)
            for p in params if not p.is_constexpr
        ]  # fmt: skip
        self.entries: dict[tuple, tuple[Any, Any, tuple]] = {}
        self.hits = 0  # launches that took the cached path (the GPU tests check it is taken)


_CACHES: dict[Any, _KernelCache] = {}


def _hooks_installed() -> bool:
    """Launch hooks (a profiler such as proton): then Triton's path, which passes them metadata."""
    if _knobs is None:
        return True
    hooks = (_knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook)
    return any(h is not None and getattr(h, "calls", True) for h in hooks)


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)``, through the cache when it is safe (module docstring)."""
    recorded = getattr(_RECORDING, "launches", None)
    if recorded is not None:
        recorded.append((kernel, grid, args, kwargs))
        return
    if not _ENABLED or not torch.cuda.is_initialized() or _hooks_installed():
        kernel[grid](*args, **kwargs)
        return
    cache = _CACHES.get(kernel)
    if cache is None:
        cache = _CACHES[kernel] = _KernelCache(kernel)
    if not cache.usable or len(args) != len(cache.flags):  # a runtime argument by keyword: Triton's path
        kernel[grid](*args, **kwargs)
        return
    device = torch.cuda.current_device()
    kw_key = tuple(kwargs.items())
    probe = cache.entries.get((device, kw_key))  # holds the backend once these keywords were launched
    entry = None
    if probe is not None:
        entry = cache.entries.get((device, kw_key, _specialisation(probe[0], args, cache.flags)))
    if entry is None:
        compiled = kernel[grid](*args, **kwargs)
        _record(kernel, cache, device, kw_key, args, kwargs, compiled)
        return
    compiled, tail = entry[1], entry[2]
    cache.hits += 1
    g0 = grid[0]
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    stream = torch._C._cuda_getCurrentRawStream(device)
    # launch metadata and hooks None: no hook is installed (checked above), so Triton's path would call none
    compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *args,
                 *tail)


def _specialisation(backend: Any, args: tuple, flags: list[tuple[bool, bool, bool]]) -> tuple:
    """What the kernel's binder computes for the runtime arguments (type and divisibility/alignment)."""
    return tuple(native_specialize_impl(backend, a, *f) for a, f in zip(args, flags, strict=True))


def _record(kernel: Any, cache: _KernelCache, device: int, kw_key: tuple, args: tuple, kwargs: dict,
            compiled: Any) -> None:
    """After Triton's own launch: remember the compiled kernel and the values of the parameters after the
    positional ones (constexprs and defaults, in signature order) for the next call with the same key."""
    if compiled is None:
        return
    if hasattr(compiled, "result"):  # asynchronous compilation mode
        compiled = compiled.result()
    caches = kernel.device_caches[device]
    backend, binder = caches[3], caches[4]
    bound, _, _ = binder(*args, **kwargs)
    tail = tuple(bound.values())[len(args):]
    spec = _specialisation(backend, args, cache.flags)
    cache.entries[(device, kw_key)] = (backend, None, ())
    cache.entries[(device, kw_key, spec)] = (backend, compiled, tail)


def cdiv(a: int, b: int) -> int:
    """Ceiling division for grids and launch arguments. ``triton.cdiv`` and ``triton.next_power_of_2`` are
    ``constexpr_function`` wrappers in Triton ≥ 3.4 that cost microseconds per host-side call."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ≥ n (1 for n ≤ 1), as ``triton.next_power_of_2`` for the sizes used here."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
