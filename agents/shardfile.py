"""The on-disk shard format: a stream of labelled uint8 images, read one sample at a time.

Layout of a shard file::

    b"GSHARD1\\n"                       8-byte magic
    repeated: <label:u32><h:u16><w:u16><c:u8> then h*w*c bytes (HWC, uint8)

A data set lives under an agent's data dir as ``DIR/<dataset>/<index:05d>.shard``.  The data set's
manifest (per shard: bytes, sha256, samples) is kept by the server; an agent trusts nothing but the
sha256 it computes itself.  Imports only the standard library (numpy lazily) so the agent and the CLI
stay light.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

MAGIC = b"GSHARD1\n"
_HEADER = struct.Struct("<IHHB")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")  # fullmatch: "$" would let a trailing newline in
SHARD_SUFFIX = ".shard"


class ShardFormatError(ValueError):
    pass


def valid_name(name: str) -> bool:
    """Data set names: lowercase letters, digits, '_', '.', '-'; no '..', at most 63 characters."""
    return bool(NAME_RE.fullmatch(name)) and ".." not in name


def shard_relpath(dataset: str, index: int) -> str:
    if not valid_name(dataset):
        raise ValueError(f"invalid data set name {dataset!r}")
    if not 0 <= int(index) < 100000:
        raise ValueError(f"invalid shard index {index!r}")
    return f"{dataset}/{int(index):05d}{SHARD_SUFFIX}"


def shard_path(data_dir: str | os.PathLike[str], dataset: str, index: int) -> Path:
    """The shard's path under ``data_dir``; raises ValueError for names that could escape it."""
    return inside(data_dir, shard_relpath(dataset, index))


def inside(data_dir: str | os.PathLike[str], relpath: str) -> Path:
    """``data_dir / relpath``, refused (ValueError) unless it lies inside the data dir with no symlink on
    the way: a symlinked data set dir or file could otherwise point anywhere, even at the agent's token."""
    root = Path(data_dir).resolve()
    path = root / relpath
    if path.resolve() != path or root not in path.parents:
        raise ValueError(f"{relpath} is outside the data dir or reached through a symlink")
    return path


def write_shard(path: str | os.PathLike[str], samples: Iterable[tuple[Any, int]]) -> dict[str, int | str]:
    """Write samples (HxWxC or HxW uint8 arrays, label) to ``path`` atomically.

    Returns the manifest entry: ``bytes``, ``sha256``, ``samples``.
    """
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    digest = hashlib.sha256()
    count = 0
    size = 0

    def put(f: Any, chunk: bytes) -> None:
        nonlocal size
        f.write(chunk)
        digest.update(chunk)
        size += len(chunk)

    with open(tmp, "wb") as f:
        put(f, MAGIC)
        for image, label in samples:
            arr = np.ascontiguousarray(image, dtype=np.uint8)
            if arr.ndim == 2:
                arr = arr[:, :, None]
            if arr.ndim != 3:
                raise ShardFormatError(f"image must be HxW or HxWxC, got shape {arr.shape}")
            h, w, c = arr.shape
            put(f, _HEADER.pack(int(label), h, w, c))
            put(f, arr.tobytes())
            count += 1
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return {"bytes": size, "sha256": digest.hexdigest(), "samples": count}


def iter_shard(path: str | os.PathLike[str]) -> Iterator[tuple[bytes, int, tuple[int, int, int]]]:
    """Yield ``(pixels, label, (h, w, c))`` one sample at a time; never reads the whole file."""
    with open(path, "rb", buffering=1 << 16) as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ShardFormatError(f"{path}: not a gsched shard (bad magic)")
        while True:
            head = f.read(_HEADER.size)
            if not head:
                return
            if len(head) != _HEADER.size:
                raise ShardFormatError(f"{path}: truncated sample header")
            label, h, w, c = _HEADER.unpack(head)
            n = h * w * c
            pixels = f.read(n)
            if len(pixels) != n:
                raise ShardFormatError(f"{path}: truncated sample")
            yield pixels, label, (h, w, c)


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


CKPT_NAME = re.compile(r"epoch-[0-9]{4}\.pt")  # a per-epoch checkpoint's file name (fullmatch)


def prune_checkpoints(directory: str | os.PathLike[str], keep: int) -> list[str]:
    """Delete all but the ``keep`` newest ``epoch-NNNN.pt`` files in ``directory`` (``keep`` 0 keeps
    every one).  Returns the names deleted.  Used by rank 0 after each checkpoint and by an agent
    receiving a mirrored one, so a long job holds ``keep`` checkpoints per copy, not one per epoch."""
    if keep <= 0:
        return []
    names = sorted(p.name for p in Path(directory).glob("epoch-*.pt") if CKPT_NAME.fullmatch(p.name))
    gone = names[:-keep]
    for name in gone:
        try:
            (Path(directory) / name).unlink()
        except OSError:
            pass
    return gone


BACKGROUND_NICE = 10


def background_priority() -> None:
    """Lower the calling thread's CPU priority to nice 10 (never raise it; Linux: nice applies per thread).  For copies nobody
    waits on, such as checkpoint mirrors, which would otherwise take CPU from the ranks training on
    the same cores; best effort elsewhere."""
    try:
        import threading

        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), BACKGROUND_NICE))
    except (AttributeError, OSError):
        pass

