"""Training entry point: ``python -m titan_delta.train --job.config_file train_configs/NAME.toml [--a.b v]``.

Run it directly for one process (CPU or one GPU) or under ``torchrun`` (the launchers in ``launch/`` do
that). CLI overrides take precedence over the TOML, which takes precedence over the defaults. Our config
sections (``[data]``, ``[nan_policy]``, extra keys of ``[optimizer]``/``[metrics]``/``[checkpoint]``)
are merged through torchtitan's ``job.custom_config_module``, selected here automatically.

The config and every path it names (data sources, tokenizer, pre-tokenised folder, checkpoints to load,
eval tasks) are checked before anything is built; a problem is one ``Config error:`` line and exit code 2.
``--check_only`` stops after these checks (exit 0 when they pass): the launchers run it once before
torchrun, which would otherwise turn the workers' exit code 2 into its own exit 1 and a failure report.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
from typing import Any

from torchtitan.tools.logging import init_logger, logger

EXIT_CONFIG_ERROR = 2
EXIT_TRAINING_STOPPED = 3
CHECK_ONLY_FLAGS = ("--check_only", "--check-only")


def _cli_value(argv: list[str], *keys: str) -> str | None:
    """Value of ``--key value`` or ``--key=value`` for any spelling in ``keys``."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in keys:
            if eq:
                return value
            return argv[i + 1] if i + 1 < len(argv) else None
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_single_process_env() -> None:
    """Without torchrun, provide the rendezvous variables of a one-process job."""
    if "LOCAL_RANK" in os.environ:
        return
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    defaults |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def build_args(argv: list[str]) -> list[str]:
    """Check the config file and select our custom config module unless the user chose one."""
    from torchtitan.config import JobConfig as TorchtitanJobConfig

    from titan_delta.trainer.config import CUSTOM_CONFIG_MODULE
    from titan_delta.trainer.config_checks import ConfigError, check_toml, load_toml, merged_schema

    config_file = _cli_value(argv, "--job.config_file", "--job.config-file")
    values = load_toml(config_file) if config_file else {}
    job_section = values.get("job", {})
    chosen = _cli_value(argv, "--job.custom_config_module", "--job.custom-config-module")
    chosen = chosen or (job_section.get("custom_config_module") if isinstance(job_section, dict) else None)
    try:
        custom = importlib.import_module(chosen or CUSTOM_CONFIG_MODULE).JobConfig
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"[job] custom_config_module = {chosen!r}: cannot import its JobConfig: {err}"
        ) from err
    if config_file:
        check_toml(values, merged_schema(TorchtitanJobConfig, custom), config_file)
    return argv if chosen else [*argv, "--job.custom_config_module", CUSTOM_CONFIG_MODULE]


def one_line(err: BaseException) -> str:
    """The message of ``err`` on one line. An error raised in a data-loader worker arrives re-raised with
    the worker's traceback in its message; the last line of that is the original ``Type: message``."""
    lines = str(err).strip().splitlines()
    if len(lines) <= 1:
        return str(err)
    name = type(err).__name__
    return lines[-1].removeprefix(f"{type(err).__module__}.{name}: ").removeprefix(f"{name}: ")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    check_only = any(arg in CHECK_ONLY_FLAGS for arg in argv)
    argv = [arg for arg in argv if arg not in CHECK_ONLY_FLAGS]
    init_logger()
    from torchtitan.config import ConfigManager

    from titan_delta.trainer import registered_families, setup_torchtitan
    from titan_delta.trainer.config_checks import ConfigError, check_job_config
    from titan_delta.trainer.nonfinite import NonFiniteTrainingError
    from titan_delta.trainer.path_checks import check_paths

    setup_torchtitan()
    try:
        args = build_args(argv)
        try:
            config = ConfigManager().parse_args(args)
        except AssertionError as err:  # torchtitan's own value checks (__post_init__) are bare asserts
            raise ConfigError(f"torchtitan rejected the config: {err}") from err
        check_job_config(config, registered_families())
        if config.checkpoint.create_seed_checkpoint and os.environ.get("WORLD_SIZE", "1") != "1":
            raise ConfigError("[checkpoint] create_seed_checkpoint needs one process (WORLD_SIZE=1)")
        check_paths(config)
    except ConfigError as err:
        logger.error(f"Config error: {err}")
        return EXIT_CONFIG_ERROR
    if check_only:
        logger.info("Config check passed")
        return 0
    ensure_single_process_env()
    return run(config, NonFiniteTrainingError)


def run(config: Any, stop_error: type[Exception]) -> int:
    """Train (or only write the step-0 seed checkpoint); returns the process exit code."""
    import torch.distributed as dist

    from titan_delta.data.config import DataConfigError
    from titan_delta.trainer.config_checks import ConfigError
    from titan_delta.trainer.dcp_model import CheckpointError
    from titan_delta.trainer.trainer import TitanDeltaTrainer

    trainer = None
    try:
        trainer = TitanDeltaTrainer(config)
        if config.checkpoint.create_seed_checkpoint:
            # Identical initial weights for runs on any parallelism: they load it via
            # --checkpoint.initial_load_path DUMP/checkpoint/step-0 (sharded RNG init differs by layout).
            trainer.checkpointer.save(curr_step=0, last_step=True)
            logger.info("Created the seed checkpoint (step 0)")
        else:
            trainer.train()
    except stop_error as err:
        logger.error(f"Training stopped: {err}")
        return EXIT_TRAINING_STOPPED
    except (ConfigError, DataConfigError, CheckpointError, FileNotFoundError) as err:
        # What the up-front checks cannot see (a file's contents, shards written with another tokenizer,
        # a file removed after the check) is still one line and exit code 2, not a traceback.
        logger.error(f"Config error: {one_line(err)}")
        return EXIT_CONFIG_ERROR
    finally:
        if trainer is not None:
            trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    logger.info("Training finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
