"""Delay scheduling on real agents: a job waits (boundedly) for the node holding its data.

Two agents; the data set lives only on node B; a blocker job holds B; node A is free.
With the blocker ended inside the wait, the job runs on B with local reads; with the blocker kept,
the job runs on A after the wait, staging its shards.
"""

from __future__ import annotations

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration
WAIT_S = 6.0


@pytest.fixture
def cluster(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = make_cluster([NodeSpec("a"), NodeSpec("b")], extra_env={"GSCHED_LOCALITY_WAIT_S": str(WAIT_S)})
    c.start_server()
    c.start_agent("b")
    c.wait_for(lambda: len(c.admin().get("/v1/nodes")) == 1, 30, "agent b")
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "1")
    c.start_agent("a")
    c.wait_for(lambda: len(c.admin().get("/v1/nodes")) == 2, 30, "agent a")
    blocker = tmp_path / "blocker.toml"
    blocker.write_text(job_toml("blocker", ranks=1, epochs=500))
    c.blocker = int(c.cli("submit", str(blocker)).stdout.split()[-1])  # type: ignore[attr-defined]
    doc = c.wait_job(c.blocker, "RUNNING", timeout=120)  # type: ignore[attr-defined]
    assert [r["node"] for r in doc["ranks"]] == ["b"]  # local data wins while both are free
    return c


def _bound_after_s(doc: dict) -> float:
    submit = next(e["time"] for e in doc["events"] if e["kind"] == "job.submit")
    bind = next(e["time"] for e in doc["events"] if e["kind"] == "job.bind")
    return float(bind - submit)


def test_job_waits_for_the_busy_data_node_and_runs_there_when_it_frees(cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = cluster
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("local", ranks=1, epochs=1))
    job_id = int(c.cli("submit", str(spec)).stdout.split()[-1])
    c.wait_for(lambda: "waiting for locality" in c.job(job_id)["reason"], 10, "the job to wait for locality")
    explain = c.admin().get(f"/v1/jobs/{job_id}/explain")
    assert explain["state"] == "PENDING" and "locality" in explain["pending_reason"]
    c.cli("cancel", str(c.blocker))  # b frees well inside the wait
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=180)
    assert doc["state"] == "COMPLETED"
    assert [r["node"] for r in doc["ranks"]] == ["b"]
    assert doc["transfer_bytes"] == 0 and all(s["local"] for s in doc["shards"])
    assert _bound_after_s(doc) < WAIT_S + 2


def test_job_takes_the_free_node_with_staging_once_the_wait_ends(cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = cluster
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("remote", ranks=1, epochs=1))
    job_id = int(c.cli("submit", str(spec)).stdout.split()[-1])
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=180)
    assert doc["state"] == "COMPLETED"
    assert [r["node"] for r in doc["ranks"]] == ["a"]
    assert doc["transfer_bytes"] > 0 and not any(s["local"] for s in doc["shards"])
    # Bound no earlier than the wait (and not much later: the cycle runs every 0.5 s).
    assert WAIT_S <= _bound_after_s(doc) < WAIT_S + 3
    c.cli("cancel", str(c.blocker))
