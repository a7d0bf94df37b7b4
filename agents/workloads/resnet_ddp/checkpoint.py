"""Checkpoints: their format, the collective save after an epoch, pruning, and resuming from one.

After each epoch, every rank sends its RNG states (python, numpy, torch, CUDA) to all; rank 0 writes
``checkpoint_dir/epoch-NNNN.pt`` (tmp file, fsync, rename; then only the newest
``train.keep_checkpoints`` are kept, 0 keeping all) holding ``format``, ``job_id``, ``epoch``,
``model``, ``optimizer``, ``scheduler``, ``sampler`` ({"epoch", "batch": 0}), ``steps_per_epoch``,
``world_size``, ``rng`` (one entry per rank) and ``history`` (the epoch records so far).  Resuming
restores all of them (RNG only when the world size is unchanged; if the placement changes the steps per
epoch, the LR schedule is re-positioned at the epoch boundary).  SIGTERM writes no mid-epoch checkpoint:
the resume point is the last finished epoch.  A checkpoint of ResNet-18 is about 90 MB (weights and
momentum).  With ``train.checkpoint`` false the train loop calls neither function here and no collective
is spent on it: a run that stops or is restarted begins again at epoch 0.
"""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from agents.shardfile import prune_checkpoints
from agents.workloads.resnet_ddp.metrics import MetricsWriter
from agents.workloads.resnet_ddp.spec import SpecError
from scheduler.protocol.rankspec import RankSpec

CHECKPOINT_FORMAT = 1


def save_checkpoint(
    spec: RankSpec,
    rank: int,
    world_size: int,
    epoch: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    steps_per_epoch: int,
    history: list[dict[str, Any]],
    metrics: MetricsWriter,
) -> None:
    """Collective: every rank sends its RNG state; rank 0 writes ``epoch-NNNN.pt`` atomically, writes the
    ``checkpoint`` metric line and prunes to ``train.keep_checkpoints``; all ranks leave together."""
    states: list[Any] = [None] * world_size
    dist.all_gather_object(states, rng_state())
    if rank == 0:
        path = Path(spec.checkpoint_dir) / f"epoch-{epoch:04d}.pt"
        size = atomic_torch_save(
            {
                "format": CHECKPOINT_FORMAT,
                "job_id": spec.job_id,
                "epoch": epoch,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "sampler": {"epoch": epoch, "batch": 0},
                "steps_per_epoch": steps_per_epoch,
                "world_size": world_size,
                "rng": states,
                "history": history,
            },
            path,
        )
        metrics.write("checkpoint", epoch=epoch, path=str(path), bytes=size)
        prune_checkpoints(spec.checkpoint_dir, spec.train.keep_checkpoints)
    dist.barrier()


def load_checkpoint(
    path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    steps_per_epoch: int,
    rank: int,
    world_size: int,
) -> tuple[int, list[dict[str, Any]]]:
    """Restore ``path`` into the model (not yet wrapped in DDP), optimizer, LR scheduler and this rank's
    RNG; returns ``(epochs done, history)``.  Raises SpecError for a checkpoint of another format."""
    try:  # tensors and plain types only: a checkpoint cannot name code to run (docs/security.md)
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise SpecError(f"{path}: not a checkpoint of tensors and plain data, refused: {e}") from None
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise SpecError(f"{path}: unknown checkpoint format {ckpt.get('format')!r}")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    start_epoch = int(ckpt["sampler"]["epoch"])
    history = list(ckpt.get("history", []))
    if ckpt.get("steps_per_epoch") != steps_per_epoch:
        # Placement changed the per-epoch step count: keep the schedule's position by epoch.
        scheduler.last_epoch = start_epoch * steps_per_epoch
        for group, lr in zip(optimizer.param_groups, scheduler.get_lr(), strict=True):
            group["lr"] = lr
    rng_states = ckpt.get("rng", [])
    if rank < len(rng_states) and ckpt.get("world_size") == world_size:
        set_rng_state(rng_states[rank])
    return start_epoch, history


def rng_state() -> dict[str, Any]:
    """This process's python, numpy, torch (and, once CUDA is in use, CUDA) generator states, as tensors
    and plain types (what ``torch.load(weights_only=True)`` reads back)."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                       "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def atomic_torch_save(obj: Any, path: Path) -> int:
    """``torch.save`` to a hidden tmp file beside ``path``, fsync, rename over ``path``; returns its size.
    A reader sees the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path.stat().st_size
