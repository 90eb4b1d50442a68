"""The launch table of the chunked Gated DeltaProduct op: which kernel each stage runs, and how, per
(K, V, n_h, dtype, gate). This is the one place these choices are made; the stages take them as arguments
and launch through ``launch_stage``.

``docs/kernels_gated_delta_product.md`` ("Launch table") has the table in words and why each row is as it is;
the constants below carry the short reasons. "16-bit" means bf16 or fp16 inputs, which store W and U as fp16
with one power-of-two scale per row and δ, ∂L/∂δ in the input dtype; fp32 inputs keep everything in fp32 and
multiply with ``input_precision="tf32x3"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from titan_delta_kernels._launch import launch, next_power_of_2
from titan_delta_kernels.gated_delta_product._common import ChunkGeometry, SequenceLayout, chunk_geometry

NUM_WARPS = 4  # every kernel
STATE_BLOCK_V = 32  # both state passes: N·H·V/BV sequential programs, so narrow tiles give more of them
STATE_FWD_BLOCK_V_16BIT_SMALL_K = 64  # forward pass, 16-bit inputs, K <= 64
STATE_BWD_BLOCK_V_NH1 = 64  # reverse pass at n_h = 1: its 64 query rows need more shared memory per tile
LEAN_FWD_STAGES = 3
LEAN_S16_MIN_K = 128  # fp16 W·S in the short-loop forward pass from this K (slower below)
OUTPUT_BLOCK_V = 128  # every V tile recomputes the chunk's scores, so one tile covers V up to 128
TRANSPOSED_MAX_TOKENS = 32  # transposed output kernel where the token block is below a warp group's 64 rows
TRANSPOSED_NO_GATE_MIN_NH = 3  # without a gate it was slower at n_h = 2
GRAD_BLOCK_K = 64  # K slice of dqkw and wy_bwd: one slice at K <= 64, two at K = 128
GRAD_BLOCK_V = 64
DQKW_MAX_REGISTERS = 168  # dqkw at K <= 64, 64-step blocks: three blocks per SM instead of two
WY_BWD_STAGES_MULTI_SLICE = 3


@dataclass(frozen=True)
class GdpLaunch:
    """Every stage's kernel choice and launch parameters for one (K, V, n_h, dtype, gate)."""

    dot_precision: str  # tl.dot input_precision of every product
    sixteen_bit: bool  # 16-bit inputs: row-scaled fp16 W and U, 16-bit δ, dδ and direct dk
    wy_series: bool  # the UT transform on 64-step blocks (else the substitution kernel)
    wy_block_v: int
    state_fwd_block_v: int
    state_fwd_lean: bool
    state_fwd_s16: bool
    state_fwd_stages: int
    state_bwd_block_v: int
    state_bwd_lean: bool
    state_bwd_stages: int
    output_transposed: bool
    output_block_v: int
    grad_block_k: int
    grad_block_v: int
    dqkw_stages: int
    dqkw_max_registers: int | None
    wy_bwd_stages: int
    wy_bwd_hoisted: bool


def launch_table(K: int, V: int, num_householder: int, dtype: torch.dtype, gated: bool) -> GdpLaunch:
    """The launch of every stage; not cached (cheap, and Dynamo warns about lru_cache in a compiled step)."""
    sixteen = dtype != torch.float32
    geo = chunk_geometry(num_householder)
    block_steps, block_tokens = geo.block_steps, geo.block_tokens
    BK, PV = max(16, next_power_of_2(K)), max(16, next_power_of_2(V))
    general_stages = 3 if BK <= 64 else 2
    fwd_bv = min(STATE_FWD_BLOCK_V_16BIT_SMALL_K if sixteen and K <= 64 else STATE_BLOCK_V, PV)
    bwd_bv = min(STATE_BWD_BLOCK_V_NH1 if num_householder == 1 else STATE_BLOCK_V, PV)
    fwd_lean = BK == K and V % fwd_bv == 0
    bks, gbv = min(GRAD_BLOCK_K, BK), min(GRAD_BLOCK_V, PV)
    return GdpLaunch(
        dot_precision="tf32" if sixteen else "tf32x3",
        sixteen_bit=sixteen,
        wy_series=block_steps == 64,
        wy_block_v=min(128 if sixteen and block_steps == 64 else 64, PV),
        state_fwd_block_v=fwd_bv,
        state_fwd_lean=fwd_lean,
        state_fwd_s16=sixteen and K >= LEAN_S16_MIN_K,
        state_fwd_stages=LEAN_FWD_STAGES if fwd_lean else general_stages,
        state_bwd_block_v=bwd_bv,
        state_bwd_lean=sixteen and BK == K and V % bwd_bv == 0,
        state_bwd_stages=general_stages,
        output_transposed=block_tokens <= TRANSPOSED_MAX_TOKENS
        and (gated or num_householder >= TRANSPOSED_NO_GATE_MIN_NH),
        output_block_v=min(OUTPUT_BLOCK_V, PV),
        grad_block_k=bks,
        grad_block_v=gbv,
        dqkw_stages=1 if sixteen and K > 64 else 2,  # 2-3 stages miscompiled ∂L/∂W there (Triton 3.6)
        dqkw_max_registers=DQKW_MAX_REGISTERS if block_steps <= 64 and K <= 64 else None,
        wy_bwd_stages=WY_BWD_STAGES_MULTI_SLICE if bks < K else 2,
        wy_bwd_hoisted=bks >= K and gbv >= V,
    )


def launch_stage(kernel, grid: tuple, tensors: tuple, geo: ChunkGeometry, seqs: SequenceLayout, HKV: tuple,
                 g: torch.Tensor | None, tail: tuple = (), sequential: bool = False, **options):  # fmt: skip
    """Launches ``kernel`` on ``tensors``, the sequence layout's arguments (N and the search rounds only for
    per-chunk kernels, not ``sequential`` passes) and ``tail``, with the shared constexprs and ``options``."""
    H, K, V = HKV
    where = (seqs.cu_seqlens, seqs.chunk_offsets, seqs.tokens_per_sequence, seqs.chunks_per_sequence)
    if not sequential:
        where += (seqs.num_sequences, seqs.search_steps)
    launch(
        kernel, grid, *tensors, *where, *tail,
        H=H, K=K, V=V, NH=geo.num_householder, C=geo.tokens_per_chunk, BT=geo.block_steps,
        BC=geo.block_tokens, USE_G=g is not None, IS_VARLEN=seqs.is_varlen, num_warps=NUM_WARPS, **options,
    )  # fmt: skip
