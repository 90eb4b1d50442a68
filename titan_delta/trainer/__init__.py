"""titan-delta on torchtitan 0.2.2: TrainSpecs, parallelize_fn, CPU/gloo support, checkpoints, NaN policy.

Importing this package does not change torchtitan; :func:`setup_torchtitan` (called by
``python -m titan_delta.train``) points it at the CPU when there is no accelerator and registers one
TrainSpec per model family.
"""

from __future__ import annotations

from titan_delta.trainer.cpu_shim import use_cpu_without_accelerator
from titan_delta.trainer.train_spec import register_train_specs, registered_families


def setup_torchtitan() -> None:
    """Idempotent: CPU device selection (inert with an accelerator) and TrainSpec registration."""
    use_cpu_without_accelerator()
    register_train_specs()


__all__ = ["register_train_specs", "registered_families", "setup_torchtitan", "use_cpu_without_accelerator"]
