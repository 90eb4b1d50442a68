"""The recurrent decode kernel against the fp64 reference, and continuing a chunked prefill."""

from __future__ import annotations

import pytest
import torch

from titan_delta.ops.gated_delta_product.reference import (
    gated_delta_product_chunked,
    gated_delta_product_recurrent,
)
from titan_delta.testing import assert_rel_close
from titan_delta_kernels.gated_delta_product import (
    gated_delta_product_recurrent_triton,
    gated_delta_product_triton,
)

from .helpers import NAMES, make_inputs


@pytest.mark.parametrize(("n_h", "varlen", "V"), [(2, False, 32), (3, True, 32), (2, False, 256)])
def test_recurrent_decode_matches_reference(n_h, varlen, V):
    B, T, N = (1, 7, 3) if varlen else (2, 3, 2)
    inputs = make_inputs(B, T, 2, 16, V, n_h, num_seqs=N)
    cu = torch.tensor([0, 2, 2, 7], dtype=torch.int32) if varlen else None
    args = [inputs[n] for n in NAMES[:5]]
    o, final = gated_delta_product_recurrent_triton(
        *args, num_householder=n_h, initial_state=inputs["initial_state"], output_final_state=True,
        cu_seqlens=cu,
    )  # fmt: skip
    ro, rfinal = gated_delta_product_recurrent(
        *(None if x is None else x.double() for x in args), num_householder=n_h,
        initial_state=inputs["initial_state"].double(), output_final_state=True, cu_seqlens=cu,
    )  # fmt: skip
    assert_rel_close(o, ro, 1e-5, "o")
    assert_rel_close(final, rfinal, 1e-5, "final_state")


def test_decode_continues_a_chunked_prefill():
    """Prefill with the chunked kernel, decode 2 tokens with the recurrent one == one pass over all."""
    n_h, T = 2, 18
    inputs = make_inputs(1, T + 2, 1, 16, 16, n_h)
    q, k, v, g, beta, h0 = (inputs[n] for n in NAMES)
    _, state = gated_delta_product_triton(
        q[:, :T], k[:, : T * n_h], v[:, : T * n_h], g[:, :T], beta[:, : T * n_h], num_householder=n_h,
        initial_state=h0, output_final_state=True,
    )  # fmt: skip
    o_dec, final = gated_delta_product_recurrent_triton(
        q[:, T:], k[:, T * n_h :], v[:, T * n_h :], g[:, T:], beta[:, T * n_h :], num_householder=n_h,
        initial_state=state, output_final_state=True,
    )  # fmt: skip
    ro, rfinal = gated_delta_product_recurrent(
        *(x.double() for x in (q, k, v, g, beta)), num_householder=n_h, initial_state=h0.double(),
        output_final_state=True,
    )  # fmt: skip
    assert_rel_close(o_dec, ro[:, T:], 1e-5, "decoded o")
    assert_rel_close(final, rfinal, 1e-5, "final_state")


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [2, 3])
def test_gpu_chunked_equals_recurrent_kernel_and_chunked_reference(n_h):
    inputs = make_inputs(2, 513, 4, 128, 128, n_h, device="cuda", dtype=torch.bfloat16)
    args = [inputs[n] for n in NAMES[:5]]
    kw = dict(num_householder=n_h, initial_state=inputs["initial_state"], output_final_state=True)
    o, final = gated_delta_product_triton(*args, **kw)
    o_rec, final_rec = gated_delta_product_recurrent_triton(*args, **kw)
    o_ref, final_ref = gated_delta_product_chunked(*(None if x is None else x.double() for x in args), **kw)
    assert_rel_close(o, o_ref, 5e-3, "chunked o")
    assert_rel_close(o_rec, o_ref, 5e-3, "recurrent o")
    assert_rel_close(final, final_ref, 5e-3, "chunked final_state")
    assert_rel_close(final_rec, final_ref, 5e-3, "recurrent final_state")
