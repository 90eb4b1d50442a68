"""The offline corpus builder: licences, file filters, dedup, held-out split, loader, CLI exit codes."""

from __future__ import annotations

import email.parser
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.data.helpers import make_loader, take
from titan_delta.data import DataConfig
from titan_delta.data.offline_corpus import build, is_heldout, pretokenize_splits
from titan_delta.data.offline_sources import (
    EDITABLE_REASON,
    decide_licence,
    file_licence_problem,
    site_sources,
)
from titan_delta.data.pretokenized import TokenShards

REPO = Path(__file__).resolve().parents[2]
CODE = "def useful_function_{k}(x):\n    '''Return x plus {k}, documented.'''\n    return x + {k}\n"


def meta(text: str):
    return email.parser.Parser().parsestr(text)


def dist(site: Path, name: str, version: str, headers: str, files: dict[str, str | bytes], egg=False):
    """A fake installed distribution: metadata + files (RECORD for dist-info, top_level.txt for egg-info)."""
    info = site / f"{name}-{version}.{'egg-info' if egg else 'dist-info'}"
    info.mkdir(parents=True)
    (info / ("PKG-INFO" if egg else "METADATA")).write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{headers}\n\nThe {name} README, long "
        "enough to be kept as a document of its own: it explains what the package does and how.\n"
    )
    for rel, body in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(body if isinstance(body, bytes) else body.encode())
    if egg:
        (info / "top_level.txt").write_text(name + "\n")
    else:
        (info / "RECORD").write_text("".join(f"{r},sha256=x,1\n" for r in files) + f"{info.name}/RECORD,,\n")


def fake_site(site: Path, extra: str = "") -> None:
    dist(
        site,
        "goodpkg",
        "1.0",
        "License-Expression: MIT",
        {
            "goodpkg/__init__.py": CODE.format(k=1) + extra,
            "goodpkg/core.py": CODE.format(k=2) * 3,
            "goodpkg/guide.md": "# Guide\n\nHow to use goodpkg in a few sentences of documentation.\n",
            "goodpkg/LICENSE.txt": "Permission is hereby granted, free of charge, to any person...\n" * 3,
            "goodpkg/_lib.so": b"\x7fELF\0\0binary",
            "goodpkg/vendored.py": "# This file is under the GNU General Public License v3.\n"
            + CODE.format(k=3),
            "goodpkg/table.py": "TABLE = [" + "1, " * 2000 + "]\n",
            "goodpkg/empty.py": "\n",
            "goodpkg/latin1.txt": "caf\xe9 ".encode("latin-1") * 40,
        },
    )
    dist(
        site,
        "badpkg",
        "2.0",
        "License: GPL-3.0-or-later\nClassifier: License :: OSI Approved :: GNU General "
        "Public License v3 (GPLv3)",
        {"badpkg/__init__.py": CODE.format(k=4)},
    )
    dist(site, "nolic", "0.1", "", {"nolic/__init__.py": CODE.format(k=5)}, egg=True)


def fake_stdlib(lib: Path) -> None:
    lib.mkdir(parents=True)
    for name in ("os", "abc", "json/__init__", "json/decoder"):
        (lib / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (lib / f"{name}.py").write_text(
            f"'''The {name} module of a fake standard library.'''\n" + CODE.format(k=9)
        )


def rows(folder: Path) -> list[dict]:
    return [r for p in sorted(folder.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]


@pytest.fixture
def tree(tmp_path):
    fake_site(tmp_path / "a/site-packages")
    fake_stdlib(tmp_path / "a/python3.99")
    return tmp_path


def test_licence_decisions():
    assert decide_licence(meta("License-Expression: MIT OR GPL-3.0\n")) == ("MIT OR GPL-3.0", "")
    assert decide_licence(meta("License-Expression: Apache-2.0 WITH LLVM-exception AND BSD-3-Clause\n"))[0]
    assert not decide_licence(meta("License-Expression: MPL-2.0 AND MIT\n"))[0]
    assert (
        decide_licence(meta("License: LGPL-2.1-or-later\n"))[1]
        == "License 'LGPL-2.1-or-later' is not permissive"
    )
    assert not decide_licence(meta("License-Expression: LicenseRef-Proprietary\n"))[0]
    assert decide_licence(meta("License: Apache 2.0\n")) == ("Apache-2.0", "")
    assert decide_licence(
        meta(
            "License: Dual License\nClassifier: License :: OSI Approved :: BSD License\n"
            "Classifier: License :: OSI Approved :: Apache Software License\n"
        )
    )[0]
    assert decide_licence(meta("Classifier: License :: Other/Proprietary License\n"))[1]
    assert decide_licence(meta("Name: x\n"))[1] == "no licence metadata"
    assert "not recognised" in decide_licence(meta("License: see the website\n"))[1]
    bsd = (
        "Redistribution and use in source and binary forms, with or without modification, are permitted.\n"
        "Neither the name of the copyright holder may be used to endorse or promote products.\n"
        "This binary distribution also bundles the following software:\n\nName: GCC runtime\n"
    )
    binary_only = bsd + "Files: pkg.libs/libgfortran*.so\nLicense: GPL-3.0-or-later WITH GCC-exception-3.1\n"
    assert decide_licence(meta("License: " + binary_only.replace("\n", "\n  ")))[0] == "BSD-3-Clause"
    sources_too = bsd + "Files: pkg/vendored/*.py\nLicense: GPL-3.0-or-later\n"
    assert "GPL" in decide_licence(meta("License: " + sources_too.replace("\n", "\n  ")))[1]
    assert file_licence_problem("/*\n * SPDX-License-Identifier: GPL-2.0-only\n */") == "SPDX GPL-2.0-only"
    assert file_licence_problem("# SPDX-License-Identifier: Apache-2.0 OR MIT\nimport os\n") == ""
    assert "PROPRIETARY" in file_licence_problem("/* These Licensed Deliverables are PROPRIETARY to X */")


def test_licences_and_file_filters(tree):
    out = tree / "out"
    manifest = build(out, [tree / "a/site-packages", tree / "a/python3.99"], log=lambda _: None)
    docs = rows(out / "train") + rows(out / "heldout")
    urls = {d["url"] for d in docs}
    assert urls == {
        "pkg://goodpkg/1.0/goodpkg/__init__.py",
        "pkg://goodpkg/1.0/goodpkg/core.py",
        "pkg://goodpkg/1.0/goodpkg/guide.md",
        "pkg://goodpkg/1.0/METADATA",
        *(f"pkg://python-stdlib/3.99/{n}.py" for n in ("os", "abc", "json/__init__", "json/decoder")),
    }
    assert manifest["total_documents"] == len(docs) and manifest["sources_kept"] == 2
    assert manifest["total_bytes"] == sum(len(d["text"].encode()) for d in docs)
    assert {d["dump"] for d in docs} == {"goodpkg-1.0", "python-stdlib-3.99"}
    assert len({d["id"] for d in docs}) == len(docs) and all(d["text"].endswith("\n") for d in docs)
    report = json.loads((out / "sources.json").read_text())
    excluded = {e["name"]: e["reason"] for e in report["excluded"]}
    assert set(excluded) == {"badpkg", "nolic"} and "GPL-3.0-or-later" in excluded["badpkg"]
    assert excluded["nolic"] == "no licence metadata"
    good = next(s for s in report["kept"] if s["name"] == "goodpkg")
    assert good["licence"] == "MIT" and good["files"] == 4
    for reason in (
        "licence or metadata file",
        "long lines (generated-looking)",
        "nearly empty",
        "not UTF-8",
        "not a text suffix",
    ):
        assert good["skipped"][reason] >= 1, reason
    assert any(r.startswith("licence notice") for r in good["skipped"])
    assert "| goodpkg | 1.0 | MIT | 4 |" in (out / "SOURCES.md").read_text()
    assert "| badpkg | 2.0 |" in (out / "EXCLUDED.md").read_text()
    assert "python-stdlib | 3.99 | PSF-2.0" in (out / "SOURCES.md").read_text()


def test_exact_duplicates_are_dropped_across_roots(tree):
    fake_site(tree / "b/site-packages", extra="# changed\n")  # the same distribution again, one file changed
    dist(
        tree / "b/site-packages",
        "otherpkg",
        "3.0",
        "License: BSD-3-Clause",
        {"otherpkg/copy.py": (CODE.format(k=2) * 3).replace("\n", "   \r\n")},
    )  # = goodpkg/core.py normalised
    out = tree / "out"
    build(out, [tree / "a/site-packages", tree / "b/site-packages"], log=lambda _: None)
    urls = [d["url"] for d in rows(out / "train") + rows(out / "heldout")]
    assert len(urls) == len(set(urls)) == 5 and "pkg://otherpkg/3.0/METADATA" in urls
    kept = {s["name"]: s for s in json.loads((out / "sources.json").read_text())["kept"]}
    assert kept["goodpkg"]["roots"] == [str(tree / "a/site-packages"), str(tree / "b/site-packages")]
    assert kept["goodpkg"]["duplicates"] == 2 and kept["otherpkg"]["duplicates"] == 1
    assert kept["goodpkg"]["skipped"]["same path in an earlier root"] == 1  # the changed __init__.py


def test_heldout_split_is_fixed(tree):
    keys = [f"pkg{k % 50}/module_{k}.py" for k in range(40_000)]
    held = [is_heldout(k.split("/")[0], k, 0.005) for k in keys]
    assert 0.004 < sum(held) / len(keys) < 0.006
    assert held == [is_heldout(k.split("/")[0], k, 0.005) for k in keys]  # a pure function of name/path
    fake_site(tree / "b/site-packages")
    out1, out2 = tree / "out1", tree / "out2"
    build(out1, [tree / "a/site-packages", tree / "a/python3.99"], 0.5, log=lambda _: None)
    build(out2, [tree / "a/python3.99", tree / "b/site-packages"], 0.5, log=lambda _: None)
    for split in ("train", "heldout"):
        assert sorted(d["id"] for d in rows(out1 / split)) == sorted(d["id"] for d in rows(out2 / split))
    assert rows(out1 / "heldout") and rows(out1 / "train")


def test_loader_and_pretokenized_shards_read_the_output(tree, tokenizer):
    out = tree / "out"
    build(out, [tree / "a/site-packages", tree / "a/python3.99"], 0.3, log=lambda _: None)
    data = DataConfig(sources=[f"parquet:{out}/train/*.parquet"], num_workers=0, lanes=1)
    batches = take(make_loader(data, 16, 2, infinite=False, tokenizer=tokenizer), None)
    assert batches and all(inputs["input"].shape == (2, 16) for inputs, _ in batches)
    result = pretokenize_splits(out, "default", threads=2)
    for split in ("train", "heldout"):
        shards = TokenShards(out / "pretokenized" / split)
        assert shards.num_tokens == result[split]["tokens"] > 0
        assert result[split]["documents"] == len(rows(out / split))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(REPO / "tools/build_offline_corpus.py"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_writes_everything_and_exits_3_when_short(tree):
    out = tree / "out"
    done = run_cli("--out", str(out), "--roots", str(tree / "a/site-packages"), str(tree / "a/python3.99"))
    assert done.returncode == 3, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("short: ") and "fewer than --min-bytes 1,000,000,000" in last
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["arguments"]["min_bytes"] == 10**9 and manifest["total_documents"] == 8
    assert (out / "heldout/part-00000.parquet").is_file() and (out / "EXCLUDED.md").is_file()


@pytest.mark.parametrize(
    "args, name",
    [
        (["--heldout-fraction", "1.5"], "--heldout-fraction"),
        (["--min-bytes", "lots"], "--min-bytes"),
        (["--roots", "/nonexistent/python"], "--roots"),
        ([], "--out"),
    ],
)
def test_cli_bad_argument_is_one_line_and_exit_2(tree, args, name):
    out = [] if name == "--out" else ["--out", str(tree / "out")]
    done = run_cli(*out, *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and name in done.stderr


def test_egg_info_files_come_from_top_level_names(tmp_path):
    site = tmp_path / "site-packages"
    dist(
        site,
        "eggpkg",
        "0.3",
        "License: BSD",
        {"eggpkg/a.py": CODE.format(k=6), "eggpkg/sub/b.py": "x = 1\n"},
        egg=True,
    )
    dist(
        site, "wheelpkg", "1.0", "License: MIT", {"eggpkg/claimed.py": CODE.format(k=7)}
    )  # its RECORD owns it
    kept, excluded = site_sources(site)
    files = {s.name: sorted(rel for _, rel in s.files if ".dist-info/" not in rel) for s in kept}
    assert not excluded and files == {
        "eggpkg": ["eggpkg/a.py", "eggpkg/sub/b.py"],
        "wheelpkg": ["eggpkg/claimed.py"],
    }


def test_editable_installs_are_left_out(tmp_path):
    """A checkout installed with ``pip install -e`` changes with every commit and path: never a source."""
    site = tmp_path / "site-packages"
    dist(site, "released", "1.0", "License: MIT", {"released/a.py": CODE.format(k=1)})
    dist(site, "checkout", "0.1", "License: MIT", {"__editable___checkout_finder.py": CODE.format(k=2)})
    (site / "checkout-0.1.dist-info/direct_url.json").write_text(
        '{"url": "file:///somewhere/checkout", "dir_info": {"editable": true}}'
    )
    (site / "released-1.0.dist-info/direct_url.json").write_text('{"url": "file:///w/r.whl", "dir_info": {}}')
    kept, excluded = site_sources(site)
    assert [s.name for s in kept] == ["released"]
    assert [(e["name"], e["reason"]) for e in excluded] == [("checkout", EDITABLE_REASON)]
