"""Seeded, on-the-fly generators of state-tracking and recall problems."""

from titan_delta.state_tracking.tasks.base import IGNORE_INDEX, StateTrackingTask, TaskBatch
from titan_delta.state_tracking.tasks.mqar import MultiQueryRecallTask
from titan_delta.state_tracking.tasks.parity import ParityTask
from titan_delta.state_tracking.tasks.reachability import DagReachabilityTask
from titan_delta.state_tracking.tasks.registry import TASKS, build_task, task_options
from titan_delta.state_tracking.tasks.swaps import ElementSwapTask
from titan_delta.state_tracking.tasks.word_problems import GROUPS, WordProblemTask

__all__ = [
    "GROUPS",
    "IGNORE_INDEX",
    "TASKS",
    "DagReachabilityTask",
    "ElementSwapTask",
    "MultiQueryRecallTask",
    "ParityTask",
    "StateTrackingTask",
    "TaskBatch",
    "WordProblemTask",
    "build_task",
    "task_options",
]
