"""Sources of the offline corpus: installed Python distributions and standard libraries, and their licences.

A source is one installed distribution (a ``*.dist-info`` / ``*.egg-info`` folder: licence from its metadata,
files from ``RECORD``, ``installed-files.txt`` or ``top_level.txt``) or one Python standard library (PSF).
Only clearly permissive licences are kept (:data:`PERMISSIVE`); anything copyleft, proprietary, unrecognised
or missing is excluded with the reason, as are editable installs (source checkouts). Files are checked again
one by one (:func:`file_licence_problem`) because wheels vendor third-party files under other terms (e.g.
NVIDIA's CUDA headers inside ``triton``).
"""

from __future__ import annotations

import email.parser
import glob
import json
import os
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

PERMISSIVE_EXCEPTIONS = {"llvm-exception"}
# "+" permissive or "-" not, normalised name, regex on lower-cased text; every match counts ("MIT or GPL").
PATTERN_TABLE = r"""
- AGPL          affero|\bagpl
- LGPL          lesser general public|library general public|\blgpl
- GPL           general public licen[cs]e|\bgpl
- MPL           mozilla|\bmpl\b|\bmpl-
- EPL           eclipse public|\bepl\b|\bepl-
- CDDL          \bcddl|common development and distribution
- restrictive   \beupl|\bsspl|\bbusl|business source|non-?commercial|\bcc-by-(nc|sa|nd)
- proprietary   proprietar|commercial licen|\beula\b|nvidia|licenseref-
+ MIT-CMU       mit-cmu|\bcmu\b
+ MIT-0         mit-0|mit no attribution
+ MIT           \bmit\b|\bexpat\b
+ 0BSD          \b0bsd\b|zero-clause bsd
+ BSD-2-Clause  bsd[- ]?2|2-clause|two-clause|simplified bsd|freebsd
+ BSD-3-Clause  bsd[- ]?3|3-clause|three-clause|new bsd|modified bsd|revised bsd
+ BSD           \bbsd\b
+ Apache-2.0    apache
+ CNRI-Python   \bcnri
+ PSF-2.0       \bpsf|python software foundation|python-2\.0|\bpython licen[cs]e
+ ISC           \bisc\b|\biscl\b
+ Unlicense     unlicense
+ Zlib          \bzlib\b|libpng
+ HPND          \bhpnd\b|historical permission
+ BSL-1.0       \bbsl-1|boost software
+ CC0-1.0       \bcc0\b
+ UPL-1.0       \bupl\b|universal permissive
+ ZPL-2.1       \bzpl\b|zope public
+ NCSA          \bncsa\b|university of illinois
+ X11           \bx11\b
"""
# Recognisable full licence texts (pasted into a ``License:`` field), on lower-cased, space-collapsed text.
FINGERPRINT_TABLE = r"""
MIT           permission is hereby granted, free of charge
BSD-3-Clause  redistribution and use in source and binary forms.*?(neither the name|endorse or promote)
BSD-2-Clause  redistribution and use in source and binary forms
Apache-2.0    apache license,? version 2\.0
PSF-2.0       python software foundation license
ISC           permission to use, copy, modify, and(/or)? distribute this software for any purpose
Unlicense     free and unencumbered software released into the public domain
"""


def _table(text: str, columns: int) -> list[list[str]]:
    return [line.split(None, columns - 1) for line in text.strip().splitlines()]


PATTERNS = [(re.compile(rx), name) for _, name, rx in _table(PATTERN_TABLE, 3)]
PERMISSIVE = {name for sign, name, _ in _table(PATTERN_TABLE, 3) if sign == "+"}
TEXT_FINGERPRINTS = [(re.compile(rx), name) for name, rx in _table(FINGERPRINT_TABLE, 2)]
BUNDLED = re.compile(r"(?i)bundles? the following software")
BINARY_FILES = re.compile(r"\.libs/|\.(so|dll|dylib|pyd|a)\b|\*\.so")
FILE_NOTICE = re.compile(
    r"GNU (?:Lesser |Library |Affero )?General Public Licen[cs]e|\b[LA]?GPL-?v?[23]|Mozilla Public License"
    r"|Eclipse Public License|\bPROPRIETARY\b|NVIDIA intellectual property"
    r"|NVIDIA CORPORATION and its licensors|License Agreement"
)
SKIP_DIR = re.compile(r"site-packages|dist-packages|__pycache__|lib-dynload|config-.*|.*\.(dist|egg)-info")
SITE_NAMES = ("site-packages", "dist-packages")
# A working tree is not a release: its README and path hooks change with the checkout and the machine, so two
# builds at different commits or paths would give different token streams.
EDITABLE_REASON = "editable install (a source checkout, not a release)"
# Python prefixes looked at (besides this interpreter's): system, conda, /opt installs, pyenv, user installs.
PREFIX_GLOBS = "/usr /usr/local /opt/conda /opt/conda/envs/* /opt/* ~/.pyenv/versions/* ~/.local ~/*conda*"
SPDX_LINE = re.compile(r"SPDX-License-Identifier:\s*([^\n*]+?)\s*(?:\*/|-->|$)", re.M)


@dataclass
class Source:
    """One kept source; ``files`` are (absolute path, path relative to its root)."""

    name: str
    version: str
    licence: str
    roots: list[str] = field(default_factory=list)
    files: list[tuple[Path, str]] = field(default_factory=list)
    description: str = ""


def licence_ids(text: str) -> set[str]:
    """Every licence name recognised in a short licence string (SPDX id, classifier or free text)."""
    low = text.lower()
    return {name for pattern, name in PATTERNS if pattern.search(low)}


def expression_ok(expr: str) -> bool | None:
    """True/False for a permissive/non-permissive licence expression (SPDX-like; ``OR`` = any alternative
    may be chosen, ``AND`` = all apply, ``WITH`` = an exception of the base licence); None if unrecognised."""
    parts = re.split(r"(\(|\)|(?<![\w.+-])(?:OR|AND|WITH)(?![\w.+-]))", expr, flags=re.I)
    tokens = [t.strip() for t in parts if t.strip()]
    pos = 0

    def parse(level: int) -> bool | None:  # level 0: OR (True wins), level 1: AND (False wins)
        nonlocal pos
        values = [parse(1) if level == 0 else parse_one()]
        while pos < len(tokens) and tokens[pos].upper() == ("OR", "AND")[level]:
            pos += 1
            values.append(parse(1) if level == 0 else parse_one())
        winner = level == 0
        return winner if winner in values else (None if None in values else not winner)

    def parse_one() -> bool | None:
        nonlocal pos
        if pos >= len(tokens):
            return None
        token, pos = tokens[pos], pos + 1
        if token == "(":
            value = parse(0)
            pos += 1 if pos < len(tokens) and tokens[pos] == ")" else 0
        else:
            ids = licence_ids(token)
            value = None if not ids else ids <= PERMISSIVE
        if pos < len(tokens) and tokens[pos].upper() == "WITH":
            exception, pos = tokens[pos + 1].lower() if pos + 1 < len(tokens) else "", pos + 2
            value = value and exception in PERMISSIVE_EXCEPTIONS
        return value

    value = parse(0)
    return value if pos == len(tokens) else None


def long_text_ids(text: str) -> set[str]:
    """Licences named in a pasted licence text; bundled components shipped only as binaries are ignored."""
    main, *rest = BUNDLED.split(text, maxsplit=1)
    bundled = rest[0] if rest else ""
    flat = re.sub(r"\s+", " ", main.lower())
    ids = {name for pattern, name in TEXT_FINGERPRINTS if pattern.search(flat)}
    ids -= {"BSD-2-Clause"} if "BSD-3-Clause" in ids else set()
    ids |= {name for name in licence_ids(flat) if name not in PERMISSIVE}
    for block in re.split(r"\n\s*Name:", bundled):
        files, licences = re.findall(r"Files:\s*(.+)", block), re.findall(r"License:\s*(.+)", block)
        if not files and not licences:
            continue
        names = set().union(*(licence_ids(m) for m in licences)) or {"unclear bundled licence"}
        if not (files and all(BINARY_FILES.search(f) for f in ",".join(files).split(","))):
            ids |= names
    return ids


def decide_licence(meta) -> tuple[str, str]:
    """``(licence, "")`` for a distribution to keep, ``("", reason)`` for one to leave out."""
    expr = (meta.get("License-Expression") or "").strip()
    if expr:
        ok = expression_ok(expr)
        verdict = "is not permissive" if ok is False else "is not recognised"
        return (expr, "") if ok else ("", f"License-Expression {expr!r} {verdict}")
    ids: set[str] = set()
    for classifier in meta.get_all("Classifier") or []:
        if classifier.startswith("License ::") and classifier.strip() != "License :: OSI Approved":
            found = licence_ids(classifier.removeprefix("License ::"))
            ids |= found or {f"unrecognised classifier {classifier!r}"}
    text, unrecognised = (meta.get("License") or "").strip(), ""
    if text and text.upper() != "UNKNOWN":
        if "\n" in text or len(text) > 200:
            ids |= long_text_ids(text) or {"unrecognised License text"}
        else:
            ok = expression_ok(text)
            if ok is False:
                return "", f"License {text!r} is not permissive"
            ids |= licence_ids(text) if ok else set()
            unrecognised = "" if ok else text
    if not ids:
        return "", f"License {unrecognised!r} is not recognised" if unrecognised else "no licence metadata"
    bad = sorted(ids - PERMISSIVE)
    if bad:
        return "", "not clearly permissive: " + ", ".join(bad)
    if text and not unrecognised and "\n" not in text and re.search(r"\b(OR|AND)\b", text):
        return text, ""  # a short expression keeps its meaning ("MIT OR Apache-2.0")
    generic = {"BSD"} if ids & {"BSD-2-Clause", "BSD-3-Clause", "0BSD"} else set()
    generic |= {"MIT"} if ids & {"MIT-CMU", "MIT-0"} else set()
    return " / ".join(sorted(ids - generic)), ""


def file_licence_problem(head: str) -> str:
    """A reason if the start of a file carries a licence notice other than a permissive one, else ``""``."""
    for expr in SPDX_LINE.findall(head):
        if not expression_ok(expr):
            return f"SPDX {expr.strip()}"
    match = FILE_NOTICE.search(head)
    return f"notice {match.group(0)!r}" if match else ""


def is_stdlib(root: Path) -> bool:
    return (root / "os.py").is_file() and (root / "abc.py").is_file()


def is_site(root: Path) -> bool:
    return any(glob.glob(str(root / "*.dist-info"))) or any(glob.glob(str(root / "*.egg-info")))


def default_roots() -> list[Path]:
    """Standard libraries and site-/dist-packages of this interpreter and of other Pythons found here."""
    prefixes = [sys.prefix, sys.base_prefix]
    for pattern in PREFIX_GLOBS.split():
        prefixes += sorted(glob.glob(os.path.expanduser(pattern)))
    found = [sysconfig.get_paths()["stdlib"], *(p for p in sys.path if p.endswith(SITE_NAMES))]
    for prefix in prefixes:
        for lib in sorted(glob.glob(f"{prefix}/lib/python[0-9]*")):
            found += [lib, f"{lib}/site-packages", f"{lib}/dist-packages"]
    roots, seen = [], set()
    for candidate in map(Path, found):
        real = os.path.realpath(candidate)
        if real not in seen and candidate.is_dir() and (is_stdlib(candidate) or is_site(candidate)):
            seen.add(real)
            roots.append(candidate)
    return roots


def expand_root(path: Path) -> list[Path]:
    """A given ``--roots`` entry: a stdlib, a site-packages folder, or a prefix holding ``lib/python*``."""
    if is_stdlib(path) or is_site(path):
        return [path]
    inner = [
        Path(p)
        for lib in sorted(glob.glob(f"{path}/lib/python[0-9]*"))
        for p in (lib, f"{lib}/site-packages", f"{lib}/dist-packages")
    ]
    return [p for p in inner if p.is_dir() and (is_stdlib(p) or is_site(p))]


def walk(folder: Path, base: Path) -> list[tuple[Path, str]]:
    out = []
    for top, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not SKIP_DIR.fullmatch(d))
        out += [(Path(top) / n, (Path(top) / n).relative_to(base).as_posix()) for n in sorted(names)]
    return out


def stdlib_source(root: Path) -> Source:
    version = root.name.removeprefix("python")
    return Source("python-stdlib", version, "PSF-2.0", [str(root)], walk(root, root))


def site_sources(root: Path) -> tuple[list[Source], list[dict]]:
    """Kept and excluded distributions of one site-packages folder."""
    infos = sorted(glob.glob(str(root / "*.dist-info")) + glob.glob(str(root / "*.egg-info")))
    claimed: set[str] = set()
    for info in infos:
        record = Path(info) / "RECORD"
        if record.is_file():
            claimed |= {line.split(",")[0] for line in record.read_text(errors="replace").splitlines()}
    kept, excluded = [], []
    for info in map(Path, infos):
        meta_file = next((info / n for n in ("METADATA", "PKG-INFO") if (info / n).is_file()), info)
        if not meta_file.is_file():
            continue
        meta = email.parser.Parser().parsestr(meta_file.read_text(errors="replace"))
        name = re.sub(r"[-_.]+", "-", (meta.get("Name") or info.name.split("-")[0]).strip().lower())
        version = (meta.get("Version") or "").strip()
        licence, reason = ("", EDITABLE_REASON) if is_editable(info) else decide_licence(meta)
        if not licence:
            excluded.append({"name": name, "version": version, "root": str(root), "reason": reason})
            continue
        description = meta.get_payload() if isinstance(meta.get_payload(), str) else ""
        kept.append(
            Source(name, version, licence, [str(root)], owned_files(root, info, claimed), description.strip())
        )
    return kept, excluded


def is_editable(info: Path) -> bool:
    """Installed with ``pip install -e``: PEP 610's ``direct_url.json`` says ``dir_info.editable``."""
    try:
        return bool(json.loads((info / "direct_url.json").read_text()).get("dir_info", {}).get("editable"))
    except (OSError, ValueError, AttributeError):
        return False


def owned_files(root: Path, info: Path, claimed: set[str]) -> list[tuple[Path, str]]:
    """Files of one distribution: RECORD, else installed-files.txt, else its top-level names (files
    another distribution's RECORD claims are not taken, nor namespace packages shared with others)."""
    if (info / "RECORD").is_file():
        rels = [line.split(",")[0] for line in (info / "RECORD").read_text(errors="replace").splitlines()]
        return [(root / r, r) for r in rels if r and ".." not in Path(r).parts and (root / r).is_file()]
    if (info / "installed-files.txt").is_file():
        paths = [(info / r).resolve() for r in (info / "installed-files.txt").read_text().split()]
        base = root.resolve()
        return [(p, p.relative_to(base).as_posix()) for p in paths if p.is_relative_to(base) and p.is_file()]
    names = (info / "top_level.txt").read_text().split() if (info / "top_level.txt").is_file() else []
    shared_file = info / "namespace_packages.txt"
    shared = shared_file.read_text().split() if shared_file.is_file() else []
    out = []
    for name in names:
        if name in shared:
            continue
        if (root / name).is_dir():
            out += [(p, r) for p, r in walk(root / name, root) if r not in claimed]
        elif (root / f"{name}.py").is_file() and f"{name}.py" not in claimed:
            out.append((root / f"{name}.py", f"{name}.py"))
    return out
