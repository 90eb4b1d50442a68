"""CPU emulation of the chunked Gated DeltaProduct kernels' rounding: which bf16 intermediate of ``lowp``
costs how much accuracy (docs/kernels_gated_delta_product.md, "lowp error budget").

    python tools/gdp_lowp_error.py                       # the three failing GPU configurations + control
    python tools/gdp_lowp_error.py --configs nogate_nh2 --seeds 0,1,2,3
    python tools/gdp_lowp_error.py --check               # the emulator without rounding == fp64 autograd

This is a PyTorch transcription, in float64, of every stage of ``kernels/gated_delta_product`` (wy_fwd,
state_fwd, output_fwd, dv_local, state_bwd, dqkw, wy_bwd), forward *and* backward, with the kernels' own
formulas (not autograd), so each rounding sits where the kernels put it:

* ``always`` roundings (both paths): T stored in bf16, T·diag(β) and T·diag(βe^G) rounded to bf16 before
  meeting K and V, chunk states and their gradients stored in bf16, every product whose operands are bf16
  in both paths (scores for dv_local and dqkw, δ/dδ/dO in dqkw, all of wy_bwd), o/dq/dk/dv stored in bf16.
* ``lowp`` sites (bf16 only with ``lowp``; fp32 storage or a tf32 product otherwise), see ``SITES``.
* tl.dot of bf16 operands = exact products, accumulated here in fp64 (the kernels accumulate in fp32: a
  ~1e-7 relative difference, far below what is measured). A tl.dot of fp32 operands runs as tf32 on
  Hopper (Triton's default ``input_precision``): both operands rounded to 10 mantissa bits
  (round-to-nearest, ties away, like ``cvt.rna.tf32.f32``). ``--no-tf32`` makes those products exact.
* The carried state of both state passes is rounded to fp32 after each chunk (the kernels keep it in fp32).
* Not emulated: the fp32/tf32 arithmetic inside the UT-transform inversion (T is exact here before its bf16
  rounding, which dominates) and the fp32 accumulation order of the products (~1e-7 relative).

The reference is the fp64 chunked PyTorch reference (== the recurrent oracle to ~1e-13) with autograd;
the inputs are the GPU tests' generators (tests/kernels/test_gated_delta_product_triton.py::make_inputs).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from titan_delta.ops.gated_delta_product.reference import gated_delta_product_chunked

Tensor = torch.Tensor

# The places where ``lowp`` rounds to bf16 and the default path does not. d_delta's and ∂L/∂W's bf16 storage
# is not listed: every kernel that reads them rounds them to bf16 first in both paths (no effect).
SITES = {
    "W": "W stored in bf16 (operand of W·S in state_fwd and of Wᵀ·dδ in state_bwd)",
    "U": "U stored in bf16 (δ = U − W·S)",
    "S_fwd": "state rounded to bf16 for W·S in state_fwd (tf32 otherwise)",
    "delta_upd": "decayed δ rounded to bf16 for the state update Kᵀδ (tf32 otherwise)",
    "delta": "δ stored in bf16 (operand of scores·δ in output_fwd)",
    "scores": "scores rounded to bf16 for scores·δ in output_fwd (tf32 otherwise)",
    "dvlocal": "local ∂L/∂δ stored in bf16 (dv_local -> state_bwd)",
    "dd_bwd": "total ∂L/∂δ rounded to bf16 for Wᵀ·dδ in state_bwd (tf32 otherwise)",
    "Wt_bwd": "fp32 W rounded to bf16 in registers for Wᵀ·dδ in state_bwd only (lowp_state; implied by W)",
    "dkpart": "direct dk stored in bf16 (dqkw -> wy_bwd)",
}
LOWP = frozenset(SITES) - {"Wt_bwd"}
# W and U kept fp32: the state passes' products follow W's dtype in the kernels, so S_fwd, delta_upd and
# dd_bwd go back to tf32 as well; δ, the local ∂L/∂δ and the direct dk stay bf16 (and d_delta, ∂L/∂W).
LOWP_SAFE = frozenset({"delta", "scores", "dvlocal", "dkpart"})
# lowp_state: W, U and everything else as by default; only state_bwd's Wᵀ·dδ takes bf16 operands.
LOWP_STATE = frozenset({"Wt_bwd", "dd_bwd"})
OUTPUTS = ("o", "final", "dq", "dk", "dv", "dg", "dbeta", "dh0")
# The tests' tolerances: 5e-3 for o and the final state, 1e-2 for dq, dk, dv, dh0, 2e-2 for dg and dβ.
TOLERANCES = {"o": 5e-3, "final": 5e-3, "dq": 1e-2, "dk": 1e-2, "dv": 1e-2, "dh0": 1e-2, "dg": 2e-2,
              "dbeta": 2e-2}  # fmt: skip


def bf16(x: Tensor) -> Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


def fp32(x: Tensor) -> Tensor:
    return x.to(torch.float32).to(x.dtype)


def tf32(x: Tensor) -> Tensor:
    """fp32 -> tf32 (10 explicit mantissa bits), round to nearest with ties away from zero."""
    bits = x.to(torch.float32).contiguous().view(torch.int32)
    bits = (bits + 0x1000) & ~0x1FFF
    return bits.view(torch.float32).to(x.dtype)


@dataclass(frozen=True)
class Rounding:
    """``lowp``: the sites rounded to bf16; ``use_tf32``: fp32 products as tf32; ``exact``: no rounding at
    all (validates the transcription against autograd); ``bf16x3``: state_bwd's Wᵀ·dδ of fp32 W as three
    bf16 products hi·hi + hi·lo + lo·hi (the ``bf16x3`` variant; ignored when W or dδ is a lowp site)."""

    lowp: frozenset[str] = frozenset()
    use_tf32: bool = True
    exact: bool = False
    bf16x3: bool = False

    def always(self, x: Tensor) -> Tensor:
        """A bf16 rounding both paths do."""
        return x if self.exact else bf16(x)

    def store(self, x: Tensor, site: str) -> Tensor:
        """A stored intermediate: bf16 at a lowp site, fp32 otherwise."""
        if self.exact:
            return x
        return bf16(x) if site in self.lowp else fp32(x)

    def operand(self, x: Tensor, site: str) -> Tensor:
        """An operand of a product that is bf16 with lowp and fp32 (tf32 on the tensor cores) otherwise."""
        if self.exact:
            return x
        if site in self.lowp:
            return bf16(x)
        return tf32(x) if self.use_tf32 else fp32(x)

    def f32(self, x: Tensor) -> Tensor:
        return x if self.exact else fp32(x)

    def f32_operand(self, x: Tensor) -> Tensor:
        """An fp32 operand of a product in both paths (the other operand is exact in tf32)."""
        if self.exact:
            return x
        return tf32(x) if self.use_tf32 else fp32(x)

    def wt_dd(self, w: Tensor, dd: Tensor) -> Tensor:
        """state_bwd's Wᵀ·dδ for one chunk: w [.., L, K] as stored, dd [.., L, V] the fp32 total ∂L/∂δ."""
        if self.exact:
            return mt(w) @ dd
        site = "W" if "W" in self.lowp else "Wt_bwd"
        if self.bf16x3 and not self.lowp & {"W", "Wt_bwd", "dd_bwd"}:
            w_hi, d_hi = bf16(w), bf16(fp32(dd))
            w_lo, d_lo = bf16(w - w_hi), bf16(fp32(dd) - d_hi)  # w - w_hi is exact in fp32
            return mt(w_hi) @ d_hi + mt(w_hi) @ d_lo + mt(w_lo) @ d_hi
        return mt(self.operand(w, site)) @ self.operand(dd, "dd_bwd")


# ---------------------------------------------------------------------------------------------- layout
def chunk_sizes(n_h: int) -> tuple[int, int]:
    """(tokens per chunk C, steps per chunk C·n_h), as kernels/gated_delta_product/_common.chunk_geometry."""
    C = max(16, 64 // n_h)
    return C, C * n_h


def to_chunks(x: Tensor, per_chunk: int, num_chunks: int) -> Tensor:
    """[B, L, H, *D] -> [B, H, n, per_chunk, *D], zero-padded."""
    x = x.movedim(2, 1)
    pad = num_chunks * per_chunk - x.shape[2]
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
    return x.reshape(*x.shape[:2], num_chunks, per_chunk, *x.shape[3:])


def from_chunks(x: Tensor, length: int) -> Tensor:
    """[B, H, n, per_chunk, *D] -> [B, length, H, *D]."""
    x = x.reshape(*x.shape[:2], -1, *x.shape[4:])[:, :, :length]
    return x.movedim(1, 2)


def mt(x: Tensor) -> Tensor:
    return x.transpose(-1, -2)


# ------------------------------------------------------------------------------------------- emulation
def emulate(q, k, v, g, beta, h0, d_out, d_final, n_h: int, scale: float, rnd: Rounding) -> dict[str, Tensor]:
    """Forward and backward of the chunked kernels in float64 with ``rnd``'s roundings.

    Inputs as the kernels receive them (q, k, v bf16; g fp32 or None; β bf16 or fp32; h0 fp32); d_out and
    d_final as autograd hands them to the backward (d_out in o's dtype, d_final fp32). Returns o, final and
    the gradients, each rounded to the dtype the kernels store it in.
    """
    dt = torch.float64
    B, T, H, _ = q.shape
    C, L = chunk_sizes(n_h)
    n = -(-T // C)
    qc = to_chunks(q.to(dt), C, n)  # [B,H,n,C,K]
    kc = to_chunks(k.to(dt), L, n)  # [B,H,n,L,K]
    vc = to_chunks(v.to(dt), L, n)
    bc = to_chunks(beta.to(dt)[..., None], L, n)[..., 0]  # [B,H,n,L]
    do = to_chunks(d_out.to(dt), C, n)  # [B,H,n,C,V]
    g_dt = dt if rnd.exact else torch.float32  # fp32 cumsum like the kernels
    gt = torch.zeros(B, T, H, dtype=g_dt) if g is None else g.to(g_dt)
    Gq = to_chunks(gt[..., None], C, n)[..., 0].cumsum(-1).to(dt)
    tok = torch.arange(L) // n_h  # token of each step within its chunk
    G = Gq[..., tok]  # [B,H,n,L]
    G_last = Gq[..., -1]  # pads have g = 0
    n_tok = (T - torch.arange(n) * C).clamp(max=C)  # [n]
    o_t = torch.arange(C)

    s_lower = torch.arange(L)[:, None] > torch.arange(L)[None, :]
    causal = (tok[None, :] <= o_t[:, None])[None] & (o_t[None, :] < n_tok[:, None])[:, :, None]  # [n,C,L]
    earlier = (tok[None, :] < o_t[:, None])  # [C,L]

    def expm(mask, x):
        return torch.where(mask, x, torch.full_like(x, float("-inf"))).exp()

    # ---- wy_fwd: T = (I + A)⁻¹, W = T diag(βe^G) K, U = T diag(β) V
    kk = kc @ mt(kc)
    decay_ss = expm(s_lower, G[..., :, None] - G[..., None, :])
    A = kk * bc[..., :, None] * decay_ss
    eye = torch.eye(L, dtype=dt)
    Tinv = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    T_st = rnd.always(Tinv)
    W = rnd.store(rnd.always(Tinv * (bc * G.exp())[..., None, :]) @ kc, "W")
    U = rnd.store(rnd.always(Tinv * bc[..., None, :]) @ vc, "U")

    # ---- state_fwd: chunk states (bf16), δ, final state
    h = h0.to(dt)
    states, deltas = [], []
    W_op = rnd.operand(W, "W")  # W stored fp32 then a tf32 operand, or stored bf16
    for c in range(n):
        states.append(rnd.always(h))
        delta = U[:, :, c] - W_op[:, :, c] @ rnd.operand(h, "S_fwd")
        deltas.append(delta)
        d_dec = delta * (G_last[:, :, c, None] - G[:, :, c]).exp()[..., None]
        h = h * G_last[:, :, c].exp()[..., None, None] + mt(kc[:, :, c]) @ rnd.operand(d_dec, "delta_upd")
        h = rnd.f32(h)
    final = h
    S = torch.stack(states, 2)  # [B,H,n,K,V] bf16 values
    delta = torch.stack(deltas, 2)  # [B,H,n,L,V] fp32 values
    delta_st = rnd.store(delta, "delta")

    # ---- output_fwd
    decay_qs = expm(causal, Gq[..., :, None] - G[..., None, :])  # [B,H,n,C,L]
    scores = (qc @ mt(kc)) * decay_qs
    d_op = delta_st if "delta" in rnd.lowp else rnd.f32_operand(delta_st)
    o = (qc @ S) * Gq.exp()[..., None] + rnd.operand(scores, "scores") @ d_op
    o = rnd.always(o * scale)

    # ---- dv_local: scale·scoresᵀ dO (scores rounded to bf16 in both paths)
    do_b = do  # already bf16 values
    dvl = rnd.store(rnd.always(mt(scores) * scale) @ do_b, "dvlocal")  # [B,H,n,L,V]

    # ---- state_bwd: reverse pass
    dh = d_final.to(dt)
    dstates, dds = [None] * n, [None] * n
    for c in reversed(range(n)):
        dstates[c] = rnd.always(dh)
        e = (G_last[:, :, c, None] - G[:, :, c]).exp()[..., None]
        dd = dvl[:, :, c] + (kc[:, :, c] @ rnd.always(dh)) * e
        dds[c] = dd
        do_s = rnd.always(do_b[:, :, c] * (scale * Gq[:, :, c].exp())[..., None])
        dh = dh * G_last[:, :, c].exp()[..., None, None] + mt(qc[:, :, c]) @ do_s - rnd.wt_dd(W[:, :, c], dd)
        dh = rnd.f32(dh)
    dh0 = dh
    dS = torch.stack(dstates, 2)  # ∂L/∂(state leaving chunk c), bf16 values
    dd = rnd.always(torch.stack(dds, 2))  # read as bf16 by both gradient kernels

    # ---- dqkw
    d_b = rnd.always(delta_st)
    dq = do_b @ mt(S)  # [B,H,n,C,K]
    ds = do_b @ mt(d_b)  # [B,H,n,C,L]
    dk = d_b @ mt(dS)  # [B,H,n,L,K]
    dw = dd @ mt(S)
    dhh = (S * dS).sum(-1)  # [B,H,n,K]
    dq = dq * (scale * Gq.exp())[..., None]
    dGq = (dq * qc).sum(-1)
    p = torch.where(earlier, scores * scale * ds, 0.0)
    dGq = dGq + p.sum(-1)
    dG = -p.sum(-2)
    dsd = torch.where(causal, ds * decay_qs * scale, 0.0)
    dq = dq + rnd.always(dsd) @ kc
    dk_o = rnd.always(mt(dsd)) @ qc
    dk = dk * (G_last[..., None] - G).exp()[..., None]
    not_last = tok[None, :] < (n_tok - 1)[:, None]  # [n,L]
    kdk = torch.where(not_last, (dk * kc).sum(-1), 0.0)
    dG = dG - kdk
    dG_last = (dhh.sum(-1) * G_last.exp() + kdk.sum(-1))
    last_tok = (o_t[None, :] == (n_tok - 1)[:, None])  # [n,C]
    dGq = dGq + torch.where(last_tok, dG_last[..., None], 0.0)
    dq_out = rnd.always(dq)
    dk_part = rnd.store(dk + dk_o, "dkpart")
    dw_b = rnd.always(-dw)

    # ---- wy_bwd
    Tt = mt(T_st)
    tdd = Tt @ dd
    dv = rnd.always(tdd * bc[..., None])
    dbeta = (tdd * vc).sum(-1)
    dT = dd @ mt(rnd.always(vc * bc[..., None]))
    tdw = Tt @ dw_b
    eg = G.exp()
    dk = dk_part + tdw * (bc * eg)[..., None]
    kw = (tdw * kc).sum(-1) * eg
    dbeta = dbeta + kw
    dG = dG + kw * bc
    dT = dT + dw_b @ mt(rnd.always(kc * (bc * eg)[..., None]))
    dA = -(rnd.always(Tt @ rnd.always(dT)) @ Tt)
    dAe = torch.where(s_lower, dA * decay_ss, 0.0)
    dbeta = dbeta + (dAe * kk).sum(-1)
    dAb = dAe * bc[..., :, None]
    dk = dk + rnd.always(dAb) @ kc + rnd.always(mt(dAb)) @ kc
    dAk = torch.where(tok[:, None] > tok[None, :], dAb * kk, 0.0)
    dG = dG + dAk.sum(-1) - dAk.sum(-2)
    dGt = torch.zeros_like(dGq).index_add_(-1, tok, dG) + dGq  # steps -> tokens
    dg = dGt.flip(-1).cumsum(-1).flip(-1)

    beta_round = rnd.always if beta.dtype == torch.bfloat16 else rnd.f32
    out = dict(
        o=from_chunks(o, T), final=final, dq=from_chunks(dq_out, T), dk=from_chunks(rnd.always(dk), T * n_h),
        dv=from_chunks(dv, T * n_h), dg=from_chunks(rnd.f32(dg), T),
        dbeta=from_chunks(beta_round(dbeta)[..., None], T * n_h)[..., 0], dh0=dh0,
    )  # fmt: skip
    if g is None:
        del out["dg"]
    return out


# ------------------------------------------------------------------------------------------- reference
def reference(q, k, v, g, beta, h0, d_out, d_final, n_h: int, scale: float) -> dict[str, Tensor]:
    """fp64 chunked reference + autograd, with the tests' loss (o·d_out + final·d_final)."""
    leaves = {n: (None if x is None else x.detach().double().requires_grad_())
              for n, x in dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0).items()}  # fmt: skip
    o, final = gated_delta_product_chunked(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], num_householder=n_h, scale=scale,
        initial_state=leaves["h0"], output_final_state=True,
    )  # fmt: skip
    loss = (o * d_out.double()).sum() + (final * d_final.double()).sum()
    names = [n for n, x in leaves.items() if x is not None]
    grads = torch.autograd.grad(loss, [leaves[n] for n in names])
    out = dict(o=o.detach(), final=final.detach())
    out.update({"d" + n: gr for n, gr in zip(names, grads, strict=True)})
    return out


def rel_rms(a: Tensor, e: Tensor) -> float:
    a, e = a.double(), e.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - e).norm() / e.norm()).item()


# -------------------------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class Config:
    """One GPU test's inputs (tests/kernels/test_gated_delta_product_triton.py / ..._variants.py)."""

    name: str
    test: str
    B: int
    T: int
    H: int
    K: int
    V: int
    n_h: int
    gated: bool
    gate_range: tuple[float, float]
    beta_bf16: bool
    dg_floor: float = 0.0


CONFIGS = {
    "nogate_nh2": Config("nogate_nh2", "test_gpu_bf16_matches_reference[False-2-2-301-4-64-64]",
                         2, 301, 4, 64, 64, 2, False, (-0.5, 0.0), True),
    "nogate_nh4": Config("nogate_nh4", "test_gpu_bf16_matches_reference[False-4-2-99-4-64-64]",
                         2, 99, 4, 64, 64, 4, False, (-0.5, 0.0), True),
    "gates_near_one": Config("gates_near_one", "test_gpu_bf16_gates_near_one_and_zero[gate_range0]",
                             2, 250, 4, 128, 128, 2, True, (-1e-6, 0.0), False, 1e-3),
    "control": Config("control", "test_gpu_lowp_bf16_matches_reference (passed)",
                      2, 257, 4, 128, 128, 2, True, (-0.5, 0.0), True),
    # Passed with lowp as the default (no gate at K = 128): a second control.
    "nogate_nh1_k128": Config("nogate_nh1_k128", "test_gpu_bf16_matches_reference[False-1-4-200-4-128-128]",
                              4, 200, 4, 128, 128, 1, False, (-0.5, 0.0), True),
    "gated_nh2_k64": Config("gated_nh2_k64", "test_gpu_bf16_matches_reference[True-2-2-301-4-64-64]",
                            2, 301, 4, 64, 64, 2, True, (-0.5, 0.0), True),
}  # fmt: skip


def make_inputs(cfg: Config, seed: int) -> dict[str, Tensor | None]:
    """The tests' make_inputs (CPU generator, then cast: the tests draw on CUDA, so the values differ but the
    distributions are the same), plus d_out / d_final as check_against_reference draws them."""
    gen = torch.Generator().manual_seed(seed)
    B, T, H, K, V, n_h = cfg.B, cfg.T, cfg.H, cfg.K, cfg.V, cfg.n_h
    lo, hi = cfg.gate_range
    bf = torch.bfloat16
    x = dict(
        q=torch.randn(B, T, H, K, generator=gen).to(bf),
        k=F.normalize(torch.randn(B, T * n_h, H, K, generator=gen), dim=-1).to(bf),
        v=torch.randn(B, T * n_h, H, V, generator=gen).to(bf),
        g=(torch.rand(B, T, H, generator=gen) * (hi - lo) + lo) if cfg.gated else None,
        beta=torch.rand(B, T * n_h, H, generator=gen) * 1.98 + 0.01,
        h0=torch.randn(B, H, K, V, generator=gen),
    )
    if cfg.beta_bf16:
        x["beta"] = x["beta"].to(bf)
    x["d_out"] = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    x["d_final"] = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
    return x


def errors(cfg: Config, x: dict, ref: dict, rnd: Rounding) -> dict[str, float]:
    """Relative RMS error of every result; dg, with a floor, as err / (‖dg‖ + floor/tol·‖dβ‖) (comparable
    to the 2e-2 tolerance exactly as the test's check)."""
    scale = cfg.K**-0.5
    d_out = x["d_out"].to(torch.bfloat16)  # autograd casts ∂L/∂o to o's dtype
    d_final = x["d_final"].to(torch.float32)
    out = emulate(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"], d_out, d_final, cfg.n_h, scale, rnd)
    res = {}
    for name, val in out.items():
        if name == "dg" and cfg.dg_floor > 0:
            err = (val.double() - ref["dg"]).norm().item()
            floor = cfg.dg_floor / TOLERANCES["dg"] * ref["dbeta"].norm().item()
            res[name] = err / (ref["dg"].norm().item() + floor)
        else:
            res[name] = rel_rms(val, ref[name])
    return res


def variants(use_tf32: bool) -> list[tuple[str, Rounding]]:
    rows = [("(a) default path (fp32 intermediates)", Rounding(frozenset(), use_tf32)),
            ("(b) lowp", Rounding(LOWP, use_tf32))]  # fmt: skip
    rows += [(f"(c) lowp, {s} fp32", Rounding(LOWP - {s}, use_tf32)) for s in SITES if s in LOWP]
    groups = {
        "W+U": {"W", "U"},
        "W+U+S_fwd": {"W", "U", "S_fwd"},
        "fwd state pass (W,U,S_fwd,delta_upd)": {"W", "U", "S_fwd", "delta_upd"},
        "bwd only (dvlocal,dd_bwd,dkpart)": {"dvlocal", "dd_bwd", "dkpart"},
    }
    rows += [(f"(c') lowp, {name} fp32", Rounding(LOWP - s, use_tf32)) for name, s in groups.items()]
    rows += [("(e) lowp_safe: lowp with W, U fp32 (state-pass products tf32)", Rounding(LOWP_SAFE, use_tf32))]
    rows += [("(f) lowp_state: default + Wᵀ·dδ of state_bwd in bf16", Rounding(LOWP_STATE, use_tf32)),
             ("(f') lowp_safe+lowp_state", Rounding(LOWP_SAFE | LOWP_STATE, use_tf32)),
             ("(g) bf16x3: default + Wᵀ·dδ of state_bwd as 3 bf16 products", Rounding(frozenset(), use_tf32,
                                                                                   bf16x3=True)),
             ("(g') lowp_safe+bf16x3", Rounding(LOWP_SAFE, use_tf32, bf16x3=True)),
             ("(h) lowp_safe+bf16x3 + Kᵀδ of state_fwd in bf16 (FLA's state update)",
              Rounding(LOWP_SAFE | {"delta_upd"}, use_tf32, bf16x3=True))]  # fmt: skip
    rows += [(f"(d) default + only {s} bf16", Rounding(frozenset({s}), use_tf32)) for s in SITES]
    return rows


def run(cfg: Config, seeds: list[int], use_tf32: bool, only: list[str] | None) -> None:
    rows = variants(use_tf32)
    if only:
        rows = [r for r in rows if any(o in r[0] for o in only)]
    table: dict[str, list[dict[str, float]]] = {name: [] for name, _ in rows}
    notes = []
    for seed in seeds:
        x = make_inputs(cfg, seed)
        scale = cfg.K**-0.5
        ref = reference(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"], x["d_out"], x["d_final"], cfg.n_h,
                        scale)  # fmt: skip
        notes.append(magnitudes(cfg, x, ref))
        for name, rnd in rows:
            table[name].append(errors(cfg, x, ref, rnd))
    outs = [o for o in OUTPUTS if o in table[rows[0][0]][0]]
    print(f"\n### {cfg.name}: {cfg.test}")
    print(f"B={cfg.B} T={cfg.T} H={cfg.H} K={cfg.K} V={cfg.V} n_h={cfg.n_h} gated={cfg.gated} "
          f"gate_range={cfg.gate_range} beta={'bf16' if cfg.beta_bf16 else 'fp32'} seeds={seeds} "
          f"tf32={'on' if use_tf32 else 'off'}; max over seeds; * = over the test's tolerance")  # fmt: skip
    for note in notes:
        print(f"  {note}")
    print("| variant | " + " | ".join(f"{o} (tol {TOLERANCES[o]:.0e})" for o in outs) + " |")
    print("|---|" + "---|" * len(outs))
    for name, per_seed in table.items():
        cells = []
        for o in outs:
            worst = max(r[o] for r in per_seed)
            cells.append(f"{worst:.2e}{'*' if worst > TOLERANCES[o] else ''}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    sys.stdout.flush()


def magnitudes(cfg: Config, x: dict, ref: dict) -> str:
    """Magnitudes behind the errors (fp64, exact arithmetic): T, U against βV, state and gradient norms."""
    dt = torch.float64
    C, L = chunk_sizes(cfg.n_h)
    n = -(-cfg.T // C)
    k = to_chunks(x["k"].to(dt), L, n)
    v = to_chunks(x["v"].to(dt), L, n)
    b = to_chunks(x["beta"].to(dt)[..., None], L, n)[..., 0]
    gt = torch.zeros(cfg.B, cfg.T, cfg.H) if x["g"] is None else x["g"]
    Gq = to_chunks(gt[..., None].to(dt), C, n)[..., 0].cumsum(-1)
    G = Gq[..., torch.arange(L) // cfg.n_h]
    lower = torch.arange(L)[:, None] > torch.arange(L)[None, :]
    A = torch.where(lower, (k @ mt(k)) * b[..., :, None] * (G[..., :, None] - G[..., None, :]).exp(), 0.0)
    eye = torch.eye(L, dtype=dt)
    Tinv = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    U = (Tinv * b[..., None, :]) @ v
    return (f"‖T‖_F/‖I‖_F = {(Tinv.norm() / eye.expand_as(A).norm()).item():.2f}, max|T| = "
            f"{Tinv.abs().max().item():.1f}, ‖U‖/‖βV‖ = {(U.norm() / (b[..., None] * v).norm()).item():.2f}, "
            f"‖final‖/‖h0‖ = {(ref['final'].norm() / x['h0'].double().norm()).item():.3f}, "
            f"‖dh0‖/‖d_final‖ = {(ref['dh0'].norm() / x['d_final'].norm()).item():.3f}, "
            f"‖o‖_rms = {ref['o'].pow(2).mean().sqrt().item():.3f}")  # fmt: skip


def profile(cfg: Config, seed: int, use_tf32: bool) -> None:
    """Relative RMS error of o per window of tokens along the sequence (and of the final state at a few
    lengths): does the error grow with position, i.e. accumulate in the carried state?"""
    x = make_inputs(cfg, seed)
    scale = cfg.K**-0.5
    ref = reference(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"], x["d_out"], x["d_final"], cfg.n_h,
                    scale)  # fmt: skip
    d_out, d_final = x["d_out"].to(torch.bfloat16), x["d_final"].to(torch.float32)
    C, _ = chunk_sizes(cfg.n_h)
    edges = [*range(0, cfg.T, 2 * C), cfg.T]
    print(f"\n### profile {cfg.name} seed {seed}: rel RMS error of o per window of tokens")
    print("| variant | " + " | ".join(f"t {a}-{b - 1}" for a, b in itertools.pairwise(edges))
          + " |\n|---|" + "---|" * (len(edges) - 1))  # fmt: skip
    for name, rnd in (("default", Rounding(frozenset(), use_tf32)), ("lowp", Rounding(LOWP, use_tf32))):
        out = emulate(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"], d_out, d_final, cfg.n_h, scale, rnd)
        cells = [f"{rel_rms(out['o'][:, a:b], ref['o'][:, a:b]):.2e}"
                 for a, b in itertools.pairwise(edges)]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |")


def check(seed: int = 0) -> None:
    """Without rounding the emulator must reproduce the fp64 reference (forward and every gradient)."""
    for cfg in (CONFIGS["nogate_nh2"], CONFIGS["gates_near_one"], CONFIGS["gated_nh2_k64"]):
        for n_h, T in ((1, 150), (2, 45), (3, 45), (4, 45)):  # 3, 2, 3, 3 chunks, the last one partial
            small = Config(cfg.name, cfg.test, 2, T, 2, 16, 32, n_h, cfg.gated, (-1.0, 0.0), cfg.beta_bf16)
            x = make_inputs(small, seed)
            x = {n: (None if t is None else t.double()) for n, t in x.items()}
            ref = reference(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"], x["d_out"], x["d_final"], n_h,
                            0.25)  # fmt: skip
            out = emulate(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"], x["d_out"], x["d_final"], n_h,
                          0.25, Rounding(exact=True))  # fmt: skip
            errs = {name: rel_rms(val, ref[name]) for name, val in out.items()}
            worst = max(errs.values())
            print(f"check {small.name} n_h={n_h} gated={small.gated}: max rel err {worst:.1e}  {errs}")
            assert worst < 1e-10, errs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--configs", default="nogate_nh2,nogate_nh4,gates_near_one,control",
                        help=f"comma-separated, from {list(CONFIGS)}")  # fmt: skip
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated generator seeds")
    parser.add_argument("--no-tf32", action="store_true", help="fp32 products exact instead of tf32")
    parser.add_argument("--only", default="", help="comma-separated substrings of the variant rows to run")
    parser.add_argument("--profile", action="store_true", help="o error along the sequence (first seed only)")
    parser.add_argument("--check", action="store_true", help="validate the emulator (no rounding)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.check:
        check()
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    only = [s for s in args.only.split(",") if s] or None
    for name in args.configs.split(","):
        if args.profile:
            profile(CONFIGS[name], seeds[0], not args.no_tf32)
            continue
        run(CONFIGS[name], seeds, not args.no_tf32, only)


if __name__ == "__main__":
    main()
