"""What a rank starts with (agents/rankenv.py), and how a [run] job's checkpoint files are taken
(agents/ckptwatch.py): pure functions and a real directory, no processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.ckptwatch import CheckpointWatch, copy_checkpoint
from agents.rankenv import RankFacts, rank_env
from agents.runas import NO_MAPPING, AccountError, resolve
from scheduler.protocol.runspec import RESERVED_ENV, reserved

FACTS = RankFacts(job_id=7, attempt=3, rank=2, local_rank=0, world_size=4, local_world_size=2, group_rank=1,
                  group_world_size=2, master_addr="10.0.0.1", master_port=29501, devices=[3, 5], device_kind="cuda",
                  threads=4, dataset="digits", shards=["/d/digits/00001.shard", "/d/digits/00004.shard"],
                  shard_list="/d/.gsched/jobs/7/attempt-3/rank-2.shards", checkpoint_dir="/d/.gsched/jobs/7/out",
                  resume_from="/d/.gsched/jobs/7/checkpoints/epoch-0002.pt", metrics_file="/d/m.jsonl")


def test_a_rank_gets_torchruns_environment_and_gscheds() -> None:
    env = rank_env({"PATH": "/usr/bin", "GSCHED_TOKEN": "gsa_secret", "HOME": "/root"}, FACTS,
                   extra={"HF_HOME": "/data/hf"}, account={"HOME": "/home/alice", "USER": "alice"})
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                                "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "ROLE_RANK": "2", "ROLE_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29501"}
    # attempt 3 is torchrun's third start: two restarts before it
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_RUN_ID"]) == ("2", "gsched-7")
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"], env["OMP_NUM_THREADS"]) == ("3,5", "PCI_BUS_ID", "4")
    assert env["GSCHED_SHARDS"] == "/d/digits/00001.shard" + os.pathsep + "/d/digits/00004.shard"
    assert (env["GSCHED_JOB_ID"], env["GSCHED_ATTEMPT"], env["GSCHED_DATASET"]) == ("7", "3", "digits")
    assert env["GSCHED_RESUME_FROM"].endswith("epoch-0002.pt") and env["GSCHED_CHECKPOINT_DIR"].endswith("/out")
    # the agent's credentials never reach a rank; the account's HOME replaces the agent's
    assert "GSCHED_TOKEN" not in env and env["HOME"] == "/home/alice" and env["HF_HOME"] == "/data/hf"
    # every name gsched sets is one a job's env may not set
    assert all(reserved(k) for k in env if k.startswith("GSCHED_") or k in RESERVED_ENV)
    assert {k for k in env if k not in ("PATH", "HOME", "USER", "HF_HOME", "PYTHONUNBUFFERED")} == {
        k for k in env if reserved(k)}


def test_an_array_jobs_index_comes_from_the_assignment_and_nothing_else_does() -> None:
    assigned = {"GSCHED_ARRAY_JOB_ID": "7", "GSCHED_ARRAY_INDEX": "3", "GSCHED_ARRAY_COUNT": "10",
                "GSCHED_JOB_ID": "666", "LD_PRELOAD": "/tmp/evil.so"}
    env = rank_env({}, FACTS, assigned=assigned)
    assert (env["GSCHED_ARRAY_JOB_ID"], env["GSCHED_ARRAY_INDEX"], env["GSCHED_ARRAY_COUNT"]) == ("7", "3", "10")
    # only the array's names are taken from it: the rank's own facts stand, and nothing else is added
    assert env["GSCHED_JOB_ID"] == str(FACTS.job_id) and "LD_PRELOAD" not in env


def test_a_cpu_rank_sees_no_cuda_device() -> None:
    env = rank_env({}, RankFacts(**{**FACTS.__dict__, "device_kind": "cpu", "resume_from": ""}))
    assert env["CUDA_VISIBLE_DEVICES"] == "" and "CUDA_DEVICE_ORDER" not in env and env["GSCHED_RESUME_FROM"] == ""


def touch(path: Path, text: str, mtime_s: float) -> None:
    path.write_text(text)
    os.utime(path, (mtime_s, mtime_s))


def test_a_file_is_a_checkpoint_once_it_stops_changing(tmp_path: Path) -> None:
    (tmp_path / "old.pt").write_text("from an earlier attempt")
    w = CheckpointWatch(tmp_path, owner=None, next_epoch=5)  # the attempt resumed from checkpoint 4
    w.prime()
    touch(tmp_path / "ckpt-1.pt", "a", 1000)
    assert w.scan() == [] and w.pending()  # seen once: it may still be written
    assert w.scan() == [("ckpt-1.pt", 5)] and not w.pending()  # unchanged since: taken, number 5
    assert w.scan() == []
    touch(tmp_path / "ckpt-1.pt", "bb", 1001)  # overwritten in place (one latest.pt style file)
    touch(tmp_path / ".ckpt-2.pt", "partial", 1001)  # hidden and temporary files are never taken
    touch(tmp_path / "ckpt-2.pt.tmp", "partial", 1001)
    assert w.scan() == []
    assert w.scan() == [("ckpt-1.pt", 6)]
    touch(tmp_path / "ckpt-3.pt", "c", 1002)
    assert w.scan(final=True) == [("ckpt-3.pt", 7)]  # the rank has ended: nothing is still being written


def test_symlinks_and_other_owners_files_are_not_checkpoints(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root's")
    out = tmp_path / "out"
    out.mkdir()
    (out / "evil.pt").symlink_to(secret)
    w = CheckpointWatch(out, owner=os.geteuid() + 1, next_epoch=1)  # files must be that account's
    (out / "mine.pt").write_text("x")
    assert w.scan(final=True) == []
    assert copy_checkpoint(out / "evil.pt", tmp_path / "copy.pt", None) is None and not (tmp_path / "copy.pt").exists()
    assert copy_checkpoint(out / "mine.pt", tmp_path / "copy.pt", os.geteuid() + 1) is None
    assert copy_checkpoint(out / "mine.pt", tmp_path / "copy.pt", os.geteuid()) == 1
    assert (tmp_path / "copy.pt").read_text() == "x"


def test_accounts_that_cannot_be_used_are_refused_saying_why() -> None:
    with pytest.raises(AccountError, match="gsched user carol has no Unix account"):
        resolve(NO_MAPPING, "n1", "carol")
    with pytest.raises(AccountError, match="there is no Unix account 'gs-no-such-account' on node n1"):
        resolve("gs-no-such-account", "n1")
    me = resolve(None, "n1")
    assert me.uid == os.geteuid() and not me.switch and me.env() == {}


def test_the_agent_path_starts_without_torch() -> None:
    code = ("import sys, agents.agent, agents.launcher, agents.rankenv, agents.runas, agents.ckptwatch\n"
            "print('torch' in sys.modules)")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", (out.stdout, out.stderr, time.monotonic() - t0)
