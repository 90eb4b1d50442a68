"""Variant strings of the chunked Gated DeltaProduct kernels: algorithms and launch parameters.

A variant is a '+'- or ','-joined list of tokens, e.g. ``save_states+lowp+fastwy+sbv=64+gwarps=4``. A string
that names flags gets exactly those; ``default`` (or an empty string) means ``DEFAULT_FLAGS`` and
``plain`` means no flag (fp32 intermediates, states recomputed in the backward: the default before the
2026-11-21 H200 runs). ``default`` and ``plain`` combine with launch keys (``default+sbv=64``).
Flags switch on alternative algorithms (``chunk.py`` / ``wy_fast.py`` say what each does); ``key=value``
tokens override a launch parameter, so a GPU sweep can try configurations without code edits. The parsed
form travels through the custom ops as its canonical text (a schema-friendly ``str``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

FLAGS = ("save_states", "lowp", "fastwy", "lowp_safe", "lowp_state", "bf16x3", "kslice", "wyseries",
         "wplanes", "ws16", "kd16", "wd16", "dkp16", "w16", "sflean", "sfs16", "sbw16",
         "otrans", "wyhoist")
# save_states is bitwise the plain path and measured 5.943 -> 5.543 ms fwd+bwd at [4,4096,16,128], n_h = 2, on
# an H200 (docs/benchmarks.md, 2026-11-21). lowp (3.867 ms with save_states) stays opt-in: as the default
# it failed 3 of the default path's GPU tests at the tolerances (K = 64 without gate at n_h = 2
# and 4, gates near 1), although its own K = V = 128 test passed.
# Since the fifth session the default adds fastwy (with 2 warps, its own default) and bf16x3: all 15 GPU tests
# of the default path passed with them (test_gated_delta_product_triton.py, H200, 2026-11-21 19:42 UTC), and
# ours-only fwd+bwd went 5.530 -> 4.632 ms at [4,4096,16,128], n_h = 2 (docs/benchmarks.md, 18:53 UTC).
DEFAULT_FLAGS = ("save_states", "fastwy", "bf16x3", "kslice", "wyseries", "dkp16", "w16", "lowp_safe",
                 "sflean", "sfs16", "sbw16", "otrans", "wyhoist")
# wyhoist (default since the fourteenth session; acts where K, V <= 64): wy_bwd with every load issued
# before its first product (wy_bwd_hoisted.py). H200, wy_bwd at [8,2048,16,64]: 0.715 -> 0.630 ms (n_h = 3),
# 0.441 -> 0.396 (n_h = 2), 0.226 -> 0.222 (n_h = 1); its 8 GPU tests passed (docs/benchmarks.md, GDP,
# fourteenth session).
# lowp_safe: lowp's bf16 storage of δ and of the backward's ∂L/∂δ, direct dk and ∂L/∂W (~70% of lowp's saved
# bytes by cost.py), but W and U stay fp32, and with them the state passes' products (tf32). The CPU emulation
# (tools/gdp_lowp_error.py; docs, "lowp error budget") puts lowp's excess error of o and of the final state
# in the forward state pass; with lowp_safe the final state is the default's and o stays ~20% inside the
# tolerance in the 3 tests lowp failed. Its four GPU tests passed on an H200 (docs/benchmarks.md, 2026-11-21
# 18:24 UTC). (∂L/∂δ and ∂L/∂W are now stored in k's dtype by every variant: ninth session.) In the default
# since the eleventh session (with w16, below): what it still stores in 16 bits (δ and the local ∂L/∂δ)
# took fwd+bwd 3.259 -> 3.198 ms at [4,4096,16,128], n_h = 2 and 2.447 -> 2.296 ms at [8,2048,16,64], n_h = 3
# on an H200, and the default path's tests and lowp's three failed configurations passed with it (GPU,
# docs/benchmarks.md, GDP, eleventh session).
# lowp_state: W and U stay fp32 (stored as by default), only state_bwd's product Wᵀ·dδ takes operands rounded
# to the input dtype in registers (fp32 accumulation). lowp's 3.4x faster state_bwd (1.226 -> 0.357 ms on an
# H200 at [4,4096,16,128], n_h = 2) came from this product's operand layout, not from bytes: a tf32 wgmma
# needs fp32 Wᵀ steps-contiguous in shared memory, and the pipeliner transposes it with 4-byte cp.async
# (state.WT_MODES; docs, "Why lowp's state_bwd is fast"). It rounds nothing in the forward, so o and the final
# state are the default's; the CPU emulation keeps every gradient well inside the GPU tolerances where lowp
# failed. bf16x3: the same layout fix at no precision cost: Wᵀ·dδ as three bf16 products (hi·hi + hi·lo +
# lo·hi, ~2^-16 relative, tighter than tf32). H200, state_bwd at [4,4096,16,128], n_h = 2: 0.456 ms
# (lowp_state) and 0.622 ms (bf16x3), against 1.224; both passed lowp_safe's 4 GPU accuracy tests. bf16x3 is
# in the default (below); lowp_state (faster, but rounds) stays opt-in, as does lowp (W already 16-bit).
# kslice: the backward's two per-chunk gradient kernels with the head dim K streamed in 64-column slices
# (grads_sliced.py), same results up to fp32 rounding. grads.py's kernels take 255 registers per thread at
# K = 128 (one 8-warp block per SM). In the default since the sixth session: on an H200 its 4 GPU tests
# passed and fwd+bwd at [4,4096,16,128] went 4.653 -> 4.023 ms (n_h = 2) and 6.931 -> 5.943 ms (n_h = 3),
# at [8,2048,16,64] 2.716 -> 1.954 ms (n_h = 2) and 4.132 -> 2.955 ms (n_h = 3), with 4 warps
# (grads_sliced.KSLICE_NUM_WARPS; docs/benchmarks.md, 22:16 UTC).
# wyseries (default since the eighth session): the UT transform on [64, 64] tiles (wy_series.py) instead of
# fastwy's 16×16 ones, which every warp holds whole (255 registers and spills at 2 warps, 12.5% occupancy).
# H200 (docs/benchmarks.md, GDP 02:50 UTC): the transform 0.501 -> 0.310 ms at [8,2048,16,64], n_h = 2, and
# 0.967 -> 0.708 ms at [4,4096,16,128], n_h = 3; its GPU tests passed at the tolerances.
# wplanes (ninth session, opt-in): W stored as two 16-bit planes, hi = W rounded and lo = W − hi rounded
# (state.split_planes; same bytes as fp32 W), for 16-bit inputs without lowp. The reverse pass loads bf16x3's
# halves instead of splitting fp32 W in registers (the same products) on 64-column V tiles: state_bwd 0.584 ->
# 0.466 ms at [4,4096,16,128], n_h = 2. But the forward got slower (the state pass adds the planes back to
# fp32; as three 16-bit products it was slower still), and fwd+bwd went 3.315 -> 3.383 ms at that shape and
# 4.975 -> 5.219 ms at n_h = 3 (H200, docs/benchmarks.md, GDP 05:10 UTC, ninth session): opt-in.
# ws16 / kd16 / wd16 (tenth session, opt-in): the state passes' W·S, Kᵀδ and Wᵀ·dδ with fp16 operands, each
# row of the first and column of the second scaled by a power of two (_common.scaled_f16): tf32's 11-bit
# significands at half the bytes. The GPU tests passed, but the scales' reductions sit on each chunk's
# critical path: on an H200 state_fwd went 0.430 -> 0.623 ms (ws16), 0.648 (kd16), 0.828 (both) at
# [4,4096,16,128], n_h = 2, and wd16's state_bwd was level there (0.584 -> 0.578) and slower at n_h = 3
# (0.760 -> 0.852 ms) (docs/benchmarks.md, GDP, tenth session). ws16 needs fp32 W: with w16 (in the default
# since the eleventh session) W·S is the row-scaled tf32 product, so ws16 is `default` without w16 plus ws16.
# dkp16 (default since the tenth session): dqkw's direct dk, which wy_bwd adds to its own dk terms in fp32, is
# stored in k's dtype instead of fp32 (dk moves by ~2.4e-3 relative, a bf16 rounding). On an H200 fwd+bwd went
# 3.311 -> 3.259 ms at [4,4096,16,128] n_h = 2, 4.982 -> 4.822 ms at n_h = 3, 1.669 -> 1.569 ms at
# [8,2048,16,64] n_h = 2; the default path's 15 GPU tests and dkp16's own 7 passed (docs/benchmarks.md, GDP,
# tenth session).
# w16 (eleventh session): W and U stored in fp16 with one power-of-two scale per row (_common.row_scaled_f16),
# for 16-bit inputs: half the bytes of fp32 W and U through the transform, both state passes and the saved
# activations. W meets S in a tf32 product, whose operand keeps 11 significant bits, fp16's own: the product
# is the default's (up to ties and rows' entries 2^28 below their largest). U enters δ = U − W S, which every
# reader rounds to 11 bits (tf32) or less; fp16 adds 2^-12 of U, an eighth of the bf16 rounding of T diag(β)
# before it meets V. No reduction joins a chunk's critical path (unlike ws16): the scales come from the
# transform, which runs in parallel over chunks. In the default since the eleventh session, with lowp_safe.
# H200, fwd+bwd: [4,4096,16,128] n_h = 2 3.259 (default before) / 3.190 (w16) / 3.198 (lowp_safe) / 3.071 ms
# (both), n_h = 3 4.813 / 4.820 / 4.757 / 4.660 ms; the transform 0.482 -> 0.442 ms and the reverse pass
# 0.583 -> 0.484 ms, while the forward pass got slower at 32 columns (0.431 -> 0.493 ms: W is widened in
# registers), hence its 64-column tiles at K <= 64 (state.STATE_FWD_BLOCK_V_ROW_SCALED).
# sflean, sfs16, sbw16, otrans (twelfth session, in the default). sflean: the forward state pass with a short
# chunk loop (state_lean.py: int32 tile offsets built once, unmasked full chunks, each product issued before
# the work that does not need it; bitwise the general kernel) and 3 pipeline stages. sfs16 (from K = 128):
# its W·S in fp16, W as stored by w16 and the state scaled per column (scaled_f16): tf32's 11 bits, half the
# chained MMA steps, no widening of W. sbw16: the reverse pass's short loop (state_bwd_lean.py) with Wᵀ·dδ as
# one fp16 product (bf16x3's three before), for row-scaled W. otrans (n_h >= 2 with a gate, n_h >= 3
# without): the output kernel transposed, so that its products are warp-group MMAs
# (output.TRANSPOSED_MAX_TOKENS). H200, fwd+bwd ours only: [4,4096,16,128] n_h = 3 4.542 -> 4.351 ms, n_h = 2
# 3.015 -> 2.881, n_h = 1 1.937 -> 1.832; the default path's 15 GPU tests, lowp's failed configurations and
# the far-from-unit-scale checks passed (docs/benchmarks.md, GDP, twelfth session). Without a gate otrans gave
# wrong o (first an illegal memory access) at [2,301,4,64], n_h = 2: a product chained into another's
# accumulator, fixed by the reverse chain in the fourteenth session (output.py). The lean reverse pass's
# bf16x3 product gave wrong dk there too (not revisited): that case takes the general kernel.
# wyhoist (thirteenth session; measured on an H200 and in the default since the fourteenth): with kslice,
# where K and V fit one slice and one V tile (K, V <= 64), wy_bwd runs ``wy_bwd_hoisted.py``: the sliced
# kernel's products in the same order (bitwise its results on the CPU), every global load issued before the
# first product instead of phase by phase. Offline sm_90a compile: docs/kernels_gated_delta_product.md,
# "Thirteenth session".
# key -> (GdpOptions field, allowed values)
LAUNCH_KEYS: dict[str, tuple[str, tuple[int, ...]]] = {
    "sbv": ("state_block_v", (16, 32, 64, 128)),  # V-tile of both sequential state passes
    "swarps": ("state_warps", (2, 4, 8)),  # warps of both state passes
    "sstages": ("state_stages", (1, 2, 3)),  # software-pipelining depth of the state passes' chunk loop
    "sfstages": ("state_fwd_stages", (1, 2, 3, 4)),  # the forward state pass's alone (over sstages)
    "sbstages": ("state_bwd_stages", (1, 2, 3, 4)),  # the reverse state pass's alone (over sstages)
    "wywarps": ("wy_warps", (1, 2, 4, 8)),  # warps of the forward UT transform (wy_fwd, fastwy or wyseries)
    "gwarps": ("grad_warps", (2, 4, 8)),  # warps of the gradient kernels dqkw and wy_bwd (both variants)
    "wystages": ("wy_bwd_stages", (1, 2, 3)),  # kslice only: software-pipelining depth of wy_bwd's loops
    "wybk": ("wy_bwd_block_k", (16, 32, 64)),  # kslice only: wy_bwd's own K-slice width
    "gregs": ("grad_max_registers", (0, 128, 160, 168, 192)),  # kslice only: register cap, 0 = none
    "dqregs": ("dqkw_max_registers", (0, 128, 160, 168, 192)),  # kslice only: dqkw's alone (over gregs)
    # kslice only: dqkw's K-slice width. Offline (sm_90, Triton 3.6, K = 128, n_h = 2) 32 columns take dqkw
    # from 255 registers + 80 B of spill and 80 KB of shared memory to 186 registers, no spill, 48 KB; with
    # dqregs=168 3 blocks fit per SM instead of 2. Yet on an H200 `dqbk=32+dqregs=168` was slower everywhere
    # (fwd+bwd 3.865 -> 4.244 ms at [4,4096,16,128], n_h = 2; docs/benchmarks.md, GDP 04:20 UTC, ninth
    # session): opt-in.
    "dqbk": ("dqkw_block_k", (16, 32, 64)),
    # output_fwd's K slice (default: all of K in one), its V tile and dv_local's (default 128: output.py)
    "obk": ("output_block_k", (16, 32, 64, 128)),
    "obv": ("output_block_v", (32, 64, 128)),
    "dbv": ("dv_local_block_v", (32, 64, 128)),
}
# Launch combinations that broke an H200 run: refused here, so a training run cannot select them.
KNOWN_BAD = {
    (("state_block_v", 32), ("state_warps", 8)): "state_bwd with BV=32 and 8 warps hit a CUDA illegal memory "
    "access on an H200 (Triton 3.6), which poisons the CUDA context",
    (("state_block_v", 16), ("state_stages", 1)): "state_bwd with BV=16 and 1 stage returned NaN on an H200 "
    "(Triton 3.6, K = 128, n_h = 1, 2026-11-22 02:16 UTC probe) where 2 stages are bitwise the default",
    (("state_block_v", 32), ("state_stages", 1)): "state_bwd with BV=32 and 1 stage hit a CUDA illegal "
    "memory access on an H200 (Triton 3.6, K = 64, 2026-11-22 sweep; K = 128, n_h = 2, 02:16 UTC probe), "
    "which poisons the CUDA context, and returned NaN at K = 128, n_h = 1",
}
STATE_BLOCK_V_DEFAULT = 32  # mirrors state.STATE_BLOCK_V (this module must import without Triton)


@dataclass(frozen=True)
class GdpOptions:
    """Switched-on flags and launch overrides (None: the kernel's default)."""

    save_states: bool = False
    lowp: bool = False
    fastwy: bool = False
    lowp_safe: bool = False
    lowp_state: bool = False
    bf16x3: bool = False
    kslice: bool = False
    wyseries: bool = False
    wplanes: bool = False
    ws16: bool = False
    kd16: bool = False
    wd16: bool = False
    dkp16: bool = False
    w16: bool = False
    sflean: bool = False
    sfs16: bool = False
    sbw16: bool = False
    otrans: bool = False
    wyhoist: bool = False
    state_block_v: int | None = None
    state_warps: int | None = None
    state_stages: int | None = None
    state_fwd_stages: int | None = None
    state_bwd_stages: int | None = None
    wy_warps: int | None = None
    grad_warps: int | None = None
    wy_bwd_stages: int | None = None
    wy_bwd_block_k: int | None = None
    grad_max_registers: int | None = None
    dqkw_max_registers: int | None = None
    dqkw_block_k: int | None = None
    output_block_k: int | None = None
    output_block_v: int | None = None
    dv_local_block_v: int | None = None

    def text(self) -> str:
        """Canonical variant string ('plain' when no flag is on); parses back to ``self``."""
        parts = [f for f in FLAGS if getattr(self, f)] or ["plain"]
        parts += [f"{key}={getattr(self, name)}" for key, (name, _) in LAUNCH_KEYS.items()
                  if getattr(self, name) is not None]  # fmt: skip
        return "+".join(parts)

    def wt_mode(self) -> int:
        """state_bwd's Wᵀ·dδ operands (state.WT_MODES) for fp32 W: 4 wd16, 1 lowp_state, 3 bf16x3, else 0."""
        return 4 if self.wd16 else 1 if self.lowp_state else 3 if self.bf16x3 else 0

    def fwd16(self) -> int:
        """state_fwd's scaled-fp16 products (its ``FWD16`` bits): 1 W·S (ws16), 2 Kᵀδ (kd16)."""
        return int(self.ws16) + 2 * int(self.kd16)

    def launch_text(self) -> str:
        """The part the custom ops need besides save_states and lowp (their own arguments)."""
        return GdpOptions(**{f.name: getattr(self, f.name) for f in fields(self)
                             if f.name not in ("save_states", "lowp")}).text()  # fmt: skip


def split_tokens(text: str) -> set[str]:
    """The tokens of a variant string, with ``default`` (also implied when no flag is named and ``plain``
    is absent) expanded to ``DEFAULT_FLAGS``."""
    names = {part.strip() for part in text.replace(",", "+").split("+")} - {""}
    if "plain" in names:
        return names - {"plain", "default"}
    if "default" in names or not names & set(FLAGS):
        names |= set(DEFAULT_FLAGS)
    return names - {"default"}


def check_tokens(names: set[str]) -> None:
    """Raises ValueError naming every unknown flag or key, or a value out of range."""
    unknown, bad = [], []
    for name in sorted(names):
        key, eq, value = name.partition("=")
        if not eq:
            if name not in FLAGS:
                unknown.append(name)
        elif key not in LAUNCH_KEYS:
            unknown.append(name)
        elif not value.isdigit() or int(value) not in LAUNCH_KEYS[key][1]:
            bad.append(f"{name} (allowed: {LAUNCH_KEYS[key][1]})")
    if unknown:
        raise ValueError(f"unknown Gated DeltaProduct variant(s) {unknown}; choose from flags {FLAGS} "
                         f"and keys {tuple(k + '=N' for k in LAUNCH_KEYS)}")  # fmt: skip
    if bad:
        raise ValueError(f"bad Gated DeltaProduct launch value(s): {', '.join(bad)}")


def parse_options(text: str) -> GdpOptions:
    """Variant string -> GdpOptions (validated, including the known-bad launch combinations). Not cached:
    it is cheap, and Dynamo would warn about an lru_cache wrapper in a compiled step."""
    names = split_tokens(text)
    check_tokens(names)
    values: dict[str, object] = {f: f in names for f in FLAGS}
    for name in names:
        key, eq, value = name.partition("=")
        if eq:
            values[LAUNCH_KEYS[key][0]] = int(value)
    opts = GdpOptions(**values)
    # Every known-bad combination broke the reverse pass, so its own stage count is the one checked.
    effective = dict(state_block_v=opts.state_block_v or STATE_BLOCK_V_DEFAULT, state_warps=opts.state_warps,
                     state_stages=opts.state_bwd_stages or opts.state_stages)  # fmt: skip
    for combo, why in KNOWN_BAD.items():
        if all(effective.get(name) == value for name, value in combo):
            raise ValueError(f"variant {text!r} is refused: {why}")
    return opts
