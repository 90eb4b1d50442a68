"""A fresh Python process loads every family's export with stock transformers calls alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

LOADER = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
diffs = {}
for family, folder in json.loads(sys.argv[1]).items():
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokens, reference = torch.load(folder + "/reference.pt")
    with torch.no_grad():
        diffs[family] = (model(tokens).logits - reference).abs().max().item()
    diffs["ids"] = tokenizer("In the beginning").input_ids
print("RESULT" + json.dumps(diffs))
"""


def _path_without_the_repository() -> str:
    """PYTHONPATH minus the repository itself (entries for installed dependencies stay)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join(e for e in entries if e and os.path.abspath(e) != repo)


def test_fresh_process_loads_model_and_tokenizer(exports, tmp_path) -> None:
    folders = {}
    for family, (model, folder) in exports.items():
        tokens = torch.randint(
            0, model.model_args.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2)
        )
        with torch.no_grad():
            torch.save((tokens, model(tokens)), folder / "reference.pt")
        folders[family] = str(folder)
    run = subprocess.run(
        [sys.executable, "-c", LOADER, json.dumps(folders)],
        cwd=tmp_path,  # nothing of the repository on the path but the installed package
        env={**os.environ, "PYTHONPATH": _path_without_the_repository()},
        stdin=subprocess.DEVNULL,  # AutoTokenizer in transformers 5 asks about the config's custom code
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    diffs = json.loads(run.stdout.rsplit("RESULT", 1)[1])
    assert diffs.pop("ids")[0] == 16382  # EOS first, as before every training document
    assert diffs == {family: 0.0 for family in exports}
