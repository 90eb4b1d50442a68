"""State-tracking suite: task generators, a curriculum trainer for zoo models, JSON reports."""

from titan_delta.state_tracking.config import StateTrackingConfig, config_from_dict, load_config
from titan_delta.state_tracking.curriculum import LengthCurriculum
from titan_delta.state_tracking.metrics import AccuracyCounts, masked_cross_entropy
from titan_delta.state_tracking.report import REPORT_FIELDS, combine_reports, format_table, write_json
from titan_delta.state_tracking.seeds import run_seeds
from titan_delta.state_tracking.tasks import TASKS, build_task
from titan_delta.state_tracking.trainer import run_experiment

__all__ = [
    "REPORT_FIELDS",
    "TASKS",
    "AccuracyCounts",
    "LengthCurriculum",
    "StateTrackingConfig",
    "build_task",
    "combine_reports",
    "config_from_dict",
    "format_table",
    "load_config",
    "masked_cross_entropy",
    "run_experiment",
    "run_seeds",
    "write_json",
]
