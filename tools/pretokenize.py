#!/usr/bin/env python
"""Pre-tokenise sources into memory-mapped uint16/uint32 shards + index for ``data.pretokenized``.

Example: ``python tools/pretokenize.py --source default --out runs/tokens/default``
then train with ``--data.pretokenized runs/tokens/default`` (same ``--data.tokenizer``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from titan_delta.data.config import DataConfig, DataConfigError
from titan_delta.data.pretokenize import pretokenize
from titan_delta.data.tokenizer import load_tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", action="append", default=None,
                        help="a data.sources entry (repeat for a mixture); default: the embedded corpus")
    parser.add_argument("--weight", action="append", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--tokenizer", default="default")
    parser.add_argument("--tokenizer-pattern", default="")
    parser.add_argument("--eos-token", default="", help="data.eos_token (Hugging Face tokenizer.json only)")
    parser.add_argument("--bos-token", default="", help="data.bos_token (Hugging Face tokenizer.json only)")
    parser.add_argument("--add-bos", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=None, help="stop after about this many tokens")
    parser.add_argument("--shard-tokens", type=int, default=1 << 28)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    config = DataConfig(sources=args.source or ["default"], weights=args.weight or [], seed=args.seed,
                        text_field=args.text_field, tokenizer=args.tokenizer,
                        tokenizer_pattern=args.tokenizer_pattern, eos_token=args.eos_token,
                        bos_token=args.bos_token, add_bos=args.add_bos, tokenize_threads=args.threads)
    try:
        tokenizer = load_tokenizer(config.tokenizer, config.tokenizer_pattern, config.tokenize_threads,
                                   config.eos_token, config.bos_token)
        counts = pretokenize(config, tokenizer, args.out, args.max_tokens, args.shard_tokens)
    except DataConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {counts['documents']} documents, {counts['tokens']} tokens "
          f"(skipped {counts['bad_records']} bad, {counts['empty_documents']} empty; "
          f"split {counts['split_documents']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
