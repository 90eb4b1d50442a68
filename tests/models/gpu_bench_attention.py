"""Manual GPU benchmark (not collected by pytest): forward+backward time of one SWA mixer with FlexAttention
block masks vs a dense masked SDPA and vs full causal SDPA (FlashAttention), bf16.

    python tests/models/gpu_bench_attention.py
"""

from __future__ import annotations

import torch

from titan_delta.models.context import MixerContext, document_ids
from titan_delta.models.mixers import AttentionConfig, SoftmaxAttention
from titan_delta.models.mixers.attention_masks import build_attention_masks


def time_ms(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    device = torch.device("cuda")
    dim, heads, window = 1024, 16, 512
    for T in (2048, 8192, 32768):
        x = torch.randn(1, T, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
        cu = torch.tensor([0, T // 3, T], dtype=torch.int32, device=device)
        row = [f"T={T:6d}"]
        for label, win, backend, docs in (
            ("swa flex", window, "flex", False),
            ("swa flex+docs", window, "flex", True),
            ("swa dense-mask sdpa", window, "sdpa", False),
            ("full causal sdpa", None, "sdpa", False),
        ):
            if backend == "sdpa" and win is not None and T > 8192:
                row.append(f"{label}: skipped (dense T×T mask)")
                continue
            mixer = SoftmaxAttention(AttentionConfig(dim, heads, heads, dim // heads, window=win)).to(device)
            mixer = mixer.to(torch.bfloat16)
            masks = build_attention_masks({win}, T, document_ids(cu, T) if docs else None, backend, device)
            ctx = MixerContext(cu_seqlens=cu if docs else None, attn_masks=masks)

            def step(mixer=mixer, ctx=ctx, x=x):
                mixer(x, ctx).sum().backward()

            row.append(f"{label}: {time_ms(step):.2f} ms")
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
