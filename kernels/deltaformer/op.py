"""DeltaFormer attention on Triton kernels: the entry point, then its autograd.

Eager calls run ``_EagerDeltaFormer`` (a plain ``autograd.Function``, cheapest in host time); under
``torch.compile`` the same bodies run as ``torch.library`` custom ops with fake kernels and registered
autograd, which trace under ``fullgraph=True`` and re-run under activation checkpointing.
"""

from __future__ import annotations

import torch

from titan_delta_kernels._checks import check_same_device, check_shape, check_tensor
from titan_delta_kernels._precompile import precompile
from titan_delta_kernels.deltaformer._common import KERNEL_DTYPES, document_tables, interpreting
from titan_delta_kernels.deltaformer.config import MAX_HEAD_DIM, launch_config
from titan_delta_kernels.deltaformer.passes import backward_pass, forward_pass

_LIB = "titan_delta"


def deltaformer_attn_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *,
    w: torch.Tensor | None = None, scale: float, cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """DeltaFormer attention with κ1 = softmax on the Triton kernels; differentiable in q, k, v, β and w.

    q, k, w: [B,T,H,D]; v: [B,T,H,Dv]; beta: [B,T,H]; 16 <= D, Dv <= 128; w=None uses q as the stage-1
    probe. Stage 1 solves u_t = v_t − β_t Σ_{i<t} softmax_i(scale·w_t·k_i) u_i; stage 2 is
    o = causal softmax(scale·q·kᵀ)·U. ``cu_seqlens`` (int32/int64 [N+1], B = 1) keeps packed documents
    apart; its values are trusted (not read on the host). fp32/bf16/fp16 inputs, fp32 accumulation; the
    output has q's dtype.
    """
    _validate(q, k, v, beta, w, cu_seqlens, scale)
    if q.shape[1] == 0:
        return v.to(q.dtype).clone()
    q, k, v, beta = (t.contiguous() for t in (q, k, v, beta))
    w = None if w is None else w.contiguous()
    if torch.compiler.is_compiling():
        return _fwd(q, k, v, beta, w, cu_seqlens, float(scale))[0]
    return _EagerDeltaFormer.apply(q, k, v, beta, w, cu_seqlens, float(scale))


def _validate(q, k, v, beta, w, cu_seqlens, scale) -> None:
    check_tensor("q", q, 4, "[B,T,H,D]", KERNEL_DTYPES)
    check_tensor("k", k, 4, "[B,T,H,D]", KERNEL_DTYPES)
    check_tensor("v", v, 4, "[B,T,H,Dv]", KERNEL_DTYPES)
    check_tensor("beta", beta, 3, "[B,T,H]", KERNEL_DTYPES)
    B, T, H, D = q.shape
    check_shape("k", k, (B, T, H, D), "[B,T,H,D] (same as q)")
    check_shape("v", v, (B, T, H, v.shape[-1]), "[B,T,H,Dv] (B,T,H as in q)")
    check_shape("beta", beta, (B, T, H), "[B,T,H] (as in q)")
    if w is not None:
        check_tensor("w", w, 4, "[B,T,H,D]", KERNEL_DTYPES)
        check_shape("w", w, (B, T, H, D), "[B,T,H,D] (same as q)")
    for name, x in (("k", k), ("v", v), ("w", w)):
        if x is not None and x.dtype != q.dtype:
            raise TypeError(f"{name} must have the same dtype as q ({q.dtype}), got {x.dtype}")
    check_same_device(q=q, k=k, v=v, beta=beta, w=w, cu_seqlens=cu_seqlens)
    for name, size in (("D (head dim of q, k, w)", D), ("Dv (head dim of v)", v.shape[-1])):
        if not 16 <= size <= MAX_HEAD_DIM:
            raise ValueError(f"the Triton DeltaFormer kernel needs 16 <= {name} <= {MAX_HEAD_DIM}, "
                             f"got {size} (titan_delta.ops.deltaformer_attn(backend='auto') runs other "
                             "head dims on the torch reference)")
    if cu_seqlens is not None:
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cu_seqlens must be a 1-D int32/int64 tensor [N+1], got {cu_seqlens.dtype} "
                            f"{tuple(cu_seqlens.shape)}")
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch size must be 1 (documents packed along T), "
                             f"got B={B}")
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise TypeError(f"scale must be a float, got {scale!r}")


class _EagerDeltaFormer(torch.autograd.Function):
    """The custom ops' bodies without the custom-op dispatch (much of a small forward's host time)."""

    @staticmethod
    def forward(ctx, q, k, v, beta, w, cu_seqlens, scale):  # type: ignore[override]
        o, u, pu, lse1, lse2 = _forward_impl(q, k, v, beta, w, cu_seqlens, scale)
        ctx.save_for_backward(q, k, v, beta, w, cu_seqlens, u, pu, o, lse1, lse2)
        ctx.scale, ctx.has_w = scale, w is not None
        return o

    @staticmethod
    def backward(ctx, do):  # type: ignore[override]
        dq, dk, dv, dbeta, dw = _backward_impl(do, *ctx.saved_tensors, ctx.scale)
        return dq, dk, dv, dbeta, (dw if ctx.has_w else None), None, None


def _interpreter_safe(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The CPU interpreter returns garbage from ``tl.dot`` on bf16 operands: bf16 inputs run in fp32 there."""
    if not interpreting():
        return list(tensors)
    return [t.float() if t is not None and t.dtype == torch.bfloat16 else t for t in tensors]


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)`` without the dispatcher round trip when it is already that dtype (host time)."""
    return x if x.dtype == dtype else x.to(dtype)


def _forward_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, w: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """o, U, P·U, lse1 and lse2: the body of the forward op. Its first call per kernel set compiles the
    kernels at once (``_precompile``)."""
    T, D = q.shape[1], q.shape[3]
    cfg = launch_config(D, v.shape[-1], T, q.dtype == torch.float32)
    key = ("deltaformer", "fwd", cfg, D, v.shape[-1], q.dtype, w is None, cu_seqlens is None)
    precompile(key, lambda: _forward_pass(q, k, v, beta, w, cu_seqlens, scale, cfg), q.device)
    return _forward_pass(q, k, v, beta, w, cu_seqlens, scale, cfg)


def _forward_pass(q, k, v, beta, w, cu_seqlens, scale, cfg):
    T = q.shape[1]
    doc_start = None if cu_seqlens is None else document_tables(cu_seqlens, T)[0]
    q32, k32, v32, beta32, w32 = _interpreter_safe(q, k, v, beta, w)
    o, u, pu, lse1, lse2 = forward_pass(q32, k32, v32, beta32, w32, doc_start, scale, cfg)
    return _as(o, q.dtype), _as(u, v.dtype), _as(pu, v.dtype), lse1, lse2


def _backward_impl(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
    w: torch.Tensor | None, cu_seqlens: torch.Tensor | None, u: torch.Tensor, pu: torch.Tensor,
    o: torch.Tensor, lse1: torch.Tensor, lse2: torch.Tensor, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv, dβ and dw (empty when w is None): the body of the backward op (kernels compiled at once
    on its first call per kernel set, as the forward's)."""
    T, D = q.shape[1], q.shape[3]
    cfg = launch_config(D, v.shape[-1], T, q.dtype == torch.float32)
    args = (do, q, k, v, beta, w, cu_seqlens, u, pu, o, lse1, lse2, scale, cfg)
    key = ("deltaformer", "bwd", cfg, D, v.shape[-1], q.dtype, w is None, cu_seqlens is None)
    precompile(key, lambda: _backward_pass(*args), q.device)
    return _backward_pass(*args)


def _backward_pass(do, q, k, v, beta, w, cu_seqlens, u, pu, o, lse1, lse2, scale, cfg):
    T = q.shape[1]
    doc_start, doc_end = (None, None) if cu_seqlens is None else document_tables(cu_seqlens, T)
    do32, q32, k32, v32, beta32, w32, u32, pu32, o32 = _interpreter_safe(do, q, k, v, beta, w, u, pu, o)
    dq, dk, dv, dbeta, dw = backward_pass(do32, q32, k32, v32, beta32, w32, u32, pu32, o32, lse1, lse2,
                                          doc_start, doc_end, scale, cfg)
    dw = q.new_empty(0) if dw is None else dw.to(w.dtype).contiguous()
    return (dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous(),
            dbeta.to(beta.dtype).contiguous(), dw)


@torch.library.custom_op(f"{_LIB}::deltaformer_triton_fwd", mutates_args=())
def _fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, w: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward_impl(q, k, v, beta, w, cu_seqlens, scale)


@_fwd.register_fake
def _fwd_fake(q, k, v, beta, w, cu_seqlens, scale):
    B, T, H, _ = q.shape
    lse1 = q.new_empty((B, H, T), dtype=torch.float32)
    lse2 = q.new_empty((B, H, T if w is not None else 0), dtype=torch.float32)
    return q.new_empty(v.shape), torch.empty_like(v), torch.empty_like(v), lse1, lse2


@torch.library.custom_op(f"{_LIB}::deltaformer_triton_bwd", mutates_args=())
def _bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
    w: torch.Tensor | None, cu_seqlens: torch.Tensor | None, u: torch.Tensor, pu: torch.Tensor,
    o: torch.Tensor, lse1: torch.Tensor, lse2: torch.Tensor, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(do, q, k, v, beta, w, cu_seqlens, u, pu, o, lse1, lse2, scale)


@_bwd.register_fake
def _bwd_fake(do, q, k, v, beta, w, cu_seqlens, u, pu, o, lse1, lse2, scale):
    dw = q.new_empty(0) if w is None else torch.empty_like(w)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta), dw


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, beta, w, cu_seqlens, scale = inputs
    o, u, pu, lse1, lse2 = output
    ctx.save_for_backward(q, k, v, beta, w, cu_seqlens, u, pu, o, lse1, lse2)
    ctx.scale, ctx.has_w = scale, w is not None
    ctx.mark_non_differentiable(u, pu, lse1, lse2)


def _backward(ctx, do, _du, _dpu, _dlse1, _dlse2):
    dq, dk, dv, dbeta, dw = _bwd(do, *ctx.saved_tensors, ctx.scale)
    return dq, dk, dv, dbeta, (dw if ctx.has_w else None), None, None


_fwd.register_autograd(_backward, setup_context=_setup_context)
