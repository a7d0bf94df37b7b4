"""A rank's input: its own shard files, streamed, split, shuffled, augmented, batched, put on the device.

A shard is a GSHARD1 file (``agents.shardfile``) or a WebDataset-style tar (``agents.wds``: ``KEY.png``
or ``KEY.jpg`` with ``KEY.cls``), told apart by their first bytes; every image must have one shape.

Each rank streams only its own shard files, one sample at a time.  The sample at position ``p`` of a
shard (0-based) is held out for accuracy when ``p % 10 == 0``; the rest is the training split.  Each
epoch visits the rank's shards in a seeded order through a seeded shuffle buffer of 1,024 samples and
applies random crop (zero padding) and optional flip; everything random in an epoch is a function of
``(seed, rank, epoch, loader worker)``, so the sampler position to restore is the epoch.

``hflip``: mirroring doubles the variety of natural images but turns glyphs into other glyphs.
``"auto"`` flips colour (3-channel) images only, a heuristic aimed at the grey ``digits`` source (one
run each here: 95% held-out accuracy after 3 epochs without flips, 41% with them).

Nothing here talks to other ranks: agreeing on the image shape and on the steps per epoch (the
minimum of what each rank's data fills) is the train loop's (``train.py``).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from agents.shardfile import MAGIC, iter_shard
from agents.wds import count_wds, is_tar, iter_wds

HOLDOUT_EVERY = 10
SHUFFLE_BUFFER = 1024


def count_samples(path: str) -> tuple[int, tuple[int, int, int] | None]:
    """Number of samples in a shard and the first sample's shape, reading headers only (a tar: its
    members' headers, and one image decoded)."""
    if is_tar(path):
        return count_wds(path)
    header = struct.Struct("<IHHB")
    n = 0
    shape = None
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{path}: neither a gsched shard (GSHARD1) nor a WebDataset tar")
        while head := f.read(header.size):
            if len(head) != header.size:
                raise ValueError(f"{path}: truncated sample header")
            _, h, w, c = header.unpack(head)
            if shape is None:
                shape = (h, w, c)
            f.seek(h * w * c, os.SEEK_CUR)
            n += 1
    return n, shape


def iter_samples(path: str) -> Iterator[tuple[bytes, int, tuple[int, int, int]]]:
    """``(pixels, label, (h, w, c))`` one sample at a time from either kind of shard."""
    return iter_wds(path) if is_tar(path) else iter_shard(path)


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
            for pos, (pixels, label, shape) in enumerate(iter_samples(self.shards[i])):
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


def to_input(x: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    """uint8 NHWC batch -> normalised float NCHW on ``device`` (normalising on the device is cheaper)."""
    x = x.to(device, non_blocking=True).permute(0, 3, 1, 2).float().div_(255.0).sub_(0.5).div_(0.25)
    return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
