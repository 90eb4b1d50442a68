"""KV cache for softmax attention (full causal or sliding window) during incremental decoding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionCache:
    """Rotated keys and values seen so far, [B, H_kv, L, D]; SWA keeps only the last ``window - 1``.

    A later query at position p ≥ seen sees keys p − window + 1 … p, so keys older than the last
    ``window − 1`` can never be read again: the cache of an SWA layer stays O(window), not O(T).
    """

    window: int | None = None
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    seen: int = 0  # tokens this layer has processed (absolute position of the next one)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, H, T, D], k/v [B, H_kv, T, D] of T new tokens → o [B, H, T, D]; appends k/v."""
        T = q.shape[2]
        keys = k if self.keys is None else torch.cat((self.keys, k), dim=2)
        values = v if self.values is None else torch.cat((self.values, v), dim=2)
        first_key = self.seen + T - keys.shape[2]  # absolute position of keys[:, :, 0]
        query_pos = torch.arange(self.seen, self.seen + T, device=q.device)
        key_pos = torch.arange(first_key, self.seen + T, device=q.device)
        distance = query_pos[:, None] - key_pos[None, :]
        allowed = distance >= 0
        if self.window is not None:
            allowed = allowed & (distance < self.window)
        gqa = q.shape[1] != k.shape[1]
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, enable_gqa=gqa)
        if self.window is not None:
            keep = max(self.window - 1, 0)
            keys, values = keys[:, :, keys.shape[2] - keep :], values[:, :, values.shape[2] - keep :]
        self.keys, self.values = keys, values
        self.seen += T
        return o
