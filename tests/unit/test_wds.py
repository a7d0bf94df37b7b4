"""WebDataset tar shards: what ``data make --format wds`` writes, the built-in reader reads back."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from agents.datasets import make_shards
from agents.shardfile import iter_shard, shard_path
from agents.wds import WdsFormatError, count_wds, is_tar, iter_members, iter_wds


def test_wds_shards_hold_the_same_samples_as_gshard1_ones(tmp_path: Path) -> None:
    # The same source, split and seed: the tar's samples are the GSHARD1 file's, pixel for pixel (PNG is
    # lossless), in the same order, keys s00000-000000...
    g = make_shards("digits:size=8", tmp_path / "g", "d", 3, seed=7)
    w = make_shards("digits:size=8", tmp_path / "w", "d", 3, seed=7, fmt="wds")
    assert w["format"] == "wds" and [s["samples"] for s in w["shards"]] == [s["samples"] for s in g["shards"]]
    for i in range(3):
        tar, gshard = shard_path(tmp_path / "w", "d", i), shard_path(tmp_path / "g", "d", i)
        assert is_tar(tar) and not is_tar(gshard)
        assert list(iter_wds(tar)) == list(iter_shard(gshard))
        assert count_wds(tar) == (g["shards"][i]["samples"], (8, 8, 1))
    keys = [k for k, _, _ in iter_members(shard_path(tmp_path / "w", "d", 1))]
    assert keys[:2] == ["s00001-000000", "s00001-000001"]
    # written twice, byte-identical (fixed member times and owners)
    again = make_shards("digits:size=8", tmp_path / "w2", "d", 3, seed=7, fmt="wds")
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in w["shards"]]


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _jpeg(colour: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (6, 4), colour).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def test_a_teams_tar_of_jpegs_reads_with_keys_grouped_and_incomplete_samples_skipped(tmp_path: Path) -> None:
    path = tmp_path / "team-000.tar"
    with tarfile.open(path, "w") as tar:
        _add(tar, "train/a.x.jpg", _jpeg((250, 0, 0)))  # key train/a (up to the first dot)
        _add(tar, "train/a.x.cls", b"3\n")
        _add(tar, "train/a.x.json", b"{}")  # other members are ignored
        _add(tar, "train/b.jpg", _jpeg((0, 0, 250)))  # no label: skipped
        _add(tar, "train/c.cls", b"1")  # no image: skipped
        _add(tar, "train/d.jpeg", _jpeg((0, 250, 0)))
        _add(tar, "train/d.cls", b"0")
    got = list(iter_wds(path))
    assert [(label, shape) for _, label, shape in got] == [(3, (4, 6, 3)), (0, (4, 6, 3))]
    first = np.frombuffer(got[0][0], dtype=np.uint8).reshape(4, 6, 3)
    assert first[2, 3, 0] > 200 and first[2, 3, 2] < 50  # red, after JPEG
    assert count_wds(path) == (2, (4, 6, 3))


def test_a_label_that_is_not_a_number_is_refused_naming_the_sample(tmp_path: Path) -> None:
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as tar:
        _add(tar, "k1.png", b"\x89PNG")
        _add(tar, "k1.cls", b"cat")
    with pytest.raises(WdsFormatError, match="k1.cls is 'cat'"):
        list(iter_members(path))
