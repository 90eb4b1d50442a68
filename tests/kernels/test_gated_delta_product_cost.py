"""The benchmark's cost model (``cost.py``) must describe the tensors the kernels really allocate.

Its GB/s and TFLOP/s columns are only as good as its sizes, so each modelled tensor is compared with the
one a real (interpreted) run produces, for the default and the lowp variant, at a shape with a partial
last chunk.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product import cost
from titan_delta_kernels.gated_delta_product._common import chunk_geometry, row_scaled_f16, sequence_layout
from titan_delta_kernels.gated_delta_product.grads import dqkw, wy_bwd
from titan_delta_kernels.gated_delta_product.output import dv_local, output_fwd
from titan_delta_kernels.gated_delta_product.state import state_bwd, state_fwd
from titan_delta_kernels.gated_delta_product.wy_fwd import wy_fwd

from .test_gated_delta_product_triton import make_inputs


@pytest.mark.parametrize(("lowp", "w16"), [(False, False), (True, False), (False, True)])
def test_cost_model_sizes_match_the_kernels(lowp, w16):
    B, T, H, K, V, n_h = 2, 23, 2, 16, 32, 2
    x = make_inputs(B, T, H, K, V, n_h, dtype=torch.float16)
    q, k, v, g = x["q"], x["k"], x["v"], x["g"]
    beta = x["beta"].to(torch.float16)
    geo = chunk_geometry(n_h)
    seqs = sequence_layout(B, T, None, geo, q.device)
    inter = torch.float16 if lowp else torch.float32
    d_out = torch.randn(B, T, H, V).to(torch.float16)
    t_inv, w, u = wy_fwd(k, v, beta, g, geo, seqs, inter)
    scales = {}
    if w16:  # the row-scaled fp16 W and U of the w16 variant; the model counts their scales with them
        (w, w_scale), (u, u_scale) = row_scaled_f16(w), row_scaled_f16(u)
        scales = dict(w_scale=w_scale, u_scale=u_scale)
    states, delta, _ = state_fwd(k, w, u, g, None, geo, seqs, **scales)
    o = output_fwd(q, k, g, delta, states, 0.25, geo, seqs)
    d_vlocal = dv_local(q, k, g, d_out, 0.25, geo, seqs, inter)
    d_states, d_delta, _ = state_bwd(q, k, w, g, d_out, None, d_vlocal, 0.25, geo, seqs,
                                     w_scale=scales.get("w_scale"))  # fmt: skip
    dq, dk_part, dw, dG_step, dG_tok = dqkw(q, k, g, delta, states, d_states, d_delta, d_out, 0.25, geo, seqs)
    dk, dv, dg, dbeta = wy_bwd(k, v, g, beta, t_inv, d_delta, dk_part, dw, dG_step, dG_tok, geo, seqs)
    real = dict(q=q, k=k, v=v, beta=beta, g=g, t_inv=t_inv, w=w, u=u, delta=delta, states=states, o=o,
                d_out=d_out, d_vlocal=d_vlocal, d_delta=d_delta, d_states=d_states, dq=dq, dk_part=dk_part,
                dw=dw, dG_step=dG_step, dG_tok=dG_tok, dk=dk, dv=dv, dbeta=dbeta, dg=dg)  # fmt: skip
    model = cost.tensor_bytes(B, T, H, K, V, n_h, lowp=lowp, in_bytes=2, w16=w16, dkp16=False)
    assert set(model) == set(real)
    for name, t in real.items():
        size = t.numel() * t.element_size()
        if w16 and name in ("w", "u"):
            size += scales[f"{name}_scale"].numel() * 4
        assert model[name] == size, name
    stages = cost.stage_costs(B, T, H, K, V, n_h, lowp=lowp, in_bytes=2)
    assert set(stages) == {*cost.FORWARD_STAGES, *cost.BACKWARD_STAGES}
    for c in stages.values():
        assert set(c.reads) | set(c.writes) <= set(model) and c.flops > c.duplicated_flops >= 0
    # Saving the states removes exactly one state pass from the backward's bytes.
    full, saved = cost.totals(stages), cost.totals(stages, save_states=True)
    assert full["backward"][0] - saved["backward"][0] == stages["state_fwd"].bytes
