"""Shared launch settings of the DeltaFormer kernels: block sizes, dot precisions and document bounds.

Every kernel works on the flattened [B, T, H, *] layout (contiguous), one (b, h) pair per program column.
Packed documents (``cu_seqlens``) are described to the kernels by two int32 [T] tables built on the
device, ``doc_start[t]`` and ``doc_end[t]``, so no kernel launch ever reads ``cu_seqlens`` on the host.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, replace

import torch
import triton

LOG2_E = 1.4426950408889634  # scores run through exp2, so the scale carries log2(e)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class BlockConfig:
    """Launch settings. ``chunk`` is the diagonal-block size of the solve (the rows solved together);
    ``superblock`` rows are solved by one sequential program per (b, h, value slice) while the
    contributions from earlier superblocks are summed by fully parallel kernels beforehand."""

    chunk: int
    superblock: int
    value_split: int  # number of programs that share one (b, h) in the sequential solve (Dv slices)
    num_warps: int
    num_stages: int
    row_tiles: tuple[int, int, int, int] = (64, 64, 8, 2)  # rows, keys, warps, stages of the row kernels
    col_tiles: tuple[int, int, int, int] = (64, 64, 8, 2)  # keys, rows, warps, stages of the key kernels
    # variants (``apply_variant``); ``_base_config`` picks the measured defaults
    fused_prep: bool = False  # normalisers + earlier-superblock sums + inverses in one launch per superblock
    overlap: bool = False  # (fused) sums over long-solved keys on a side stream, beside the current solve
    prep_tiles: tuple[int, int, int, int] | None = None  # rows, keys, warps, stages of that launch
    keep_inverse: bool = False  # the forward hands its diagonal-block inverses to the backward
    solve_keys: int = 0  # key (row) tile of the sequential solves' inner loops; 0 = chunk
    # wavefront solves, a program per (chunk, b, h) with flags between them: the forward as one launch
    # ("full") or only inside each superblock ("superblock"); the backward as one launch
    wave_forward: str = ""
    wave_backward: bool = False
    wave_inverse: bool = False  # (superblock wavefront) each program builds its chunk's inverse itself
    wave_defer: int = 2  # key chunks a wavefront program takes one by one as they are solved
    wave_tiles: tuple[int, int, int, int] = (4, 2, 4, 2)  # warps, stages of the forward; of the backward
    inverse_split: int = 1  # block rows of the diagonal-block inverses; 1 = doubling (``inverse.py``)
    backward_superblock: int = 0  # superblock rows of the (non-wavefront) backward; 0 = ``superblock``
    # register caps (Triton's ``maxnreg``; 0 = the compiler's choice) of the fused preparation launch and
    # of the forward wavefront: below 128 at 4 warps, four blocks fit on an SM instead of three
    prep_registers: int = 0
    wave_registers: int = 0

    def __post_init__(self) -> None:
        if self.chunk < 16 or self.chunk & (self.chunk - 1):
            raise ValueError(f"BlockConfig.chunk must be a power of two >= 16, got {self.chunk}")
        for name in ("row_tiles", "col_tiles"):
            tiles = getattr(self, name)
            if len(tiles) != 4 or any(size < 1 for size in tiles) or any(s & (s - 1) for s in tiles[:3]):
                raise ValueError(f"BlockConfig.{name} must be 4 positive ints (powers of two but the last), "
                                 f"got {tiles}")
        if self.superblock < self.chunk or self.superblock % self.chunk:
            raise ValueError(
                f"BlockConfig.superblock must be a positive multiple of chunk={self.chunk}, "
                f"got {self.superblock}"
            )
        if self.backward_superblock < 0 or self.backward_superblock % self.chunk:
            raise ValueError(f"BlockConfig.backward_superblock must be 0 or a positive multiple of "
                             f"chunk={self.chunk}, got {self.backward_superblock}")
        if self.value_split < 1:
            raise ValueError(f"BlockConfig.value_split must be >= 1, got {self.value_split}")
        if self.solve_keys and (self.solve_keys < 16 or self.solve_keys & (self.solve_keys - 1)):
            raise ValueError(f"BlockConfig.solve_keys must be 0 or a power of two >= 16, "
                             f"got {self.solve_keys}")
        if self.wave_forward not in ("", "full", "superblock"):
            raise ValueError(f"BlockConfig.wave_forward must be '', 'full' or 'superblock', "
                             f"got {self.wave_forward!r}")
        if self.inverse_split < 1 or self.inverse_split & (self.inverse_split - 1) \
                or self.chunk // self.inverse_split < 16:
            raise ValueError(f"BlockConfig.inverse_split must be a power of two leaving blocks of >= 16 rows "
                             f"(chunk={self.chunk}), got {self.inverse_split}")
        for name in ("prep_registers", "wave_registers"):
            regs = getattr(self, name)
            if regs and not 24 <= regs <= 255:
                raise ValueError(f"BlockConfig.{name} must be 0 (no cap) or in 24..255, got {regs}")
        if self.wave_defer < 1:
            raise ValueError(f"BlockConfig.wave_defer must be >= 1, got {self.wave_defer}")
        wave = self.wave_tiles
        if len(wave) != 4 or min(wave) < 1 or wave[0] & (wave[0] - 1) or wave[2] & (wave[2] - 1):
            raise ValueError(f"BlockConfig.wave_tiles must be 4 positive ints (warps powers of two), "
                             f"got {wave}")
        prep = self.prep_tiles
        if prep is not None and (len(prep) != 4 or prep[0] % self.chunk or min(prep) < 1
                                 or any(s & (s - 1) for s in prep[:3])):
            raise ValueError(f"BlockConfig.prep_tiles must be 4 positive ints (powers of two but the last) "
                             f"with rows a multiple of chunk={self.chunk}, got {prep}")

    @property
    def bwd_superblock(self) -> int:
        return self.backward_superblock or self.superblock

    @property
    def solve_tile(self) -> int:
        """Key tile of the forward solve's inner loop (row tile of the backward's)."""
        return self.solve_keys or self.chunk

    @property
    def prep(self) -> tuple[int, int, int, int]:
        """Tiles of the fused launch: its own if given, else the row kernels' with rows rounded to chunks."""
        if self.prep_tiles is not None:
            return self.prep_tiles
        rows, keys, warps, stages = self.row_tiles
        return (max(self.chunk, rows // self.chunk * self.chunk), keys, warps, stages)


def _env_tiles(text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    try:
        row_text, col_text = text.split(";")
        return tuple(int(x) for x in row_text.split(",")), tuple(int(x) for x in col_text.split(","))
    except ValueError as err:
        raise ValueError("TITAN_DELTA_DF_TILES must look like "
                         f"'rows,keys,warps,stages;keys,rows,warps,stages', got {text!r}") from err


_CONFIG_ENV = ("TITAN_DELTA_DF_SUPERBLOCK", "TITAN_DELTA_DF_VSPLIT", "TITAN_DELTA_DF_TILES",
               "TITAN_DELTA_DF_VARIANT")


def default_config(head_dim: int, value_dim: int, seq_len: int, variant: str = "") -> BlockConfig:
    """Tiles for the GPU (64-row chunks) and small ones for the CPU interpreter, where tests are tiny;
    then the opt-in ``variant`` (or, when it is empty, ``TITAN_DELTA_DF_VARIANT``) on top. Cached on
    everything it reads: the host time of an op call matters at small shapes (docs/benchmarks.md, run 14)."""
    env = tuple(os.environ.get(name) for name in _CONFIG_ENV)
    if not all(type(n) is int for n in (head_dim, value_dim, seq_len)):  # symbolic sizes (fake tensors)
        return _config.__wrapped__(head_dim, value_dim, seq_len, variant, interpreting(), env)
    return _config(head_dim, value_dim, seq_len, variant, interpreting(), env)


@functools.lru_cache(maxsize=256)
def _config(head_dim: int, value_dim: int, seq_len: int, variant: str, _interpreting: bool,
            env: tuple[str | None, ...]) -> BlockConfig:
    base = _base_config(head_dim, value_dim, seq_len)  # reads the same environment as the key
    return apply_variant(base, variant or env[-1] or "")


def _base_config(head_dim: int, value_dim: int, seq_len: int) -> BlockConfig:
    if interpreting():
        return BlockConfig(chunk=16, superblock=32, value_split=1, num_warps=4, num_stages=1,
                           row_tiles=(16, 16, 4, 1), col_tiles=(16, 16, 4, 1), fused_prep=True)
    env = os.environ.get("TITAN_DELTA_DF_SUPERBLOCK")
    # The backward's superblocks: best of {256, 512, 1024} on an H200 (docs/benchmarks.md, run 3): 256 at
    # T = 8192 (less sequential work per (b, h)), 512 at T = 2048. The forward's are twice as long since
    # its solves became wavefronts: each superblock costs two launches, and the host time of those set the
    # pace — at [2,8192,32,128] the forward took 4.53 ms on the host against 4.00 ms on the GPU with 256,
    # 1.64 against 4.09 with 512 (do_bench 4.16 ms; the default's 4.03-5.30 in three runs); at [8,2048,16,64]
    # 1.08 against 0.52 with 512, 0.82 against 0.51 with 1024 (run 14). Other lengths are untuned.
    backward_superblock = 256 if seq_len >= 8192 else 512
    superblock = int(env) if env else 2 * backward_superblock
    backward_superblock = 0 if env else backward_superblock
    split_env = os.environ.get("TITAN_DELTA_DF_VSPLIT")
    value_split = int(split_env) if split_env else max(1, triton.next_power_of_2(value_dim) // 64)
    width = max(head_dim, value_dim)
    chunk = 64 if width <= 128 else 32
    superblock = max(chunk, (superblock // chunk) * chunk)
    # measured on an H200 (docs/benchmarks.md): 128-row tiles for D = 128, 64-row tiles for D = 64
    row_tiles = (64, 64, 4, 3) if width <= 64 else (128, 64, 8, 3) if width <= 128 else (32, 32, 8, 1)
    col_tiles = row_tiles
    tiles_env = os.environ.get("TITAN_DELTA_DF_TILES")
    if tiles_env:
        row_tiles, col_tiles = _env_tiles(tiles_env)  # type: ignore[assignment]
    # One fused launch per superblock (normalisers, earlier-superblock sums, inverses) with 64-row, 4-warp
    # tiles: on an H200 (docs/benchmarks.md, run 4) this cut the forward at [2,8192,32,128] from 5.27 ms
    # (separate launches) to 4.15 ms, where 8-warp tiles took 7.09 ms; at [8,2048,16,64] 0.670 -> 0.597 ms
    # (with keepinv). Head dims above 128 keep the separate launches (the fused tiles are untried there).
    fused = width <= 128
    prep_tiles = (64, 64, 4, 3) if fused else None
    # Capped at 128 registers (154-160 uncapped) the preparation launch at D <= 64 fits 4 blocks per SM
    # instead of 3 and spills nothing (offline sm_90a compile, Triton 3.6, tools/bench/kernel_resources.py);
    # on an H200 its two launches at [8,2048,16,64] took 253 -> 243 µs and the forward's GPU time 0.450 ->
    # 0.442 ms (docs/benchmarks.md, run 29). At D = 128 it takes up to 218 registers: a cap would spill.
    prep_registers = 128 if fused and width <= 64 else 0
    # Wavefront solves (fourth session, docs/benchmarks.md runs 9-11, H200): inside each superblock of the
    # forward for D <= 128, [2,8192,32,128] fwd 4.105 -> 4.017 ms, fwd+bwd 19.473 -> 19.397 ms (run 11);
    # the backward as one wavefront launch for D <= 64 only, where [8,2048,16,64] went fwd 0.606 -> 0.524
    # ms and fwd+bwd 2.245 -> 2.011 ms (run 11) with 4 warps and 3 stages (8 warps: 0.622 / 2.129, run 10);
    # at D = 128 that backward was slower (21.95 against 19.46 ms, run 10).
    wave_forward = "superblock" if fused else ""
    wave_backward = width <= 64
    wave_tiles = (4, 3, 4, 3) if width <= 64 else (8, 2, 8, 2)
    if not fused:  # the separate launches keep one superblock size for both passes
        superblock, backward_superblock = backward_superblock or superblock, 0
    return BlockConfig(chunk=chunk, superblock=superblock, backward_superblock=backward_superblock,
                       value_split=value_split,
                       num_warps=4 if width <= 64 else 8, num_stages=2, row_tiles=row_tiles,
                       col_tiles=col_tiles, fused_prep=fused, prep_tiles=prep_tiles,
                       wave_forward=wave_forward, wave_backward=wave_backward, wave_tiles=wave_tiles,
                       prep_registers=prep_registers)


def _ints(text: str, count: int, token: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(":"))
    except ValueError:
        values = ()
    if len(values) != count:
        raise ValueError(f"variant token {token!r} needs {count} ':'-separated ints")
    return values


# token: the wavefront fields it sets
_WAVE_TOKENS = {"wave": {"wave_forward": "full", "wave_backward": True},
                "wavesb": {"wave_forward": "superblock"}, "wavebwd": {"wave_backward": True},
                "superblocks": {"wave_forward": "", "wave_backward": False},
                "waveinv": {"wave_forward": "superblock", "wave_inverse": True, "fused_prep": True}}
_INT_TOKENS = {"skeys": "solve_keys", "swarps": "num_warps", "chunk": "chunk", "sb": "superblock",
               "vsplit": "value_split", "defer": "wave_defer", "invsplit": "inverse_split",
               "bsb": "backward_superblock", "pregs": "prep_registers", "wregs": "wave_registers"}


def apply_variant(cfg: BlockConfig, spec: str) -> BlockConfig:
    """Opt-in variants as a comma list, e.g. ``"fused,keepinv,skeys=128"`` (docs/kernels_deltaformer.md):
    ``fused`` (one launch per superblock for normalisers, earlier-superblock sums and inverses),
    ``overlap`` (implies ``fused``: the sums over keys solved before the previous superblock run on a side
    stream while that superblock is solved),
    ``unfused`` (separate launches, the default before run 4 and above D = 128),
    ``keepinv`` (the backward reuses the forward's inverses), ``skeys=N`` (inner tile of the sequential
    solves), ``swarps=N`` (warps of the solves; the separate inverse launch takes at most 4),
    ``vsplit=N`` (value slices of the solves), ``chunk=N`` (diagonal block rows), ``sb=N`` (superblock rows
    of both passes), ``bsb=N`` (of the backward only), ``ptile=R:K:W:S`` (tiles of the fused launch; rows
    a multiple of chunk), ``wave``
    (both solves as one wavefront launch each, ``wavefront.py``),
    ``wavesb`` (the superblock forward with a wavefront inside each superblock, ``superblock_wave.py``),
    ``wavebwd`` (the backward as one wavefront launch), ``waveinv`` (``wavesb`` whose programs build
    their chunk's inverse before their first wait, so the preparation launch does not), ``superblocks``
    (no wavefront; the backward's superblocks for both passes),
    ``defer=N`` (key chunks a wavefront program takes one by one), ``wtile=W:S:W:S`` (warps and stages of
    the wavefront launches, forward then backward), ``invsplit=N`` (diagonal-block inverses by N×N blocks
    and block substitution instead of doubling, ``inverse.py``; chunk / N >= 16), ``pregs=N`` / ``wregs=N``
    (register caps of the fused preparation launch / the forward wavefront)."""
    changes: dict = {}
    for token in filter(None, (part.strip() for part in spec.split(","))):
        name, _, value = token.partition("=")
        if name in ("fused", "overlap", "keepinv") and not value:
            changes["keep_inverse" if name == "keepinv" else "fused_prep"] = True
            if name == "overlap":
                changes["overlap"] = True
        elif name == "unfused" and not value:
            changes.update(fused_prep=False, overlap=False)
        elif name in _WAVE_TOKENS and not value:
            changes.update(_WAVE_TOKENS[name])
            if name == "superblocks":  # the run 8 default: one superblock size, the backward's
                changes.update(superblock=cfg.bwd_superblock, backward_superblock=0)
        elif name == "wtile" and value:
            changes["wave_tiles"] = _ints(value, 4, token)
        elif name in _INT_TOKENS and value:
            changes[_INT_TOKENS[name]] = _ints(value, 1, token)[0]
        elif name == "ptile" and value:
            changes["prep_tiles"] = _ints(value, 4, token)
        else:
            raise ValueError(f"unknown DeltaFormer kernel variant token {token!r} in {spec!r}")
    if not changes:
        return cfg
    chunk = changes.get("chunk", cfg.chunk)
    superblock = changes.get("superblock", cfg.superblock)
    changes["superblock"] = max(chunk, superblock // chunk * chunk)
    if "superblock" in changes and "backward_superblock" not in changes:
        changes["backward_superblock"] = 0  # sb=N sets both passes unless bsb=N says otherwise
    if changes.get("backward_superblock", cfg.backward_superblock):
        bsb = changes.get("backward_superblock", cfg.backward_superblock)
        changes["backward_superblock"] = max(chunk, bsb // chunk * chunk)
    prep = changes.get("prep_tiles", cfg.prep_tiles)
    if prep is not None and "prep_tiles" not in changes and prep[0] % chunk:
        changes["prep_tiles"] = (chunk, *prep[1:])  # a larger chunk than the default tiles' rows
    return replace(cfg, **changes)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 products; bf16/fp16 products are exact in fp32 accumulation anyway."""
    return "ieee" if dtype == torch.float32 else "tf32"


def inverse_precision(dtype: torch.dtype) -> str:
    """Precision of the small fp32 products of the diagonal-block inverses and their application.

    For bf16/fp16 inputs plain tf32 measured the same errors as tf32x3 at a third of the cost (the
    inverse entries are bounded by 1: β P is row-substochastic); fp32 inputs get exact products."""
    env = os.environ.get("TITAN_DELTA_DF_INV_PREC")
    if env:
        return env
    return "ieee" if dtype == torch.float32 or interpreting() else "tf32"


def register_cap(max_registers: int) -> dict[str, int]:
    """Launch options for a register cap: none under the interpreter, which has no such option."""
    return {"maxnreg": max_registers} if max_registers and not interpreting() else {}


def log2_int(n: int) -> int:
    return int(math.log2(n))


def document_tables(cu_seqlens: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [T] first position and one-past-last position of each token's document, on the device."""
    bounds = cu_seqlens.to(torch.int64)
    positions = torch.arange(seq_len, device=bounds.device, dtype=torch.int64)
    doc = torch.searchsorted(bounds[1:], positions, right=True)
    doc_start = bounds[doc].to(torch.int32)
    doc_end = bounds[(doc + 1).clamp_max(bounds.numel() - 1)].to(torch.int32)
    return doc_start.contiguous(), doc_end.contiguous()


def new_buffer(
    shape: tuple[int, ...] | torch.Size, *, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """torch.empty, except under TITAN_DELTA_POISON=1 (tests) where it is NaN-filled, so any element a
    kernel forgets to write shows up in the comparison with the reference."""
    out = torch.empty(tuple(shape), device=device, dtype=dtype)
    if os.environ.get("TITAN_DELTA_POISON") == "1":
        out.fill_(float("nan"))
    return out
