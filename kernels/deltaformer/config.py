"""The launch table of the DeltaFormer kernels: every block size, warp count and path choice.

``width = max(D, Dv)`` and the sequence length pick every launch; nothing else changes one (the table and
its reasons: docs/kernels_deltaformer.md, "Launch table"). Under the CPU interpreter the same paths run
with 16-row chunks and tiles and short superblocks, so CPU tests cross their boundaries at small lengths.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from titan_delta_kernels._launch import next_power_of_2
from titan_delta_kernels.deltaformer._common import interpreting

MAX_HEAD_DIM = 128
FORWARD_SUPERBLOCK = 512  # rows per preparation launch + forward wavefront, 16-bit inputs on a GPU
WAVE_BACKWARD_SUPERBLOCK = 1024  # rows per backward wavefront launch from LONG_WAVE on (16-bit, GPU)
LONG_WAVE = 4096  # sequence length from which the wavefront backward runs superblock by superblock


@dataclass(frozen=True)
class LaunchConfig:
    chunk: int  # rows of a diagonal block: the unit of the solves and of their inverses
    superblock: int  # forward rows per preparation launch + wavefront solve
    backward_superblock: int  # backward rows per transposed-solve launch (superblock backward only)
    wave_backward: bool  # the backward solve as wavefronts, else superblock by superblock
    wave_backward_superblock: int  # rows per backward wavefront launch (0: all rows in one)
    tiles: tuple[int, int, int, int]  # rows, keys, warps, stages of the row and key (column) kernels
    prep: tuple[int, int, int, int]  # rows, keys, warps, stages of the preparation launch
    prep_registers: int  # register cap of the preparation launch (0: the compiler's choice)
    wave_forward_launch: tuple[int, int]  # warps, stages of the forward wavefront
    wave_backward_launch: tuple[int, int]  # warps, stages of the backward wavefront
    solve_launch: tuple[int, int]  # warps, stages of the superblock backward solve
    value_block: int  # value columns per program of the superblock backward solve


def launch_config(head_dim: int, value_dim: int, seq_len: int, fp32: bool = False) -> LaunchConfig:
    """The table's row for these sizes and input precision; cached, since the host time of a call matters at
    small shapes."""
    return _config(head_dim, value_dim, seq_len, fp32, interpreting())


@functools.lru_cache(maxsize=256)
def _config(head_dim: int, value_dim: int, seq_len: int, fp32: bool, cpu_interpreter: bool) -> LaunchConfig:
    width = max(head_dim, value_dim)
    if width > MAX_HEAD_DIM:
        raise ValueError(f"DeltaFormer kernels: D, Dv <= {MAX_HEAD_DIM}, got {head_dim}, {value_dim}")
    value_block = min(64, next_power_of_2(value_dim))
    small = width <= 64
    if cpu_interpreter:
        tiny = (16, 16, 4, 1)
        return LaunchConfig(chunk=16, superblock=64, backward_superblock=32, wave_backward=small,
                            wave_backward_superblock=32, tiles=tiny,
                            prep=tiny, prep_registers=0, wave_forward_launch=(4, 2),
                            wave_backward_launch=(4, 2), solve_launch=(4, 1), value_block=value_block)
    # Backward superblocks: shorter at long T (less sequential work per (b, h)). The forward's (16-bit
    # inputs) are FORWARD_SUPERBLOCK rows at every T: its wavefront recomputes the scores inside its
    # superblock, which the preparation's pass over earlier superblocks forms once, so shorter ones do less
    # work and wait along shorter chains.
    backward_superblock = 256 if seq_len >= 8192 else 512
    if fp32:
        # fp32 inputs are the accuracy path, where the first call's compile matters more than speed. Every
        # product is tf32x3 (an operand split and three MMAs): with the 16-bit launches below the kernels
        # spill and the set compiles several times longer. 16-row chunks and tiles take warp-level MMAs
        # (warp-group MMAs need 64 rows) whose loop-invariant operand splits fit in registers; one stage (no
        # software pipelining) cuts the code again, and the wavefront backward at every width is one kernel
        # where the superblock backward compiles four.
        return LaunchConfig(
            chunk=16,
            superblock=2 * backward_superblock,
            backward_superblock=backward_superblock,
            wave_backward=True,
            wave_backward_superblock=0,
            tiles=(16, 32, 4, 1),
            prep=(16, 32, 8, 1),  # 8 warps: no spill where 4 spill with the sums over earlier superblocks
            prep_registers=0,
            wave_forward_launch=(8, 1),  # 8 warps: no spill at D = 128, where 4 spill
            wave_backward_launch=(8, 1),
            solve_launch=(4, 1),  # unused (wavefront backward); kept valid should a width take superblocks
            value_block=value_block,
        )
    return LaunchConfig(
        chunk=64,
        superblock=FORWARD_SUPERBLOCK,
        backward_superblock=backward_superblock,
        # The wavefront backward wins at D <= 64; at D = 128 the superblock backward is faster.
        wave_backward=small,
        # One wavefront per (b, h) chains every chunk to the next, each chunk's program with a fixed cost
        # of its own: at long T the chain, not the arithmetic, sets the time. From LONG_WAVE on, superblocks
        # from the end: key launches sum the rows solved after each superblock over its keys (no chain),
        # and its wavefront streams only its own later chunks; at T = 2048 one launch stays faster
        # (docs/kernels_deltaformer.md, "Launch table").
        wave_backward_superblock=WAVE_BACKWARD_SUPERBLOCK if seq_len >= LONG_WAVE else 0,
        tiles=(64, 64, 4, 3) if small else (128, 64, 8, 3),
        prep=(64, 64, 4, 3),  # 4-warp tiles: 8 warps were slower at both widths
        # capped, 4 blocks per SM fit instead of 3 at D <= 64 without spilling; at D = 128 a cap would spill
        prep_registers=128 if small else 0,
        # uncapped at D <= 64 it takes 142-146 registers, 3 blocks per SM; capped at 128 for 4 it spilled and
        # ran slower
        wave_forward_launch=(4, 3) if small else (8, 2),
        wave_backward_launch=(4, 3),
        solve_launch=(4 if small else 8, 2),
        value_block=value_block,
    )


MIN_ROWS_PER_SPLIT = 4  # row tiles per split of the later-rows sum: fewer only adds slabs to sum
PROGRAMS_PER_SM = 2  # splits stop once the key programs times the splits fill the SMs this many times


def later_rows_splits(rows: int, row_tile: int, key_programs: int, device: torch.device) -> tuple[int, int]:
    """(splits, rows per split, a multiple of ``row_tile``) of a superblock's sum over ``rows`` later rows."""
    slots = PROGRAMS_PER_SM * _multiprocessors(device)
    splits = max(1, min(-(-rows // (MIN_ROWS_PER_SPLIT * row_tile)), -(-slots // key_programs)))
    per_split = -(-rows // splits)
    return splits, -(-per_split // row_tile) * row_tile


@functools.lru_cache(maxsize=16)
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda" or interpreting():
        return 4  # the interpreter: a few programs, so CPU tests split at small lengths
    return torch.cuda.get_device_properties(device).multi_processor_count
