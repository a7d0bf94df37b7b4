"""Limits with real processes on loopback: a job past its time limit, a rank that crashes."""

from __future__ import annotations

import os
import signal
import time

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml, rank_processes

pytestmark = pytest.mark.integration


@pytest.fixture
def two_nodes(make_cluster):  # type: ignore[no-untyped-def]
    c = make_cluster([NodeSpec("n1"), NodeSpec("n2")], ttl_s=4.0).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "2")
    return c


def _free_everywhere(c) -> bool:  # type: ignore[no-untyped-def]
    return all(n["devices_free"] == n["devices"] for n in c.admin().get("/v1/nodes"))


def test_a_job_past_its_time_limit_is_stopped_and_ends_timeout_with_its_checkpoints(two_nodes, tmp_path):  # type: ignore[no-untyped-def]
    c = two_nodes
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("endless", ranks=2, epochs=1000, limits='time = "30m"'))
    job_id = int(c.cli("submit", str(spec)).stdout.split()[-1])
    c.wait_job(job_id, "RUNNING", timeout=120)
    assert rank_processes(job_id, c.root)
    # Once it has finished four epochs (however long a loaded machine takes for them), its limit is
    # cut to a few seconds past now (``update --time``, down only for a running job): it must stop then.
    c.wait_for(lambda: len(c.job(job_id)["metrics"]) >= 4, 300, "four epochs")
    started = c.job(job_id)["started_at"]
    limit = int(time.time() - started) + 6
    c.cli("update", str(job_id), "--time", f"{limit}s")

    doc = c.wait_job(job_id, {"TIMEOUT", "COMPLETED", "FAILED"}, timeout=120)
    assert doc["state"] == "TIMEOUT", doc["reason"]
    assert f"time limit of {limit}s" in doc["reason"]
    # It ran its whole limit (never stopped early) and was stopped by it, not by its 1000 epochs (below);
    # how soon after the limit depends on the cycle and the machine's load, so no upper bound here.
    assert doc["ended_at"] - doc["started_at"] >= limit
    # The epochs it finished were checkpointed (and mirrored) before the limit struck: a resubmit could resume.
    assert doc["checkpoints"] and all(len(ck["nodes"]) >= 2 for ck in doc["checkpoints"])
    # An epoch's metrics line goes out before its checkpoint is written and mirrored, so the limit can
    # strike between the two: the last finished epoch may lack a checkpoint.  The job keeps the newest
    # 3 (keep_checkpoints' default), on disk as in the listing.
    epochs = [m["epoch"] for m in doc["metrics"]]
    ckpt_epochs = [ck["epoch"] for ck in doc["checkpoints"]]
    assert epochs == list(range(1, len(epochs) + 1)) and 4 <= len(epochs) < 1000
    last = epochs[-1] if ckpt_epochs[-1] == epochs[-1] else epochs[-1] - 1
    assert ckpt_epochs == [last - 2, last - 1, last]
    def on_disk(node: str) -> set[str]:
        return {p.name for p in (c.data_dir(node) / ".gsched" / "jobs" / str(job_id) / "checkpoints").glob("epoch-*.pt")}

    nodes = {n for ck in doc["checkpoints"] for n in ck["nodes"]}
    assert all(len(on_disk(n)) <= 3 for n in nodes)  # older ones were deleted on rank 0's node and the mirror
    # Every listed checkpoint is on disk on one of its nodes, except that the oldest may already be pruned
    # (on rank 0's node and on the mirror) for a newer one written just before the limit struck, which
    # the listing did not get: then that newer one is on disk.
    def kept(epoch: int, where: set[str]) -> bool:
        return any(f"epoch-{epoch:04d}.pt" in on_disk(n) for n in where)

    listed = doc["checkpoints"]
    assert all(kept(ck["epoch"], set(ck["nodes"])) for ck in listed[1:])
    assert kept(listed[0]["epoch"], set(listed[0]["nodes"])) or kept(listed[-1]["epoch"] + 1, nodes)
    # Every rank was stopped and its devices went back to the pool.
    c.wait_for(lambda: rank_processes(job_id, c.root) == [], 30, "the ranks to exit")
    c.wait_for(lambda: _free_everywhere(c), 30, "the devices to be free")
    assert [e["kind"] for e in doc["events"]].count("job.timeout") == 1


def test_a_crashed_rank_stops_its_gang_and_fails_the_job_naming_rank_code_and_log(two_nodes, tmp_path):  # type: ignore[no-untyped-def]
    c = two_nodes
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("crashy", ranks=2, epochs=1000))
    job_id = int(c.cli("submit", str(spec)).stdout.split()[-1])
    doc = c.wait_for(lambda: (d := c.job(job_id))["metrics"] and d, 120, "a first epoch")
    pids = rank_processes(job_id, c.root)
    assert len(pids) == 2
    rank1_node = next(r["node"] for r in doc["ranks"] if r["rank"] == 1)
    victim = next(p for p in pids if b"RANK=1" in open(f"/proc/{p}/environ", "rb").read().split(b"\0"))
    os.kill(victim, signal.SIGKILL)  # as the OOM killer would

    doc = c.wait_job(job_id, {"FAILED", "COMPLETED", "PENDING"}, timeout=60)
    assert doc["state"] == "FAILED", doc["reason"]
    assert f"rank 1 on {rank1_node} exited with code -9 (SIGKILL)" in doc["reason"]
    # The reason carries the last lines of the first failed rank's log (it printed its epochs).
    assert "epoch" in doc["reason"].lower()
    assert doc["restarts"] == 0 and doc["attempt"] == 1  # not retried: retry_on_failure defaults to 0
    # Its peer was stopped with it; nothing of the job runs any more, the devices are free.
    c.wait_for(lambda: rank_processes(job_id, c.root) == [], 30, "the surviving rank to be stopped")
    c.wait_for(lambda: _free_everywhere(c), 30, "the devices to be free")


def test_retry_on_failure_places_the_job_again_then_fails_it_past_the_bound(two_nodes, tmp_path):  # type: ignore[no-untyped-def]
    c = two_nodes
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("retried", ranks=1, epochs=1000, limits='time = "10m"\nretry_on_failure = 1'))
    job_id = int(c.cli("submit", str(spec)).stdout.split()[-1])

    def kill_the_rank(attempt: int) -> None:
        c.wait_for(lambda: (d := c.job(job_id))["state"] == "RUNNING" and d["attempt"] == attempt and d, 120,
                   f"attempt {attempt} to run")
        c.wait_for(lambda: len(rank_processes(job_id, c.root)) == 1, 60, "its rank process")
        os.kill(rank_processes(job_id, c.root)[0], signal.SIGKILL)

    kill_the_rank(1)
    doc = c.wait_for(lambda: (d := c.job(job_id))["attempt"] == 2 and d, 60, "the retry")
    requeue = [e["message"] for e in doc["events"] if e["kind"] == "job.requeue"]
    assert len(requeue) == 1 and "exited with code -9 (SIGKILL); retry 1 of 1" in requeue[0]
    kill_the_rank(2)
    doc = c.wait_job(job_id, {"FAILED", "COMPLETED"}, timeout=60)
    assert doc["state"] == "FAILED" and "rank 0 on" in doc["reason"] and "code -9" in doc["reason"]
    assert doc["attempt"] == 2 and doc["restarts"] == 0  # a retry is not a node-loss restart
