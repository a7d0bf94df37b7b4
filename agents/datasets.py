"""Image sources that ``gsched data make`` turns into sharded data sets.

A *source spec* is a string ``KIND[:ARGS]``:

``digits[:size=16]``
    scikit-learn's bundled handwritten digits: 1,797 real 8x8 grey images, 10 classes, no download.
    Pixel values 0..16 are scaled to 0..255.  ``size`` (default 16, a multiple of 8) upsamples by pixel
    repetition (nearest neighbour, so no information is invented).  16x16 is the default because
    random-crop augmentation with padding has room to move at 16 pixels, while ResNet-18 still costs
    only a quarter of what it costs at 32x32 (see ``agents.workloads.resnet_ddp``); ``size=8`` is the
    cheapest and the native resolution.

``synthetic[:classes=10,samples=5000,size=32,channels=3,noise=0.35,seed=0]``
    Generated, learnable images of any size and count: each class has a smooth random template
    (a few coloured 2-D sinusoids); a sample is its class template, shifted by up to ``size//8``
    pixels, scaled in contrast, plus Gaussian noise of ``noise`` (relative to the template's range).
    Sample ``i`` has class ``i % classes`` and depends only on ``(seed, i)``: sources are random-access
    and reproducible.

``imagefolder:PATH[?size=32]``
    A user's ImageFolder tree: ``PATH/<class>/<image file>``; classes are the sub-folder names in
    sorted order, labels their positions.  Images are decoded with PIL, converted to RGB and resized
    (bilinear, aspect ratio not kept) to ``size`` x ``size`` (default 32).  Everything after the first
    ``?`` is options, so PATH itself must not contain ``?``.

Every source yields ``(uint8 HxWxC numpy array, label)``.  :func:`make_shards` turns one into shard
files.  Who calls: the CLI (``gsched data make``) and tests; nothing here imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.shardfile import shard_path, valid_name, write_shard
from agents.wds import write_wds

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif", ".tiff"}
Progress = Callable[[int, int], None]


class SourceError(ValueError):
    """A source spec that cannot be used; the message says what to change."""


@dataclass
class Source:
    """A random-access image source: ``len(source)`` samples, ``source.sample(i) -> (image, label)``."""

    spec: str
    classes: list[str]
    image_shape: tuple[int, int, int]
    length: int
    _get: Callable[[int], tuple[Any, int]] = field(repr=False)

    def __len__(self) -> int:
        return self.length

    def sample(self, index: int) -> tuple[Any, int]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self._get(index)

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        for i in range(self.length):
            yield self._get(i)


def parse_options(text: str, allowed: dict[str, type], spec: str) -> dict[str, Any]:
    """Parse ``k=v,k=v`` into typed values; unknown keys and bad values raise SourceError."""
    out: dict[str, Any] = {}
    if not text:
        return out
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in allowed:
            raise SourceError(
                f"source {spec!r}: unknown option {part!r}; allowed: {', '.join(sorted(allowed))} (as key=value)"
            )
        try:
            out[key] = allowed[key](value.strip())
        except ValueError:
            raise SourceError(
                f"source {spec!r}: option {key}={value!r} is not a valid {allowed[key].__name__}"
            ) from None
    return out


def open_source(spec: str) -> Source:
    """Resolve a source spec (see the module docstring) to a :class:`Source`."""
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "digits":
        return _digits(spec, parse_options(rest, {"size": int}, spec))
    if kind == "synthetic":
        opts = parse_options(
            rest,
            {"classes": int, "samples": int, "size": int, "channels": int, "noise": float, "seed": int},
            spec,
        )
        return _synthetic(spec, **opts)
    if kind == "imagefolder":
        path, _, query = rest.partition("?")
        if not path:
            raise SourceError(f"source {spec!r}: give the folder, as imagefolder:/path/to/tree")
        return _imagefolder(spec, path, **parse_options(query, {"size": int}, spec))
    raise SourceError(
        f"unknown source {spec!r}: use digits, synthetic[:classes=..,samples=..,size=..] or imagefolder:PATH"
    )


def _digits(spec: str, opts: dict[str, Any]) -> Source:
    import numpy as np
    from sklearn.datasets import load_digits

    size = opts.get("size", 16)
    if size < 8 or size % 8:
        raise SourceError(f"source {spec!r}: size must be a multiple of 8 (8, 16, 24, 32...), got {size}")
    bunch = load_digits()
    images = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    factor = size // 8
    if factor > 1:
        images = images.repeat(factor, axis=1).repeat(factor, axis=2)
    images = images[:, :, :, None]
    labels = bunch.target.astype(int)

    def get(i: int) -> tuple[Any, int]:
        return images[i], int(labels[i])

    return Source(spec, [str(d) for d in range(10)], (size, size, 1), len(labels), get)


def _synthetic(
    spec: str,
    classes: int = 10,
    samples: int = 5000,
    size: int = 32,
    channels: int = 3,
    noise: float = 0.35,
    seed: int = 0,
) -> Source:
    import numpy as np

    if not 2 <= classes <= 1000:
        raise SourceError(f"source {spec!r}: classes must be between 2 and 1000, got {classes}")
    if samples < 1:
        raise SourceError(f"source {spec!r}: samples must be at least 1, got {samples}")
    if not 4 <= size <= 1024 or channels not in (1, 3):
        raise SourceError(f"source {spec!r}: size must be 4..1024 and channels 1 or 3")
    if noise < 0:
        raise SourceError(f"source {spec!r}: noise must be >= 0")

    # Class templates in [0, 1]: three random oriented sinusoids per channel, smooth enough to survive
    # a shift of a few pixels, distinct enough between classes to be learnable.
    trng = np.random.default_rng([seed, 0x7E3])
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) / size
    templates = np.zeros((classes, size, size, channels))
    for k in range(classes):
        for ch in range(channels):
            acc = np.zeros((size, size))
            for _ in range(3):
                fx, fy = trng.uniform(-3, 3, size=2)
                phase = trng.uniform(0, 2 * np.pi)
                acc += trng.uniform(0.5, 1.0) * np.sin(2 * np.pi * (fx * xx + fy * yy) + phase)
            templates[k, :, :, ch] = acc
        t = templates[k]
        templates[k] = (t - t.min()) / max(float(t.max() - t.min()), 1e-9)
    max_shift = max(1, size // 8)

    def get(i: int) -> tuple[Any, int]:
        label = i % classes
        rng = np.random.default_rng([seed, 0x5A1, i])
        dy, dx = rng.integers(-max_shift, max_shift + 1, size=2)
        img = np.roll(templates[label], (int(dy), int(dx)), axis=(0, 1))
        img = 0.5 + (img - 0.5) * rng.uniform(0.7, 1.0) + rng.normal(0.0, noise, size=img.shape)
        return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8), label

    return Source(spec, [f"class{k}" for k in range(classes)], (size, size, channels), samples, get)


def _imagefolder(spec: str, path: str, size: int = 32) -> Source:
    import numpy as np
    from PIL import Image

    root = Path(path).expanduser()
    if not root.is_dir():
        raise SourceError(f"source {spec!r}: {root} is not a directory of class sub-folders")
    if not 4 <= size <= 1024:
        raise SourceError(f"source {spec!r}: size must be 4..1024, got {size}")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    files: list[tuple[Path, int]] = []
    for label, name in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / name):
            dirnames.sort()
            for fname in sorted(filenames):
                if Path(fname).suffix.lower() in IMAGE_SUFFIXES:
                    files.append((Path(dirpath) / fname, label))
    if not files:
        raise SourceError(
            f"source {spec!r}: no images under {root}; expected {root}/<class>/<image>"
            f" with suffixes {', '.join(sorted(IMAGE_SUFFIXES))}"
        )

    def get(i: int) -> tuple[Any, int]:
        fpath, label = files[i]
        try:
            with Image.open(fpath) as im:
                rgb = im.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
                return np.asarray(rgb, dtype=np.uint8), label
        except OSError as exc:
            raise SourceError(f"source {spec!r}: cannot read image {fpath}: {exc}") from exc

    return Source(spec, classes, (size, size, 3), len(files), get)


def make_shards(
    source_spec: str,
    out_dir: str | os.PathLike[str],
    dataset_name: str,
    n_shards: int,
    seed: int = 0,
    progress: Progress | None = None,
    fmt: str = "gshard",
) -> dict[str, Any]:
    """Shuffle the source deterministically and split it into ``n_shards`` shard files.

    ``fmt``: ``"gshard"`` (GSHARD1, ``agents.shardfile``) or ``"wds"`` (WebDataset-style tars of
    ``KEY.png`` + ``KEY.cls``, ``agents.wds``; keys ``s{shard:05d}-{sample:06d}``).

    Shard ``i`` is written atomically to ``shard_path(out_dir, dataset_name, i)``.  The order is a
    permutation drawn from ``seed`` alone, so the same (source, n_shards, seed) gives byte-identical
    shards; shard sizes differ by at most one sample.  ``progress(done, total)`` (samples) is called at
    the start, every 256 samples and at the end.  Returns the manifest::

        {"name", "source", "seed", "classes": [class names], "num_classes", "image_shape": [h, w, c],
         "samples", "bytes", "shards": [{"index", "bytes", "sha256", "samples"}]}

    Raises SourceError for a bad spec and ValueError for a bad name or shard count.  Not idempotent
    with respect to other files in the data set's folder: existing shards of the same indices are
    replaced, others are left alone.
    """
    import numpy as np

    if fmt not in ("gshard", "wds"):
        raise ValueError(f"unknown shard format {fmt!r}: use gshard or wds")
    if not valid_name(dataset_name):
        raise ValueError(
            f"invalid data set name {dataset_name!r}: use lowercase letters, digits, '_', '.', '-'"
        )
    source = open_source(source_spec)
    total = len(source)
    if not 1 <= n_shards <= total:
        raise ValueError(f"cannot split {total} samples into {n_shards} shards: use 1..{total} shards")
    order = np.random.default_rng(seed).permutation(total)
    done = 0
    if progress:
        progress(0, total)

    def samples_of(indices: Any) -> Iterator[tuple[Any, int]]:
        nonlocal done
        for idx in indices:
            yield source.sample(int(idx))
            done += 1
            if progress and done % 256 == 0 and done != total:
                progress(done, total)

    shards = []
    for i, chunk in enumerate(np.array_split(order, n_shards)):
        dest = shard_path(out_dir, dataset_name, i)
        if fmt == "wds":
            entry = write_wds(dest, samples_of(chunk), prefix=f"s{i:05d}-")
        else:
            entry = write_shard(dest, samples_of(chunk))
        shards.append({"index": i, **entry})
    if progress:
        progress(done, total)
    return {
        "name": dataset_name,
        "source": source_spec,
        "format": fmt,
        "seed": seed,
        "classes": list(source.classes),
        "num_classes": len(source.classes),
        "image_shape": list(source.image_shape),
        "samples": total,
        "bytes": sum(int(s["bytes"]) for s in shards),
        "shards": shards,
    }
