"""The spine, end to end: a real server and two agent processes on loopback train a 2-rank job."""

from __future__ import annotations

import math
import re

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml, rank_processes

pytestmark = pytest.mark.integration


@pytest.fixture
def two_nodes(make_cluster, db_url):  # type: ignore[no-untyped-def]
    """Two nodes and a server on each database backend (SQLite file, throw-away PostgreSQL 15)."""
    c = make_cluster([NodeSpec("n1", "r1", gpus=1), NodeSpec("n2", "r1", gpus=1)], db=db_url).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "4", "--replicas", "2")
    return c


def test_two_rank_job_trains_to_completion_on_the_nodes_holding_its_data(two_nodes, tmp_path):  # type: ignore[no-untyped-def]
    c = two_nodes
    alice = c.add_user("alice")
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("e2e", ranks=2, epochs=3))
    out = c.cli("submit", str(spec), token=alice)
    job_id = int(out.stdout.strip().splitlines()[-1])

    doc = c.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    assert doc["user"] == "alice"
    # One rank on each node, each with its own device.
    assert sorted(r["node"] for r in doc["ranks"]) == ["n1", "n2"]
    assert all(r["state"] == "EXITED" and r["exit_code"] == 0 for r in doc["ranks"])
    # Every shard was read from the rank's own disk: nothing staged.
    assert {s["shard"] for s in doc["shards"]} == {0, 1, 2, 3}
    assert all(s["local"] for s in doc["shards"])
    assert doc["local_fraction"] == 1.0 and doc["transfer_bytes"] == 0
    # Per-epoch metrics reached the server: finite, decreasing loss.
    losses = [m["loss"] for m in doc["metrics"]]
    assert [m["epoch"] for m in doc["metrics"]] == [1, 2, 3]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    # A checkpoint per epoch, on disk on rank 0's node.
    assert [ck["epoch"] for ck in doc["checkpoints"]] == [1, 2, 3]
    rank0 = next(r["node"] for r in doc["ranks"] if r["rank"] == 0)
    last = doc["checkpoints"][-1]
    assert rank0 in last["nodes"]
    ckpt_file = c.data_dir(rank0) / ".gsched" / "jobs" / str(job_id) / "checkpoints" / "epoch-0003.pt"
    assert ckpt_file.is_file() and ckpt_file.stat().st_size == last["bytes"]
    # The queue, show --json and logs answer with the documented fields.
    shown = c.cli("show", str(job_id), "--json", token=alice).stdout
    for key in ("id", "name", "user", "state", "ranks", "shards", "local_fraction", "transfer_bytes", "metrics", "reason"):
        assert f'"{key}"' in shown
    logs = c.cli("logs", str(job_id), "--rank", "0", token=alice).stdout
    assert "epoch" in logs.lower()
    # The rank's CPU threads: torch's pool and OpenMP's are set alike, as torchrun sets them.
    started = re.search(r"started: device cpu, backend gloo, (\d+) CPU threads \(OMP_NUM_THREADS=(\d+)\)", logs)
    assert started is not None and started.group(1) == started.group(2), logs[:400]
    # Devices are back in the pool.
    assert all(n["devices_free"] == 1 for n in c.admin().get("/v1/nodes"))


def test_cancel_kills_every_rank_and_frees_devices(two_nodes, tmp_path):  # type: ignore[no-untyped-def]
    c = two_nodes
    bob = c.add_user("bob")
    spec = tmp_path / "long.toml"
    spec.write_text(job_toml("long", ranks=2, epochs=200))
    job_id = int(c.cli("submit", str(spec), token=bob).stdout.split()[-1])
    c.wait_job(job_id, "RUNNING", timeout=120)
    c.wait_for(lambda: len(rank_processes(job_id, c.root)) == 2, 60, "both rank processes to exist")

    out = c.cli("cancel", str(job_id), token=bob)
    assert "CANCELLED" in out.stdout
    c.wait_for(lambda: not rank_processes(job_id, c.root), 60, "every rank process to be gone")
    c.wait_for(lambda: all(n["devices_free"] == 1 for n in c.admin().get("/v1/nodes")), 30, "devices to be freed")
    doc = c.job(job_id)
    assert doc["state"] == "CANCELLED"
    assert all(r["state"] == "KILLED" for r in doc["ranks"])
    # A second cancel is refused with a clear message.
    again = c.cli("cancel", str(job_id), token=bob, check=False)
    assert again.returncode != 0 and "already CANCELLED" in again.stderr
