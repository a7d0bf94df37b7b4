"""Two servers on one PostgreSQL database: one schedules, both serve; the standby takes over."""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import create_engine, text

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration


def test_killing_the_leader_hands_scheduling_to_the_standby(make_cluster, postgres, tmp_path):  # type: ignore[no-untyped-def]
    url = postgres.new_database()
    c = make_cluster([NodeSpec("n1"), NodeSpec("n2")], db=url, servers=2, ttl_s=10.0,
                     extra_env={"GSCHED_LEASE_TTL_S": "3"}).start()
    leader = c.wait_for(lambda: c.leader() is not None and c.leader() + 1, 30, "a leader") - 1
    standby = 1 - leader
    assert c.health(standby)["leader"] is False  # exactly one schedules; both answer
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "2")
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("ha", ranks=2, epochs=3))
    first = int(c.cli("submit", str(spec)).stdout.split()[-1])
    c.wait_job(first, "RUNNING", timeout=120)

    c.kill(c.server_name(leader), signal.SIGKILL)
    t_kill = time.time()
    c.wait_for(lambda: c.health(standby) and c.health(standby)["leader"], 20, "the standby to take the lease")
    took_over_s = time.time() - t_kill
    assert took_over_s < 10  # lease TTL 3 s plus a cycle interval or two

    # The running job was not disturbed, and new work is scheduled by the new leader.
    second = int(c.cli("submit", str(spec)).stdout.split()[-1])  # the CLI fails over to the standby
    for job_id in (first, second):
        doc = c.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=300)
        assert doc["state"] == "COMPLETED", doc["reason"]
        assert doc["attempt"] == 1
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT time, durations, leader FROM cluster_samples ORDER BY time")).all()
    engine.dispose()
    leaders = [r.leader for r in rows]
    assert len(set(leaders)) == 2 and "" not in leaders
    # Never two cycles at once: every cycle ends before the next one (of any leader) starts.
    spans = [(r.time, r.time + sum((r.durations or {}).values())) for r in rows]
    for (_s1, e1), (s2, _) in zip(spans, spans[1:], strict=False):
        assert s2 >= e1
    # The handover shows in the record: the old leader's cycles, then only the new one's.
    switch = next(i for i, ld in enumerate(leaders) if ld != leaders[0])
    assert len(set(leaders[switch:])) == 1
