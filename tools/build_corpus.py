#!/usr/bin/env python
"""Build the embedded default corpus (``titan_delta/assets/default_corpus.parquet``).

Sources (Debian packages, fetched with ``apt-get download`` and unpacked with ``dpkg -x``, no install):

* ``bible-kjv-text`` + ``bible-kjv`` — the King James Version, read through the package's own ``bible``
  program (the data file is in its private compressed format); one document per chapter.
  Public domain in most of the world (in the UK the text is under perpetual Crown patent).
* ``python3.11-doc`` — the reStructuredText sources of the Python 3.11 documentation (PSF licence);
  one document per page, the sections chosen below (no changelogs, C API or distutils).

The parquet file uses FineWeb-edu's column schema so the same loader code reads both. Columns that only
make sense for FineWeb-edu (language_score, score, int_score, token_count) are null here.

Usage: ``python tools/build_corpus.py --workdir build/corpus [--out titan_delta/assets/...]``
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

KJV_BOOKS = (
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel",
    "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
    "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations",
    "Ezekiel", "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk",
    "Zephaniah", "Haggai", "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans",
    "1 Corinthians", "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians",
    "1 Thessalonians", "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James",
    "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation",
)
PYDOC_SECTIONS = ("tutorial", "howto", "faq", "reference", "library", "using", "extending", "installing")
PYDOC_FILES = ("glossary.rst.txt",)
SCHEMA = pa.schema(
    [
        ("text", pa.string()),
        ("id", pa.string()),
        ("dump", pa.string()),
        ("url", pa.string()),
        ("file_path", pa.string()),
        ("language", pa.string()),
        ("language_score", pa.float64()),
        ("token_count", pa.int64()),
        ("score", pa.float64()),
        ("int_score", pa.int64()),
    ]
)
VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def fetch(workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", "bible-kjv-text", "bible-kjv", "python3.11-doc"], cwd=workdir,
                   check=True)
    for deb in sorted(workdir.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(workdir / "root")], check=True)


def kjv_documents(root: Path) -> list[dict]:
    data_dir = root / "usr/lib"
    out = subprocess.run([str(root / "usr/bin/bible"), "-f", "-p", str(data_dir), "ge1:1-re22:21"],
                         check=True, capture_output=True, text=True).stdout
    books = KJV_BOOKS
    chapters: dict[tuple[int, int], list[str]] = {}
    abbrevs: list[str] = []
    for line in out.splitlines():
        m = VERSE.match(line)
        if m is None:
            raise RuntimeError(f"unexpected line from bible: {line[:80]!r}")
        abbrev, chapter, verse, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        if not abbrevs or abbrevs[-1] != abbrev:
            abbrevs.append(abbrev)
        chapters.setdefault((len(abbrevs) - 1, chapter), []).append(f"{verse} {text.strip()}")
    if len(abbrevs) != 66:
        raise RuntimeError(f"expected 66 books from bible, got {len(abbrevs)}")
    docs = []
    for (book, chapter), verses in chapters.items():
        title = f"{books[book]} {chapter}" if books[book] != "Psalms" else f"Psalm {chapter}"
        docs.append(_record(f"The King James Bible: {title}\n\n" + "\n".join(verses) + "\n",
                            source="bible-kjv-text_4.38", path=f"kjv/{books[book]}/{chapter}"))
    return docs


def pydoc_documents(root: Path) -> list[dict]:
    src = root / "usr/share/doc/python3.11/html/_sources"
    files = [src / name for name in PYDOC_FILES]
    for section in PYDOC_SECTIONS:
        files += sorted((src / section).rglob("*.rst.txt"))
    docs = []
    for path in files:
        text = path.read_text(encoding="utf-8").strip()
        if text:
            rel = path.relative_to(src).as_posix()
            docs.append(_record(text + "\n", source="python3.11-doc_3.11.2", path=f"python-docs/{rel}"))
    return docs


def _record(text: str, source: str, path: str) -> dict:
    digest = hashlib.sha1(f"{source}/{path}".encode()).hexdigest()[:16]
    return {
        "text": text, "id": f"<titan-delta:{digest}>", "dump": source, "url": path, "file_path": path,
        "language": "en", "language_score": None, "token_count": None, "score": None, "int_score": None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="scratch folder for the .deb files")
    default_out = Path(__file__).resolve().parents[1] / "titan_delta/assets/default_corpus.parquet"
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--skip-fetch", action="store_true", help="reuse debs already unpacked in --workdir")
    args = parser.parse_args(argv)
    if not args.skip_fetch:
        fetch(args.workdir)
    root = args.workdir / "root"
    docs = kjv_documents(root) + pydoc_documents(root)
    # Interleave the two sources deterministically so any prefix of the file mixes prose and code docs.
    docs.sort(key=lambda d: d["id"])
    table = pa.Table.from_pylist(docs, schema=SCHEMA)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.out, compression="zstd", compression_level=19, row_group_size=256)
    chars = sum(len(d["text"]) for d in docs)
    print(f"wrote {args.out.name}: {len(docs)} documents, {chars / 1e6:.2f} M characters, "
          f"{args.out.stat().st_size / 1e6:.2f} MB on disk", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
