"""lm-eval's stock ``hf`` model on an export scores the shipped local tasks exactly as our adapter does."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is the optional 'eval' extra")
pytest.importorskip("accelerate", reason="lm-eval's hf model needs lm-eval[hf] (accelerate)")


def _evaluate(model, tasks, model_args=None):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from titan_delta.eval.local_tasks import local_task_configs

    configs = local_task_configs()
    return simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[configs[name] for name in tasks],
        limit=3,
        bootstrap_iters=0,
        task_manager=TaskManager(include_defaults=False),
        log_samples=True,
        gen_kwargs="max_gen_toks=6",
    )


def _leaves(value):
    if isinstance(value, list | tuple):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _assert_same(theirs, ours, task) -> None:
    """Metrics, and every per-sample response (log-likelihoods, greedy flags, generated text)."""
    metrics = [{k: v for k, v in r["results"][task].items() if isinstance(v, float)} for r in (theirs, ours)]
    assert metrics[0] == pytest.approx(metrics[1], rel=1e-5), task
    responses = [_leaves([s["filtered_resps"] for s in r["samples"][task]]) for r in (theirs, ours)]
    assert len(responses[0]) == len(responses[1])
    for a, b in zip(*responses, strict=True):
        assert a == (pytest.approx(b, rel=1e-5) if isinstance(b, float) else b), task


def test_stock_hf_model_matches_adapter(exports, monkeypatch, tmp_path) -> None:
    import datasets.config

    from titan_delta.data.tokenizer import load_tokenizer
    from titan_delta.eval.adapter import TitanDeltaEvalLM

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    model, folder = exports["gated_deltaproduct_swa"]
    hf_args = f"pretrained={folder},trust_remote_code=True,dtype=float32,device=cpu,batch_size=4"
    scoring = ["titan_delta_tiny_mc", "titan_delta_tiny_cloze", "titan_delta_tiny_gen"]
    ours = _evaluate(
        TitanDeltaEvalLM(model, load_tokenizer(), batch_size=4), [*scoring, "titan_delta_tiny_ppl"]
    )
    theirs = _evaluate("hf", scoring, hf_args)
    # perplexity windows: lm-eval adds its own prefix token, so the tokenizer must not add ours too
    rolling = _evaluate("hf", ["titan_delta_tiny_ppl"], hf_args + ",add_bos_token=False")
    for task in scoring:
        _assert_same(theirs, ours, task)
    _assert_same(rolling, ours, "titan_delta_tiny_ppl")
