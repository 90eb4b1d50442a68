"""Real multi-process DCP: 2 gloo ranks save the loader state, 3 ranks load it; each new rank gets the
cursors of the lanes it now owns, written by whichever old rank owned them."""

from __future__ import annotations

import os
import socket
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from titan_delta.data import DataConfig, build_dataloader


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loader(rank: int, world: int):
    config = DataConfig(lanes=12, num_workers=0, document_masking=True)
    job = SimpleNamespace(data=config, training=SimpleNamespace(seq_len=32, local_batch_size=2))
    return build_dataloader(world, rank, None, job)


def _rank(rank: int, port: int, folder: str, steps: int) -> None:
    """3 processes: ranks 0-1 train and save as a 2-rank job, then all 3 load as a 3-rank job."""
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=3)
    old_job = dist.new_group([0, 1])
    if rank < 2:
        loader = _loader(rank, 2)
        batches = iter(loader)
        for _ in range(steps):
            next(batches)
        torch.save(loader.state_dict(), f"{folder}/saved_{rank}.pt")
        dcp.save({"dataloader": loader}, checkpoint_id=f"{folder}/ckpt", process_group=old_job)
    dist.barrier()
    loader = _loader(rank, 3)
    dcp.load({"dataloader": loader}, checkpoint_id=f"{folder}/ckpt")
    torch.save(loader.state_dict(), f"{folder}/loaded_{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_dcp_checkpoint_reshards_lane_cursors(tmp_path: Path):
    steps = int(torch.randint(1, 6, ()).item())
    mp.spawn(_rank, args=(_free_port(), str(tmp_path), steps), nprocs=3)
    saved: dict[str, torch.Tensor] = {}
    for r in range(2):
        saved.update(torch.load(tmp_path / f"saved_{r}.pt"))
    lanes_seen = []
    for r in range(3):
        loaded = torch.load(tmp_path / f"loaded_{r}.pt")
        for key, value in loaded.items():
            assert torch.equal(value, saved[key]), (r, key)
        lanes_seen += [k for k in loaded if k.startswith("lane_")]
    assert sorted(lanes_seen) == sorted(k for k in saved if k.startswith("lane_"))
    assert any(v[2] > 0 for k, v in saved.items() if k.startswith("lane_"))  # cursors really moved
