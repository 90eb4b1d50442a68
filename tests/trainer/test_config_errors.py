"""Bad config files, keys and values fail before training starts, naming the file/section/key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tests.trainer.helpers import DEBUG_CONFIG, parsed_debug_config
from titan_delta.train import EXIT_CONFIG_ERROR, build_args, main
from titan_delta.trainer import registered_families, setup_torchtitan
from titan_delta.trainer.config_checks import ConfigError, check_job_config


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[trainning]\nsteps = 3\n", "unknown section 'trainning' in top level (did you mean 'training'?)"),
        ("[nan_policy]\nmax_skiped_steps = 3\n", "unknown key 'max_skiped_steps' in [nan_policy]"),
        ("[lr_scheduler]\nwarmup_step = 1\n", "(did you mean 'warmup_steps'?)"),
        ("[metrics]\npeak_tflops = 'fast'\n", "[metrics] peak_tflops = 'fast': expected float"),
        (
            "[activation_checkpoint]\nmode = 'sometimes'\n",
            "expected 'selective' | 'full' | 'memory_budget' | 'none'",
        ),
        ("[data]\nsources = 'default'\n", "[data] sources = 'default': expected list of str"),
    ],
)
def test_bad_toml_keys_and_types(tmp_path: Path, extra: str, message: str) -> None:
    # TOML forbids redefining a table, so the section under test is removed from the copy first.
    section = extra.split("]")[0] + "]"
    path = tmp_path / "bad.toml"
    path.write_text(_without_section(DEBUG_CONFIG.read_text(), section) + "\n" + extra)
    with pytest.raises(ConfigError) as err:
        build_args(["--job.config_file", str(path)])
    assert str(path) in str(err.value) and message in str(err.value)


def _without_section(text: str, section: str) -> str:
    """The TOML text with one [section] table removed (so the test can redefine it)."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.startswith("["):
            skipping = line.strip() == section
        if not skipping:
            out.append(line)
    return "\n".join(out)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        build_args(["--job.config_file", str(tmp_path / "missing.toml")])
    broken = tmp_path / "broken.toml"
    broken.write_text("[training\nsteps = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        build_args(["--job.config_file", str(broken)])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--model.name", "deltaformr"], "name = 'deltaformr': unknown model (did you mean 'deltaformer'?)"),
        (["--model.flavor", "7B"], "[model] flavor = '7B': deltaformer has flavors"),
        (["--checkpoint.keep_latest_k", "1"], "[checkpoint] keep_latest_k = 1"),
        (["--parallelism.tensor_parallel_degree", "2"], "[parallelism] tensor_parallel_degree = 2"),
        (["--parallelism.data_parallel_replicate_degree", "-2"], "replicate_degree = -2: expected >= 1"),
        (["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "x"],
         "selective_ac_option = 'x'"),
        (["--lr_scheduler.warmup_steps", "1000"], "[lr_scheduler] warmup_steps = 1000"),
        (["--nan_policy.max_skipped_steps", "-2"], "[nan_policy] max_skipped_steps = -2"),
        (["--data.lanes", "0"], "data.lanes must be >= 1"),
        (["--validation.enable"], "[validation] dataset_path is not set"),
        (["--profiling.enable_profiling", "--profiling.profile_freq", "3"], "[profiling] profile_freq = 3"),
    ],
)  # fmt: skip
def test_bad_values_after_parsing(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_job_config(parsed_debug_config(*overrides), registered_families())
    assert message in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is")
def test_profiling_without_a_gpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="profiler needs a CUDA"):
        check_job_config(parsed_debug_config("--profiling.enable_profiling"), registered_families())


def test_main_exits_with_config_error_code(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text(DEBUG_CONFIG.read_text().replace("local_batch_size", "local_batch_sise"))
    assert main(["--job.config_file", str(path)]) == EXIT_CONFIG_ERROR
    assert main(["--job.config_file", str(DEBUG_CONFIG), "--model.flavor", "huge"]) == EXIT_CONFIG_ERROR


def test_our_sections_and_defaults_are_merged() -> None:
    config = parsed_debug_config("--optimizer.no_weight_decay", "A_log,norm")
    assert config.optimizer.no_weight_decay == ["A_log", "norm"]
    assert config.optimizer.lr == 2e-3  # torchtitan's keys of the same section survive the merge
    assert config.checkpoint.last_save_model_only is False
    assert config.nan_policy.max_skipped_steps == 10
    assert config.data.sources == ["default"]


SHIPPED = sorted((DEBUG_CONFIG.parent).glob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_configs_are_valid_and_sized(path: Path) -> None:
    import torch

    from titan_delta.data import build_tokenizer
    from titan_delta.models import TitanDeltaLM

    config = _parsed_file(path)
    families = registered_families()
    check_job_config(config, families)
    args = copy.deepcopy(setup_and_spec(config.model.name).model_args[config.model.flavor])
    args.update_from_config(config, tokenizer=build_tokenizer(config))
    with torch.device("meta"):
        model = TitanDeltaLM(args)
    params, flops = args.get_nparams_and_flops(model, config.training.seq_len)
    expected = {"debug": (1e6, 1e7), "340M": (2.5e8, 4.5e8), "1.3B": (1.0e9, 1.6e9)}[config.model.flavor]
    assert expected[0] < params < expected[1], params
    # 6 FLOPs per non-embedding parameter and token, plus the mixers' sequence FLOPs
    assert flops > 6 * (params - args.vocab_size * args.dim)
    if config.model.flavor != "debug":
        assert config.training.seq_len == 2048
        assert config.training.global_batch_size * config.training.seq_len == 524_288


def _parsed_file(path: Path):
    from torchtitan.config import ConfigManager

    setup_torchtitan()
    return ConfigManager().parse_args(build_args(["--job.config_file", str(path)]))


def setup_and_spec(name: str):
    from torchtitan.protocols.train_spec import get_train_spec

    setup_torchtitan()
    return get_train_spec(name)


def test_replicate_degree_minus_one_fills_the_ranks_the_shard_degree_leaves() -> None:
    from types import SimpleNamespace

    from titan_delta.trainer.trainer import resolve_replicate_degree

    par = SimpleNamespace(data_parallel_replicate_degree=-1, data_parallel_shard_degree=8)
    resolve_replicate_degree(par, 32)
    assert par.data_parallel_replicate_degree == 4
    par = SimpleNamespace(data_parallel_replicate_degree=-1, data_parallel_shard_degree=8)
    with pytest.raises(ConfigError, match="the 12 ranks do not divide by data_parallel_shard_degree = 8"):
        resolve_replicate_degree(par, 12)


@pytest.mark.parametrize(
    ("world", "local", "replicate", "shard"), [(16, 8, 2, 8), (4, 4, 1, 4), (4, None, 1, 4)]
)
def test_both_degrees_minus_one_shard_inside_a_node_and_replicate_across(world, local, replicate, shard):
    from types import SimpleNamespace

    from titan_delta.trainer.trainer import resolve_replicate_degree

    par = SimpleNamespace(data_parallel_replicate_degree=-1, data_parallel_shard_degree=-1)
    resolve_replicate_degree(par, world, local)
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (replicate, shard)
