"""``python -m titan_delta.eval --checkpoint DIR --tasks a,b [--limit N] [--num-fewshot K]``.

Evaluates an exported or DCP checkpoint on lm-eval tasks, prints lm-eval's table and writes the full
result JSON. Task names: any lm-eval task, the shipped offline tasks (``local`` = all of them) and
``paper`` (the DeltaFormer/DeltaProduct zero-shot suite, which needs the Hugging Face hub or its cache).
Under ``torchrun`` every rank loads the model and scores a share of the requests.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

import torch

from titan_delta.eval.checkpoint import CheckpointError, load_checkpoint
from titan_delta.eval.local_tasks import expand_task_names

EXIT_BAD_INPUT = 2
EXIT_NO_RESULTS = 1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m titan_delta.eval", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--checkpoint", required=True, help="exported folder, step-N folder or their parent")
    parser.add_argument("--tasks", required=True, help="comma-separated task names or suites (paper, local)")
    parser.add_argument("--limit", type=float, default=None, help="examples per task (< 1: a fraction)")
    parser.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: task's)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=None, help="context limit (default: model's)")
    parser.add_argument("--config", default=None, help="training TOML; needed for DCP checkpoints")
    parser.add_argument("--step", type=int, default=None, help="DCP step (default: newest complete)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--add-bos", action="store_true", default=None, help="contexts start with BOS")
    parser.add_argument("--output", default="eval_results.json", help="where to write the result JSON")
    parser.add_argument("--bootstrap-iters", type=int, default=0, help="stderr bootstrap (0: none)")
    return parser


def _limit(value: float | None) -> float | int | None:
    if value is None:
        return None
    if value <= 0:
        raise CheckpointError(f"--limit {value}: expected > 0 (a count, or a fraction below 1)")
    return int(value) if value >= 1 else value


def _init_distributed(device: torch.device) -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")


def run(args: argparse.Namespace) -> tuple[dict[str, Any] | None, dict[str, str]]:
    from titan_delta.eval.adapter import TitanDeltaEvalLM
    from titan_delta.eval.harness import run_tasks, task_manager_for, unknown_task_message

    names = expand_task_names(args.tasks)
    limit = _limit(args.limit)
    manager = task_manager_for(names)
    unknown = unknown_task_message(names, manager)
    if unknown:
        raise CheckpointError(f"--tasks: {unknown}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    _init_distributed(device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    loaded = load_checkpoint(args.checkpoint, args.config, args.step)
    model = loaded.model.to(device=device, dtype=DTYPES[args.dtype])
    add_bos = loaded.add_bos if args.add_bos is None else args.add_bos
    lm = TitanDeltaEvalLM(
        model, loaded.tokenizer, batch_size=args.batch_size, max_length=args.max_length, add_bos=add_bos
    )
    outcome = run_tasks(
        lm, names, limit=limit, num_fewshot=args.num_fewshot, bootstrap_iters=args.bootstrap_iters,
        manager=manager,
    )  # fmt: skip
    if outcome.results is not None:
        outcome.results["titan_delta"] = {
            "checkpoint": loaded.source,
            "step": loaded.step,
            "failed": outcome.failed,
        }
    return outcome.results, outcome.failed


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        results, failed = run(args)
    except (CheckpointError, ValueError, FileNotFoundError) as err:
        print(f"titan_delta.eval: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    if results is None:  # a rank other than 0, or no task could be loaded
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"titan_delta.eval: no task could be run: {failed}", file=sys.stderr)
            return EXIT_NO_RESULTS
        return 0
    from lm_eval.utils import make_table

    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"wrote {args.output}")
    return 0
