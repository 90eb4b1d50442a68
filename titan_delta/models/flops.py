"""FLOP formulas, per token, for the work each mixer really does (not the Transformer 6N rule).

Conventions (so numbers compare across mixers and with torchtitan's MFU):
- A multiply-add counts 2 FLOPs; only matmul-like work is counted (exp/softmax/norms/gates are not).
- Dense work: 2 FLOPs per weight of every projection, the short convs and the LM head, per token
  (the embedding lookup is a gather and is excluded).
- Training FLOPs = 3 × forward FLOPs (backward ≈ 2 × forward for matmuls); activation-checkpoint
  recomputation is NOT counted, as in torchtitan's MFU.
- Sequence mixers are counted for one document of ``seq_len`` tokens (packed shorter documents do less).
Per layer and per token, H heads, key dim D_k, value dim D_v, T = seq_len:
- Causal softmax attention: 2·H·(D_k + D_v)·n̄, n̄ = mean keys per query = (T + 1)/2 (query t sees
  t + 1 keys; blocks above the diagonal are skipped by FlashAttention / FlexAttention).
- Sliding window W: same with n̄ = (1/T)·Σ_{t=1..T} min(W, t) = (W(W+1)/2 + (T − W)·W)/T for W < T.
- DeltaFormer: stage-1 scores κ1(w_t, k_i) over i < t: 2·D_k·(T − 1)/2; stage-1 triangular solve
  (I + diag β·P)U = V by substitution, over the same i < t: 2·D_v·(T − 1)/2; stage 2 = causal attention
  over U: 2·(D_k + D_v)·(T + 1)/2. Total 2·H·T·(D_k + D_v).
- Gated DeltaProduct with n_h steps per token and chunks of C interleaved steps (FLA-style chunked
  algorithm, dense C×C blocks as a kernel issues them). Per step: K Kᵀ in the chunk 2CD_k, UT transform
  (inverse of the unit lower-triangular C×C block) C²/3, W = T·βK 2CD_k, U = T·βV 2CD_v, state passing
  W·S and Kᵀ·(U − W·S) 2·2·D_k·D_v. Per token (query): q·S 2D_kD_v, intra-chunk q·Kᵀ 2CD_k and its
  product with the new values 2CD_v.
"""

from __future__ import annotations

from torch import nn

from titan_delta.models.components.short_conv import ShortCausalConv

TRAINING_FLOPS_FACTOR = 3  # forward + backward (2×) for matmuls
GDP_CHUNK_SIZE = 64  # interleaved steps per chunk in the Gated DeltaProduct kernels


def mean_keys_per_query(seq_len: int, window: int | None = None) -> float:
    """Average number of keys a causal query attends to over positions 1..T, optionally windowed."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if window is None or window >= seq_len:
        return (seq_len + 1) / 2
    return (window * (window + 1) / 2 + (seq_len - window) * window) / seq_len


def softmax_attention_flops(
    n_heads: int, head_dim_k: int, head_dim_v: int, seq_len: int, window: int | None = None
) -> float:
    """Forward FLOPs per token of q·kᵀ and p·v for causal (window=None) or sliding-window attention."""
    return 2 * n_heads * (head_dim_k + head_dim_v) * mean_keys_per_query(seq_len, window)


def deltaformer_flops(n_heads: int, head_dim_k: int, head_dim_v: int, seq_len: int) -> float:
    """Forward FLOPs per token of DeltaFormer's two passes: stage-1 scores + triangular solve over the
    strictly earlier tokens, then causal attention over U."""
    earlier = (seq_len - 1) / 2  # mean number of strictly earlier tokens
    stage1_scores = 2 * head_dim_k * earlier
    stage1_solve = 2 * head_dim_v * earlier
    stage2 = 2 * (head_dim_k + head_dim_v) * (seq_len + 1) / 2
    return n_heads * (stage1_scores + stage1_solve + stage2)


def gated_deltaproduct_flops(
    n_heads: int, head_dim_k: int, head_dim_v: int, num_householder: int, chunk_size: int = GDP_CHUNK_SIZE
) -> float:
    """Forward FLOPs per token of chunked Gated DeltaProduct (independent of T: linear-time)."""
    K, V, C = head_dim_k, head_dim_v, chunk_size
    per_step = (
        2 * C * K  # β K Kᵀ inside the chunk
        + C * C / 3  # UT transform: inverse of the unit lower-triangular C×C block
        + 2 * C * K  # W = T · βK
        + 2 * C * V  # U = T · βV
        + 2 * K * V  # W · S
        + 2 * K * V  # S += Kᵀ · (U − W·S)
    )
    per_query = 2 * K * V + 2 * C * K + 2 * C * V  # q·S, intra-chunk q·Kᵀ and its product with values
    return n_heads * (num_householder * per_step + per_query)


def count_parameters(model: nn.Module) -> int:
    """All parameters; a tied embedding/LM-head matrix is counted once."""
    return sum(p.numel() for p in model.parameters())


def dense_matmul_weights(model: nn.Module) -> int:
    """Weights used once per token in a multiply-add: every nn.Linear (the LM head even when its matrix
    is tied to the embedding) and the short-conv taps. Embedding lookups, norms and gate vectors excluded."""
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            total += module.weight.numel() + (module.bias.numel() if module.bias is not None else 0)
        elif isinstance(module, ShortCausalConv):
            total += module.weight.numel()
    return total


def forward_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """2 × dense weights + every mixer's own work (modules exposing ``core_flops_per_token``)."""
    mixers = sum(
        m.core_flops_per_token(seq_len) for m in model.modules() if hasattr(m, "core_flops_per_token")
    )
    return 2 * dense_matmul_weights(model) + mixers


def training_flops_per_token(model: nn.Module, seq_len: int) -> float:
    return TRAINING_FLOPS_FACTOR * forward_flops_per_token(model, seq_len)
