"""The lifecycle's effects carried out on a session (scheduler/store/effects.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from scheduler.core.clock import FakeClock
from scheduler.core.lifecycle import IllegalTransition, JobState, RankState, TransferState
from scheduler.core.placement import Candidate, ShardRead
from scheduler.server import service as svc
from scheduler.store.binder import bind
from scheduler.store.db import Database
from scheduler.store.effects import bind_job, move
from scheduler.store.models import Event, Job, Node, Rank, Transfer
from tests.db.test_store import ALICE, SPEC, setup_cluster

ONE_RANK = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}


def _job_row(j: Job) -> tuple:  # type: ignore[type-arg]
    return (j.state, j.reason, j.attempt, j.locality_wait_since, j.master_port, j.transfer_bytes,
            j.transfer_cost_ms, j.local_fraction, j.progress)


def test_bind_job_makes_the_same_job_row_and_event_as_the_binder_in_the_cycle(db: Database) -> None:
    clock = FakeClock(100.0)
    setup_cluster(db, clock)
    with db.session() as s:
        a, _ = svc.submit_job(s, clock.now(), ALICE, ONE_RANK, None)
        b, _ = svc.submit_job(s, clock.now(), ALICE, ONE_RANK, None)
        for job_id in (a, b):
            s.get(Job, job_id).progress = {"stale": True}
    # The rank on n2 reads shard 0 from n1: 1000 bytes to stage, none read locally.
    cand = lambda j, node: Candidate(j, (node,), 1, (ShardRead(0, 0, node, "n1", 1000),), 1000, 320)  # noqa: E731
    with db.session() as s:
        assert bind(s, clock.now(), a, cand(a, "n2")) is True
    with db.session() as s:
        bind_job(s, clock.now(), s.get(Job, b), cand(b, "n2"))
    with db.session() as s:
        ja, jb = s.get(Job, a), s.get(Job, b)
        assert _job_row(jb) == _job_row(ja) == ("BOUND", "bound to n2", 1, None, None, 1000, 320, 0.0, {})
        binds = [e.message for e in s.scalars(select(Event).where(Event.kind == "job.bind").order_by(Event.job_id))]
        assert binds == ["attempt 1 on n2; 1000 bytes to stage (~320 ms)"] * 2


def test_a_finish_stops_every_live_rank_and_records_the_state(db: Database) -> None:
    clock = FakeClock(100.0)
    setup_cluster(db, clock)
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, SPEC, None)
    with db.session() as s:
        job = s.get(Job, job_id)
        bind_job(s, clock.now(), job, Candidate(job_id, ("n1", "n2"), 1, (), 0, 0))
        for rank, (node, state) in enumerate((("n1", RankState.RUNNING), ("n2", RankState.EXITED))):
            s.add(Rank(job_id=job_id, attempt=1, rank=rank, node=node, devices=[0], state=state))
    with db.session() as s:
        move(s, clock.advance(5), s.get(Job, job_id), JobState.TIMEOUT, "ran past its time limit of 60s")
    with db.session() as s:
        job = s.get(Job, job_id)
        assert (job.state, job.reason, job.ended_at) == ("TIMEOUT", "ran past its time limit of 60s", 105.0)
        assert [r.state for r in s.scalars(select(Rank).order_by(Rank.rank))] == ["KILLING", "EXITED"]
        assert s.scalar(select(Event.message).where(Event.kind == "job.timeout")) == "ran past its time limit of 60s"


def test_running_closes_the_job_s_staging_transfers_and_counts_their_bytes(db: Database) -> None:
    clock = FakeClock(100.0)
    setup_cluster(db, clock)
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, ONE_RANK, None)
    with db.session() as s:
        job = s.get(Job, job_id)
        bind_job(s, clock.now(), job, Candidate(job_id, ("n2",), 1, (), 1000, 320))
        s.add(Transfer(job_id=job_id, dataset="d", shard=0, src="n1", dst="n2", bytes=1000, state=TransferState.JOB,
                       created_at=clock.now()))
    with db.session() as s:
        move(s, clock.advance(3), s.get(Job, job_id), JobState.RUNNING, "running", nodes=("n2",))
    with db.session() as s:
        job = s.get(Job, job_id)
        assert (job.state, job.started_at, job.progress) == ("RUNNING", 103.0, {"staged": True})
        t = s.scalar(select(Transfer))
        assert (t.state, t.ended_at) == ("done", 103.0)
        assert s.get(Node, "n2").staged_bytes == 1000 and s.get(Node, "n1").staged_bytes == 0
        assert s.scalar(select(Event.message).where(Event.kind == "job.running")) == "on n2"


def test_an_illegal_move_changes_nothing(db: Database) -> None:
    clock = FakeClock(100.0)
    setup_cluster(db, clock)
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, SPEC, None)
    with db.session() as s, pytest.raises(IllegalTransition):
        move(s, clock.now(), s.get(Job, job_id), JobState.RUNNING, "running", nodes=("n1",))
    with db.session() as s:
        job = s.get(Job, job_id)
        assert (job.state, job.reason, job.started_at) == ("PENDING", "submitted", None)
        assert [e.kind for e in s.scalars(select(Event).where(Event.job_id == job_id))] == ["job.submit"]
