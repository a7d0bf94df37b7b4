"""``[train] keep_checkpoints``: a long job keeps its newest checkpoints, not one per epoch.

The pruning rule itself, the agent's data server applying it to a mirrored checkpoint (a real
``DataServer`` on loopback, a real PUT), and the job spec refusing the one value that could race.
"""

from __future__ import annotations

import hashlib
import time
import urllib.request
from pathlib import Path

import pytest

from agents.dataserver import DataServer, checkpoint_dir
from agents.shardfile import prune_checkpoints
from scheduler.core.jobspec import JobSpecError, validate_spec
from scheduler.protocol.tickets import ticket

KEY = "k" * 64


def make(directory: Path, epochs: range) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for e in epochs:
        (directory / f"epoch-{e:04d}.pt").write_bytes(b"x" * e)


def test_keeps_the_newest_and_leaves_other_files_alone(tmp_path: Path) -> None:
    make(tmp_path, range(1, 13))  # epoch 10..12 sort after 9 because names are zero-padded
    (tmp_path / "notes.txt").write_text("mine")
    assert prune_checkpoints(tmp_path, 3) == [f"epoch-{e:04d}.pt" for e in range(1, 10)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-0010.pt", "epoch-0011.pt", "epoch-0012.pt",
                                                          "notes.txt"]
    assert prune_checkpoints(tmp_path, 0) == [] and len(list(tmp_path.glob("epoch-*.pt"))) == 3  # 0 keeps all


def test_a_mirrored_checkpoint_prunes_the_older_copies_on_the_receiving_node(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make(checkpoint_dir(data, 5), range(1, 4))  # epochs 1..3 mirrored earlier
    srv = DataServer("127.0.0.1", 0, data, "n2", lambda: KEY, lambda *a: None)
    srv.start()
    try:
        body = b"checkpoint of epoch 4"
        ts = int(time.time())
        req = urllib.request.Request(
            f"http://127.0.0.1:{srv.port}/checkpoints/5/epoch-0004.pt", data=body, method="PUT",
            headers={"X-Gsched-Ticket": ticket(KEY, "ckpt", 5, "epoch-0004.pt", ts), "X-Gsched-Time": str(ts),
                     "X-Gsched-Sha256": hashlib.sha256(body).hexdigest(), "X-Gsched-Keep": "2"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 201
    finally:
        srv.stop()
    left = sorted(p.name for p in checkpoint_dir(data, 5).iterdir())
    assert left == ["epoch-0003.pt", "epoch-0004.pt"]
    assert (checkpoint_dir(data, 5) / "epoch-0004.pt").read_bytes() == body


def spec(**train: object) -> dict[str, object]:
    return {"name": "t", "resources": {"ranks": 1, "gpus_per_rank": 1}, "data": {"dataset": "d"},
            "train": {"epochs": 2, **train}}


def test_the_spec_takes_0_or_at_least_2_and_defaults_to_3() -> None:
    assert validate_spec(spec()).train.keep_checkpoints == 3
    assert validate_spec(spec(keep_checkpoints=0)).train.keep_checkpoints == 0
    with pytest.raises(JobSpecError, match="train.keep_checkpoints"):
        validate_spec(spec(keep_checkpoints=1))


def test_checkpoint_is_a_boolean_that_defaults_to_true() -> None:
    assert validate_spec(spec()).train.checkpoint is True
    assert validate_spec(spec(checkpoint=False)).train.checkpoint is False
    with pytest.raises(JobSpecError, match="train.checkpoint"):
        validate_spec(spec(checkpoint="no"))


def test_a_mirror_copy_runs_at_background_priority_in_its_own_thread_only() -> None:
    import os
    import threading

    from agents.shardfile import BACKGROUND_NICE, background_priority

    seen: list[int] = []

    def copy() -> None:  # what the mirror thread and the receiving handler do first
        background_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=copy)
    t.start()
    t.join()
    assert seen == [max(before, BACKGROUND_NICE)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # training threads keep theirs
