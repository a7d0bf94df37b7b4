"""Registering files in place (agents/inplace.py): what a node hashes, links, and refuses, naming it.

Real files in a temporary data dir; the only stand-in is the progress callback, which is where a writer
appends to a file while it is hashed (so the change lands mid-read, every time)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from agents.inplace import InPlaceError, find_files, hash_file, link_shard
from agents.shardfile import shard_path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    (d / "team" / "sub").mkdir(parents=True)
    (d / "team" / "b.tar").write_bytes(b"bbb")
    (d / "team" / "a.tar").write_bytes(b"aaa")
    (d / "team" / "sub" / "c.tar").write_bytes(b"ccc")
    (d / "team" / "notes.txt").write_text("x")
    (d / "digits").mkdir()
    (d / "digits" / "00000.shard").write_bytes(b"GSHARD1\n")  # gsched's own: never registered again
    return d


def test_files_below_the_folder_matching_the_glob_sorted(data: Path) -> None:
    found = find_files(data, "n1", "team", "*.tar")
    assert [(f.rel, f.data_rel) for f in found] == [("a.tar", "team/a.tar"), ("b.tar", "team/b.tar"),
                                                    ("sub/c.tar", "team/sub/c.tar")]
    assert [f.rel for f in find_files(data, "n1", str(data), "*")] == [
        "team/a.tar", "team/b.tar", "team/notes.txt", "team/sub/c.tar"]  # absolute inside is fine


@pytest.mark.parametrize("path, glob, status, words", [
    ("../elsewhere", "*", 403, "node n1: ../elsewhere is outside its data dir"),
    ("/etc", "*", 403, "node n1: /etc is outside its data dir"),
    ("missing", "*", 404, "node n1 has no missing"),
    ("team", "*.parquet", 422, "node n1: no file under team matches '*.parquet'"),
])
def test_bad_paths_and_globs_are_refused_naming_node_and_path(data: Path, path: str, glob: str, status: int,
                                                               words: str) -> None:
    with pytest.raises(InPlaceError, match=re.escape(words)) as e:
        find_files(data, "n1", path, glob)
    assert e.value.status == status


def test_a_symlink_out_of_the_data_dir_is_refused_naming_it(data: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.tar"
    secret.write_bytes(b"s")
    (data / "team" / "link.tar").symlink_to(secret)
    with pytest.raises(InPlaceError, match=r"team/link.tar is a symlink out of its data dir") as e:
        find_files(data, "n1", "team", "*.tar")
    assert e.value.status == 403
    (data / "team" / "link.tar").unlink()
    (data / "team" / "outdir").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(InPlaceError, match=r"team/outdir is a symlink out of its data dir"):
        find_files(data, "n1", "team", "*")
    (data / "out").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(InPlaceError, match="node n1: out is a symlink out of its data dir"):
        find_files(data, "n1", "out", "*")


def test_hashing_streams_and_a_file_that_changes_meanwhile_is_refused(data: Path) -> None:
    big = data / "team" / "big.tar"
    big.write_bytes(os.urandom(3 << 20))  # three 1 MiB reads
    seen: list[tuple[int, int]] = []
    sha, st = hash_file("n1", big, lambda name, done, total: seen.append((done, total)))
    assert sha == hashlib.sha256(big.read_bytes()).hexdigest() and st.st_size == 3 << 20
    assert seen == [(1 << 20, 3 << 20), (2 << 20, 3 << 20), (3 << 20, 3 << 20)]

    def writer(name: str, done: int, total: int) -> None:
        if done == 1 << 20:
            with open(big, "ab") as f:
                f.write(b"more")

    with pytest.raises(InPlaceError, match="node n1: team/big.tar changed while it was hashed") as e:
        hash_file("n1", big, writer, label="team/big.tar")
    assert e.value.status == 409


def test_linking_makes_the_file_its_shard_without_a_copy_and_touches_nothing_stored(data: Path) -> None:
    sha = hashlib.sha256(b"aaa").hexdigest()
    dest = link_shard(data, "n1", "team/a.tar", "team", 0, sha)
    assert dest == shard_path(data, "team", 0) and os.path.samefile(dest, data / "team" / "a.tar")
    assert link_shard(data, "n1", "team/a.tar", "team", 0, sha) == dest  # idempotent
    # another file for a shard that exists: refused, the stored shard unchanged
    with pytest.raises(InPlaceError, match="already holds other bytes") as e:
        link_shard(data, "n1", "team/b.tar", "team", 0, hashlib.sha256(b"bbb").hexdigest())
    assert e.value.status == 409 and dest.read_bytes() == b"aaa"
    # bytes changed since the scan: refused, nothing linked
    with pytest.raises(InPlaceError, match="team/b.tar no longer has the bytes registered"):
        link_shard(data, "n1", "team/b.tar", "team", 1, sha)
    assert not shard_path(data, "team", 1).exists()
