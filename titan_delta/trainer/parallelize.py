"""TrainSpec ``parallelize_fn``: activation checkpointing, per-block torch.compile, then FSDP2/HSDP or DDP.

Data parallelism only (our models have no TP/CP/PP plans). Gradients are *summed* across ranks in
every mode, because the trainer already divides each rank's loss by the global number of tokens:
- FSDP2 / HSDP: one ``fully_shard`` per block, one for the embedding, one for [final norm, LM head], and
  the root; params in ``mixed_precision_param`` (bf16), reductions in fp32, divide factor 1. On gloo
  (CPU) the reduction is forced to plain SUM: gloo has no PREMUL_SUM.
- DDP (replicate only): a SUM comm hook replaces DDP's built-in averaging, which on top of the token
  normalisation would divide gradients by the world size a second time (torchtitan 0.2.2 does that).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torchtitan.config import TORCH_DTYPE_MAP, JobConfig
from torchtitan.distributed import ParallelDims
from torchtitan.tools.logging import logger

from titan_delta.trainer.activation_checkpoint import apply_activation_checkpointing
from titan_delta.trainer.compile import compile_blocks

RESHARD_POLICIES = ("default", "always", "never")


def check_supported_parallelism(parallel_dims: ParallelDims) -> None:
    unsupported = {
        "tensor_parallel_degree": parallel_dims.tp,
        "context_parallel_degree": parallel_dims.cp,
        "pipeline_parallel_degree": parallel_dims.pp,
        "expert_parallel_degree": parallel_dims.ep,
    }
    for key, degree in unsupported.items():
        if degree != 1:
            raise ValueError(
                f"[parallelism] {key} = {degree}: titan-delta models support data parallelism only "
                "(data_parallel_shard_degree / data_parallel_replicate_degree)"
            )


# No annotations: DDP inspects the hook's signature and rejects postponed (string) annotations.
def _sum_allreduce_hook(group, bucket):
    """DDP comm hook (ProcessGroup, GradBucket) -> Future: all-reduce SUM, no division by world size."""
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def apply_ddp(model: nn.Module, mesh: DeviceMesh, compiled: bool) -> None:
    if compiled:
        torch._dynamo.config.optimize_ddp = "ddp_optimizer"
    replicate(model, device_mesh=mesh, bucket_cap_mb=100)
    model.register_comm_hook(mesh.get_group(), _sum_allreduce_hook)
    logger.info(f"Applied DDP over {mesh.size()} ranks (SUM all-reduce of token-normalised gradients)")


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard_policy: str = "default",
    cpu_offload: bool = False,
) -> None:
    """fully_shard each block, the embedding, [norm, output] and the root (HSDP if ``mesh`` is 2-D)."""
    if reshard_policy not in RESHARD_POLICIES:
        raise ValueError(
            f"[parallelism] fsdp_reshard_after_forward = {reshard_policy!r}: "
            f"expected one of {RESHARD_POLICIES}"
        )
    config: dict = {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype, reduce_dtype)}
    if cpu_offload:
        config["offload_policy"] = CPUOffloadPolicy()
    reshard = reshard_policy != "never"
    tied = getattr(getattr(model, "model_args", None), "enable_weight_tying", False)
    if not tied:  # a tied embedding/head weight must stay in one FSDP unit: the root's
        fully_shard(model.tok_embeddings, **config, reshard_after_forward=reshard)
    for block in model.layers.values():
        fully_shard(block, **config, reshard_after_forward=reshard)
    if not tied:
        # The head runs last in forward and first in backward: keeping it gathered saves one all-gather.
        fully_shard([model.norm, model.output], **config, reshard_after_forward=reshard_policy == "always")
    fully_shard(model, **config)
    force_sum = mesh.device_type == "cpu"  # gloo cannot PREMUL_SUM
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if force_sum:
                module.set_force_sum_reduction_for_comms(True)
    kind = "HSDP" if mesh.ndim == 2 else "FSDP"
    logger.info(f"Applied {kind} over mesh {tuple(mesh.shape)} (params {param_dtype}, reduce {reduce_dtype})")


def parallelize_titan_delta(
    model: nn.Module, parallel_dims: ParallelDims, job_config: JobConfig
) -> nn.Module:
    """AC → compile → data parallelism, in that order (torchtitan's): compile sees the AC wrappers and
    FSDP hooks go around the compiled blocks."""
    check_supported_parallelism(parallel_dims)
    apply_activation_checkpointing(model, job_config.activation_checkpoint)
    compiled = job_config.compile.enable and "model" in job_config.compile.components
    if compiled:
        compile_blocks(model, job_config.compile.backend)
    if parallel_dims.fsdp_enabled:
        names = ["dp_replicate", "fsdp"] if parallel_dims.dp_replicate_enabled else ["fsdp"]
        apply_fsdp(
            model,
            parallel_dims.get_mesh(names),
            param_dtype=TORCH_DTYPE_MAP[job_config.training.mixed_precision_param],
            reduce_dtype=TORCH_DTYPE_MAP[job_config.training.mixed_precision_reduce],
            reshard_policy=job_config.parallelism.fsdp_reshard_after_forward,
            cpu_offload=job_config.training.enable_cpu_offload,
        )
    elif parallel_dims.dp_replicate_enabled:
        apply_ddp(model, parallel_dims.get_mesh("dp_replicate"), compiled)
    return model
