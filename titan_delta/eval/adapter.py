"""lm-eval ``LM`` over a titan-delta model and tokenizer: log-likelihoods, rolling perplexity, greedy
generation, batched and data-parallel (see ``distributed.py``) so it also runs on the live training model.

lm-eval sees one process (rank 0 of 1) on every rank: each rank receives every request, scores its own
share and returns the gathered results, so the harness computes identical metrics everywhere.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from torch import nn

from titan_delta.eval.distributed import RankShare
from titan_delta.eval.requests import (
    ScoringRow,
    Tokenizer,
    batches_by_length,
    batches_of_equal_length,
    cut_at_stop,
    document_prefix,
    generation_prompt,
    loglikelihood_row,
    rolling_rows,
)
from titan_delta.models.decoding import greedy_generate

logger = logging.getLogger(__name__)
DEFAULT_MAX_GEN_TOKS = 256


class TitanDeltaEvalLM(LM):
    """Args:
    model: a ``TitanDeltaLM`` (plain, compiled per block, FSDP-sharded: any data-parallel layout).
    tokenizer: ``titan_delta.data.tokenizer.DataTokenizer`` (tiktoken or Hugging Face; anything with
        encode/decode/eos_id/bos_id).
    batch_size: rows per forward. max_length: context limit (default: the model's ``max_seq_len``).
    add_bos: contexts start with EOS, BOS like training documents did with ``[data] add_bos``.
    process_group: ranks that evaluate together (default: the world, when initialised).
    pad_to_multiple: right-pad scoring batches to a multiple of this length (fewer recompiles).
    force_eager: run compiled blocks eagerly (eval shapes vary; the compile cache stays for training).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        *,
        batch_size: int = 8,
        max_length: int | None = None,
        add_bos: bool = False,
        process_group: Any = None,
        pad_to_multiple: int = 1,
        force_eager: bool = True,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if pad_to_multiple < 1:
            raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.pad_to_multiple, self.force_eager = batch_size, pad_to_multiple, force_eager
        model_args = getattr(model, "model_args", None)
        self.max_length = int(max_length or getattr(model_args, "max_seq_len", 0))
        if self.max_length < 2:
            raise ValueError(
                f"max_length must be >= 2 (or the model must carry model_args); got {max_length}"
            )
        vocab = getattr(model_args, "vocab_size", None)
        if vocab is not None and hasattr(tokenizer, "get_vocab_size") and tokenizer.get_vocab_size() > vocab:
            raise ValueError(
                f"tokenizer has {tokenizer.get_vocab_size()} tokens but the model's vocab_size is {vocab}: "
                "evaluate with the tokenizer the model was trained with"
            )
        self.prefix = document_prefix(tokenizer, add_bos)
        self.share = RankShare(process_group)
        self.model_device = next(model.parameters()).device
        self.forwards = 0  # forward calls this rank made, dummies included (tests check the split)
        self._warned_sampling = False

    # ------------------------------------------------------------------ model calls
    def _run(self) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        if self.force_eager:
            stack.enter_context(torch.compiler.set_stance("force_eager"))
        return stack

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return self.model(tokens.to(self.model_device))

    def _idle_forward(self) -> None:
        """A one-token forward whose result is thrown away: keeps a sharded model's collectives aligned."""
        self._forward(torch.tensor([self.prefix[:1]], dtype=torch.long))

    # ------------------------------------------------------------------ scoring
    def _score_batch(self, rows: list[ScoringRow]) -> list[tuple[float, bool]]:
        length = max(len(r.inputs) for r in rows)
        length = -(-length // self.pad_to_multiple) * self.pad_to_multiple
        tokens = torch.zeros(len(rows), length, dtype=torch.long)  # right padding: causal, never seen
        for b, row in enumerate(rows):
            tokens[b, : len(row.inputs)] = torch.tensor(row.inputs)
        logits = self._forward(tokens)
        logprobs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        results = []
        for b, row in enumerate(rows):
            n, end = len(row.targets), len(row.inputs)
            lp = logprobs[b, end - n : end]
            targets = torch.tensor(row.targets, device=lp.device)
            total = lp.gather(-1, targets[:, None]).sum().item()
            results.append((float(total), bool((lp.argmax(-1) == targets).all())))
        return results

    def _score_rows(self, rows: list[ScoringRow]) -> list[tuple[float, bool]]:
        """Scores of ``rows`` in their order, computed in length-sorted batches shared among ranks."""
        batches = batches_by_length([len(r.inputs) for r in rows], self.batch_size)
        scored: list[tuple[int, tuple[float, bool]]] = []

        def run(batch: list[int]) -> None:
            scored.extend(zip(batch, self._score_batch([rows[i] for i in batch]), strict=True))

        with self._run():
            self.share.lockstep(self.share.mine(batches), run, self._idle_forward)
        results: list[Any] = [None] * len(rows)
        for i, result in self.share.gather(scored):
            results[i] = result
        return results

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        rows = [
            loglikelihood_row(i, *req.args, self.tokenizer, self.prefix, self.max_length)
            for i, req in enumerate(requests)
        ]
        return self._score_rows(rows)

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        rows = [
            row
            for i, req in enumerate(requests)
            for row in rolling_rows(i, req.args[0], self.tokenizer, self.prefix, self.max_length)
        ]
        totals = [0.0] * len(requests)
        for row, (logprob, _) in zip(rows, self._score_rows(rows), strict=True):
            totals[row.request] += logprob
        return totals

    # ------------------------------------------------------------------ generation
    def _generation_settings(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], int]:
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
        if max_new < 1:
            raise ValueError(f"generation_kwargs max_gen_toks must be >= 1, got {max_new}")
        sampling = gen_kwargs.get("do_sample") or float(gen_kwargs.get("temperature", 0.0) or 0.0) > 0
        if sampling and not self._warned_sampling:
            logger.warning("titan-delta eval generates greedily; do_sample/temperature are ignored")
            self._warned_sampling = True
        return until, max_new

    def _decode(self, ids: list[int], stops: list[str]) -> tuple[str, bool]:
        eos = self.tokenizer.eos_id
        ended = eos in ids
        text, stopped = cut_at_stop(self.tokenizer.decode(ids[: ids.index(eos)] if ended else ids), stops)
        return text, stopped or ended

    def _generate_batch(self, prompts: list[list[int]], stops: list[str], max_new: int) -> list[str]:
        def is_finished(generated: torch.Tensor) -> torch.Tensor:
            rows = generated.tolist()
            return torch.tensor([self._decode(r, stops)[1] for r in rows], device=generated.device)

        prompt = torch.tensor(prompts, dtype=torch.long, device=self.model_device)
        self.forwards += 1  # the prefill; every later step is counted through the sync below
        generated = greedy_generate(
            self.model, prompt, max_new, is_finished=is_finished, any_rank_continues=self._next_step
        )
        return [self._decode(row, stops)[0] for row in generated.tolist()]

    def _next_step(self, wants_more: bool) -> bool:
        more = self.share.any_rank(wants_more)
        self.forwards += int(more)
        return more

    def generate_until(self, requests: list[Any]) -> list[str]:
        settings = [self._generation_settings(dict(req.args[1])) for req in requests]
        prompts = [
            generation_prompt(req.args[0], self.tokenizer, self.prefix, self.max_length, max_new)
            for req, (_, max_new) in zip(requests, settings, strict=True)
        ]
        keys = [(len(p), tuple(stops), n) for p, (stops, n) in zip(prompts, settings, strict=True)]
        done: list[tuple[int, str]] = []

        def run(batch: list[int]) -> None:
            stops, max_new = settings[batch[0]]
            texts = self._generate_batch([prompts[i] for i in batch], stops, max_new)
            done.extend(zip(batch, texts, strict=True))

        def idle() -> None:
            self._generate_batch([self.prefix[:1]], [], 1)

        with self._run():
            self.share.lockstep(self.share.mine(batches_of_equal_length(keys, self.batch_size)), run, idle)
        results: list[Any] = [None] * len(requests)
        for i, text in self.share.gather(done):
            results[i] = text
        return results
