"""Analytic HBM-traffic and matmul-FLOP model of each kernel stage — an estimate, not a measurement.

The benchmark divides measured stage times by these numbers (GB/s, TFLOP/s) so the bottleneck of each
stage is visible at a glance. Bytes count every tensor a stage reads or writes once: re-reads of the same
rows by the other V-tile programs of a (sequence, head) are assumed to hit L2, and the transposed second
loads of a tile (our way round ``tl.trans``) are not counted. FLOPs are the ``tl.dot`` work exactly as the
kernels issue it, at block sizes (padding included), counting the products that are duplicated only to
avoid ``tl.trans`` (also reported on their own) and not the element-wise or reduction work.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from titan_delta_kernels.gated_delta_product._common import chunk_geometry

STATE_BLOCK_V = 32  # mirrors state.STATE_BLOCK_V (not imported: the model must not need a GPU build)
STATE_FWD_BLOCK_V_ROW_SCALED = 64  # mirrors state.STATE_FWD_BLOCK_V_ROW_SCALED (forward pass, w16, K <= 64)
STATE_BWD_BLOCK_V_NH1 = 64  # mirrors state.STATE_BWD_BLOCK_V_NH1 (and state.STATE_BWD_BLOCK_V_PLANES)
OUTPUT_BLOCK_V = 128  # mirrors output.OUTPUT_BLOCK_V (V tile of output_fwd and dv_local)
FORWARD_STAGES = ("wy_fwd", "state_fwd", "output_fwd")
BACKWARD_STAGES = ("state_fwd", "dv_local", "state_bwd", "dqkw", "wy_bwd")  # state_fwd: recomputation


@dataclass(frozen=True)
class StageCost:
    """One kernel launch: bytes read/written per tensor, matmul FLOPs, and how it parallelises."""

    name: str
    reads: dict[str, int]
    writes: dict[str, int]
    flops: int
    duplicated_flops: int  # the part of ``flops`` that only exists to avoid tl.trans
    programs: int
    sequential_chunks: int  # chunks one program walks in order (0: one chunk per program)

    @property
    def bytes(self) -> int:
        return sum(self.reads.values()) + sum(self.writes.values())


def tensor_bytes(B: int, T: int, H: int, K: int, V: int, n_h: int, *, lowp: bool = False,
                 in_bytes: int = 2, w16: bool = False, lowp_safe: bool = False,
                 dkp16: bool = True) -> dict[str, int]:  # fmt: skip
    """Size of every tensor the chunked kernels touch (β in the input dtype, g and its gradient fp32).
    ``w16``: W and U in fp16 plus one fp32 scale per row; ``lowp_safe``: δ and the local ∂L/∂δ in the input
    dtype; ``dkp16`` (in the default): the direct dk in the input dtype."""
    geo = chunk_geometry(n_h)
    tok, step = B * T * H, B * T * n_h * H
    chunk_heads = B * triton.cdiv(T, geo.tokens_per_chunk) * H
    inter = in_bytes if lowp else 4
    wu, wu_scale = (2, 4) if w16 and not lowp else (inter, 0)
    small = in_bytes if lowp_safe else inter
    sizes = dict(
        q=tok * K * in_bytes, k=step * K * in_bytes, v=step * V * in_bytes, beta=step * in_bytes, g=tok * 4,
        t_inv=step * geo.block_steps * in_bytes, w=step * (K * wu + wu_scale), u=step * (V * wu + wu_scale),
        delta=step * V * small, states=chunk_heads * K * V * in_bytes, o=tok * V * in_bytes,
        d_out=tok * V * in_bytes, d_vlocal=step * V * small, d_delta=step * V * in_bytes,
        d_states=chunk_heads * K * V * in_bytes, dq=tok * K * in_bytes,
        dk_part=step * K * (in_bytes if dkp16 else inter),
        dw=step * K * in_bytes, dG_step=step * 4, dG_tok=tok * 4, dk=step * K * in_bytes,
        dv=step * V * in_bytes, dbeta=step * in_bytes, dg=tok * 4,
    )  # fmt: skip
    return sizes


def stage_costs(B: int, T: int, H: int, K: int, V: int, n_h: int, *, lowp: bool = False,
                in_bytes: int = 2, state_block_v: int | None = None,
                w_planes: bool = False, **storage: bool) -> dict[str, StageCost]:  # fmt: skip
    """Cost of each stage for a [B, T, H, K/V] problem (no varlen), keyed by kernel name. ``state_block_v``:
    the V tile of both state passes (None: their defaults); ``w_planes``: W as planes (same bytes as fp32 W,
    a 64-column V tile in the reverse pass by default); ``storage``: ``tensor_bytes``' dtype switches."""
    geo = chunk_geometry(n_h)
    s = tensor_bytes(B, T, H, K, V, n_h, lowp=lowp, in_bytes=in_bytes, **storage)
    BT, BC, BK = geo.block_steps, geo.block_tokens, max(16, triton.next_power_of_2(K))
    bv_chunk = min(OUTPUT_BLOCK_V, max(16, triton.next_power_of_2(V)))
    n_v = triton.cdiv(V, bv_chunk)
    chunk_heads = B * triton.cdiv(T, geo.tokens_per_chunk) * H
    row_scaled = storage.get("w16") and not lowp and K <= 64
    fwd_block_v = STATE_FWD_BLOCK_V_ROW_SCALED if row_scaled else STATE_BLOCK_V
    state_programs = B * H * triton.cdiv(V, min(state_block_v or fwd_block_v, V))
    bwd_block_v = state_block_v or (STATE_BWD_BLOCK_V_NH1 if n_h == 1 or w_planes else STATE_BLOCK_V)
    state_bwd_programs = B * H * triton.cdiv(V, min(bwd_block_v, V))
    walk = triton.cdiv(T, geo.tokens_per_chunk)

    def pick(*names: str) -> dict[str, int]:
        return {n: s[n] for n in names}

    def per_chunk(name, reads, writes, flops, dup=0, programs=chunk_heads, chunks=0) -> StageCost:
        return StageCost(name, pick(*reads), pick(*writes), flops * chunk_heads, dup * chunk_heads,
                         programs, chunks)  # fmt: skip

    mm = 2  # FLOPs per multiply-add
    costs = [
        per_chunk("wy_fwd", ("k", "v", "beta", "g"), ("t_inv", "w", "u"),
                  mm * (BT * BT * BK * 2 + BT * BT * V + (BT // 16) * BT**3)),
        per_chunk("state_fwd", ("k", "w", "u", "g"), ("states", "delta"), mm * 2 * BT * BK * V,
                  programs=state_programs, chunks=walk),
        per_chunk("output_fwd", ("q", "k", "delta", "states", "g"), ("o",),
                  mm * (n_v * BC * BT * BK + BC * BK * V + BC * BT * V), programs=chunk_heads * n_v),
        per_chunk("dv_local", ("q", "k", "d_out", "g"), ("d_vlocal",),
                  mm * (n_v * BT * BC * BK + BT * BC * V), programs=chunk_heads * n_v),
        per_chunk("state_bwd", ("q", "k", "w", "d_out", "d_vlocal", "g"), ("d_states", "d_delta"),
                  mm * (2 * BT * BK * V + BK * BC * V), programs=state_bwd_programs, chunks=walk),
        per_chunk("dqkw", ("q", "k", "delta", "states", "d_states", "d_delta", "d_out", "g"),
                  ("dq", "dk_part", "dw", "dG_step", "dG_tok"),
                  mm * (BC * V * BK + 2 * BC * V * BT + 2 * BT * V * BK + 3 * BC * BT * BK),
                  dup=mm * BT * V * BC),
        per_chunk("wy_bwd", ("k", "v", "beta", "g", "t_inv", "d_delta", "dw", "dk_part", "dG_step", "dG_tok"),
                  ("dk", "dv", "dbeta", "dg"),
                  mm * (3 * BT * BT * V + 6 * BT * BT * BK + 4 * BT**3),
                  dup=mm * (BT * BT * V + BT * BT * BK + 2 * BT**3)),
    ]  # fmt: skip
    return {c.name: c for c in costs}


def totals(costs: dict[str, StageCost], *, save_states: bool = False) -> dict[str, tuple[int, int]]:
    """(bytes, FLOPs) of the forward, of the backward (without its state pass when states are saved)
    and of both, from per-stage costs."""
    bwd = [n for n in BACKWARD_STAGES if not (save_states and n == "state_fwd")]
    out = {}
    for label, names in (("forward", FORWARD_STAGES), ("backward", bwd)):
        out[label] = (sum(costs[n].bytes for n in names), sum(costs[n].flops for n in names))
    out["fwd+bwd"] = tuple(a + b for a, b in zip(out["forward"], out["backward"], strict=True))
    return out


def flops_estimate(B: int, T: int, H: int, D: int, n_h: int, chunk_steps: int = 64) -> float:
    """Matmul FLOPs of one chunked forward (K = V = D): UT transform, state pass, outputs (C rows/chunk)."""
    steps = T * n_h
    per_step = 2 * chunk_steps * D * 3 + chunk_steps**2 / 3 + 2 * D * D * 2  # A, W, U; inverse; δ, S update
    per_token = 2 * D * D + 2 * chunk_steps * D * 2  # q S₀, scores, scores·δ (one query row per token)
    return B * H * (steps * per_step + T * per_token)


def print_model(B: int, T: int, H: int, D: int, n_h: int) -> None:
    """The cost model alone (no GPU): per-stage GB and GFLOP, default vs lowp, and the totals."""
    for lowp in (False, True):
        costs = stage_costs(B, T, H, D, D, n_h, lowp=lowp)
        print(f"\n# cost model [{B}, {T}, {H}, {D}] n_h={n_h} {'lowp' if lowp else 'default'} (estimates)")
        for c in costs.values():
            walk = f", {c.sequential_chunks} chunks in order" if c.sequential_chunks else ""
            print(f"- {c.name}: {c.bytes / 1e9:.3f} GB, {c.flops / 1e9:.1f} GFLOP (duplicated "
                  f"{c.duplicated_flops / 1e9:.1f}), {c.programs} programs{walk}")  # fmt: skip
        for save_states in (False, True):
            for label, (nbytes, flops) in totals(costs, save_states=save_states).items():
                print(f"- {label}{' (save_states)' if save_states else ''}: {nbytes / 1e9:.3f} GB, "
                      f"{flops / 1e9:.1f} GFLOP")  # fmt: skip
