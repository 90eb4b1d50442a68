"""Activation checkpointing per decoder block: full, every n-th block, or selective per op.

``[activation_checkpoint] mode``: "none" | "full" (recompute every block in backward) | "selective"
with ``selective_ac_option`` = "n" (a positive int: checkpoint every n-th block, counted from the first
block of *this* model) or "op" (inside every block keep the outputs of matmuls, attention and our
DeltaFormer / Gated DeltaProduct ops; recompute the cheap element-wise ops and norms).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from torchtitan.config.job_config import ActivationCheckpoint as ACConfig
from torchtitan.tools.logging import logger

AC_MODES = ("none", "full", "selective")
# Namespaces of our own torch.library custom ops (Triton kernels); their outputs are always kept.
OUR_OP_NAMESPACES = ("titan_delta",)


def _ops_to_save() -> set[object]:
    """Expensive ops whose outputs per-op SAC keeps (built lazily: some ops exist only in some builds)."""
    names = [
        ("aten", "mm"), ("aten", "addmm"), ("aten", "bmm"),
        ("aten", "_scaled_dot_product_efficient_attention"),
        ("aten", "_scaled_dot_product_flash_attention"),
        ("aten", "_scaled_dot_product_cudnn_attention"),
        ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
        ("aten", "_scaled_dot_product_attention_math"),
        ("_c10d_functional", "reduce_scatter_tensor"),
    ]  # fmt: skip
    ops: set[object] = set()
    for namespace, name in names:
        packet = getattr(getattr(torch.ops, namespace), name, None)
        if packet is not None:
            ops.add(packet.default)
    flex = getattr(torch._higher_order_ops, "flex_attention", None)
    if flex is not None:
        ops.add(flex)
    return ops


def _per_op_policy(save: set[object]) -> Callable[..., CheckpointPolicy]:
    def policy(ctx: object, func: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        namespace = getattr(func, "namespace", "")
        if func in save or namespace in OUR_OP_NAMESPACES:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def parse_every_n(option: str) -> int | None:
    """The n of selective_ac_option = "n", None for "op"; a clear error for anything else."""
    if option == "op":
        return None
    if option.isdigit() and int(option) >= 1:
        return int(option)
    raise ValueError(
        f"[activation_checkpoint] selective_ac_option = {option!r}: expected 'op' or a positive integer n "
        "(checkpoint every n-th block)"
    )


def _wrap(block: nn.Module, config: ACConfig, context_fn: Callable | None = None) -> nn.Module:
    kwargs = {"preserve_rng_state": config.preserve_rng_state, "determinism_check": config.determinism_check}
    if context_fn is not None:
        kwargs["context_fn"] = context_fn
    return checkpoint_wrapper(block, early_stop=config.early_stop, debug=config.debug, **kwargs)


def apply_activation_checkpointing(model: nn.Module, config: ACConfig) -> int:
    """Wrap the blocks of ``model.layers`` in place; returns how many blocks were wrapped."""
    if config.mode not in AC_MODES:
        raise ValueError(
            f"[activation_checkpoint] mode = {config.mode!r}: expected one of {AC_MODES} "
            "(memory_budget is not supported by titan-delta)"
        )
    if config.mode == "none":
        return 0
    every_n = parse_every_n(config.selective_ac_option) if config.mode == "selective" else 1
    layers = model.get_submodule("layers")
    save = _ops_to_save()
    wrapped = 0
    for index, (name, block) in enumerate(list(layers.named_children())):
        if every_n is None:
            policy = _per_op_policy(save)
            new_block = _wrap(block, config, lambda p=policy: create_selective_checkpoint_contexts(p))
        elif (index + 1) % every_n == 0:
            new_block = _wrap(block, config)
        else:
            continue
        layers.register_module(name, new_block)
        wrapped += 1
    what = "per-op selective" if every_n is None else f"every {every_n} block(s)"
    logger.info(f"Activation checkpointing ({config.mode}, {what}): {wrapped} of {len(layers)} blocks")
    return wrapped
