"""DeltaFormer Triton kernels against the repository's references.

CPU (CI): the kernels run in Triton's interpreter at tiny shapes (chunk 16, superblock 32, so T = 37..45
crosses chunk and superblock boundaries with ragged ends) against the fp64 token-by-token oracle.
GPU (``gpu`` marker): real shapes in bf16/fp16 against the fp32 chunk-wise reference, long sequences,
no host synchronisation with ``cu_seqlens``, and ``torch.compile(fullgraph=True)``.
Every kernel-allocated buffer is NaN-poisoned (TITAN_DELTA_POISON=1) so unwritten elements fail.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta.ops import deltaformer_attn
from titan_delta.ops.deltaformer.reference import deltaformer_attn_chunked, deltaformer_attn_recurrent
from titan_delta.testing import rel_rms_error
from titan_delta_kernels.deltaformer import deltaformer_attn_triton


@pytest.fixture(autouse=True)
def _poison_kernel_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITAN_DELTA_POISON", "1")


def _make(B, T, H, D, Dv, *, separate_w, dtype, device, beta_max=1.0):
    def rand(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)

    q, k, v = rand(B, T, H, D), rand(B, T, H, D), rand(B, T, H, Dv)
    w = rand(B, T, H, D) if separate_w else None
    beta = (torch.rand(B, T, H, device=device) * beta_max).to(dtype)
    return q, k, v, beta, w


def _grads(fn, inputs, d_out):
    """Output and gradients of ``fn(*inputs)`` (None inputs skipped) for cotangent ``d_out``."""
    leaves = [None if x is None else x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    used = [x for x in leaves if x is not None]
    grads = torch.autograd.grad(out, used, d_out, allow_unused=True)
    return out, [torch.zeros_like(x) if g is None else g for x, g in zip(used, grads, strict=True)]


def _compare(ours, ours_grads, ref, ref_grads, tol_out, tol_grad):
    names = ["dq", "dk", "dv", "dbeta", "dw"]
    errors = {"o": rel_rms_error(ours, ref)}
    errors.update({n: rel_rms_error(a, b) for n, a, b in zip(names, ours_grads, ref_grads, strict=False)})
    assert errors["o"] <= tol_out, errors
    assert all(e <= tol_grad for n, e in errors.items() if n != "o"), errors
    return errors


CPU_CASES = {
    # name: (B, T, H, D, Dv, separate_w, cu_seqlens)
    "ragged_two_superblocks": (1, 37, 2, 16, 16, False, None),
    "batch_w_separate_dv32": (2, 40, 1, 16, 32, True, None),
    "varlen_with_empty_and_single_docs": (1, 45, 2, 16, 16, True, [0, 1, 20, 20, 45]),
    "varlen_w_is_q": (1, 41, 1, 16, 32, False, [0, 17, 18, 41]),
    "single_token": (1, 1, 1, 16, 16, False, None),
}


def check_against_oracle(B, T, H, D, Dv, separate_w, cu, variant: str | None = None) -> None:
    """fp32 kernel (default path, or ``variant``) vs the fp64 recurrent oracle: output and every gradient."""
    q, k, v, beta, w = _make(B, T, H, D, Dv, separate_w=separate_w, dtype=torch.float64, device="cpu")
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    scale = 0.37
    d_out = torch.randn(B, T, H, Dv, dtype=torch.float64)
    inputs = [q, k, v, beta, w]
    chosen = {} if variant is None else {"variant": variant}

    def reference(q, k, v, beta, w):
        return deltaformer_attn_recurrent(q, k, v, beta, w=w, scale=scale, cu_seqlens=cu_seqlens)

    def kernel(q, k, v, beta, w):
        return deltaformer_attn_triton(q, k, v, beta, w=w, scale=scale, cu_seqlens=cu_seqlens, **chosen)

    ref, ref_grads = _grads(reference, inputs, d_out)
    fp32 = [None if x is None else x.float() for x in inputs]
    ours, ours_grads = _grads(kernel, fp32, d_out.float())
    assert ours.dtype == torch.float32
    _compare(ours, ours_grads, ref, ref_grads, tol_out=2e-5, tol_grad=5e-5)


@pytest.mark.parametrize("case", list(CPU_CASES))
def test_matches_fp64_oracle_forward_and_backward(case: str) -> None:
    check_against_oracle(*CPU_CASES[case])


def test_bf16_inputs_give_bf16_output_close_to_oracle() -> None:
    q, k, v, beta, _ = _make(1, 20, 1, 16, 16, separate_w=False, dtype=torch.bfloat16, device="cpu")
    ours = deltaformer_attn_triton(q, k, v, beta, scale=0.25)
    ref = deltaformer_attn_recurrent(*(x.double() for x in (q, k, v, beta)), scale=0.25)
    assert ours.dtype == torch.bfloat16
    assert rel_rms_error(ours, ref) <= 1e-2


def test_public_op_triton_backend_matches_torch_backend() -> None:
    q, k, v, beta, _ = _make(1, 24, 2, 16, 16, separate_w=False, dtype=torch.float32, device="cpu")
    ours = deltaformer_attn(q, k, v, beta, backend="triton")
    ref = deltaformer_attn(q, k, v, beta, backend="torch")
    assert rel_rms_error(ours, ref) <= 2e-5


def test_compiles_fullgraph_with_autograd() -> None:
    """The custom ops' fake kernels and autograd let dynamo/AOTAutograd trace the op without a break."""
    q, k, v, beta, _ = _make(1, 18, 1, 16, 16, separate_w=False, dtype=torch.float32, device="cpu")
    proj = torch.randn(16, 16)

    def block(q, k, v, beta):
        return deltaformer_attn_triton(q @ proj, k, torch.tanh(v), torch.sigmoid(beta), scale=0.25).sum(-1)

    d_out = torch.randn(1, 18, 1)
    eager, eager_grads = _grads(block, [q, k, v, beta], d_out)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out, grads = _grads(compiled, [q, k, v, beta], d_out)
    assert rel_rms_error(out, eager) <= 1e-6
    assert all(rel_rms_error(a, b) <= 1e-6 for a, b in zip(grads, eager_grads, strict=True))


def test_activation_checkpointing_recomputes_to_the_same_gradients() -> None:
    q, k, v, beta, _ = _make(1, 20, 2, 16, 16, separate_w=False, dtype=torch.float32, device="cpu")
    d_out = torch.randn(1, 20, 2, 16)

    def attn(q, k, v, beta):
        return deltaformer_attn_triton(q, k, v, beta, scale=0.3)

    def checkpointed(q, k, v, beta):
        return torch.utils.checkpoint.checkpoint(attn, q, k, v, beta, use_reentrant=False)

    _, plain = _grads(attn, [q, k, v, beta], d_out)
    _, recomputed = _grads(checkpointed, [q, k, v, beta], d_out)
    assert all(rel_rms_error(a, b) <= 1e-6 for a, b in zip(recomputed, plain, strict=True))


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")
def test_fsdp2_sharded_block_matches_unsharded(tmp_path) -> None:
    """FSDP2 (torchtitan's wrapper) around a block using the op: same gradients as the plain module."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)
            self.beta = torch.nn.Linear(32, 2)
            self.out = torch.nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            B, T, _ = x.shape
            q, k, v = self.qkv(x).view(B, T, 3, 2, 16).unbind(2)
            o = deltaformer_attn_triton(q, k, v, torch.sigmoid(self.beta(x)), scale=0.25)
            return self.out(o.flatten(2))

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        sharded, plain = Block(), Block()
        plain.load_state_dict(sharded.state_dict())
        fully_shard(sharded, mesh=init_device_mesh("cpu", (1,)))
        x = torch.randn(1, 20, 32)
        sharded(x).square().sum().backward()
        plain(x).square().sum().backward()
        for (name, p), q in zip(sharded.named_parameters(), plain.parameters(), strict=True):
            assert rel_rms_error(p.grad.full_tensor(), q.grad) <= 1e-6, name
    finally:
        dist.destroy_process_group()


def test_custom_op_passes_opcheck() -> None:
    from titan_delta_kernels.deltaformer.op import _fwd

    q, k, v, beta, w = _make(1, 9, 1, 16, 16, separate_w=True, dtype=torch.float32, device="cpu")
    leaves = tuple(x.requires_grad_(True) for x in (q, k, v, beta))
    for probe in (None, w.requires_grad_(True)):
        torch.library.opcheck(_fwd, (*leaves, probe, None, 0.25))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dtype": torch.float64}, TypeError, "q must have dtype"),
        ({"D": 8}, ValueError, "16 <= D"),
        ({"B": 2, "cu_seqlens": torch.tensor([0, 4, 8])}, ValueError, "batch size must be 1"),
        ({"v_heads": 3}, ValueError, "v must have shape"),
    ],
)
def test_bad_input_raises_clear_error(kwargs: dict, error: type[Exception], match: str) -> None:
    B, D = kwargs.get("B", 1), kwargs.get("D", 16)
    dtype = kwargs.get("dtype", torch.float32)
    q = torch.randn(B, 8, 2, D, dtype=dtype)
    v = torch.randn(B, 8, kwargs.get("v_heads", 2), D, dtype=dtype)
    beta = torch.rand(B, 8, 2, dtype=dtype)
    with pytest.raises(error, match=match):
        deltaformer_attn_triton(q, q, v, beta, scale=0.25, cu_seqlens=kwargs.get("cu_seqlens"))


# ----------------------------------------------------------------------------------------------- GPU


def _gpu_check(B, T, H, D, *, separate_w, dtype, cu=None, tol_out=6e-3, tol_grad=1e-2):
    q, k, v, beta, w = _make(B, T, H, D, D, separate_w=separate_w, dtype=dtype, device="cuda")
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32, device="cuda")
    scale = D**-0.5
    d_out = torch.randn(B, T, H, D, device="cuda", dtype=dtype)
    inputs = [q, k, v, beta, w]

    def kernel(q, k, v, beta, w):
        return deltaformer_attn_triton(q, k, v, beta, w=w, scale=scale, cu_seqlens=cu_seqlens)

    def reference(q, k, v, beta, w):
        return deltaformer_attn_chunked(q, k, v, beta, w=w, scale=scale, cu_seqlens=cu_seqlens)

    ours, ours_grads = _grads(kernel, inputs, d_out)
    ref, ref_grads = _grads(reference, [None if x is None else x.float() for x in inputs], d_out.float())
    assert ours.dtype == dtype
    return _compare(ours, ours_grads, ref, ref_grads, tol_out, tol_grad)


def check_variant_on_gpu(variant: str, B: int, T: int, H: int, D: int,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 kernels under ``variant`` (through the environment, as a training run sets it) against the fp32
    reference; prints the errors. Shared by the variant, wavefront and split-inverse test files."""
    monkeypatch.setenv("TITAN_DELTA_DF_VARIANT", variant)
    errors = _gpu_check(B, T, H, D, separate_w=False, dtype=torch.bfloat16)
    print(f"[{B},{T},{H},{D}] {variant}: " + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("B", "T", "H", "D", "separate_w"),
                         [(2, 1000, 4, 64, False), (1, 2048, 2, 128, True), (1, 777, 3, 128, False),
                          (1, 600, 2, 256, False)])
def test_gpu_matches_fp32_reference(B, T, H, D, separate_w, dtype) -> None:
    errors = _gpu_check(B, T, H, D, separate_w=separate_w, dtype=dtype)
    print(f"[{B},{T},{H},{D}] w={'sep' if separate_w else 'q'} {dtype}: "
          + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "tf32x3"])
def test_gpu_diagonal_inverse_precision(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The diagonal-block inverses in plain tf32 (3x cheaper than tf32x3) must still meet the bf16 bounds."""
    monkeypatch.setenv("TITAN_DELTA_DF_INV_PREC", precision)
    errors = _gpu_check(2, 2048, 2, 128, separate_w=False, dtype=torch.bfloat16)
    print(f"inverse in {precision}: " + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))


@pytest.mark.gpu
def test_gpu_fp32_inputs_are_exact() -> None:
    _gpu_check(1, 700, 2, 64, separate_w=True, dtype=torch.float32, tol_out=1e-4, tol_grad=1e-4)


@pytest.mark.gpu
def test_gpu_varlen_matches_reference() -> None:
    errors = _gpu_check(1, 3000, 2, 64, separate_w=True, dtype=torch.bfloat16,
                        cu=[0, 1, 700, 700, 1777, 2900, 3000])
    print("varlen bf16: " + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))


@pytest.mark.gpu
def test_gpu_varlen_does_not_synchronise_with_host() -> None:
    q, k, v, beta, _ = _make(1, 1024, 2, 64, 64, separate_w=False, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, 300, 1024], dtype=torch.int32, device="cuda")
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    deltaformer_attn_triton(*leaves, scale=0.125, cu_seqlens=cu).sum().backward()  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        deltaformer_attn_triton(*leaves, scale=0.125, cu_seqlens=cu).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_gpu_long_sequence_with_beta_one_stays_finite() -> None:
    T = 32768
    q, k, v, _, _ = _make(1, T, 2, 64, 64, separate_w=False, dtype=torch.bfloat16, device="cuda")
    beta = torch.ones(1, T, 2, device="cuda", dtype=torch.bfloat16)
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    out = deltaformer_attn_triton(*leaves, scale=0.125)
    out.backward(torch.randn_like(out))
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(x.grad).all() for x in leaves)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_default_superblocks_at_long_length_match_reference(D: int) -> None:
    """T >= 8192 with the GPU defaults: many forward superblocks (512 rows), and at D = 128 backward
    superblocks of another size (256 rows); T is not a multiple of either."""
    errors = _gpu_check(1, 8192 + 37, 2, D, separate_w=False, dtype=torch.bfloat16)
    print(f"[1,8229,2,{D}] defaults: " + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))


@pytest.mark.gpu
def test_gpu_compile_fullgraph_matches_eager() -> None:
    q, k, v, beta, _ = _make(2, 512, 4, 64, 64, separate_w=False, dtype=torch.bfloat16, device="cuda")
    proj = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16) * 0.125

    def block(q, k, v, beta):
        return deltaformer_attn_triton(q @ proj, k, v, torch.sigmoid(beta), scale=0.125)

    d_out = torch.randn(2, 512, 4, 64, device="cuda", dtype=torch.bfloat16)
    eager, eager_grads = _grads(block, [q, k, v, beta], d_out)
    out, grads = _grads(torch.compile(block, fullgraph=True), [q, k, v, beta], d_out)
    assert rel_rms_error(out, eager) <= 1e-2
    assert all(rel_rms_error(a, b) <= 2e-2 for a, b in zip(grads, eager_grads, strict=True))
