"""Read a Hugging Face model folder: ``config.json`` and its weights, whichever way they are stored.

Weights may be one ``model.safetensors``, shards listed in ``model.safetensors.index.json``, or the older
``pytorch_model.bin`` (single or indexed; read with ``weights_only=True``, so no pickled code runs).
Tensors come back as stored (dtype included); the importer casts them.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PYTORCH_BIN, PYTORCH_BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


class HFFolderError(ValueError):
    """The folder is not a readable Hugging Face model folder; the message names the file."""


def read_config(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        raise HFFolderError(f"{folder}: not a folder")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        raise HFFolderError(f"{path}: unreadable ({err}); expected a Hugging Face config.json") from err
    if not isinstance(config, dict):
        raise HFFolderError(f"{path}: expected a JSON object")
    return config


def _shards(folder: str, index_name: str) -> list[str]:
    path = os.path.join(folder, index_name)
    try:
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise HFFolderError(f"{path}: unreadable shard index ({err})") from err
    return sorted(set(weight_map.values()))


def _read_safetensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (OSError, ValueError, RuntimeError) as err:
        raise HFFolderError(f"{path}: unreadable safetensors file ({err})") from err


def _read_bin(path: str) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as err:
        raise HFFolderError(f"{path}: unreadable PyTorch weights ({err})") from err
    if not isinstance(state, dict):
        raise HFFolderError(f"{path}: expected a state dict, got {type(state).__name__}")
    return state


def read_weights(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's weights, keyed by the names it was saved with."""
    if os.path.isfile(os.path.join(folder, SAFETENSORS)):
        return _read_safetensors(os.path.join(folder, SAFETENSORS))
    for index, reader in ((SAFETENSORS_INDEX, _read_safetensors), (PYTORCH_BIN_INDEX, _read_bin)):
        if os.path.isfile(os.path.join(folder, index)):
            state: dict[str, torch.Tensor] = {}
            for shard in _shards(folder, index):
                state.update(reader(os.path.join(folder, shard)))
            return state
    if os.path.isfile(os.path.join(folder, PYTORCH_BIN)):
        return _read_bin(os.path.join(folder, PYTORCH_BIN))
    raise HFFolderError(
        f"{folder}: no weights ({SAFETENSORS}, {SAFETENSORS_INDEX}, {PYTORCH_BIN} or {PYTORCH_BIN_INDEX})"
    )
