"""The launch table of the chunked Gated DeltaProduct op: which kernel each stage runs, and how, per (K, V,
n_h, dtype, gate), the state passes' tiles also by the call's sequences × heads. This is the one place these
choices are made; the stages take them as arguments and launch through ``launch_stage``.

``docs/kernels_gated_delta_product.md`` ("Launch table") has the table in words and why each row is as it is;
the constants below carry the short reasons. "16-bit" means bf16 or fp16 inputs, which store W and U as fp16
with one power-of-two scale per row and δ, ∂L/∂δ in the input dtype; fp32 inputs keep everything in fp32 and
multiply with ``input_precision="tf32x3"``.

The 16-bit rows are tuned for speed. fp32 is the accuracy path and has its own rows (``_fp32_launch``), tuned
for a short cold compile instead (speed matters little there): a tf32x3 product splits both operands in two
and runs three MMAs, so the 16-bit rows' tiles, in fp32, spilled registers in most kernels and took more than
twice as long to compile. The CPU interpreter takes the same rows as a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from titan_delta_kernels._launch import launch, next_power_of_2
from titan_delta_kernels.gated_delta_product._common import ChunkGeometry, SequenceLayout, chunk_geometry

NUM_WARPS = 4  # every 16-bit kernel; fp32 state passes and gradient kernels
STATE_BLOCK_V = 32  # both state passes: N·H·V/BV sequential programs, so narrow tiles give more of them
# The state passes' tiles by the programs 32-column tiles give (sequences × heads × V/32), measured at
# K = 128, n_h = 2 (docs/kernels_gated_delta_product.md, "Launch table"; other K and n_h keep 32): below
# STATE_MIN_PROGRAMS (under half an H100's SMs: long context at batch 1) 16-column tiles, twice the
# programs; from STATE_WIDE_MIN_PROGRAMS (about two programs per SM at 64 columns: 340M at batch 16)
# 64-column tiles, half the programs, each reading its chunk's keys once for twice the columns.
STATE_NARROW_BLOCK_V = 16
STATE_MIN_PROGRAMS = 64
STATE_WIDE_BLOCK_V = 64
STATE_WIDE_MIN_PROGRAMS = 512
STATE_WIDE_FWD_STAGES = 2  # the short-loop forward pass at 64 columns: 3 stages were slower
STATE_FWD_BLOCK_V_16BIT_SMALL_K = 64  # forward pass, 16-bit inputs, K <= 64
STATE_BWD_BLOCK_V_NH1 = 64  # reverse pass at n_h = 1: its 64 query rows need more shared memory per tile
LEAN_FWD_STAGES = 3
LEAN_S16_MIN_K = 128  # fp16 W·S in the short-loop forward pass from this K (slower below)
OUTPUT_BLOCK_V = 256  # every V tile recomputes the chunk's scores, so one tile covers all of V (<= 256)
TRANSPOSED_MAX_TOKENS = 32  # transposed output kernel where the token block is below a warp group's 64 rows
TRANSPOSED_NO_GATE_MIN_NH = 3  # without a gate it was slower at n_h = 2
GRAD_BLOCK_K = 64  # K slice of dqkw and wy_bwd: one slice at K <= 64, two at K = 128
GRAD_BLOCK_V = 64
DQKW_MAX_REGISTERS = 168  # dqkw at K <= 64, 64-step blocks: three blocks per SM instead of two
WY_BWD_STAGES_MULTI_SLICE = 3
# fp32 inputs: each chosen by the offline sm_90 compile time and spills (tools/bench/kernel_resources.py)
FP32_WARPS = 8  # UT transform and output kernels, 32-token blocks and up: fewer spills, shorter compile
FP32_WY_BLOCK_V = 32
FP32_STATE_BLOCK_V = 16  # forward pass, and reverse pass at K > 64 (at 32 both spilled there)
FP32_OUTPUT_BLOCK_V = 32  # the direct output kernel (and dv_local with it)
FP32_OUTPUT_T_BLOCK_V = 64  # the transposed one: with 32 columns it spilled ~1 KB at K = 128
FP32_GRAD_BLOCK = 16  # dqkw's and wy_bwd's K slices and V tiles: wider ones spilled


@dataclass(frozen=True)
class GdpLaunch:
    """Every stage's kernel choice and launch parameters for one (K, V, n_h, dtype, gate, few programs)."""

    dot_precision: str  # tl.dot input_precision of every product
    sixteen_bit: bool  # 16-bit inputs: row-scaled fp16 W and U, 16-bit δ, dδ and direct dk
    wy_series: bool  # the UT transform on 64-step blocks (else the substitution kernel)
    wy_block_v: int
    wy_warps: int
    state_fwd_block_v: int
    state_fwd_lean: bool
    state_fwd_s16: bool
    state_fwd_stages: int
    state_bwd_block_v: int
    state_bwd_lean: bool
    state_bwd_stages: int
    output_transposed: bool
    output_block_v: int  # output_fwd's V tile and dv_local's
    output_warps: int
    grad_block_k: int
    grad_block_v: int
    grad_warps: int  # dqkw and wy_bwd
    dqkw_stages: int
    dqkw_max_registers: int | None
    wy_bwd_stages: int
    wy_bwd_hoisted: bool


def state_block_v(K: int, V: int, num_householder: int, sequence_heads: int | None) -> int:
    """The 16-bit state passes' value columns per program (both passes) where the program count decides
    them: ``sequence_heads`` (sequences × heads of the call; None: unknown) × V/STATE_BLOCK_V programs below
    STATE_MIN_PROGRAMS take STATE_NARROW_BLOCK_V, from STATE_WIDE_MIN_PROGRAMS STATE_WIDE_BLOCK_V, at the
    measured K = 128 and n_h = 2 with V a multiple of the tile (the lean kernels); else STATE_BLOCK_V."""
    if sequence_heads is None or K != 128 or num_householder != 2:
        return STATE_BLOCK_V
    programs = sequence_heads * -(-V // STATE_BLOCK_V)
    if programs < STATE_MIN_PROGRAMS and V % STATE_NARROW_BLOCK_V == 0:
        return STATE_NARROW_BLOCK_V
    if programs >= STATE_WIDE_MIN_PROGRAMS and V % STATE_WIDE_BLOCK_V == 0:
        return STATE_WIDE_BLOCK_V
    return STATE_BLOCK_V


def launch_table(
    K: int, V: int, num_householder: int, dtype: torch.dtype, gated: bool, sequence_heads: int | None = None
) -> GdpLaunch:
    """The launch of every stage; not cached (cheap, and Dynamo warns about lru_cache in a compiled step).
    16-bit inputs here, fp32 in ``_fp32_launch``. ``sequence_heads`` (sequences × heads) selects the state
    passes' tiles by their program count (``state_block_v``); everything else depends on the other
    arguments."""
    if dtype == torch.float32:
        return _fp32_launch(K, V, num_householder, gated)
    geo = chunk_geometry(num_householder)
    block_steps, block_tokens = geo.block_steps, geo.block_tokens
    BK, PV = max(16, next_power_of_2(K)), max(16, next_power_of_2(V))
    general_stages = 3 if BK <= 64 else 2
    state_bv = state_block_v(K, V, num_householder, sequence_heads)
    lean_fwd_stages = STATE_WIDE_FWD_STAGES if state_bv == STATE_WIDE_BLOCK_V else LEAN_FWD_STAGES
    fwd_bv = min(STATE_FWD_BLOCK_V_16BIT_SMALL_K if K <= 64 else state_bv, PV)
    bwd_bv = min(STATE_BWD_BLOCK_V_NH1 if num_householder == 1 else state_bv, PV)
    fwd_lean = BK == K and V % fwd_bv == 0
    bks, gbv = min(GRAD_BLOCK_K, BK), min(GRAD_BLOCK_V, PV)
    return GdpLaunch(
        dot_precision="tf32",
        sixteen_bit=True,
        wy_series=block_steps == 64,
        # the series kernel scales each row of U by its largest entry, so one tile holds all of V
        wy_block_v=PV if block_steps == 64 else min(64, PV),
        wy_warps=NUM_WARPS,
        state_fwd_block_v=fwd_bv,
        state_fwd_lean=fwd_lean,
        state_fwd_s16=K >= LEAN_S16_MIN_K,
        state_fwd_stages=lean_fwd_stages if fwd_lean else general_stages,
        state_bwd_block_v=bwd_bv,
        state_bwd_lean=BK == K and V % bwd_bv == 0,
        state_bwd_stages=general_stages,
        output_transposed=_output_transposed(block_tokens, num_householder, gated),
        output_block_v=min(OUTPUT_BLOCK_V, PV),
        output_warps=NUM_WARPS,
        grad_block_k=bks,
        grad_block_v=gbv,
        grad_warps=NUM_WARPS,
        dqkw_stages=1 if K > 64 else 2,  # 2-3 stages miscompiled ∂L/∂W there (Triton 3.6)
        dqkw_max_registers=DQKW_MAX_REGISTERS if block_steps <= 64 and K <= 64 else None,
        wy_bwd_stages=WY_BWD_STAGES_MULTI_SLICE if bks < K else 2,
        wy_bwd_hoisted=bks >= K and gbv >= V,
    )


def _output_transposed(block_tokens: int, num_householder: int, gated: bool) -> bool:
    return block_tokens <= TRANSPOSED_MAX_TOKENS and (gated or num_householder >= TRANSPOSED_NO_GATE_MIN_NH)


def _fp32_launch(K: int, V: int, num_householder: int, gated: bool) -> GdpLaunch:
    """fp32 inputs: every product tf32x3, everything stored in fp32, launches chosen for compile time (narrow
    tiles, 8 warps in the UT transform and output kernels, no software pipelining in the gradient kernels)."""
    geo = chunk_geometry(num_householder)
    BK, PV = max(16, next_power_of_2(K)), max(16, next_power_of_2(V))
    general_stages = 3 if BK <= 64 else 2
    fwd_bv = min(FP32_STATE_BLOCK_V, PV)
    fwd_lean = BK == K and V % fwd_bv == 0
    transposed = _output_transposed(geo.block_tokens, num_householder, gated)
    # 8 warps over 16-token blocks (n_h = 4) made illegal memory accesses on an H100 (Triton 3.6)
    chunk_warps = FP32_WARPS if geo.block_tokens >= 32 else NUM_WARPS
    return GdpLaunch(
        dot_precision="tf32x3",
        sixteen_bit=False,
        # The substitution kernel at every block size: the series kernel spilled ~1.5 KB per thread with
        # tf32x3 (its 16-step inverses and Horner products) and compiled markedly slower.
        wy_series=False,
        wy_block_v=min(FP32_WY_BLOCK_V, PV),
        wy_warps=chunk_warps,
        state_fwd_block_v=fwd_bv,
        state_fwd_lean=fwd_lean,
        state_fwd_s16=False,
        state_fwd_stages=LEAN_FWD_STAGES if fwd_lean else general_stages,
        # The reverse pass keeps 4 warps and at least 2 stages: 8 warps (at 32 columns) and 1 stage (at 16
        # or 32 columns) broke it on an H200 (Triton 3.6: illegal memory access, NaN), while 16 columns with
        # 2 stages ran right there. Where K <= 64, 32 columns (as the 16-bit rows at n_h >= 2) hardly spill.
        state_bwd_block_v=min(STATE_BLOCK_V if K <= 64 else FP32_STATE_BLOCK_V, PV),
        state_bwd_lean=False,
        state_bwd_stages=general_stages,
        output_transposed=transposed,
        output_block_v=min(FP32_OUTPUT_T_BLOCK_V if transposed else FP32_OUTPUT_BLOCK_V, PV),
        output_warps=chunk_warps,
        grad_block_k=min(FP32_GRAD_BLOCK, BK),
        grad_block_v=min(FP32_GRAD_BLOCK, PV),
        # 4 warps: at 8, dqkw and wy_bwd made illegal memory accesses on an H100 (Triton 3.6)
        grad_warps=NUM_WARPS,
        # No software pipelining in the gradient kernels: it compiled slower, and 2-3 stages of dqkw's δ loop
        # miscompiled with 16-bit δ (Triton 3.6).
        dqkw_stages=1,
        dqkw_max_registers=None,  # 8 warps need ~200 registers; a cap would spill
        wy_bwd_stages=1,
        wy_bwd_hoisted=False,  # it needs one K slice and one V tile: K, V <= 16 only; one kernel instead
    )


def launch_stage(kernel, grid: tuple, tensors: tuple, geo: ChunkGeometry, seqs: SequenceLayout, HKV: tuple,
                 g: torch.Tensor | None, tail: tuple = (), sequential: bool = False,
                 num_warps: int = NUM_WARPS, **options):  # fmt: skip
    """Launches ``kernel`` on ``tensors``, the sequence layout's arguments (N and the search rounds only for
    per-chunk kernels, not ``sequential`` passes) and ``tail``, with the shared constexprs and ``options``."""
    H, K, V = HKV
    where = (seqs.cu_seqlens, seqs.chunk_offsets, seqs.tokens_per_sequence, seqs.chunks_per_sequence)
    if not sequential:
        where += (seqs.num_sequences, seqs.search_steps)
    launch(
        kernel, grid, *tensors, *where, *tail,
        H=H, K=K, V=V, NH=geo.num_householder, C=geo.tokens_per_chunk, BT=geo.block_steps,
        BC=geo.block_tokens, USE_G=g is not None, IS_VARLEN=seqs.is_varlen, num_warps=num_warps, **options,
    )  # fmt: skip
