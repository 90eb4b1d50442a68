#!/usr/bin/env python
"""Data pipeline throughput: tokenise+pack from local parquet, and the pre-tokenised loader (tokens/s).

Counts input tokens of the batches the trainer would receive (``B·T`` per batch) over a timed window
after a warm-up batch (worker start-up excluded). Prints one line per configuration plus ``os.getloadavg``
so numbers from a shared machine can be judged.

Example: ``python tools/bench/data.py --workers 2 --seconds 20``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

from titan_delta.data import DataConfig, build_dataloader, load_tokenizer
from titan_delta.data.pretokenize import pretokenize
from titan_delta.data.sources import DEFAULT_CORPUS

warnings.filterwarnings("ignore", message=".*set_vital.*")


def measure(config: DataConfig, seq_len: int, batch: int, seconds: float, tokenizer,
            world: int = 1) -> tuple[float, int]:
    job = SimpleNamespace(data=config, training=SimpleNamespace(seq_len=seq_len, local_batch_size=batch))
    loader = build_dataloader(world, 0, tokenizer, job)
    it = iter(loader)
    next(it)  # warm-up: workers started, first documents read
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        inputs, _ = next(it)
        tokens += inputs["input"].numel()
    elapsed = time.perf_counter() - start
    del it, loader
    return tokens / elapsed, tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parquet", default=str(DEFAULT_CORPUS), help="glob of local parquet files")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="tokeniser threads per worker")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--masking", action="store_true", help="document masking on (cu_seqlens)")
    parser.add_argument("--world", type=int, default=1,
                        help="measure rank 0 of this many data-parallel ranks (it owns lanes/world lanes)")
    parser.add_argument("--skip-pretokenized", action="store_true")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer("default", threads=args.threads)
    print(f"# cpu cores visible: {os.cpu_count()}, load average before: {os.getloadavg()}")
    text = DataConfig(sources=[f"parquet:{args.parquet}"], num_workers=args.workers,
                      tokenize_threads=args.threads, document_masking=args.masking)
    rate, tokens = measure(text, args.seq_len, args.batch, args.seconds, tokenizer, args.world)
    print(f"tokenise+pack  parquet  world={args.world} workers={args.workers} threads/worker={args.threads} "
          f"T={args.seq_len} B={args.batch} masking={args.masking}: {rate:,.0f} tokens/s "
          f"({tokens:,} tokens), load {os.getloadavg()}")
    if args.skip_pretokenized:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "shards"
        pretokenize(DataConfig(sources=[f"parquet:{args.parquet}"], tokenize_threads=2), tokenizer, folder,
                    progress=False)
        pre = DataConfig(pretokenized=str(folder), num_workers=args.workers, document_masking=args.masking)
        rate, tokens = measure(pre, args.seq_len, args.batch, args.seconds, tokenizer)
        print(f"pre-tokenised  memmap   workers={args.workers} T={args.seq_len} B={args.batch}: "
              f"{rate:,.0f} tokens/s ({tokens:,} tokens), load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
