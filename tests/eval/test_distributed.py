"""Two gloo ranks split the requests, run the same number of forwards and gather identical results."""

from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .helpers import HYBRID, Request, tiny_model

CONTEXTS = ["a", "The Lord is my shepherd", "def f(x):", "1 2 3 4 5 6 7", "Blessed are", "import os", "x"]
TEXTS = ["In the beginning.", "for i in range(10): print(i)", "short"]
PROMPTS = ["Q: one\nA:", "Q: a longer question here\nA:", "Q: two\nA:"]


def _evaluate(lm) -> dict:
    return {
        "loglikelihood": lm.loglikelihood([Request(c, " and") for c in CONTEXTS]),
        "rolling": lm.loglikelihood_rolling([Request(t) for t in TEXTS]),
        "generate": lm.generate_until([Request(p, {"until": ["\n"], "max_gen_toks": 4}) for p in PROMPTS]),
    }


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        from titan_delta.data.tokenizer import load_tokenizer
        from titan_delta.eval.adapter import TitanDeltaEvalLM

        torch.manual_seed(0)
        model = tiny_model(vocab_size=16384, **HYBRID)
        lm = TitanDeltaEvalLM(model, load_tokenizer(), batch_size=2)
        scored_rows: list[int] = []
        score_batch = lm._score_batch
        lm._score_batch = lambda rows: (scored_rows.extend(r.request for r in rows), score_batch(rows))[1]
        results = _evaluate(lm)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"results": results, "forwards": lm.forwards, "rows": len(scored_rows)}, f)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_split_and_gather(tmp_path, tokenizer) -> None:
    from titan_delta.eval.adapter import TitanDeltaEvalLM

    # spawn, not fork: a child forked after the parent's OpenMP pool started can hang in its first matmul
    mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    torch.manual_seed(0)
    single = TitanDeltaEvalLM(tiny_model(vocab_size=16384, **HYBRID), tokenizer, batch_size=2)
    expected = _evaluate(single)
    for rank in ranks:
        got = rank["results"]
        assert got["generate"] == expected["generate"]
        for key in ("loglikelihood", "rolling"):
            flat_got = torch.tensor(
                [x[0] if isinstance(x, list) else x for x in got[key]], dtype=torch.float64
            )
            flat_exp = torch.tensor(
                [x[0] if isinstance(x, tuple) else x for x in expected[key]], dtype=torch.float64
            )
            torch.testing.assert_close(flat_got, flat_exp, rtol=1e-9, atol=1e-9)
    # lock-step: both ranks made the same number of forwards (dummies included) ...
    assert ranks[0]["forwards"] == ranks[1]["forwards"]
    # ... and each scored only its share of the rows (7 loglikelihood + 3 rolling windows here).
    assert ranks[0]["rows"] + ranks[1]["rows"] == len(CONTEXTS) + len(TEXTS)
    assert 0 < ranks[0]["rows"] < len(CONTEXTS) + len(TEXTS)
