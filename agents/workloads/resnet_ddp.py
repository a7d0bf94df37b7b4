"""The built-in workload: one rank of data-parallel ResNet-18 training over gsched shards.

Who calls: the node agent launches one process per rank as
``python -m agents.workloads.resnet_ddp --spec RANKSPEC.json`` with the torch.distributed environment
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, and
``CUDA_VISIBLE_DEVICES`` on GPU nodes).  Exit status: 0 when training finished (or stopped at
``stop_after_epochs``), 143 after SIGTERM (ranks stop together at the next step boundary; the last
per-epoch checkpoint is the resume point), 2 for a bad rank spec, 1 for any other error (traceback on
stderr).  Tests call :func:`train` in-process with a process group they initialised.
``python -m agents.workloads.resnet_ddp --bench`` measures one rank's images/s on random data instead
(on CUDA: with and without bf16 and channels-last), for the device check.

Rank spec (JSON; unknown keys are refused)::

    {
      "job_id": 7,                          # int, for log lines
      "shards": ["/data/digits/00000.shard", ...],   # absolute paths this rank reads (>= 1)
      "num_classes": 10,
      "checkpoint_dir": "/ckpt/job-7",      # epoch-0001.pt, epoch-0002.pt, ... (written by rank 0)
      "resume_from": null,                  # a checkpoint path, or null to start fresh
      "metrics_path": "/ckpt/job-7/metrics.jsonl",   # rank 0 appends JSON lines here
      "stop_after_epochs": null,            # optional: stop (exit 0) after this many epochs in total,
                                            # as if preempted; for tests and drills
      "train": {
        "epochs": 5,              # total epochs, counting those before a resume
        "batch_size": 32,         # per rank, per micro-step
        "lr": 0.1,                # base rate; see lr_scaling
        "grad_accum_steps": 1,    # micro-steps per optimizer step
        "lr_scaling": "linear",   # "linear" | "none"
        "warmup_epochs": 0,       # linear warmup (may be fractional), then cosine decay to 0
        "loader_workers": "auto", # int, or "auto": 0 on CPU, min(4, cores per rank) on CUDA
        "eval_every": 1,          # held-out accuracy every N epochs and after the last; 0: never
        "seed": 0,
        "backend": "auto",        # "auto" | "gloo" | "nccl"   (auto: nccl with CUDA, else gloo)
        "device": "auto",         # "auto" | "cpu" | "cuda"    (auto: cuda when visible)
        "amp": "auto",            # "auto" | "bf16" | "off"    (auto: bf16 on CUDA if supported)
        "channels_last": "auto",  # "auto" | true | false      (auto: true on CUDA)
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "hflip": "auto",          # random horizontal flip: true | false | "auto" (3-channel only)
        "crop_padding": "auto",   # int, or "auto": max(1, image size // 8) pixels
        "checkpoint": true        # false: no checkpoint is written (a restart begins at epoch 0)
      }
    }

What the knobs trade:

* ``grad_accum_steps``: gradients of ``k`` micro-batches are summed locally (``no_sync``) and
  all-reduced once, so ranks synchronise ``k`` times less often and the global batch grows ``k``-fold
  without more memory.  BatchNorm still sees micro-batch statistics.
* ``lr_scaling = "linear"``: the rate actually used is ``lr * global_batch / 256`` with
  ``global_batch = world_size * batch_size * grad_accum_steps`` (Goyal et al.): ``lr`` is the rate
  for a global batch of 256, so a job keeps its meaning when it is placed on more or fewer ranks.
  The price is that large global batches get large rates, which is why ``warmup_epochs`` exists.
  ``"none"`` uses ``lr`` as is, whatever the world size.
* ``loader_workers``: decode and augment in background processes; on CUDA they hide input time
  behind the GPU, on a small CPU node they compete with the training threads.
* ``eval_every``: held-out accuracy costs a pass over one tenth of the data.
* ``hflip``: mirroring doubles the variety of natural images but turns glyphs into other glyphs.
  ``"auto"`` flips colour (3-channel) images only, a heuristic aimed at the grey ``digits`` source
  (one run each here: 95% held-out accuracy after 3 epochs without flips, 41% with them).

Data: each rank streams only its own shard files, one sample at a time.  The sample at position
``p`` of a shard (0-based) is held out for accuracy when ``p % 10 == 0``; the rest is the training
split.  Each epoch visits the rank's shards in a seeded order through a seeded shuffle buffer of 1,024
samples and applies random crop (zero padding) and optional flip; everything random in an epoch is a
function of ``(seed, rank, epoch, loader worker)``, so the sampler position to restore is the epoch.
Ranks may hold different sample counts: every rank runs the same number of optimizer steps per epoch,
the all-reduced minimum of what each rank's data fills (full batches only); the rest of a larger rank's
samples wait for a later epoch's shuffle.

Model: torchvision ``resnet18(weights=None)`` with the first convolution taking the data's channel
count.  For images of at most 32 pixels the stem is the CIFAR one (3x3 convolution, stride 1, no max
pool): the usual 7x7/2 + pool would shrink a 16x16 digit to 4x4 before the first block.  Its cost grows
with the input area, so the digits source defaults to 16x16 (a quarter of the cost of 32x32); larger
images keep ImageNet's stem.

Metrics (rank 0 appends one JSON object per line to ``metrics_path``)::

    {"type": "progress", "job_id", "epoch", "step", "steps", "time"}        # at most every 2 s
    {"type": "epoch", "job_id", "epoch" (1-based), "loss" (mean training loss over all ranks),
     "accuracy" (held-out, all ranks; null when not evaluated this epoch), "eval_samples",
     "images_per_s" (all ranks), "images_per_s_rank" (mean per rank), "data_wait_fraction"
     (mean over ranks of time blocked on input / epoch time), "data_wait_s", "step_time_s"
     (mean per optimizer step), "steps", "lr" (after the epoch), "epoch_time_s", "world_size",
     "backend" ("nccl" | "gloo"), "device" ("cuda" | "cpu"), "bf16", "channels_last", "time"}
    {"type": "checkpoint", "job_id", "epoch", "path", "bytes", "time"}
    {"type": "done", "job_id", "epoch", "stopped", "time"}   # training finished or stopped (SIGTERM)

Checkpoints: after each epoch, every rank sends its RNG states (python, numpy, torch, CUDA) to all;
rank 0 writes ``checkpoint_dir/epoch-NNNN.pt`` (tmp file, fsync, rename; then only the newest
``train.keep_checkpoints`` are kept, 0 keeping all) holding ``format``, ``epoch``,
``model``, ``optimizer``, ``scheduler``, ``sampler`` ({"epoch", "batch": 0}), ``steps_per_epoch``,
``world_size``, ``rng`` (one entry per rank) and ``history`` (the epoch records so far).  Resuming
restores all of them (RNG only when the world size is unchanged; if the placement changes the steps per
epoch, the LR schedule is re-positioned at the epoch boundary).  SIGTERM writes no mid-epoch checkpoint:
the resume point is the last finished epoch.  A checkpoint of ResNet-18 is about 90 MB (weights and
momentum).  With ``train.checkpoint`` false none is written and no collective is spent on it: a run
that stops or is restarted begins again at epoch 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from agents.shardfile import MAGIC, iter_shard, prune_checkpoints

REFERENCE_BATCH = 256
HOLDOUT_EVERY = 10
SHUFFLE_BUFFER = 1024
PROGRESS_EVERY_S = 2.0
CHECKPOINT_FORMAT = 1


class SpecError(ValueError):
    """A rank spec that cannot run; the message names the field."""


@dataclass
class TrainConfig:
    epochs: int
    batch_size: int
    lr: float
    grad_accum_steps: int = 1
    lr_scaling: str = "linear"
    warmup_epochs: float = 0.0
    loader_workers: int | str = "auto"
    eval_every: int = 1
    seed: int = 0
    backend: str = "auto"
    device: str = "auto"
    amp: str = "auto"
    channels_last: bool | str = "auto"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    hflip: bool | str = "auto"
    crop_padding: int | str = "auto"
    keep_checkpoints: int = 0  # 0 keeps every epoch's checkpoint
    checkpoint: bool = True  # false: write none (a restarted job begins at epoch 0)


@dataclass
class RankSpec:
    job_id: int
    shards: list[str]
    train: TrainConfig
    num_classes: int
    checkpoint_dir: str
    metrics_path: str
    resume_from: str | None = None
    stop_after_epochs: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_CHOICES = {
    "lr_scaling": ("linear", "none"),
    "backend": ("auto", "gloo", "nccl"),
    "device": ("auto", "cpu", "cuda"),
    "amp": ("auto", "bf16", "off"),
}


def parse_spec(raw: dict[str, Any]) -> RankSpec:
    """Validate a rank spec dict (see the module docstring); raise SpecError naming the field."""
    if not isinstance(raw, dict):
        raise SpecError("rank spec must be a JSON object")
    top = {
        "job_id",
        "shards",
        "train",
        "num_classes",
        "checkpoint_dir",
        "metrics_path",
        "resume_from",
        "stop_after_epochs",
    }
    unknown = set(raw) - top
    if unknown:
        raise SpecError(f"unknown rank spec field(s): {', '.join(sorted(unknown))}")
    for key in ("job_id", "shards", "train", "num_classes", "checkpoint_dir", "metrics_path"):
        if key not in raw:
            raise SpecError(f"rank spec is missing {key!r}")
    train_raw = raw["train"]
    if not isinstance(train_raw, dict):
        raise SpecError("train must be an object")
    names = {f.name for f in fields(TrainConfig)}
    unknown = set(train_raw) - names
    if unknown:
        raise SpecError(
            f"unknown train field(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(names))}"
        )
    for key in ("epochs", "batch_size", "lr"):
        if key not in train_raw:
            raise SpecError(f"train.{key} is required")
    cfg = TrainConfig(**train_raw)

    def need(cond: bool, name: str, what: str) -> None:
        if not cond:
            raise SpecError(f"train.{name} must be {what}, got {getattr(cfg, name)!r}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    need(is_int(cfg.epochs) and cfg.epochs >= 1, "epochs", "an integer >= 1")
    need(is_int(cfg.batch_size) and cfg.batch_size >= 1, "batch_size", "an integer >= 1")
    need(isinstance(cfg.lr, int | float) and cfg.lr > 0, "lr", "a number > 0")
    need(is_int(cfg.grad_accum_steps) and cfg.grad_accum_steps >= 1, "grad_accum_steps", "an integer >= 1")
    need(
        isinstance(cfg.warmup_epochs, int | float) and cfg.warmup_epochs >= 0,
        "warmup_epochs",
        "a number >= 0",
    )
    need(
        cfg.loader_workers == "auto" or (is_int(cfg.loader_workers) and int(cfg.loader_workers) >= 0),
        "loader_workers",
        '"auto" or an integer >= 0',
    )
    need(is_int(cfg.eval_every) and cfg.eval_every >= 0, "eval_every", "an integer >= 0")
    need(is_int(cfg.keep_checkpoints) and cfg.keep_checkpoints >= 0, "keep_checkpoints", "an integer >= 0")
    need(is_int(cfg.seed), "seed", "an integer")
    need(isinstance(cfg.checkpoint, bool), "checkpoint", "true or false")
    need(cfg.channels_last in ("auto", True, False), "channels_last", '"auto", true or false')
    need(cfg.hflip in ("auto", True, False), "hflip", '"auto", true or false')
    need(
        cfg.crop_padding == "auto" or (is_int(cfg.crop_padding) and int(cfg.crop_padding) >= 0),
        "crop_padding",
        '"auto" or an integer >= 0',
    )
    need(isinstance(cfg.momentum, int | float) and 0 <= cfg.momentum < 1, "momentum", "in [0, 1)")
    need(isinstance(cfg.weight_decay, int | float) and cfg.weight_decay >= 0, "weight_decay", ">= 0")
    for name, allowed in _CHOICES.items():
        need(getattr(cfg, name) in allowed, name, " | ".join(f'"{a}"' for a in allowed))

    shards = raw["shards"]
    if not isinstance(shards, list) or not shards or not all(isinstance(s, str) for s in shards):
        raise SpecError("shards must be a non-empty list of shard file paths")
    if not (isinstance(raw["num_classes"], int) and raw["num_classes"] >= 2):
        raise SpecError(f"num_classes must be an integer >= 2, got {raw['num_classes']!r}")
    stop = raw.get("stop_after_epochs")
    if stop is not None and not (isinstance(stop, int) and stop >= 1):
        raise SpecError(f"stop_after_epochs must be null or an integer >= 1, got {stop!r}")
    return RankSpec(
        job_id=int(raw["job_id"]),
        shards=list(shards),
        train=cfg,
        num_classes=int(raw["num_classes"]),
        checkpoint_dir=str(raw["checkpoint_dir"]),
        metrics_path=str(raw["metrics_path"]),
        resume_from=raw.get("resume_from"),
        stop_after_epochs=stop,
    )


def scaled_lr(base_lr: float, world_size: int, batch_size: int, grad_accum_steps: int, mode: str) -> float:
    """The peak learning rate actually used.

    ``"linear"``: ``base_lr * (world_size * batch_size * grad_accum_steps) / 256`` (``base_lr`` is the
    rate for a global batch of 256).  ``"none"``: ``base_lr``.
    """
    if mode == "none":
        return float(base_lr)
    if mode == "linear":
        return float(base_lr) * (world_size * batch_size * grad_accum_steps) / REFERENCE_BATCH
    raise ValueError(f'lr_scaling must be "linear" or "none", got {mode!r}')


def lr_factor(step: int, steps_per_epoch: int, epochs: int, warmup_epochs: float) -> float:
    """Multiplier of the peak rate at optimizer step ``step`` (0-based): linear warmup, then cosine to 0."""
    total = max(1, steps_per_epoch * epochs)
    warmup = min(total, int(round(warmup_epochs * steps_per_epoch)))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ----------------------------------------------------------------------------------------------- data


def count_samples(path: str) -> tuple[int, tuple[int, int, int] | None]:
    """Number of samples in a shard and the first sample's shape, reading headers only."""
    import struct

    header = struct.Struct("<IHHB")
    n = 0
    shape = None
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{path}: not a gsched shard (bad magic)")
        while head := f.read(header.size):
            if len(head) != header.size:
                raise ValueError(f"{path}: truncated sample header")
            _, h, w, c = header.unpack(head)
            if shape is None:
                shape = (h, w, c)
            f.seek(h * w * c, os.SEEK_CUR)
            n += 1
    return n, shape


def split_counts(n: int) -> tuple[int, int]:
    """(train, held-out) sample counts of a shard of ``n`` samples."""
    held = (n + HOLDOUT_EVERY - 1) // HOLDOUT_EVERY
    return n - held, held


def _decode(pixels: bytes, shape: tuple[int, int, int]) -> np.ndarray:
    return np.frombuffer(pixels, dtype=np.uint8).reshape(shape)


class ShardStream(IterableDataset):
    """Yields ready batches ``(uint8 NxHxWxC tensor, int64 labels)`` from one rank's shards.

    Training mode: the training split, seeded shard order and shuffle buffer, random crop and flip;
    only full batches.  Eval mode: the held-out split in file order, no augmentation, the last batch
    may be short.  With loader workers, worker ``w`` of ``W`` takes shard ``i`` when ``i % W == w``
    (or, with fewer shards than workers, every ``W``-th sample).  Call :meth:`set_epoch` before each
    epoch's iterator is created.
    """

    def __init__(
        self,
        shards: list[str],
        batch_size: int,
        train: bool,
        seed: int,
        rank: int,
        hflip: bool = True,
        crop_padding: int = 1,
    ) -> None:
        self.shards = list(shards)
        self.batch_size = batch_size
        self.train = train
        self.seed = seed
        self.rank = rank
        self.hflip = hflip
        self.crop_padding = crop_padding
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _samples(
        self, worker: int, workers: int, rng: np.random.Generator
    ) -> Iterator[tuple[np.ndarray, int]]:
        order = list(range(len(self.shards)))
        if self.train:
            rng.shuffle(order)
        by_shard = len(self.shards) >= workers
        seen = 0
        for i in order:
            if by_shard and i % workers != worker:
                continue
            for pos, (pixels, label, shape) in enumerate(iter_shard(self.shards[i])):
                held = pos % HOLDOUT_EVERY == 0
                if held == self.train:
                    continue
                seen += 1
                if not by_shard and (seen - 1) % workers != worker:
                    continue
                yield _decode(pixels, shape), label

    def _augment(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        p = self.crop_padding
        h, w, _ = img.shape
        if p:
            padded = np.pad(img, ((p, p), (p, p), (0, 0)))
            y, x = rng.integers(0, 2 * p + 1, size=2)
            img = padded[y : y + h, x : x + w]
        if self.hflip and rng.random() < 0.5:
            img = img[:, ::-1]
        return img

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        rng = np.random.default_rng([self.seed, self.rank, self.epoch, worker])
        samples = self._samples(worker, workers, rng)
        if self.train:
            samples = _shuffled(samples, SHUFFLE_BUFFER, rng)
        images: list[np.ndarray] = []
        labels: list[int] = []
        for img, label in samples:
            images.append(self._augment(img, rng) if self.train else img)
            labels.append(label)
            if len(images) == self.batch_size:
                yield _collate(images, labels)
                images, labels = [], []
        if images and not self.train:
            yield _collate(images, labels)

    def batches_per_epoch(self, counts: list[int], workers: int) -> int:
        """Full training batches one epoch yields, given each shard's training-sample count."""
        workers = max(1, workers)
        if len(counts) >= workers:
            per_worker = [sum(c for i, c in enumerate(counts) if i % workers == w) for w in range(workers)]
        else:
            total = sum(counts)
            per_worker = [(total - w + workers - 1) // workers for w in range(workers)]
        return sum(n // self.batch_size for n in per_worker)


def _shuffled(items: Iterator[Any], size: int, rng: np.random.Generator) -> Iterator[Any]:
    buf: list[Any] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = int(rng.integers(size))
        buf[j], item = item, buf[j]
        yield item
    rng.shuffle(buf)  # type: ignore[arg-type]
    yield from buf


def _collate(images: list[np.ndarray], labels: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(np.stack(images)), torch.tensor(labels, dtype=torch.int64)


# ---------------------------------------------------------------------------------------------- model


def build_model(num_classes: int, image_shape: tuple[int, int, int]) -> nn.Module:
    """torchvision ResNet-18, random init, stem adapted to the image size and channel count."""
    from torchvision.models import resnet18

    h, w, c = image_shape
    model = resnet18(weights=None, num_classes=num_classes)
    if max(h, w) <= 32:
        model.conv1 = nn.Conv2d(c, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()  # type: ignore[assignment]
    elif c != 3:
        model.conv1 = nn.Conv2d(c, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def wrap_ddp(model: nn.Module, device: torch.device) -> DDP:
    """DDP as training uses it; gradients live in the all-reduce buckets (one copy less)."""
    return DDP(
        model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True
    )


def to_input(x: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    """uint8 NHWC batch -> normalised float NCHW on ``device`` (normalising on the device is cheaper)."""
    x = x.to(device, non_blocking=True).permute(0, 3, 1, 2).float().div_(255.0).sub_(0.5).div_(0.25)
    return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def backward_accumulated(
    model: nn.Module,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    criterion: Callable[..., torch.Tensor],
    autocast: Callable[[], Any],
) -> torch.Tensor:
    """Forward and backward over ``micro_batches``, gradients averaged as one batch; returns the mean loss.

    The caller zeroes the gradients before and steps the optimizer after.  On a DDP model, every
    micro-step but the last runs under ``no_sync()``, so the gradient all-reduce happens once.
    Each micro-loss is divided by the number of micro-batches: with equal micro-batch sizes the
    accumulated gradient equals the gradient of the mean loss over their union.
    """
    k = len(micro_batches)
    total = torch.zeros((), device=micro_batches[0][0].device)
    for i, (x, y) in enumerate(micro_batches):
        sync = i == k - 1 or not isinstance(model, DDP)
        ctx = contextlib.nullcontext() if sync else model.no_sync()  # type: ignore[operator]
        with ctx:
            with autocast():
                loss = criterion(model(x), y) / k
            loss.backward()
        total += loss.detach().float()
    return total


# ------------------------------------------------------------------------------------------- runtime


@dataclass
class Runtime:
    device: torch.device
    amp: bool
    channels_last: bool
    loader_workers: int

    def autocast(self) -> Any:
        if self.amp:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


def resolve_runtime(cfg: TrainConfig, local_rank: int, local_world_size: int) -> Runtime:
    """Pick device, precision, memory format and loader workers from the config and the machine."""
    cuda_ok = torch.cuda.is_available()
    if cfg.device == "cuda" and not cuda_ok:
        raise SpecError('train.device is "cuda" but no CUDA device is visible to this rank')
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and cuda_ok)
    if use_cuda:
        index = local_rank % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
    if cfg.amp == "bf16":
        amp = True
    elif cfg.amp == "off":
        amp = False
    else:
        amp = use_cuda and torch.cuda.is_bf16_supported()
    channels_last = use_cuda if cfg.channels_last == "auto" else bool(cfg.channels_last)
    if cfg.loader_workers == "auto":
        cores = max(1, (os.cpu_count() or 1) // max(1, local_world_size))
        workers = min(4, cores) if use_cuda else 0
    else:
        workers = int(cfg.loader_workers)
    return Runtime(device, amp, channels_last, workers)


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _atomic_torch_save(obj: Any, path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path.stat().st_size


class MetricsWriter:
    """Rank 0's JSON-lines writer; other ranks get one that writes nothing."""

    def __init__(self, path: str | None, job_id: int) -> None:
        self.path = Path(path) if path else None
        self.job_id = job_id
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, kind: str, **values: Any) -> None:
        if not self.path:
            return
        line = json.dumps({"type": kind, "job_id": self.job_id, **values, "time": time.time()})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _allreduce(values: list[float], op: Any, device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def evaluate(model: nn.Module, stream: ShardStream, rt: Runtime) -> tuple[float, float]:
    """(correct, count) over this rank's held-out samples; not reduced across ranks."""
    model.eval()
    correct = torch.zeros((), device=rt.device, dtype=torch.float64)
    count = 0
    with torch.no_grad():
        for x, y in stream:
            with rt.autocast():
                logits = model(to_input(x, rt.device, rt.channels_last))
            correct += (logits.argmax(1) == y.to(rt.device)).sum()
            count += len(y)
    model.train()
    return float(correct.item()), float(count)


def train(
    spec: RankSpec | dict[str, Any],
    rank: int,
    world_size: int,
    *,
    local_rank: int = 0,
    local_world_size: int = 1,
    stop_event: threading.Event | None = None,
) -> dict[str, Any]:
    """Run (or resume) training for this rank inside an already-initialised default process group.

    All ranks must call it with specs that differ only in ``shards``.  Returns a summary:
    ``{"epochs_done", "stopped" (True if stop_event ended it early), "history": [epoch metrics]}``.
    ``history`` is the same on every rank.  Raises SpecError for unusable specs or data.
    """
    spec = spec if isinstance(spec, RankSpec) else parse_spec(spec)
    cfg = spec.train
    rt = resolve_runtime(cfg, local_rank, local_world_size)
    stop_event = stop_event or threading.Event()
    metrics = MetricsWriter(spec.metrics_path if rank == 0 else None, spec.job_id)

    counts, shapes = [], set()
    for path in spec.shards:
        n, shape = count_samples(path)
        counts.append(split_counts(n)[0])
        if shape:
            shapes.add(shape)
    if len(shapes) > 1:
        raise SpecError(f"rank {rank}: shards hold images of different shapes {sorted(shapes)}")
    # Every rank must agree on the image shape: exchange it (a rank with empty shards sends zeros).
    local_shape = next(iter(shapes)) if shapes else (0, 0, 0)
    all_shapes = _allreduce([float(v) for v in local_shape], dist.ReduceOp.MAX, rt.device)
    image_shape = (int(all_shapes[0]), int(all_shapes[1]), int(all_shapes[2]))
    if shapes and image_shape != local_shape or 0 in image_shape:
        raise SpecError(
            f"ranks disagree on the image shape or hold no samples: {local_shape} vs {image_shape}"
        )

    pad = max(1, image_shape[0] // 8) if cfg.crop_padding == "auto" else int(cfg.crop_padding)
    hflip = image_shape[2] == 3 if cfg.hflip == "auto" else bool(cfg.hflip)
    train_ds = ShardStream(spec.shards, cfg.batch_size, True, cfg.seed, rank, hflip, pad)
    eval_ds = ShardStream(spec.shards, cfg.batch_size * 2, False, cfg.seed, rank)
    micro_local = train_ds.batches_per_epoch(counts, rt.loader_workers)
    steps_per_epoch = int(_allreduce([micro_local // cfg.grad_accum_steps], dist.ReduceOp.MIN, rt.device)[0])
    if steps_per_epoch < 1:
        raise SpecError(
            f"a rank has too few training samples for one step of batch_size={cfg.batch_size} x "
            f"grad_accum_steps={cfg.grad_accum_steps}: lower batch_size or give every rank more shards"
        )

    _seed_all(cfg.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = build_model(spec.num_classes, image_shape).to(rt.device)
    if rt.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    peak_lr = scaled_lr(cfg.lr, world_size, cfg.batch_size, cfg.grad_accum_steps, cfg.lr_scaling)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=peak_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, steps_per_epoch, cfg.epochs, cfg.warmup_epochs)
    )
    _seed_all(cfg.seed * 1000 + rank + 1)  # per-rank streams from here on

    start_epoch = 0
    history: list[dict[str, Any]] = []
    if spec.resume_from:
        ckpt = torch.load(spec.resume_from, map_location="cpu", weights_only=False)
        if ckpt.get("format") != CHECKPOINT_FORMAT:
            raise SpecError(f"{spec.resume_from}: unknown checkpoint format {ckpt.get('format')!r}")
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
            _set_rng_state(rng_states[rank])

    ddp = wrap_ddp(model, rt.device)
    criterion = nn.CrossEntropyLoss()
    loader_kwargs: dict[str, Any] = {
        "batch_size": None,
        "num_workers": rt.loader_workers,
        "pin_memory": rt.device.type == "cuda",
    }
    if rt.loader_workers > 0:
        loader_kwargs["prefetch_factor"] = 4
    check_every = 1 if rt.device.type == "cpu" else 10
    last_epoch_done = start_epoch
    stopped = False
    end_epoch = cfg.epochs if spec.stop_after_epochs is None else min(cfg.epochs, spec.stop_after_epochs)

    for epoch in range(start_epoch, end_epoch):
        train_ds.set_epoch(epoch)
        loader = DataLoader(train_ds, **loader_kwargs)
        it = iter(loader)
        ddp.train()
        loss_sum = torch.zeros((), device=rt.device, dtype=torch.float64)
        wait_s = 0.0
        images = 0
        last_progress = time.monotonic()
        t0 = time.perf_counter()
        for step in range(steps_per_epoch):
            if step % check_every == 0:
                flag = _allreduce([1.0 if stop_event.is_set() else 0.0], dist.ReduceOp.MAX, rt.device)[0]
                if flag:
                    stopped = True
                    break
            micro = []
            for _ in range(cfg.grad_accum_steps):
                tw = time.perf_counter()
                x, y = next(it)
                wait_s += time.perf_counter() - tw
                micro.append((to_input(x, rt.device, rt.channels_last), y.to(rt.device, non_blocking=True)))
                images += len(y)
            optimizer.zero_grad(set_to_none=True)
            loss_sum += backward_accumulated(ddp, micro, criterion, rt.autocast)
            optimizer.step()
            scheduler.step()
            now = time.monotonic()
            if rank == 0 and now - last_progress >= PROGRESS_EVERY_S:
                metrics.write("progress", epoch=epoch + 1, step=step + 1, steps=steps_per_epoch)
                last_progress = now
        del it, loader
        if stopped:
            break
        if rt.device.type == "cuda":
            torch.cuda.synchronize()
        epoch_s = time.perf_counter() - t0
        loss_total, images_total, wait_frac_sum, wait_total = _allreduce(
            [float(loss_sum.item()), float(images), wait_s / max(epoch_s, 1e-9), wait_s],
            dist.ReduceOp.SUM,
            rt.device,
        )
        (epoch_s_max,) = _allreduce([epoch_s], dist.ReduceOp.MAX, rt.device)

        accuracy = None
        eval_samples = 0
        if cfg.eval_every and ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs):
            correct, count = evaluate(model, eval_ds, rt)
            correct, count = _allreduce([correct, count], dist.ReduceOp.SUM, rt.device)
            accuracy = correct / count if count else None
            eval_samples = int(count)

        record = {
            "epoch": epoch + 1,
            "loss": loss_total / (world_size * steps_per_epoch),
            "accuracy": accuracy,
            "eval_samples": eval_samples,
            "images_per_s": images_total / max(epoch_s_max, 1e-9),
            "images_per_s_rank": images_total / max(epoch_s_max, 1e-9) / world_size,
            "data_wait_fraction": wait_frac_sum / world_size,
            "data_wait_s": wait_total / world_size,
            "step_time_s": epoch_s_max / steps_per_epoch,
            "steps": steps_per_epoch,
            "lr": optimizer.param_groups[0]["lr"],
            "epoch_time_s": epoch_s_max,
            "world_size": world_size,
            # How the rank ran, so a job's metrics say which path (NCCL/CUDA or gloo/CPU) produced them.
            "backend": dist.get_backend(),
            "device": rt.device.type,
            "bf16": rt.amp,
            "channels_last": rt.channels_last,
        }
        history.append(record)
        metrics.write("epoch", **record)
        acc = record.get("accuracy")
        print(f"[job {spec.job_id} rank {rank}/{world_size}] epoch {epoch + 1}/{cfg.epochs}: loss {record['loss']:.4f} "
              f"accuracy {'-' if acc is None else f'{100 * acc:.1f}%'} {record['images_per_s']:.0f} images/s "
              f"data wait {100 * record['data_wait_fraction']:.0f}%", flush=True)
        if cfg.checkpoint:
            _save_checkpoint(
                spec, rank, world_size, epoch + 1, model, optimizer, scheduler, steps_per_epoch, history, metrics
            )
        last_epoch_done = epoch + 1
    metrics.write("done", epoch=last_epoch_done, stopped=stopped)
    return {"epochs_done": last_epoch_done, "stopped": stopped, "history": history}


def _save_checkpoint(
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
    """Collective: every rank sends its RNG state; rank 0 writes ``epoch-NNNN.pt`` atomically."""
    states: list[Any] = [None] * world_size
    dist.all_gather_object(states, _rng_state())
    if rank == 0:
        path = Path(spec.checkpoint_dir) / f"epoch-{epoch:04d}.pt"
        size = _atomic_torch_save(
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


# ------------------------------------------------------------------------------------------ process


def bench(
    image_shape: tuple[int, int, int] = (32, 32, 3),
    num_classes: int = 10,
    batch_size: int = 256,
    steps: int = 30,
    warmup_steps: int = 5,
    device: str = "auto",
    amp: bool = False,
    channels_last: bool = False,
) -> dict[str, Any]:
    """One rank's training throughput on random data, no process group: the device check's figure.

    Runs ``warmup_steps`` untimed then ``steps`` timed SGD steps of the same model and input path as
    :func:`train` (uint8 NHWC -> device -> normalise), and returns ``{"images_per_s", "step_time_s",
    "device", "amp", "channels_last", "batch_size", "image_shape"}``.
    """
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    dev = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.backends.cudnn.benchmark = True
    rt = Runtime(dev, amp, channels_last, 0)
    torch.manual_seed(0)
    model = build_model(num_classes, image_shape).to(dev)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    x = torch.randint(0, 256, (batch_size, *image_shape), dtype=torch.uint8)
    y = torch.randint(0, num_classes, (batch_size,))
    if use_cuda:
        x, y = x.pin_memory(), y.pin_memory()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        batch = [(to_input(x, dev, channels_last), y.to(dev, non_blocking=True))]
        backward_accumulated(model, batch, criterion, rt.autocast)
        opt.step()

    for _ in range(warmup_steps):
        step()
    if use_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if use_cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    return {
        "images_per_s": steps * batch_size / elapsed,
        "step_time_s": elapsed / steps,
        "device": torch.cuda.get_device_name(dev) if use_cuda else "cpu",
        "amp": "bf16" if amp else "off",
        "channels_last": channels_last,
        "batch_size": batch_size,
        "image_shape": list(image_shape),
    }


def _threads(local_world_size: int) -> int:
    env = os.environ.get("GSCHED_THREADS")
    if env:
        return max(1, int(env))
    return max(1, (os.cpu_count() or 1) // max(1, local_world_size))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.workloads.resnet_ddp")
    parser.add_argument("--spec", help="path of this rank's RANKSPEC.json")
    parser.add_argument(
        "--bench",
        action="store_true",
        help="instead of training: one rank's images/s on random data, with and without bf16 and "
        "channels-last (on CUDA), one JSON line each",
    )
    parser.add_argument("--bench-size", type=int, default=32, help="image side for --bench (default 32)")
    parser.add_argument("--bench-batch", type=int, default=256, help="batch for --bench (default 256)")
    parser.add_argument("--bench-steps", type=int, default=30, help="timed steps for --bench (default 30)")
    args = parser.parse_args(argv)
    if args.bench:
        torch.set_num_threads(_threads(1))
        variants = [(False, False), (True, False), (False, True), (True, True)]
        if not torch.cuda.is_available():
            variants = [(False, False)]
        for amp, cl in variants:
            figures = bench(
                (args.bench_size, args.bench_size, 3),
                batch_size=args.bench_batch,
                steps=args.bench_steps,
                amp=amp,
                channels_last=cl,
            )
            print(json.dumps(figures), flush=True)
        return 0
    if not args.spec:
        parser.error("--spec is required (or --bench)")
    try:
        with open(args.spec, encoding="utf-8") as f:
            spec = parse_spec(json.load(f))
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except (OSError, ValueError, KeyError) as exc:
        print(f"resnet_ddp: cannot start: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    torch.set_num_threads(_threads(local_world_size))
    initialised = False
    try:
        rt = resolve_runtime(spec.train, local_rank, local_world_size)
        backend = spec.train.backend
        if backend == "auto":
            backend = "nccl" if rt.device.type == "cuda" else "gloo"
        from datetime import timedelta

        timeout_s = float(os.environ.get("GSCHED_PG_TIMEOUT_S", "600"))
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
            device_id=rt.device if backend == "nccl" else None,
        )
        initialised = True
        print(f"[job {spec.job_id} rank {rank}/{world_size}] started: device {rt.device}, backend {backend}, "
              f"{torch.get_num_threads()} CPU threads (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})",
              flush=True)
        result = train(
            spec, rank, world_size, local_rank=local_rank, local_world_size=local_world_size, stop_event=stop
        )
        return 143 if result["stopped"] else 0
    except SpecError as exc:
        print(f"resnet_ddp rank {rank}: {exc}", file=sys.stderr)
        return 2
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        if initialised:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
