"""After a cycle binds ranks on a node, the server nudges its agent (scheduler/server/nudge.py), which then
heartbeats at once: with agents asked to report only every 60 s, a job still starts in seconds."""

from __future__ import annotations

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration
HEARTBEAT_S = 60.0


def test_a_bound_job_starts_without_waiting_for_the_next_heartbeat(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = make_cluster([NodeSpec("n1")], heartbeat_s=HEARTBEAT_S, ttl_s=3 * HEARTBEAT_S)
    c.start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "1")
    # data make's copies and the agent's report of them wake the agent; let it fall back to its 60 s tick
    c.wait_for(lambda: c.admin().get("/v1/datasets")[0]["replicas_healthy_min"] >= 1, 60, "the replicas reported")
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("nudged", ranks=1, epochs=1))
    job_id = int(c.cli("submit", str(spec)).stdout.split()[-1])
    doc = c.wait_job(job_id, "RUNNING", timeout=HEARTBEAT_S / 2)
    assert doc["started_at"] - doc["submitted_at"] < HEARTBEAT_S / 3
