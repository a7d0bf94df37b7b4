"""WebDataset-style tar shards: ``KEY.png`` (or ``KEY.jpg``/``KEY.jpeg``) with ``KEY.cls`` (the label as
decimal text), the members of one sample next to each other.  A team's image tars train with ``[train]``
as they are, and ``gsched data make --format wds`` writes such tars.

Read and written with the standard library's ``tarfile`` (images with Pillow, numpy lazily): the reader
needs one pass over members grouped by key, which is all the ``webdataset`` package would do for us
here, and it would bring its own pipeline and dependencies into the agent.  The key of a member is its
path up to the first ``.`` of its file name (WebDataset's rule), so ``a/b.x.png`` belongs to ``a/b``;
its kind is the last extension (``png``).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

IMAGE_EXTS = ("png", "jpg", "jpeg")


class WdsFormatError(ValueError):
    pass


def is_tar(path: str | os.PathLike[str]) -> bool:
    """Whether the file is a tar archive (POSIX ``ustar`` magic at offset 257)."""
    with open(path, "rb") as f:
        head = f.read(265)
    return head[257:262] == b"ustar"


def _split(name: str) -> tuple[str, str]:
    """(key, kind): the path up to the file name's first dot, and the last part of what follows."""
    folder, _, base = name.rpartition("/")
    key, _, ext = base.partition(".")
    return (f"{folder}/{key}" if folder else key), ext.rpartition(".")[2].lower()


def iter_members(path: str | os.PathLike[str]) -> Iterator[tuple[str, bytes, int]]:
    """Yield ``(key, encoded image bytes, label)`` per complete sample, in file order; a sample missing
    its image or its label is skipped.  Raises WdsFormatError for a ``.cls`` that is not an integer."""
    current: str | None = None
    parts: dict[str, bytes] = {}

    def done() -> Iterator[tuple[str, bytes, int]]:
        image = next((parts[e] for e in IMAGE_EXTS if e in parts), None)
        if current is None or image is None or "cls" not in parts:
            return
        text = parts["cls"].decode("ascii", "replace").strip()
        try:
            yield current, image, int(text)
        except ValueError:
            raise WdsFormatError(f"{path}: {current}.cls is {text[:20]!r}, not an integer label") from None

    with tarfile.open(path, "r:") as tar:
        for m in tar:
            if not m.isfile():
                continue
            key, ext = _split(m.name)
            if key != current:
                yield from done()
                current, parts = key, {}
            if ext in IMAGE_EXTS or ext == "cls":
                f = tar.extractfile(m)
                parts[ext] = f.read() if f else b""
        yield from done()


def decode(image: bytes) -> Any:
    """Encoded image -> uint8 HxWxC numpy array (grey stays one channel, anything else RGB)."""
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(image)) as im:
        pixels = im.convert("L") if im.mode in ("L", "1", "I;16", "I") else im.convert("RGB")
        arr = np.asarray(pixels, dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


def iter_wds(path: str | os.PathLike[str]) -> Iterator[tuple[bytes, int, tuple[int, int, int]]]:
    """``(pixels, label, (h, w, c))`` per sample, as ``agents.shardfile.iter_shard`` yields them."""
    for _, image, label in iter_members(path):
        arr = decode(image)
        h, w, c = arr.shape
        yield arr.tobytes(), label, (h, w, c)


def count_wds(path: str | os.PathLike[str]) -> tuple[int, tuple[int, int, int] | None]:
    """Samples in a tar shard and the first one's shape (decodes one image only)."""
    n = 0
    shape = None
    for _, image, _ in iter_members(path):
        if shape is None:
            h, w, c = decode(image).shape
            shape = (h, w, c)
        n += 1
    return n, shape


def write_wds(path: str | os.PathLike[str], samples: Iterable[tuple[Any, int]], prefix: str = "") -> dict[str, Any]:
    """Write samples (HxW or HxWxC uint8 arrays, label) as a tar of ``KEY.png`` + ``KEY.cls``, atomically.

    Keys are ``{prefix}{i:06d}``.  Member times and owners are fixed, so the same samples give the same
    bytes.  Returns the manifest entry: ``bytes``, ``sha256``, ``samples``."""
    import numpy as np
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    count = 0

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = 0
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for image, label in samples:
            arr = np.ascontiguousarray(image, dtype=np.uint8)
            if arr.ndim == 3 and arr.shape[2] == 1:
                arr = arr[:, :, 0]
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, format="PNG")
            key = f"{prefix}{count:06d}"
            add(tar, f"{key}.png", buf.getvalue())
            add(tar, f"{key}.cls", str(int(label)).encode())
            count += 1
    digest = hashlib.sha256()
    with open(tmp, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    size = tmp.stat().st_size
    os.replace(tmp, path)
    return {"bytes": size, "sha256": digest.hexdigest(), "samples": count}
