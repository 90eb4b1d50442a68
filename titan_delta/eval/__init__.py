"""Downstream evaluation with lm-eval: the adapter (``adapter.TitanDeltaEvalLM``), scheduled evals during
training (``ScheduledEvaluator``), the ``python -m titan_delta.eval`` command and offline tasks.

lm-eval is an optional dependency (the ``eval`` extra): it is imported only when an eval actually runs.
"""

from titan_delta.eval.config import EvalConfig
from titan_delta.eval.scheduled import ScheduledEvaluator

__all__ = ["EvalConfig", "ScheduledEvaluator"]
