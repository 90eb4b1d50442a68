"""Wide value heads run as slices of value columns (exact: each column of the state evolves on its own)."""

from __future__ import annotations

import pytest
import torch

from titan_delta.ops.gated_delta_product import api
from titan_delta.ops.gated_delta_product.reference import gated_delta_product_chunked
from titan_delta.testing import assert_rel_close

from .gdp_helpers import initial_state_for, make_inputs


@pytest.mark.parametrize(
    ("v_dim", "k_dim", "expected"),
    [(64, 128, 64), (128, 128, 128), (256, 128, 256), (512, 128, 256), (384, 128, 128), (192, 128, 64),
     (96, 128, None), (2048, 128, None), (64, 64, 64), (128, 64, 64), (256, 64, 64), (96, 64, None)],
)  # fmt: skip
def test_value_piece(v_dim: int, k_dim: int, expected: int | None) -> None:
    assert api.value_piece(v_dim, k_dim) == expected


@pytest.mark.parametrize("n_h", [1, 3])
def test_value_pieces_equal_one_call_with_gradients(n_h: int) -> None:
    x = make_inputs(B=2, T=9, H=2, K=8, V=24, n_h=n_h)
    h0 = initial_state_for(x)
    leaves = {n: t.clone().requires_grad_(True) for n, t in {**x, "h0": h0}.items()}
    o_weight = torch.randn(2, 9, 2, 24, dtype=torch.float64)  # a random linear loss of o and the state
    s_weight = torch.randn_like(h0)

    def run(piece: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        args = {n: leaves[n] for n in ("q", "k", "v", "g", "beta")}
        o, state = api.run_in_value_pieces(
            gated_delta_product_chunked, piece, **args, initial_state=leaves["h0"],
            num_householder=n_h, scale=0.3, output_final_state=True, cu_seqlens=None,
        )  # fmt: skip
        loss = (o * o_weight).sum() + (state * s_weight).sum()
        return o, state, dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values())), strict=True))

    o_one, s_one, g_one = run(24)
    o_cut, s_cut, g_cut = run(8)
    assert_rel_close(o_cut, o_one, 1e-12, "o")
    assert_rel_close(s_cut, s_one, 1e-12, "final state")
    for name in g_one:
        assert_rel_close(g_cut[name], g_one[name], 1e-12, f"d{name}")


def test_auto_sends_wide_values_to_the_kernel_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA, V = 256 reaches the kernel as one call and V = 512 as two 256-wide ones (K = 128), V = 256 as
    four 64-wide ones at K = 64; without CUDA "auto" keeps the reference."""
    widths = []

    def fake_kernel(q, k, v, g, beta, **kwargs):
        widths.append(v.shape[-1])
        return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype), None

    monkeypatch.setattr(api, "_load_triton_kernel", lambda: fake_kernel)
    x = make_inputs(B=1, T=2, H=1, K=128, V=512, n_h=2, dtype=torch.float32)
    o, _ = api.gated_delta_product(**x, num_householder=2, backend="auto")
    assert widths == [] and o.shape[-1] == 512
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    o, _ = api.gated_delta_product(**x, num_householder=2, backend="auto")
    assert widths == [256, 256] and o.shape[-1] == 512
    x["v"] = x["v"][..., :256]
    o, _ = api.gated_delta_product(**x, num_householder=2, backend="auto")
    assert widths == [256, 256, 256] and o.shape[-1] == 256
    x["q"], x["k"] = x["q"][..., :64], x["k"][..., :64]  # K = 64: 64-column slices
    o, _ = api.gated_delta_product(**x, num_householder=2, backend="auto")
    assert widths == [256, 256, 256, 64, 64, 64, 64] and o.shape[-1] == 256


@pytest.mark.gpu
def test_gpu_auto_with_a_narrow_key_and_a_wide_value_matches_the_reference() -> None:
    """K = 64, V = 256 on a GPU: the kernel refuses one launch, auto runs 64-column slices within bf16
    tolerances of the fp64 reference."""
    from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

    torch.manual_seed(0)
    x = make_inputs(B=2, T=150, H=2, K=64, V=256, n_h=2, dtype=torch.float64)
    x = {n: t if n == "g" else t.bfloat16().double() for n, t in x.items()}  # the reference sees bf16 inputs
    args = [x[n].cuda() if n == "g" else x[n].cuda().bfloat16() for n in ("q", "k", "v", "g", "beta")]
    with pytest.raises(ValueError, match="chunked kernels take V > 64 only with K = 128"):
        gated_delta_product_triton(*args, num_householder=2)
    expected, _ = gated_delta_product_chunked(**x, num_householder=2)
    got, _ = api.gated_delta_product(*args, num_householder=2)
    assert_rel_close(got.cpu(), expected, 5e-3, "o")
