"""The ``[eval]`` section: scheduled lm-eval runs inside a training job (see ``scheduled.py``).

No ``from __future__ import annotations``: torchtitan merges custom config sections by inspecting each
field's type object, which postponed annotations would turn into strings.
"""

from dataclasses import dataclass, field

DEFAULT_TASKS = ["titan_delta_tiny_mc", "titan_delta_tiny_ppl"]


@dataclass
class EvalConfig:
    enable: bool = False
    """Run lm-eval tasks during training (every ``interval`` steps and/or at the end)"""

    interval: int = 0
    """Steps between evals; 0 = only at the end (with ``at_end``)"""

    at_end: bool = True
    """Also evaluate after the last training step"""

    tasks: list[str] = field(default_factory=lambda: list(DEFAULT_TASKS))
    """lm-eval task names or suites ("local": the shipped offline tasks; "paper": the papers' suite)"""

    limit: float = 0.0
    """Examples per task: 0 = all, >= 1 a count, in (0, 1) a fraction"""

    num_fewshot: int = -1
    """Few-shot examples; -1 = each task's default"""

    batch_size: int = 8
    """Rows per forward (per rank)"""

    max_length: int = 0
    """Context limit in tokens; 0 = the model's max_seq_len"""

    bootstrap_iters: int = 0
    """Bootstrap iterations for stderr; 0 = none (fast; stderr is reported as N/A)"""

    seed: int = 1234
    """Seed of lm-eval's few-shot sampling (the training RNG state is restored afterwards)"""

    results_file: str = "eval/results.jsonl"
    """JSONL file (relative to the dump folder) that gets one line per task and eval"""

    def validate(self) -> None:
        """Raise ValueError naming the offending ``[eval]`` field."""
        if self.interval < 0:
            raise ValueError(f"[eval] interval = {self.interval}: expected >= 0 (0 = only at the end)")
        if self.limit < 0:
            raise ValueError(f"[eval] limit = {self.limit}: expected 0 (all), a count >= 1 or a fraction < 1")
        if self.limit > 1 and self.limit != int(self.limit):
            raise ValueError(f"[eval] limit = {self.limit}: a count above 1 must be a whole number")
        if self.num_fewshot < -1:
            raise ValueError(f"[eval] num_fewshot = {self.num_fewshot}: expected >= 0, or -1 for the default")
        if self.batch_size < 1:
            raise ValueError(f"[eval] batch_size = {self.batch_size}: expected >= 1")
        if self.max_length < 0:
            raise ValueError(f"[eval] max_length = {self.max_length}: expected >= 0 (0 = model's)")
        if self.bootstrap_iters < 0:
            raise ValueError(f"[eval] bootstrap_iters = {self.bootstrap_iters}: expected >= 0")
        if isinstance(self.tasks, str) or not all(isinstance(t, str) and t.strip() for t in self.tasks):
            raise ValueError(f"[eval] tasks = {self.tasks!r}: expected a list of task names")
        if self.enable and not self.tasks:
            raise ValueError("[eval] tasks is empty but [eval] enable = true")
        if not self.results_file or self.results_file.startswith("/"):
            raise ValueError(
                f"[eval] results_file = {self.results_file!r}: expected a path relative to the dump folder"
            )

    @property
    def limit_arg(self) -> float | int | None:
        """``limit`` as lm-eval takes it."""
        if self.limit == 0:
            return None
        return int(self.limit) if self.limit >= 1 else self.limit
