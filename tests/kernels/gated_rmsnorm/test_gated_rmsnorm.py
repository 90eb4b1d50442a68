"""The Triton gated RMSNorm against ``GatedRMSNorm.forward_torch`` computed in fp64.

CPU (TRITON_INTERPRET=1, set by tests/conftest.py): rows that cross the kernels' row tiles and programs, V
not a power of two, the gate as a strided slice of a wider tensor (Gated DeltaProduct's gate GEMM), fp32 at
1e-5 and fp16 at 1e-2; kernel-allocated buffers are NaN-poisoned. Also the module wired to the op, its
torch.compile(fullgraph=True) trace and ``opcheck``. GPU (``gpu`` marker): the 340M shape in bf16 against fp64
and against the PyTorch bf16 path, and a deterministic weight gradient.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta.models.components import norms as norms_module
from titan_delta.models.components.norms import GatedRMSNorm
from titan_delta.testing import assert_rel_close, rel_rms_error
from titan_delta_kernels.gated_rmsnorm import gated_rmsnorm
from titan_delta_kernels.gated_rmsnorm import op as norm_ops

EPS = 1e-6


@pytest.fixture(autouse=True)
def _poison_kernel_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITAN_DELTA_POISON", "1")


def strided_gate(B, T, H, V, dtype, device="cpu", offset=12, extra=4):
    """A [B, T, H, V] view of a [B, T, offset + H·V + extra] tensor, as the model slices its gate GEMM."""
    wide = torch.randn(B, T, offset + H * V + extra, device=device).to(dtype)
    return wide[..., offset : offset + H * V].view(B, T, H, V)


def reference(x, gate, weight, dy):
    """(y, dx, dgate, dweight) of the PyTorch path in fp64."""
    norm = GatedRMSNorm(x.shape[-1], EPS).double().to(x.device)
    with torch.no_grad():
        norm.weight.copy_(weight)
    x, gate = x.detach().double().requires_grad_(), gate.detach().double().requires_grad_()
    y = norm.forward_torch(x, gate)
    return (y, *torch.autograd.grad(y, (x, gate, norm.weight), dy.double()))


def kernel(x, gate, weight, dy):
    x, gate, weight = (t.detach().requires_grad_() for t in (x, gate, weight))
    y = gated_rmsnorm(x, gate, weight, EPS)
    return (y, *torch.autograd.grad(y, (x, gate, weight), dy))


def check(x, gate, weight, tol):
    dy = torch.randn_like(x)
    got, expected = kernel(x, gate, weight, dy), reference(x, gate, weight, dy)
    assert got[0].dtype == got[1].dtype == x.dtype and got[2].dtype == gate.dtype
    for name, a, e in zip(("y", "dx", "dgate", "dweight"), got, expected, strict=True):
        assert_rel_close(a, e, tol, f"{name} (shape {tuple(x.shape)}, dtype {x.dtype})")


# ---------------------------------------------------------------- CPU (interpreter) tests, tiny shapes
@pytest.mark.parametrize(
    ("B", "T", "H", "V", "strided"),
    [
        (1, 1, 1, 8, False),  # one row
        (2, 37, 3, 48, True),  # V not a power of two; 222 rows: several programs, the last one short
        (1, 9, 4, 256, True),  # the 340M head width (8 rows per forward tile)
        (3, 5, 2, 1024, False),  # the widest row: one row per tile
    ],
)
def test_matches_reference_fp32(B, T, H, V, strided):
    x = torch.randn(B, T, H, V)
    gate = strided_gate(B, T, H, V, torch.float32) if strided else torch.randn(B, T, H, V)
    check(x, gate, torch.randn(V), 1e-5)


def test_matches_reference_fp16():
    x = torch.randn(2, 21, 4, 64).half()
    check(x, strided_gate(2, 21, 4, 64, torch.float16), torch.randn(64), 1e-2)


def test_gate_without_contiguous_heads_is_copied():
    """A gate whose heads are not contiguous within a row (a transposed view) is read correctly."""
    x = torch.randn(2, 6, 3, 16)
    gate = torch.randn(2, 6, 16, 3).transpose(-1, -2)
    check(x, gate, torch.randn(16), 1e-5)


def test_rejects_bad_arguments():
    x, gate, weight = torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.randn(8)
    with pytest.raises(ValueError, match="gate must have x's shape"):
        gated_rmsnorm(x, gate[:, :3], weight)
    with pytest.raises(ValueError, match=r"weight must have shape \[V\] = \[8\]"):
        gated_rmsnorm(x, gate, torch.randn(4))
    with pytest.raises(ValueError, match="V <= 1024"):
        gated_rmsnorm(torch.randn(1, 2, 2048), torch.randn(1, 2, 2048), torch.randn(2048))
    with pytest.raises(TypeError, match="x must have dtype"):
        gated_rmsnorm(x.double(), gate, weight)


def test_custom_ops_pass_opcheck():
    x = torch.randn(5, 3, 16, requires_grad=True)
    gate = strided_gate(1, 5, 3, 16, torch.float32)[0].detach().requires_grad_()
    weight = torch.randn(16, requires_grad=True)
    torch.library.opcheck(norm_ops.gated_rmsnorm_fwd, (x, gate, weight, EPS))
    dy = torch.randn(5, 3, 16)
    torch.library.opcheck(norm_ops.gated_rmsnorm_bwd, (dy, x.detach(), gate.detach(), weight.detach(), EPS))


def _force_kernel(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Makes ``GatedRMSNorm.forward`` take the Triton op on CPU; returns a list counting its loads."""
    loads = []
    load = norms_module._gated_kernel
    monkeypatch.setattr(norms_module, "_gated_kernel_applies", lambda x, gate, weight: True)
    monkeypatch.setattr(norms_module, "_gated_kernel", lambda: loads.append(1) or load())
    return loads


def test_module_runs_the_op_when_it_applies(monkeypatch):
    norm = GatedRMSNorm(32, EPS)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 7, 4, 32, requires_grad=True)
    gate = strided_gate(2, 7, 4, 32, torch.float32).requires_grad_()
    dy = torch.randn(2, 7, 4, 32)
    expected = norm.forward_torch(x, gate)
    expected_grads = torch.autograd.grad(expected, (x, gate, norm.weight), dy)
    loads = _force_kernel(monkeypatch)
    got = norm(x, gate)
    assert loads, "the module did not take the Triton path"
    assert_rel_close(got, expected, 1e-5, "y")
    for name, a, e in zip(("dx", "dgate", "dweight"), torch.autograd.grad(got, (x, gate, norm.weight), dy),
                          expected_grads, strict=True):  # fmt: skip
        assert_rel_close(a, e, 1e-5, name)


def test_module_compiles_fullgraph_with_the_op(monkeypatch):
    """torch.compile(fullgraph=True) traces the module through the op's fake kernel and autograd rule."""
    _force_kernel(monkeypatch)
    targets: set[str] = set()
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def recording_backend(gm, example_inputs):
        targets.update(str(node.target) for node in gm.graph.nodes)
        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    norm = GatedRMSNorm(16, EPS)
    x = torch.randn(1, 5, 2, 16, requires_grad=True)
    wide = torch.randn(1, 5, 40, requires_grad=True)
    y = torch.compile(lambda x, wide: norm(x, wide[..., 4:36].view(1, 5, 2, 16)), fullgraph=True,
                      backend=recording_backend)(x, wide)  # fmt: skip
    y.square().sum().backward()
    assert "titan_delta.gated_rmsnorm_fwd.default" in targets, sorted(targets)
    expected = norm.forward_torch(x, wide[..., 4:36].view(1, 5, 2, 16))
    assert_rel_close(y, expected, 1e-5, "compiled y")
    grads = torch.autograd.grad(expected.square().sum(), (x, wide, norm.weight))
    for name, a, e in zip(("dx", "dwide", "dweight"), (x.grad, wide.grad, norm.weight.grad), grads,
                          strict=True):  # fmt: skip
        assert_rel_close(a, e, 1e-5, f"compiled {name}")


# ---------------------------------------------------------------- GPU tests, the 340M shape
@pytest.mark.gpu
def test_gpu_340m_shape_bf16():
    """Triton vs fp64 at 1e-2 and no less accurate than the PyTorch path on the same bf16 inputs
    (gated_deltaproduct 340M: 4 heads of 256, the gate a slice of the 1,040-column gate GEMM)."""
    B, T, H, V = 16, 2048, 4, 256
    x = torch.randn(B, T, H, V, device="cuda").to(torch.bfloat16)
    gate = strided_gate(B, T, H, V, torch.bfloat16, "cuda")
    weight = 1 + 0.1 * torch.randn(V, device="cuda")
    dy = torch.randn_like(x)
    got, expected = kernel(x, gate, weight, dy), reference(x, gate, weight, dy)
    norm = GatedRMSNorm(V, EPS).cuda()
    with torch.no_grad():
        norm.weight.copy_(weight)
    xt, gt = x.detach().requires_grad_(), gate.detach().requires_grad_()
    yt = norm.forward_torch(xt, gt)
    torch_path = (yt, *torch.autograd.grad(yt, (xt, gt, norm.weight), dy))
    for name, a, t, e in zip(("y", "dx", "dgate", "dweight"), got, torch_path, expected, strict=True):
        err, torch_err = rel_rms_error(a, e), rel_rms_error(t, e)
        assert err <= 1e-2, f"{name}: relative RMS error {err:.3e}"
        assert err <= 1.1 * torch_err + 1e-6, f"{name}: Triton {err:.3e} vs PyTorch path {torch_err:.3e}"
    again = kernel(x, gate, weight, dy)
    assert all(torch.equal(a, b) for a, b in zip(got, again, strict=True)), "differs between identical runs"
