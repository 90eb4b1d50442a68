"""Train a zoo model on one task with the length curriculum, then measure accuracy at and beyond the
training length. ``run_experiment(config)`` runs one seed and returns the JSON-ready report described in
report.py; ``titan_delta.state_tracking.seeds.run_seeds`` runs several and adds their mean.

The hot loop never reads a GPU value on the host: batches are copied without blocking, the loss stays a
tensor, and the host only synchronises at the curriculum checks (every ``eval_every`` steps)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from titan_delta.models import TitanDeltaLM, count_parameters
from titan_delta.state_tracking.config import StateTrackingConfig, TrainingConfig
from titan_delta.state_tracking.curriculum import LengthCurriculum
from titan_delta.state_tracking.metrics import AccuracyCounts, masked_cross_entropy
from titan_delta.state_tracking.modeling import build_task_model
from titan_delta.state_tracking.runtime import autocast, batch_to_device, device_description, resolve_device
from titan_delta.state_tracking.tasks import StateTrackingTask, TaskBatch, build_task

REPORT_SCHEMA = "titan_delta.state_tracking/1"


@torch.no_grad()
def evaluate(
    model: TitanDeltaLM,
    task: StateTrackingTask,
    config: StateTrackingConfig,
    length: int,
    sequences: int,
    rng: np.random.Generator,
    device: torch.device,
) -> AccuracyCounts:
    """Accuracy on ``sequences`` fresh problems of size ``length`` (model left in train mode after)."""
    model.eval()
    counts = AccuracyCounts()
    remaining = sequences
    while remaining > 0:
        batch = batch_to_device(task.sample(length, min(remaining, config.eval.batch_size), rng), device)
        with autocast(device, config.training.precision):
            logits = model(batch.inputs)
        counts.update(logits.float(), batch.targets)
        remaining -= batch.inputs.shape[0]
    model.train()
    return counts


def lr_factor(training: TrainingConfig) -> Callable[[int], float]:
    """Linear warmup over ``warmup_steps``, then constant or cosine decay to 0 at ``steps``."""
    warmup, total = training.warmup_steps, training.steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if training.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_optimizer(
    model: TitanDeltaLM, config: StateTrackingConfig, device: torch.device
) -> torch.optim.Optimizer:
    """AdamW; matrices decay, vectors (norms, gates, biases) do not. Fused on CUDA (one kernel per step)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.training.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    betas = (float(config.training.betas[0]), float(config.training.betas[1]))
    fused = True if device.type == "cuda" else None
    return torch.optim.AdamW(groups, lr=config.training.lr, betas=betas, fused=fused)


def train_step(
    model: TitanDeltaLM,
    batch: TaskBatch,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    training: TrainingConfig,
    device: torch.device,
) -> torch.Tensor:
    """One optimizer step; returns the loss as a tensor so that nothing here waits for the GPU."""
    with autocast(device, training.precision):
        loss = masked_cross_entropy(model(batch.inputs), batch.targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if training.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), training.grad_clip)
    optimizer.step()
    schedule.step()
    return loss.detach()


def run_experiment(config: StateTrackingConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train and evaluate with ``config.training.seed``; several ``training.seeds`` go to run_seeds."""
    t_cfg, c_cfg = config.training, config.curriculum
    if t_cfg.seeds:
        raise ValueError(
            f"training.seeds={t_cfg.seeds} asks for several runs; run_experiment runs one "
            "(training.seed): call titan_delta.state_tracking.run_seeds instead"
        )
    task = build_task(config.task.name, config.task.options)
    eval_lengths = config.eval_lengths()
    for length in (c_cfg.start_length, c_cfg.final_length, *eval_lengths):
        task.check_length(length)
    device = resolve_device(t_cfg.device)
    torch.manual_seed(t_cfg.seed)
    max_tokens = max(task.tokens_per_sequence(n) for n in (c_cfg.final_length, *eval_lengths))
    model = build_task_model(config.model, task.vocab_size, max_tokens).to(device)
    optimizer = build_optimizer(model, config, device)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(t_cfg))
    train_rng = np.random.default_rng([t_cfg.seed, 0])
    check_rng = np.random.default_rng([t_cfg.seed, 1])
    curriculum = LengthCurriculum(c_cfg.start_length, c_cfg.final_length, c_cfg.threshold)
    history: list[dict[str, Any]] = []
    length_changes: list[dict[str, int]] = []
    stopped_by, solved_at_step, step = "steps", None, 0
    loss = torch.full((), float("nan"))
    log(
        f"task {task.name} {config.task.options} | model {model.model_args.layer_mixers()} "
        f"d={model.model_args.dim} rope={config.model.rope} | {count_parameters(model):,} params | "
        f"{device_description(device)} {t_cfg.precision} | seed {t_cfg.seed}"
    )
    start = time.perf_counter()
    bar = tqdm(total=t_cfg.steps, disable=not config.output.progress, dynamic_ncols=True, leave=False)
    model.train()
    for step in range(1, t_cfg.steps + 1):
        batch = batch_to_device(task.sample(curriculum.length, t_cfg.batch_size, train_rng), device)
        loss = train_step(model, batch, optimizer, schedule, t_cfg, device)
        bar.update(1)
        if step % c_cfg.eval_every == 0:
            length = curriculum.length
            accuracy = evaluate(
                model, task, config, length, c_cfg.eval_sequences, check_rng, device
            ).token_accuracy
            loss_value = float(loss)
            history.append({"step": step, "length": length, "token_accuracy": accuracy, "loss": loss_value})
            if curriculum.update(accuracy):
                length_changes.append({"step": step, "from": length, "to": curriculum.length})
            if curriculum.solved and solved_at_step is None:
                solved_at_step = step
            bar.set_postfix(length=length, acc=f"{accuracy:.3f}", loss=f"{loss_value:.3f}")
            if curriculum.solved and c_cfg.stop_when_solved:
                stopped_by = "solved"
                break
        if t_cfg.time_limit_s and time.perf_counter() - start > t_cfg.time_limit_s:
            stopped_by = "time_limit"
            break
    bar.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the GPU may still be working through queued steps
    train_time = time.perf_counter() - start
    eval_rows = []
    for length in eval_lengths:
        eval_rng = np.random.default_rng([t_cfg.seed, 2, length])  # the same problems for every model
        counts = evaluate(model, task, config, length, config.eval.sequences, eval_rng, device)
        eval_rows.append({
            "length": length,
            "tokens": task.tokens_per_sequence(length),
            "token_accuracy": counts.token_accuracy,
            "sequence_accuracy": counts.sequence_accuracy,
            "majority_baseline": counts.majority_baseline,
            "sequences": counts.sequences,
            "beyond_training": length > curriculum.length,
        })  # fmt: skip
    return {
        "schema": REPORT_SCHEMA,
        "config": config.to_dict(),
        "task": {
            "name": task.name, "options": dict(config.task.options),
            "vocab_size": task.vocab_size, "length_unit": task.length_unit,
        },
        "model": {
            "mixers": list(model.model_args.layer_mixers()), "parameters": count_parameters(model),
            "rope": config.model.rope,
        },
        "device": str(device),
        "device_name": device_description(device),
        "precision": t_cfg.precision,
        "seed": t_cfg.seed,
        "torch_version": torch.__version__,
        "training": {
            "steps_run": step, "wall_time_s": train_time, "stopped_by": stopped_by,
            "cut_short": stopped_by == "time_limit", "final_train_length": curriculum.length,
            "solved": curriculum.solved, "solved_at_step": solved_at_step, "final_loss": float(loss),
        },
        "curriculum_history": history,
        "length_changes": length_changes,
        "eval": eval_rows,
    }  # fmt: skip
