"""Gated DeltaProduct decoding state: the [H, K, V] recurrent state plus the short convs' last inputs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from titan_delta.ops import gated_delta_product
from titan_delta.ops.gated_delta_product.reference import gated_delta_product_step


@dataclass
class GatedDeltaProductCache:
    """O(1) memory in the sequence length: what a recurrent layer needs to continue a sequence."""

    state: torch.Tensor | None = None  # [B, H, K, V] fp32 (fp64 for fp64 inputs)
    conv_history: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [B, conv_size - 1, C]
    seen: int = 0

    def convolve(self, name: str, conv: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Run the short conv ``conv`` on x [B, T, C] as the continuation of everything it saw before."""
        y, self.conv_history[name] = conv.forward_with_history(x, self.conv_history.get(name))
        return y

    def recur(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor | None,
        beta: torch.Tensor,
        num_householder: int,
        backend: str,
    ) -> torch.Tensor:
        """Op layout (q [B,T,H,K], k/v/beta interleaved over T·n_h) → o [B,T,H,V]; advances the state."""
        B, T, H, K = q.shape
        n = num_householder
        if T == 1:  # one decode step: the plain recurrence, no chunking overhead
            state = self.state
            if state is None:
                dtype = torch.promote_types(q.dtype, torch.float32)
                state = q.new_zeros(B, H, K, v.shape[-1], dtype=dtype)
            g_t = None if g is None else g[:, 0]
            o_t, self.state = gated_delta_product_step(
                q[:, 0], k.view(B, n, H, K), v.view(B, n, H, -1), g_t, beta.view(B, n, H), state
            )
            o = o_t[:, None]
        else:
            o, self.state = gated_delta_product(
                q, k, v, g, beta,
                num_householder=n, initial_state=self.state, output_final_state=True, backend=backend,
            )  # fmt: skip
        self.seen += T
        return o
