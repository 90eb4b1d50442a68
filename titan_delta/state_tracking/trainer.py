"""Train a zoo model on one task with the length curriculum, then measure accuracy at and beyond the
training length. ``run_experiment(config)`` returns the JSON-ready report described in report.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from titan_delta.models import TitanDeltaLM, count_parameters
from titan_delta.state_tracking.config import StateTrackingConfig
from titan_delta.state_tracking.curriculum import LengthCurriculum
from titan_delta.state_tracking.metrics import AccuracyCounts, masked_cross_entropy
from titan_delta.state_tracking.modeling import build_task_model, position_ids_for
from titan_delta.state_tracking.tasks import StateTrackingTask, build_task

REPORT_SCHEMA = "titan_delta.state_tracking/1"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("training.device='cuda' but no CUDA device is available")
    return torch.device(name)


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
        batch = task.sample(length, min(remaining, config.eval.batch_size), rng).to(device)
        logits = model(batch.inputs, position_ids=position_ids_for(config.model, batch.inputs))
        counts.update(logits, batch.targets)
        remaining -= batch.inputs.shape[0]
    model.train()
    return counts


def build_optimizer(model: TitanDeltaLM, config: StateTrackingConfig) -> torch.optim.Optimizer:
    """AdamW; matrices decay, vectors (norms, gates, biases) do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.training.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.training.lr, betas=(0.9, 0.98))


def run_experiment(config: StateTrackingConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    t_cfg, c_cfg = config.training, config.curriculum
    task = build_task(config.task.name, config.task.options)
    eval_lengths = config.eval_lengths()
    for length in (c_cfg.start_length, c_cfg.final_length, *eval_lengths):
        task.check_length(length)
    device = resolve_device(t_cfg.device)
    torch.manual_seed(t_cfg.seed)
    max_tokens = max(task.tokens_per_sequence(n) for n in (c_cfg.final_length, *eval_lengths))
    model = build_task_model(config.model, task.vocab_size, max_tokens).to(device)
    optimizer = build_optimizer(model, config)
    warmup = max(t_cfg.warmup_steps, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    train_rng = np.random.default_rng([t_cfg.seed, 0])
    check_rng = np.random.default_rng([t_cfg.seed, 1])
    curriculum = LengthCurriculum(c_cfg.start_length, c_cfg.final_length, c_cfg.threshold)
    history: list[dict[str, Any]] = []
    length_changes: list[dict[str, int]] = []
    stopped_by, solved_at_step, loss_value, step = "steps", None, float("nan"), 0
    log(
        f"task {task.name} {config.task.options} | model {model.model_args.layer_mixers()} "
        f"d={model.model_args.dim} rope={config.model.rope} | {count_parameters(model):,} params | {device}"
    )
    start = time.perf_counter()
    bar = tqdm(total=t_cfg.steps, disable=not config.output.progress, dynamic_ncols=True, leave=False)
    model.train()
    for step in range(1, t_cfg.steps + 1):
        batch = task.sample(curriculum.length, t_cfg.batch_size, train_rng).to(device)
        logits = model(batch.inputs, position_ids=position_ids_for(config.model, batch.inputs))
        loss = masked_cross_entropy(logits, batch.targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if t_cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t_cfg.grad_clip)
        optimizer.step()
        schedule.step()
        loss_value = float(loss.detach())
        bar.update(1)
        if step % c_cfg.eval_every == 0:
            length = curriculum.length
            accuracy = evaluate(
                model, task, config, length, c_cfg.eval_sequences, check_rng, device
            ).token_accuracy
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
        "torch_version": torch.__version__,
        "training": {
            "steps_run": step, "wall_time_s": train_time, "stopped_by": stopped_by,
            "final_train_length": curriculum.length, "solved": curriculum.solved,
            "solved_at_step": solved_at_step, "final_loss": loss_value,
        },
        "curriculum_history": history,
        "length_changes": length_changes,
        "eval": eval_rows,
    }  # fmt: skip
