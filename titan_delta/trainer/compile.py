"""torch.compile per decoder block with ``fullgraph=True``.

All blocks of a family share code and shapes, so compiling blocks (not the whole model) compiles each
block kind once and keeps FSDP's per-block hooks outside the graphs. ``fullgraph=True`` turns any graph
break around our ops into an error instead of a silent slowdown.
"""

from __future__ import annotations

import torch
from torch import nn
from torchtitan.tools.logging import logger


def compile_blocks(model: nn.Module, backend: str = "inductor") -> None:
    """Replace every block in ``model.layers`` by its compiled version, in place."""
    if not backend:
        raise ValueError("[compile] backend must name a torch.compile backend, e.g. 'inductor'")
    layers = model.get_submodule("layers")
    for name, block in list(layers.named_children()):
        layers.register_module(name, torch.compile(block, backend=backend, fullgraph=True))
    logger.info(f"Compiled {len(layers)} blocks with torch.compile(backend={backend!r}, fullgraph=True)")
