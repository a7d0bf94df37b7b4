"""Choosing the checkpoint a resumed rank loads: verified against the recorded sha256, the newest good
one, skips reported with their reason, never an unverified file (agents/ckptverify.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agents.ckptverify import choose, verified
from agents.staging import StagingError
from scheduler.protocol.messages import Resume


def _ckpt(store: Path, epoch: int, data: bytes, nodes: list[str], sha: str | None = None) -> Resume:
    path = store / f"epoch-{epoch:04d}.pt"
    return Resume(epoch=epoch, path=str(path), nodes=nodes, addresses=[f"{n}:1" for n in nodes],
                  sha256=hashlib.sha256(data).hexdigest() if sha is None else sha)


class _Peers:
    """Peers' files by address: a fetch copies them into dest when they hash right, as agents/staging.fetch
    does (raising StagingError otherwise); every call is remembered."""

    def __init__(self, files: dict[tuple[str, str], bytes]) -> None:
        self.files = files
        self.calls: list[tuple[str, str]] = []

    def __call__(self, address: str, name: str, dest: Path, sha: str) -> None:
        self.calls.append((address, name))
        data = self.files.get((address, name))
        if data is None:
            raise StagingError(f"{address}: no such file")
        if hashlib.sha256(data).hexdigest() != sha:
            raise StagingError(f"{name} from {address}: sha256 mismatch")
        dest.write_bytes(data)


def test_a_good_local_copy_is_used_without_fetching(tmp_path):
    (tmp_path / "epoch-0002.pt").write_bytes(b"two")
    peers = _Peers({})
    c = choose([_ckpt(tmp_path, 2, b"two", ["here", "b"])], lambda n: tmp_path / n, peers, "here")
    assert c.checkpoint is not None and c.checkpoint.epoch == 2 and c.path == tmp_path / "epoch-0002.pt"
    assert c.skipped == [] and peers.calls == []


def test_a_corrupt_local_copy_is_set_aside_and_a_good_one_fetched(tmp_path):
    (tmp_path / "epoch-0002.pt").write_bytes(b"tw0")
    peers = _Peers({("b:1", "epoch-0002.pt"): b"two"})
    c = choose([_ckpt(tmp_path, 2, b"two", ["here", "b"])], lambda n: tmp_path / n, peers, "here")
    assert c.checkpoint is not None and c.checkpoint.epoch == 2
    assert (tmp_path / "epoch-0002.pt").read_bytes() == b"two"
    assert (tmp_path / ".epoch-0002.pt.corrupt").read_bytes() == b"tw0"


def test_a_newest_that_fails_everywhere_is_skipped_for_the_previous_good_one(tmp_path):
    (tmp_path / "epoch-0003.pt").write_bytes(b"thr33")  # corrupted on disk here
    (tmp_path / "epoch-0002.pt").write_bytes(b"two")
    peers = _Peers({("b:1", "epoch-0003.pt"): b"thr3e"})  # and on the peer
    newest = _ckpt(tmp_path, 3, b"three", ["here", "b"])
    c = choose([newest, _ckpt(tmp_path, 2, b"two", ["here", "b"])], lambda n: tmp_path / n, peers, "here")
    assert c.checkpoint is not None and c.checkpoint.epoch == 2 and c.path == tmp_path / "epoch-0002.pt"
    assert [s.epoch for s, _ in c.skipped] == [3]
    why = c.skipped[0][1]
    assert "copy on here does not match" in why and "from b" in why and "sha256 mismatch" in why
    assert not (tmp_path / "epoch-0003.pt").exists()  # the bad bytes are out of the checkpoint names


def test_a_checkpoint_without_a_recorded_sha256_is_never_loaded(tmp_path):
    (tmp_path / "epoch-0001.pt").write_bytes(b"one")
    c = choose([_ckpt(tmp_path, 1, b"one", ["here"], sha="")], lambda n: tmp_path / n, _Peers({}), "here")
    assert c.checkpoint is None and c.path is None
    assert c.skipped[0][1] == "no sha256 recorded for it"
    assert not verified(tmp_path / "epoch-0001.pt", "")


@pytest.mark.parametrize("held", [[], ["here"]])
def test_nothing_verifies_gives_no_checkpoint(tmp_path, held):
    c = choose([_ckpt(tmp_path, 1, b"one", held)], lambda n: tmp_path / n, _Peers({}), "here")
    assert c.checkpoint is None and [s.epoch for s, _ in c.skipped] == [1]
