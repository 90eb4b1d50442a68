"""The lm-eval adapter against hand computations from the model's own logits."""

from __future__ import annotations

import math

import pytest
import torch

from titan_delta.eval.adapter import TitanDeltaEvalLM
from titan_delta.eval.requests import cut_at_stop

from .helpers import HYBRID, Request, tiny_model

VOCAB = 16384  # the shipped tokenizer's


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_model(vocab_size=VOCAB, **HYBRID)


def hand_logprob(model, tokenizer, context_ids: list[int], continuation_ids: list[int]) -> tuple[float, bool]:
    tokens = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(tokens[:, :-1]).double(), dim=-1)[0]
    n = len(continuation_ids)
    picked = logprobs[-n:].gather(-1, torch.tensor(continuation_ids)[:, None])
    greedy = bool((logprobs[-n:].argmax(-1) == torch.tensor(continuation_ids)).all())
    return float(picked.sum()), greedy


def test_loglikelihood_equals_hand_computation(model, tokenizer) -> None:
    lm = TitanDeltaEvalLM(model, tokenizer, batch_size=2)
    pairs = [("In the beginning God created", " the heaven"), ("x = [1, 2,", " 3]"), ("", "Hello world")]
    pairs.append(("A longer context that ends with a space so its boundary moves ", "forward"))
    results = lm.loglikelihood([Request(c, x) for c, x in pairs])
    eos = tokenizer.eos_id
    for (context, continuation), (logprob, greedy) in zip(pairs, results, strict=True):
        stripped = context.rstrip()
        moved = context[len(stripped) :] + continuation
        expected = hand_logprob(model, tokenizer, [eos, *tokenizer.encode(stripped)], tokenizer.encode(moved))
        assert logprob == pytest.approx(expected[0], abs=1e-6) and greedy == expected[1]
        assert logprob < 0


def test_loglikelihood_truncates_context_from_the_left(model, tokenizer) -> None:
    context, continuation = "one two three four five six seven eight nine ten", " eleven"
    lm = TitanDeltaEvalLM(model, tokenizer, batch_size=1, max_length=6)
    (logprob, _), = lm.loglikelihood([Request(context, continuation)])  # fmt: skip
    whole = [tokenizer.eos_id, *tokenizer.encode(context), *tokenizer.encode(continuation)][-7:]
    n = len(tokenizer.encode(continuation))
    assert logprob == pytest.approx(hand_logprob(model, tokenizer, whole[:-n], whole[-n:])[0], abs=1e-6)


def test_rolling_loglikelihood_is_the_sum_over_all_tokens(model, tokenizer) -> None:
    text = "And God saw the light, that it was good: and God divided the light from the darkness."
    ids = tokenizer.encode(text)
    one_window = TitanDeltaEvalLM(model, tokenizer, batch_size=3)
    expected = hand_logprob(model, tokenizer, [tokenizer.eos_id], ids)[0]
    assert one_window.loglikelihood_rolling([Request(text)])[0] == pytest.approx(expected, abs=1e-6)
    # Windows of 5: every token once, each window conditioned on the 5 tokens before its last target.
    stream, total = [tokenizer.eos_id, *ids], 0.0
    for start in range(1, len(stream), 5):
        end = min(start + 5, len(stream))
        context = stream[max(0, end - 6) : start]
        total += hand_logprob(model, tokenizer, context, stream[start:end])[0]
    windowed = TitanDeltaEvalLM(model, tokenizer, batch_size=2, max_length=5)
    assert windowed.loglikelihood_rolling([Request(text)])[0] == pytest.approx(total, abs=1e-6)
    assert not math.isclose(total, expected)  # the short windows really did lose context


def _reference_text(model, tokenizer, prompt: str, steps: int) -> tuple[list[int], str]:
    tokens = torch.tensor([[tokenizer.eos_id, *tokenizer.encode(prompt)]])
    out = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(tokens)[0, -1].argmax())
            out.append(nxt)
            tokens = torch.cat((tokens, torch.tensor([[nxt]])), dim=1)
    return out, tokenizer.decode(out)


def test_generate_until_stops_at_stop_sequences_and_max_tokens(model, tokenizer) -> None:
    prompt = "Q: Which keyword defines a function?\nA:"
    ids, text = _reference_text(model, tokenizer, prompt, 8)
    assert tokenizer.eos_id not in ids  # (a random tiny model; if this ever fails pick another prompt)
    stop = tokenizer.decode(ids[4:6])
    assert stop and text.find(stop) > 0
    lm = TitanDeltaEvalLM(model, tokenizer, batch_size=4)
    outputs = lm.generate_until([
        Request(prompt, {"until": [stop], "max_gen_toks": 8}),
        Request(prompt, {"until": ["\u2603never"], "max_gen_toks": 3}),
        Request(prompt, {"until": stop, "max_gen_toks": 8, "do_sample": False}),
    ])  # fmt: skip
    assert outputs[0] == cut_at_stop(text, [stop])[0] == outputs[2]
    assert outputs[1] == tokenizer.decode(ids[:3])


def test_generation_ends_at_eos(model, tokenizer) -> None:
    lm = TitanDeltaEvalLM(model, tokenizer)
    hello = tokenizer.encode("hello")
    assert lm._decode([*hello, tokenizer.eos_id, *hello], ["\n"]) == ("hello", True)
    assert lm._decode(hello, ["\n"]) == ("hello", False)


def test_adapter_rejects_bad_settings(model, tokenizer) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        TitanDeltaEvalLM(model, tokenizer, batch_size=0)
    small = tiny_model(vocab_size=97, n_layers=1)
    with pytest.raises(ValueError, match="vocab_size is 97"):
        TitanDeltaEvalLM(small, tokenizer)
    lm = TitanDeltaEvalLM(model, tokenizer, max_length=8)
    with pytest.raises(ValueError, match="max_gen_toks"):
        lm.generate_until([Request("hi", {"max_gen_toks": 0})])
