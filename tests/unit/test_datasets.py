"""Sources and make_shards: shards hold exactly the source's samples, deterministically split."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from agents.datasets import SourceError, make_shards, open_source
from agents.shardfile import iter_shard, sha256_file, shard_path


def read_all(data_dir, name, n_shards):
    """Every (label, pixels) in shard order, and the per-shard counts."""
    out, counts = [], []
    for i in range(n_shards):
        items = [(label, shape, pixels) for pixels, label, shape in iter_shard(shard_path(data_dir, name, i))]
        counts.append(len(items))
        out.extend(items)
    return out, counts


def test_digits_is_real_and_scaled():
    src = open_source("digits")
    # 1,797 scikit-learn digits, upsampled 8x8 -> 16x16 by pixel repetition, one channel.
    assert len(src) == 1797 and src.image_shape == (16, 16, 1) and len(src.classes) == 10
    img, label = src.sample(0)
    assert img.dtype == np.uint8 and img.shape == (16, 16, 1) and label == 0
    # Source values 0..16 scale by 255/16: sample 0's brightest pixel, 15, becomes 239.
    assert img.max() == 239
    whole = np.stack([im for im, _ in src])
    assert whole.min() == 0 and whole.max() == 255
    assert (img[0::2, 0::2] == img[1::2, 1::2]).all()  # each source pixel is a 2x2 block
    small, _ = open_source("digits:size=8").sample(0)
    assert (small[:, :, 0] == img[0::2, 0::2, 0]).all()


def test_shards_round_trip_every_sample_once(tmp_path):
    spec = "synthetic:classes=3,samples=101,size=8,seed=4"
    manifest = make_shards(spec, tmp_path, "syn", 4, seed=1)
    items, counts = read_all(tmp_path, "syn", 4)
    # 101 samples into 4 shards: sizes 26, 25, 25, 25 (differ by at most one).
    assert counts == [26, 25, 25, 25]
    assert [s["samples"] for s in manifest["shards"]] == counts
    src = open_source(spec)
    expected = Counter((label, img.tobytes()) for img, label in src)
    assert Counter((label, pixels) for label, _, pixels in items) == expected
    assert all(shape == (8, 8, 3) for _, shape, _ in items)
    assert manifest["samples"] == 101 and manifest["num_classes"] == 3
    assert manifest["image_shape"] == [8, 8, 3] and manifest["classes"] == ["class0", "class1", "class2"]
    for entry in manifest["shards"]:
        path = shard_path(tmp_path, "syn", entry["index"])
        assert entry["bytes"] == path.stat().st_size
        assert entry["sha256"] == sha256_file(path)
    assert manifest["bytes"] == sum(s["bytes"] for s in manifest["shards"])


def test_same_seed_same_bytes_other_seed_other_order(tmp_path):
    a = make_shards("digits:size=8", tmp_path / "a", "d", 3, seed=7)
    b = make_shards("digits:size=8", tmp_path / "b", "d", 3, seed=7)
    c = make_shards("digits:size=8", tmp_path / "c", "d", 3, seed=8)
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]
    assert [s["sha256"] for s in a["shards"]] != [s["sha256"] for s in c["shards"]]
    # Shuffled, not the source order: the first shard's labels are not 0, 1, 2, ... as in load_digits.
    items, _ = read_all(tmp_path / "a", "d", 3)
    assert [label for label, _, _ in items[:10]] != list(range(10))


def test_progress_reports_start_and_end(tmp_path):
    calls = []
    make_shards(
        "synthetic:samples=600,size=4,classes=2", tmp_path, "p", 2, progress=lambda d, t: calls.append((d, t))
    )
    # Start, every 256 samples, end.
    assert calls == [(0, 600), (256, 600), (512, 600), (600, 600)]


def test_synthetic_is_learnable_by_nearest_class_mean():
    src = open_source("synthetic:classes=5,samples=500,size=16,seed=2")
    x = np.stack([img for img, _ in src]).reshape(500, -1).astype(np.float64)
    y = np.array([label for _, label in src])
    means = np.stack([x[:400][y[:400] == k].mean(0) for k in range(5)])
    pred = np.argmin(((x[400:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    # Chance is 20%; even the simplest classifier separates the classes well.
    assert (pred == y[400:]).mean() > 0.6


def test_imagefolder_resizes_and_labels_by_sorted_folder(tmp_path):
    from PIL import Image

    for cls, colour in (("cat", (255, 0, 0)), ("ant", (0, 0, 255))):
        (tmp_path / "tree" / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (20 + i, 10), colour).save(tmp_path / "tree" / cls / f"{i}.png")
    (tmp_path / "tree" / "cat" / "notes.txt").write_text("not an image")
    src = open_source(f"imagefolder:{tmp_path / 'tree'}?size=12")
    assert src.classes == ["ant", "cat"] and len(src) == 6 and src.image_shape == (12, 12, 3)
    img, label = src.sample(0)
    assert img.shape == (12, 12, 3) and label == 0 and tuple(img[5, 5]) == (0, 0, 255)
    manifest = make_shards(f"imagefolder:{tmp_path / 'tree'}?size=12", tmp_path / "data", "pets", 2)
    assert manifest["samples"] == 6 and manifest["classes"] == ["ant", "cat"]


@pytest.mark.parametrize(
    "spec, words",
    [
        ("mnist", "unknown source"),
        ("digits:size=12", "multiple of 8"),
        ("synthetic:colours=3", "unknown option"),
        ("synthetic:samples=abc", "not a valid int"),
        ("imagefolder:/nonexistent/tree", "not a directory"),
    ],
)
def test_bad_specs_say_what_to_change(spec, words):
    with pytest.raises(SourceError, match=words):
        open_source(spec)


def test_bad_name_and_shard_count(tmp_path):
    with pytest.raises(ValueError, match="invalid data set name"):
        make_shards("digits", tmp_path, "../up", 2)
    with pytest.raises(ValueError, match="1..1797 shards"):
        make_shards("digits", tmp_path, "d", 0)


def test_module_does_not_import_torch():
    code = "import sys, agents.datasets as d; d.open_source('digits'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
