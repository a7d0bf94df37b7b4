"""The snapshot carries what preemption needs of a running job's spec: ``[limits] preemptible``."""

from __future__ import annotations

from scheduler.core.jobspec import validate_spec
from scheduler.core.lifecycle import JobState, RankState
from scheduler.store.db import Database
from scheduler.store.models import Job, Rank
from scheduler.store.snapshot_reader import build_snapshot


def _running(s, job_id: int, limits: dict) -> None:  # type: ignore[no-untyped-def]
    spec = validate_spec({"name": f"j{job_id}", "resources": {"ranks": 1, "gpus_per_rank": 1},
                         "data": {"dataset": "tiny"}, "limits": limits})
    s.add(Job(id=job_id, name=f"j{job_id}", user="alice", state=JobState.RUNNING, submitted_at=0.0,
              pending_since=0.0, started_at=10.0, attempt=1, spec=spec.model_dump()))
    s.flush()
    s.add(Rank(job_id=job_id, attempt=1, rank=0, node="n1", devices=[job_id], state=RankState.RUNNING))


def test_running_jobs_say_whether_they_may_be_preempted(db: Database) -> None:
    with db.session() as s:
        _running(s, 1, {})
        _running(s, 2, {"preemptible": False})
    with db.read() as s:
        snap = build_snapshot(s, 100.0)
    assert {r.id: r.preemptible for r in snap.running} == {1: True, 2: False}
