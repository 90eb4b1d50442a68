"""Masks for causal / sliding-window softmax attention, with and without packed documents.

Two backends:
- "flex": FlexAttention with a BlockMask, so fully masked blocks (outside the window, other documents) are
  skipped rather than computed and discarded. Block masks are built once per forward per distinct window
  (shared by all layers); without documents they are also cached across steps per (T, window, device).
- "sdpa": a dense [T, T] boolean mask for ``scaled_dot_product_attention``. O(T²) memory; meant for CPU
  and tests.
With neither a window nor documents, both use SDPA's plain ``is_causal`` path (no mask at all).
Query t sees key i iff i ≤ t, t − i < window (when set) and both lie in the same document.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

ATTN_BACKENDS = ("auto", "flex", "sdpa")

_STATIC_BLOCK_MASKS: dict[tuple[int, int | None, str], BlockMask] = {}
# torch.compile only wraps here; nothing is compiled until the first call on a GPU.
_COMPILED_FLEX_ATTENTION = torch.compile(flex_attention, dynamic=False)


def resolve_attn_backend(backend: str, device: torch.device) -> str:
    """ "auto" is FlexAttention on CUDA and dense SDPA elsewhere."""
    if backend not in ATTN_BACKENDS:
        raise ValueError(f"attn_backend must be one of {ATTN_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    return backend


def dense_attention_mask(
    seq_len: int, window: int | None, doc_ids: torch.Tensor | None, device: torch.device
) -> torch.Tensor | None:
    """[T, T] bool (True = attend), or None when plain causal attention suffices."""
    if window is None and doc_ids is None:
        return None
    pos = torch.arange(seq_len, device=device)
    distance = pos[:, None] - pos[None, :]
    allowed = distance >= 0
    if window is not None:
        allowed = allowed & (distance < window)
    if doc_ids is not None:
        allowed = allowed & (doc_ids[:, None] == doc_ids[None, :])
    return allowed


def _mask_mod(window: int | None, doc_ids: torch.Tensor | None):
    def mask_mod(b, h, q_idx, kv_idx):
        allowed = q_idx >= kv_idx
        if window is not None:
            allowed = allowed & (q_idx - kv_idx < window)
        if doc_ids is not None:
            allowed = allowed & (doc_ids[q_idx] == doc_ids[kv_idx])
        return allowed

    return mask_mod


def flex_block_mask(
    seq_len: int, window: int | None, doc_ids: torch.Tensor | None, device: torch.device
) -> BlockMask:
    """Block-sparse mask for FlexAttention; cached across calls when there are no documents."""
    if doc_ids is None:
        key = (seq_len, window, str(device))
        cached = _STATIC_BLOCK_MASKS.get(key)
        if cached is None:
            cached = create_block_mask(_mask_mod(window, None), None, None, seq_len, seq_len, device=device)
            _STATIC_BLOCK_MASKS[key] = cached
        return cached
    return create_block_mask(_mask_mod(window, doc_ids), None, None, seq_len, seq_len, device=device)


def build_attention_masks(
    windows: set[int | None],
    seq_len: int,
    doc_ids: torch.Tensor | None,
    backend: str,
    device: torch.device,
) -> dict[int | None, Any]:
    """One mask per distinct window used by the model's attention layers (None = full causal).
    Full causal attention without documents needs no mask on any backend: SDPA's causal kernels (flash /
    cuDNN) are the fastest there, so the Transformer baseline is not slowed by a block mask."""
    builder = flex_block_mask if resolve_attn_backend(backend, device) == "flex" else dense_attention_mask
    return {
        window: None if window is None and doc_ids is None else builder(seq_len, window, doc_ids, device)
        for window in windows
    }


# FlexAttention's backward tiles at head dims up to 64 on CUDA, chosen by measurement for the hybrids' sliding
# windows (docs/models.md, "Sliding-window layers"): as fast as max-autotune's pick without its compile-time
# search, where the default tiles are slower. At head dim 128 the defaults were the fastest, so wider heads
# keep them.
_FLEX_SMALL_HEAD_OPTIONS = {"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32, "num_warps": 4,
                            "num_stages": 3}


def flex_kernel_options(head_dim: int, device: torch.device) -> dict[str, int] | None:
    """``kernel_options`` for FlexAttention at this head dim (None: its defaults)."""
    if device.type == "cuda" and head_dim <= 64:
        return dict(_FLEX_SMALL_HEAD_OPTIONS)
    return None


def flex_attention_fn(device: torch.device):
    """FlexAttention compiled (its fast path) on GPU; eager on CPU, where the unfused implementation is
    only used to cross-check the dense path in tests. The compiled wrapper is made at import: creating it
    lazily would mutate module state inside traced code, which activation checkpointing under
    torch.compile rejects ("HOP: Unsafe side effect")."""
    return _COMPILED_FLEX_ATTENTION if device.type == "cuda" else flex_attention
