"""A pending job's reason is stored as words (``Job.reason``) and as data (``explain["why"]``), written
together by submit, the cycle's report and a requeue; the metrics, the queue and explain read the data.
Run against SQLite and PostgreSQL alike (``db_url``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sqlalchemy.orm import Session

from scheduler.core.clock import FakeClock
from scheduler.core.reasons import Reason
from scheduler.server import service as svc
from scheduler.server.auth import Identity
from scheduler.server.cycle import run_cycle
from scheduler.server.heartbeat import process_heartbeat
from scheduler.server.metrics import collect, pending_by_kind
from scheduler.server.views import explain_view
from scheduler.store.db import Database
from scheduler.store.models import Job, Node
from tests.db.test_store import ALICE, SPEC, heartbeat, settings, setup_cluster

ONE = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}


def pending_series(s: Session, clock: FakeClock) -> dict[str, float]:
    """``gsched_jobs_pending_by_reason`` as ``/metrics`` shows it: label value -> pending jobs."""
    ctx = SimpleNamespace(clock=clock, settings=settings())
    fam = next(f for f in collect(s, ctx) if f.name == "gsched_jobs_pending_by_reason")
    return {sample.labels["reason"]: sample.value for sample in fam.samples}


def summary(s: Session, job_id: int) -> dict[str, Any]:
    return next(j for j in svc.queue_rows(s) if j["id"] == job_id)


def test_a_new_job_is_new_then_gets_the_cycles_reason_as_words_and_data(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock, nodes=("n1",))  # one device
    with db.session() as s:
        first, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)
        second, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)
    with db.read() as s:
        job = s.get(Job, second)
        assert job.reason == "submitted"
        assert job.explain["why"] == {"kind": "new", "message": "submitted", "at_s": None, "at_word": "until"}
        assert pending_by_kind(s) == {"new": 2}
        series = pending_series(s, clock)
        assert series["new"] == 2 and sum(series.values()) == 2
        assert (summary(s, second)["reason_kind"], summary(s, second)["reason_at_s"]) == ("new", None)

    now = clock.advance(1)
    assert run_cycle(db, settings(reserve_min_wait_s=0), now).bound == [first]
    with db.read() as s:
        job = s.get(Job, second)
        # The second fits nowhere: it holds the reservation (taken at once here) from when the first
        # ends by its limit (1 h).
        why = Reason.from_dict(job.explain["why"])
        assert job.reason == why.text() == f"devices busy: needs 1, 0 free; devices reserved for it from t={now + 3600:.0f}s"
        assert (why.kind, why.at_s, why.at_word) == ("reserved", now + 3600, "from")
        assert pending_by_kind(s) == {"reserved": 1}
        assert pending_series(s, clock)["reserved"] == 1
        row = summary(s, second)
        assert (row["reason"], row["reason_kind"], row["reason_at_s"], row["why"]) == (
            job.reason, "reserved", now + 3600, why.as_dict())
        doc = explain_view(s, job)
        assert (doc["pending_reason"], doc["reason_kind"], doc["reason_at_s"], doc["why"]) == (
            job.reason, "reserved", now + 3600, why.as_dict())
        bound = s.get(Job, first)
        assert bound.explain["why"] is None and summary(s, first)["why"] is None  # bound: no reason


def test_a_refused_bind_is_bind_failed_and_counted_as_other(db: Database) -> None:
    clock = FakeClock(100.0)
    setup_cluster(db, clock, nodes=("n1",))
    with db.session() as s:
        chosen, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)

    def node_lost() -> bool:
        with db.session() as s:
            s.get(Node, "n1").state = "down"
        return True

    run_cycle(db, settings(), clock.advance(1), fence=node_lost)
    with db.read() as s:
        job = s.get(Job, chosen)
        assert job.reason == "bind failed: node n1 is not up any more"
        assert job.explain["why"]["kind"] == "bind_failed"
        assert [c["why"]["kind"] for c in job.explain["candidates"]] == ["bind_failed"]
        assert pending_by_kind(s) == {"other": 1}  # the series' label values are as they were
        assert "bind_failed" not in pending_series(s, clock)


def test_a_requeued_job_is_requeued_and_keeps_its_last_explanation_until_the_next_report(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, SPEC, None)
    assert run_cycle(db, settings(), clock.advance(1)).bound == [job_id]
    with db.session() as s:
        job = s.get(Job, job_id)
        before = dict(job.explain)
        svc.requeue_job(s, clock.advance(5), job, "node n2 is down")
    with db.read() as s:
        job = s.get(Job, job_id)
        assert job.state == "PENDING" and job.reason == "requeued: node n2 is down"
        assert job.explain["why"] == {"kind": "requeued", "message": job.reason, "at_s": None, "at_word": "until"}
        assert {k: v for k, v in job.explain.items() if k != "why"} == {
            k: v for k, v in before.items() if k != "why"}  # the rest waits for the next report
        assert pending_by_kind(s) == {"requeued": 1}
        assert pending_series(s, clock)["requeued"] == 1
        assert summary(s, job_id)["reason_kind"] == "requeued"
    clock.advance(6)
    with db.session() as s:  # n1 keeps reporting, n2 is silent: the next cycle declares it down
        process_heartbeat(s, clock.now(), Identity("agent", "n1"), heartbeat("n1"))
    run_cycle(db, settings(), clock.advance(6))
    with db.read() as s:
        job = s.get(Job, job_id)
        assert job.reason == "more devices than the cluster has up: needs 2, the up nodes have 1"
        assert job.explain["why"]["kind"] == "too_large" and pending_by_kind(s) == {"too_large": 1}
