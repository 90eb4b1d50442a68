#!/usr/bin/env python
"""Build the offline corpus (Python sources and docs of permissively licensed installed packages).

Example: ``python tools/build_offline_corpus.py --out /data/offline_corpus --pretokenize``, then train with
``--data.sources "parquet:/data/offline_corpus/train/*.parquet"`` (see docs/data.md, "Offline corpus").
Exit codes: 0 done; 2 bad argument; 3 everything written but fewer than ``--min-bytes`` bytes of text.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def count(text: str) -> int:
    value = int(float(text))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder (train/, heldout/, reports)")
    parser.add_argument(
        "--roots",
        type=Path,
        nargs="+",
        default=None,
        help="stdlib / site-packages folders or Python prefixes (default: found on this machine)",
    )
    parser.add_argument("--min-bytes", type=count, default=10**9, help="exit 3 below this much text (1e9)")
    parser.add_argument("--heldout-fraction", type=fraction, default=0.005)
    parser.add_argument("--max-file-bytes", type=count, default=1 << 20, help="skip larger files")
    parser.add_argument("--threads", type=count, default=8, help="file reading and tokenising threads")
    parser.add_argument("--pretokenize", action="store_true", help="also write pretokenized/{train,heldout}")
    parser.add_argument("--tokenizer", default="default", help="tokenizer for --pretokenize (data.tokenizer)")
    parser.add_argument(
        "--pretokenize-max-tokens",
        type=count,
        default=None,
        help="stop each split after about this many tokens (a quick look)",
    )
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"argument --out: {args.out} exists and is not a folder")
    for root in args.roots or []:
        if not root.is_dir():
            parser.error(f"argument --roots: {root} is not a folder")
    # Imported after argument checks: the package imports torch (seconds), a bad argument should fail fast.
    from titan_delta.data.offline_corpus import build, pretokenize_splits, write_json
    from titan_delta.data.offline_sources import default_roots, expand_root

    for root in args.roots or []:
        if not expand_root(root):
            parser.error(
                f"argument --roots: {root} holds no Python standard library or installed distributions"
            )
    roots = args.roots or default_roots()
    arguments = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    arguments["roots"] = [str(r) for r in roots]
    manifest = build(
        args.out, roots, args.heldout_fraction, args.max_file_bytes, max(args.threads, 1), arguments
    )
    if args.pretokenize:
        tokens = pretokenize_splits(
            args.out, args.tokenizer, args.threads or None, args.pretokenize_max_tokens
        )
        manifest["pretokenized"] = tokens
        total = tokens["train"]["tokens"] + tokens["heldout"]["tokens"]
        if args.pretokenize_max_tokens is None and total:
            manifest["approx_tokens"] = total
            manifest["bytes_per_token"] = round(manifest["total_bytes"] / total, 3)
        write_json(args.out / "manifest.json", manifest)
    short = manifest["total_bytes"] < args.min_bytes
    print(
        f"{'short' if short else 'done'}: {manifest['total_bytes']:,} bytes of text in "
        f"{manifest['total_documents']:,} documents from {manifest['sources_kept']} sources"
        + (f", fewer than --min-bytes {args.min_bytes:,}" if short else "")
        + f" -> {args.out}",
        file=sys.stderr,
    )
    return 3 if short else 0


if __name__ == "__main__":
    raise SystemExit(main())
