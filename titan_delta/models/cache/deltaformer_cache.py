"""K+U cache for DeltaFormer decoding: every earlier key k_i and stage-1 output u_i of the sequence.

Stage 1 of a new token, u_t = v_t − β_t Σ_{i<t} κ1(w_t, k_i) u_i, reads all earlier keys and u's; stage 2,
o_t = Σ_{i≤t} softmax(q_t·k_i) u_i, reads them again. Both are O(L) per token given the cache, so
generating n tokens costs O(n·L) instead of re-running the O(L²) prefill every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from titan_delta.ops.deltaformer import deltaformer_stage1_chunked
from titan_delta.ops.deltaformer.inputs import compute_dtype
from titan_delta.ops.deltaformer.kappa import elementwise_kappa


@dataclass
class DeltaFormerCache:
    """keys [B, H, L, D] and u [B, H, L, Dv] in the op's compute dtype (fp32; fp64 for fp64 inputs),
    one entry per query head (GQA keys are stored already repeated, as the op consumes them)."""

    keys: torch.Tensor | None = None
    u: torch.Tensor | None = None

    @property
    def seen(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        beta: torch.Tensor | None,
        w: torch.Tensor | None,
        kernel: str,
        scale: float | None = None,
    ) -> torch.Tensor:
        """q/k/w [B, T, H, D], v [B, T, H, Dv], beta [B, T, H] or None → o [B, T, H, Dv] in q's dtype."""
        dtype = compute_dtype(q, beta)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if self.keys is None:  # prefill: the chunked solve of the whole prompt at once
            u_new = deltaformer_stage1_chunked(q, k, v, beta, w=w, kernel=kernel, scale=scale)
            self.keys = k.to(dtype).transpose(1, 2)
            self.u = u_new.to(dtype).transpose(1, 2)
        else:
            self._extend_stage1(k, v, beta, q if w is None else w, kernel, scale, dtype)
        return self._stage2(q.to(dtype), scale).to(q.dtype)

    def _extend_stage1(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        beta: torch.Tensor | None,
        w: torch.Tensor,
        kernel: str,
        scale: float,
        dtype: torch.dtype,
    ) -> None:
        """Append u_t of each new token in order (each one reads the u's of the ones before it)."""
        assert self.keys is not None and self.u is not None
        keys, u = self.keys, self.u
        for t in range(k.shape[1]):
            scores = torch.einsum("bhd,bhld->bhl", w[:, t].to(dtype), keys) * scale
            if kernel == "softmax":
                kappa = torch.softmax(scores, dim=-1)
            else:
                kappa = elementwise_kappa(scores, kernel)
            correction = torch.einsum("bhl,bhle->bhe", kappa, u)
            step = 1.0 if beta is None else beta[:, t].to(dtype)[..., None]
            u_t = v[:, t].to(dtype) - step * correction
            keys = torch.cat((keys, k[:, t].to(dtype)[:, :, None]), dim=2)
            u = torch.cat((u, u_t[:, :, None]), dim=2)
        self.keys, self.u = keys, u

    def _stage2(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Causal softmax attention of the T newest queries over every cached key (themselves included)."""
        assert self.keys is not None and self.u is not None
        T, L = q.shape[1], self.keys.shape[2]
        scores = torch.einsum("bthd,bhld->bhtl", q, self.keys) * scale
        query_pos = torch.arange(L - T, L, device=q.device)[:, None]
        allowed = torch.arange(L, device=q.device)[None, :] <= query_pos
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return torch.einsum("bhtl,bhle->bthe", probs, self.u)
