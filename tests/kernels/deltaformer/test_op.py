"""The DeltaFormer op (``deltaformer_attn_triton``) against the pure-PyTorch references.

CPU (CI): the kernels run in Triton's interpreter (16-row chunks, 64-row forward and 32-row backward
superblocks) against the fp64 token-by-token oracle at lengths that cross chunk and superblock boundaries
with ragged ends; width = max(D, Dv) <= 64 takes the wavefront backward, wider the superblock backward.
GPU (``gpu`` marker): real shapes in bf16/fp16 against the fp32 chunk-wise reference, fp32 against the
fp64 one at 1e-4, compile time, long sequences, no host synchronisation with ``cu_seqlens``, and
``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.deltaformer.helpers import check_against_oracle, describe, gpu_check, grads, make_inputs
from titan_delta.ops import deltaformer_attn
from titan_delta.ops.deltaformer.reference import deltaformer_attn_recurrent
from titan_delta.testing import rel_rms_error
from titan_delta_kernels.deltaformer import deltaformer_attn_triton

CPU_CASES = {
    # name: (B, T, H, D, Dv, separate_w, cu_seqlens)
    "ragged": (1, 37, 2, 16, 16, False, None),
    "batch_w_separate_dv32": (2, 40, 1, 16, 32, True, None),
    "varlen_with_empty_and_single_docs": (1, 45, 2, 16, 16, True, [0, 1, 20, 20, 45]),
    "varlen_w_is_q": (1, 41, 1, 16, 32, False, [0, 17, 18, 41]),
    "single_token": (1, 1, 1, 16, 16, False, None),
    "three_forward_superblocks": (1, 130, 2, 16, 16, False, None),
    "three_superblocks_varlen_sep_w": (1, 140, 1, 16, 32, True, [0, 3, 70, 70, 71, 140]),
    # width > 64: the superblock backward (64-column value slices: two programs per (b, h) at Dv = 80)
    "wide_values_varlen": (1, 101, 1, 16, 80, False, [0, 1, 40, 40, 101]),
    "wide_keys_sep_w": (1, 50, 1, 72, 16, True, None),
    # the later-rows sum of the first backward superblocks split over rows (two slabs), batch of two
    "wide_keys_row_splits_batch": (2, 120, 1, 72, 16, False, None),
}


@pytest.mark.parametrize("case", list(CPU_CASES))
def test_matches_fp64_oracle_forward_and_backward(case: str) -> None:
    check_against_oracle(*CPU_CASES[case])


def test_bf16_inputs_give_bf16_output_close_to_oracle() -> None:
    q, k, v, beta, _ = make_inputs(1, 20, 1, 16, 16, separate_w=False, dtype=torch.bfloat16, device="cpu")
    ours = deltaformer_attn_triton(q, k, v, beta, scale=0.25)
    ref = deltaformer_attn_recurrent(*(x.double() for x in (q, k, v, beta)), scale=0.25)
    assert ours.dtype == torch.bfloat16
    assert rel_rms_error(ours, ref) <= 1e-2


def test_public_op_triton_backend_matches_torch_backend() -> None:
    q, k, v, beta, _ = make_inputs(1, 24, 2, 16, 16, separate_w=False, dtype=torch.float32, device="cpu")
    ours = deltaformer_attn(q, k, v, beta, backend="triton")
    ref = deltaformer_attn(q, k, v, beta, backend="torch")
    assert rel_rms_error(ours, ref) <= 2e-5


def test_compiles_fullgraph_with_autograd() -> None:
    """The custom ops' fake kernels and autograd let dynamo/AOTAutograd trace the op without a break."""
    q, k, v, beta, _ = make_inputs(1, 18, 1, 16, 16, separate_w=False, dtype=torch.float32, device="cpu")
    proj = torch.randn(16, 16)

    def block(q, k, v, beta):
        return deltaformer_attn_triton(q @ proj, k, torch.tanh(v), torch.sigmoid(beta), scale=0.25).sum(-1)

    d_out = torch.randn(1, 18, 1)
    eager, eager_grads = grads(block, [q, k, v, beta], d_out)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out, got = grads(compiled, [q, k, v, beta], d_out)
    assert rel_rms_error(out, eager) <= 1e-6
    assert all(rel_rms_error(a, b) <= 1e-6 for a, b in zip(got, eager_grads, strict=True))


def test_activation_checkpointing_recomputes_to_the_same_gradients() -> None:
    q, k, v, beta, _ = make_inputs(1, 20, 2, 16, 16, separate_w=False, dtype=torch.float32, device="cpu")
    d_out = torch.randn(1, 20, 2, 16)

    def attn(q, k, v, beta):
        return deltaformer_attn_triton(q, k, v, beta, scale=0.3)

    def checkpointed(q, k, v, beta):
        return torch.utils.checkpoint.checkpoint(attn, q, k, v, beta, use_reentrant=False)

    _, plain = grads(attn, [q, k, v, beta], d_out)
    _, recomputed = grads(checkpointed, [q, k, v, beta], d_out)
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

    q, k, v, beta, w = make_inputs(1, 9, 1, 16, 16, separate_w=True, dtype=torch.float32, device="cpu")
    leaves = tuple(x.requires_grad_(True) for x in (q, k, v, beta))
    for probe in (None, w.requires_grad_(True)):
        torch.library.opcheck(_fwd, (*leaves, probe, None, 0.25))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dtype": torch.float64}, TypeError, "q must have dtype"),
        ({"D": 8}, ValueError, r"16 <= D \(head dim of q, k, w\) <= 128"),
        ({"D": 256}, ValueError, r"16 <= D \(head dim of q, k, w\) <= 128, got 256"),
        ({"Dv": 160}, ValueError, r"16 <= Dv \(head dim of v\) <= 128, got 160"),
        ({"B": 2, "cu_seqlens": torch.tensor([0, 4, 8])}, ValueError, "batch size must be 1"),
        ({"v_heads": 3}, ValueError, "v must have shape"),
    ],
)
def test_bad_input_raises_clear_error(kwargs: dict, error: type[Exception], match: str) -> None:
    B, D = kwargs.get("B", 1), kwargs.get("D", 16)
    dtype = kwargs.get("dtype", torch.float32)
    q = torch.randn(B, 8, 2, D, dtype=dtype)
    v = torch.randn(B, 8, kwargs.get("v_heads", 2), kwargs.get("Dv", D), dtype=dtype)
    beta = torch.rand(B, 8, 2, dtype=dtype)
    with pytest.raises(error, match=match):
        deltaformer_attn_triton(q, q, v, beta, scale=0.25, cu_seqlens=kwargs.get("cu_seqlens"))


# ----------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("B", "T", "H", "D", "separate_w"),
                         [(2, 1000, 4, 64, False), (1, 2048, 2, 128, True), (1, 777, 3, 128, False),
                          (1, 600, 2, 96, False), (1, 900, 2, 96, True)])
def test_gpu_matches_fp32_reference(B, T, H, D, separate_w, dtype) -> None:
    errors = gpu_check(B, T, H, D, separate_w=separate_w, dtype=dtype)
    print(f"[{B},{T},{H},{D}] w={'sep' if separate_w else 'q'} {dtype}: {describe(errors)}")


@pytest.mark.gpu
@pytest.mark.parametrize("separate_w", [False, True])
@pytest.mark.parametrize("D", [64, 96, 128])
def test_gpu_fp32_inputs_match_fp64_reference_within_1e4(D: int, separate_w: bool) -> None:
    """fp32 means fp32: o and every gradient within 1e-4 relative RMS of the fp64 reference."""
    errors = gpu_check(1, 700, 2, D, separate_w=separate_w, dtype=torch.float32, tol_out=1e-4, tol_grad=1e-4,
                       ref_dtype=torch.float64)
    print(f"[1,700,2,{D}] w={'sep' if separate_w else 'q'} fp32: {describe(errors)}")


@pytest.mark.gpu
def test_gpu_varlen_matches_reference() -> None:
    errors = gpu_check(1, 3000, 2, 64, separate_w=True, dtype=torch.bfloat16,
                       cu=[0, 1, 700, 700, 1777, 2900, 3000])
    print(f"varlen bf16: {describe(errors)}")


@pytest.mark.gpu
def test_gpu_varlen_long_matches_reference() -> None:
    """From T = 4096 the wavefront backward runs in 1024-row superblocks: documents across their bounds."""
    errors = gpu_check(1, 5000, 2, 64, separate_w=False, dtype=torch.bfloat16,
                       cu=[0, 1, 1000, 1024, 2100, 4100, 5000])
    print(f"varlen bf16, T = 5000: {describe(errors)}")


@pytest.mark.gpu
def test_gpu_varlen_does_not_synchronise_with_host() -> None:
    q, k, v, beta, _ = make_inputs(1, 1024, 2, 64, 64, separate_w=False, dtype=torch.bfloat16, device="cuda")
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
    q, k, v, _, _ = make_inputs(1, T, 2, 64, 64, separate_w=False, dtype=torch.bfloat16, device="cuda")
    beta = torch.ones(1, T, 2, device="cuda", dtype=torch.bfloat16)
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    out = deltaformer_attn_triton(*leaves, scale=0.125)
    out.backward(torch.randn_like(out))
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(x.grad).all() for x in leaves)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_long_length_superblocks_match_reference(D: int) -> None:
    """T >= 8192: 512-row forward superblocks, at D = 64 1024-row backward wavefront launches, at D = 128
    256-row backward superblocks; T is not a multiple of any."""
    errors = gpu_check(1, 8192 + 37, 2, D, separate_w=False, dtype=torch.bfloat16)
    print(f"[1,8229,2,{D}]: {describe(errors)}")


def _run(B: int, T: int, H: int, D: int, seed: int = 0) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    q, k, v, beta, _ = make_inputs(B, T, H, D, D, separate_w=False, dtype=torch.bfloat16, device="cuda")
    d_out = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    out = deltaformer_attn_triton(*leaves, scale=D**-0.5)
    out.backward(d_out)
    return [out.detach()] + [x.grad for x in leaves]


@pytest.mark.gpu
@pytest.mark.parametrize(("B", "T", "H", "D"), [(8, 2048, 16, 64), (2, 8192, 8, 64), (2, 4096, 16, 128)])
def test_gpu_wavefronts_are_bitwise_repeatable(B, T, H, D) -> None:
    """Thousands of wavefront programs, many more than are resident at once: every run gives the same bits
    (each program sums in a fixed order, so a read of rows before their flag was set would show)."""
    first = _run(B, T, H, D)
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(first, _run(B, T, H, D), strict=True))


@pytest.mark.gpu
def test_gpu_compile_fullgraph_matches_eager() -> None:
    q, k, v, beta, _ = make_inputs(2, 512, 4, 64, 64, separate_w=False, dtype=torch.bfloat16, device="cuda")
    proj = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16) * 0.125

    def block(q, k, v, beta):
        return deltaformer_attn_triton(q @ proj, k, v, torch.sigmoid(beta), scale=0.125)

    d_out = torch.randn(2, 512, 4, 64, device="cuda", dtype=torch.bfloat16)
    eager, eager_grads = grads(block, [q, k, v, beta], d_out)
    out, got = grads(torch.compile(block, fullgraph=True), [q, k, v, beta], d_out)
    assert rel_rms_error(out, eager) <= 1e-2
    assert all(rel_rms_error(a, b) <= 2e-2 for a, b in zip(got, eager_grads, strict=True))
