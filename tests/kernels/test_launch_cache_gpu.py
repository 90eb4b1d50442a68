"""GPU: the cached launch path runs the same kernels as Triton's own (bitwise), and really is taken.

Both kernel families launch through ``titan_delta_kernels._launch.launch``; these tests run each op with the
cache off (Triton's path), then on — a first call that records, a second that hits — and compare every
output and gradient bitwise. A misaligned input (a view 2 bytes into its storage) must not reuse a kernel
compiled for 16-byte-aligned pointers.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels import _launch

pytestmark = pytest.mark.gpu


def _hits() -> int:
    return sum(cache.hits for cache in _launch._CACHES.values())


def _outputs_and_grads(fn, inputs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    gen = torch.Generator(device=out.device).manual_seed(seed)
    out.backward(torch.randn(out.shape, device=out.device, dtype=out.dtype, generator=gen))
    return [out.detach()] + [x.grad for x in leaves if x.grad is not None]


def _check_bitwise(fn, inputs: list[torch.Tensor], label: str) -> None:
    previous = _launch.set_enabled(False)
    try:
        expected = _outputs_and_grads(fn, inputs, 0)
        _launch.set_enabled(True)
        _outputs_and_grads(fn, inputs, 0)  # records the compiled kernels
        before = _hits()
        got = _outputs_and_grads(fn, inputs, 0)
        hits = _hits() - before
    finally:
        _launch.set_enabled(previous)
    assert hits > 0, f"{label}: the cached path was never taken"
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(a, b), f"{label}: output/gradient {i} differs between the launch paths"


def _misaligned_copy(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of x whose data pointer is 2 bytes (one bf16) past a 16-byte boundary."""
    buf = torch.empty(x.numel() + 8, device=x.device, dtype=x.dtype)
    view = buf[1:1 + x.numel()].view(x.shape)
    view.copy_(x)
    assert view.data_ptr() % 16 != 0
    return view


@pytest.mark.parametrize("misaligned", [False, True])
def test_deltaformer_cached_launches_match_triton_bitwise(misaligned):
    from titan_delta_kernels.deltaformer import deltaformer_attn_triton

    gen = torch.Generator(device="cuda").manual_seed(1)
    B, T, H, D = 2, 1000, 4, 64
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    beta = torch.rand(B, T, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    if misaligned:  # after an aligned call, so a wrongly shared cache entry would be found
        _check_bitwise(lambda *a: deltaformer_attn_triton(*a, scale=D ** -0.5), [q, k, v, beta], "aligned")
        q = _misaligned_copy(q)
    _check_bitwise(lambda *a: deltaformer_attn_triton(*a, scale=D ** -0.5), [q, k, v, beta],
                   f"deltaformer misaligned={misaligned}")  # fmt: skip


def test_gated_delta_product_cached_launches_match_triton_bitwise():
    from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

    gen = torch.Generator(device="cuda").manual_seed(2)
    B, T, H, K, n_h = 2, 300, 4, 64, 2
    q = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.nn.functional.normalize(
        torch.randn(B, T * n_h, H, K, device="cuda", generator=gen), dim=-1).to(torch.bfloat16)
    v = torch.randn(B, T * n_h, H, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    g = -torch.rand(B, T, H, device="cuda", generator=gen) * 0.5
    beta = (torch.rand(B, T * n_h, H, device="cuda", generator=gen) * 2).to(torch.bfloat16)

    def run(q, k, v, g, beta):
        return gated_delta_product_triton(q, k, v, g, beta, num_householder=n_h, scale=K ** -0.5)

    _check_bitwise(run, [q, k, v, g, beta], "gated delta product")
