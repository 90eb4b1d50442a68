"""FlexAttention's kernel options for a sliding-window block mask: fwd and fwd+bwd time of each, on one GPU.

Each option set runs in its own process (a failed compile leaves the others alone); every row also checks
the output against dense-mask SDPA. The table behind ``flex_kernel_options``
(titan_delta/models/mixers/attention_masks.py; docs/models.md, "Sliding-window layers"):

    python tools/bench/flex_attention_tiles.py --shape 16x2048x16x64 --window 512
"""

from __future__ import annotations

import argparse
import subprocess
import sys

OPTION_SETS = {
    "defaults": {},
    "shipped (`flex_kernel_options`)": {"_shipped": True},
    "max-autotune": {"_mode": "max-autotune-no-cudagraphs"},
    "backward 64x128 / 128x64, 8 warps, 2 stages": {"BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128,
                                                    "BLOCK_N2": 64, "num_warps": 8, "num_stages": 2},
    "forward 128x128, 8 warps, 2 stages": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
    "USE_TMA": {"USE_TMA": True},
}


def _measure(shape: str, window: int, options: dict) -> str:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from triton.testing import do_bench

    from titan_delta.models.mixers.attention_masks import flex_kernel_options

    B, T, H, D = (int(x) for x in shape.split("x"))
    mode = options.pop("_mode", None)
    if options.pop("_shipped", False):
        options = flex_kernel_options(D, torch.device("cuda")) or {}
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    mask = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki < window), None, None, T, T,
                             device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False, mode=mode)

    def forward():
        return compiled(q, k, v, block_mask=mask, kernel_options=options or None)

    def step():
        forward().backward(grad)

    step()
    with torch.no_grad():
        pos = torch.arange(T, device="cuda")
        distance = pos[:, None] - pos[None, :]
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=(distance >= 0) & (distance < window)).float()
        err = ((forward().float() - ref).norm() / ref.norm()).item()
    fwd = do_bench(forward, warmup=10, rep=200)
    both = do_bench(step, warmup=10, rep=200, grad_to_none=[q, k, v])
    return f"{fwd:.3f} | {both:.3f} | {err:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="16x2048x16x64", help="BxTxHxD (default 16x2048x16x64)")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: the option set's name
    args = parser.parse_args()
    if args.one is not None:
        print(_measure(args.shape, args.window, dict(OPTION_SETS[args.one])))
        return
    print(f"| kernel options ({args.shape}, window {args.window}) | fwd ms | fwd+bwd ms | rel err vs SDPA |")
    print("|---|---:|---:|---:|")
    for name in OPTION_SETS:
        run = subprocess.run([sys.executable, __file__, "--shape", args.shape, "--window", str(args.window),
                              "--one", name], capture_output=True, text=True, timeout=300)
        lines = run.stdout.strip().splitlines()
        print(f"| {name} | {lines[-1] if run.returncode == 0 and lines else 'failed'} |")


if __name__ == "__main__":
    main()
