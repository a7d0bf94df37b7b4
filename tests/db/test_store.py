"""The control plane's store, run against SQLite and a real PostgreSQL alike (``db_url`` fixture).

No processes here: the service functions, the heartbeat protocol and the cycle are driven directly
with a fake clock, so each test reads as the sequence of requests a real cluster would make.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import select, text

from scheduler.core.clock import FakeClock
from scheduler.core.errors import Forbidden
from scheduler.core.placement import Candidate
from scheduler.core.policy_config import PolicyConfig
from scheduler.protocol.messages import Heartbeat, MetricIn
from scheduler.server import service as svc
from scheduler.server.auth import Identity
from scheduler.server.config import Settings
from scheduler.server.cycle import run_cycle
from scheduler.server.heartbeat import process_heartbeat
from scheduler.server.views import explain_view
from scheduler.store import binder
from scheduler.store.binder import bind, bind_all
from scheduler.store.db import Database
from scheduler.store.leader import holds, try_lead
from scheduler.store.models import Base, ClusterSample, Dataset, Job, Node, Rank, Replica, Shard

SHA = "ab" * 32
ADMIN = Identity("admin", "admin")
ALICE = Identity("user", "alice")


def settings(**policy) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(heartbeat_ttl_s=10.0, policy=replace(PolicyConfig(locality_wait_s=0), **policy))


def heartbeat(node: str, ranks=(), devices: int = 1, replicas=None, rack: str = "r1") -> Heartbeat:  # type: ignore[no-untyped-def]
    return Heartbeat.model_validate({
        "node": node, "rack": rack, "address": f"127.0.0.1:{9000 + int(node[-1])}", "incarnation": f"inc-{node}",
        "devices": [{"index": i} for i in range(devices)], "replicas": replicas, "ranks": list(ranks)})


def setup_cluster(db: Database, clock: FakeClock, nodes=("n1", "n2")) -> None:  # type: ignore[no-untyped-def]
    with db.session() as s:
        svc.add_user(s, clock.now(), None, "admin", 1, role="admin")
        svc.add_user(s, clock.now(), None, "alice", 1)
        s.add(Dataset(name="d", source="test", classes=2, image_shape=[8, 8, 1], replicas_required=1,
                      owner="admin", created_at=0))
        s.add(Shard(dataset="d", index=0, bytes=1000, sha256=SHA, samples=10))
        s.add(Shard(dataset="d", index=1, bytes=1000, sha256=SHA, samples=10))
    for n in nodes:
        with db.session() as s:
            process_heartbeat(s, clock.now(), Identity("agent", n), heartbeat(
                n, replicas=[{"dataset": "d", "shard": i, "bytes": 1000, "sha256": SHA} for i in (0, 1)]))


HEAD = "0014"  # the newest migration in migrations/versions

SPEC = {"name": "j", "resources": {"ranks": 2, "gpus_per_rank": 1}, "data": {"dataset": "d"},
        "train": {"epochs": 1}, "limits": {"time": "1h"}}


def test_migrations_bring_an_empty_database_to_head(db: Database) -> None:
    assert db.current_revision() == HEAD
    db.upgrade()  # idempotent
    assert db.current_revision() == HEAD


def test_upgrade_from_the_previous_revision_keeps_every_row(db_url: str) -> None:
    d = Database(db_url)
    d.upgrade("0001")
    with d.engine.begin() as conn:
        conn.execute(text("INSERT INTO users (name, token_hash, shares, role, created_at) "
                          "VALUES ('alice', 'h1', 2.0, 'user', 1.0)"))
        conn.execute(text("INSERT INTO jobs (name, \"user\", spec, state, reason, submitted_at, pending_since, attempt, "
                          "restarts, failures, transfer_bytes, transfer_cost_ms, local_fraction, factor, priority, "
                          "explain, progress) VALUES ('j', 'alice', '{}', 'PENDING', '', 5.0, 5.0, 0, 0, 0, 0, 0, "
                          "1.0, 1.0, 0.0, '{}', '{}')"))
        conn.execute(text("INSERT INTO cluster_samples (time, devices_total, devices_busy, pending, running, durations) "
                          "VALUES (7.0, 4, 2, 1, 1, '{}')"))
        conn.execute(text("INSERT INTO datasets (name, source, classes, image_shape, replicas_required, owner, "
                          "created_at) VALUES ('digits', 'digits', 10, '[8, 8, 1]', 2, 'alice', 3.0)"))
    d.upgrade()
    assert d.current_revision() == HEAD
    with d.engine.connect() as conn:
        assert conn.execute(text("SELECT name, shares FROM users")).all() == [("alice", 2.0)]
        assert conn.execute(text("SELECT name, state, submitted_at, locality_wait_since FROM jobs")).all() == [
            ("j", "PENDING", 5.0, None)]
        assert conn.execute(text("SELECT devices_busy, leader FROM cluster_samples")).all() == [(2, "")]
        assert conn.execute(text("SELECT count(*) FROM leases")).scalar() == 0
        # a data set stored before spans: laid out whole (span 1), as it was
        assert conn.execute(text("SELECT name, replicas_required, span FROM datasets")).all() == [("digits", 2, 1)]
    d.dispose()


def test_a_retried_submit_with_the_same_request_id_stores_one_job(db: Database) -> None:
    clock = FakeClock(100.0)
    setup_cluster(db, clock)
    with db.session() as s:
        first = svc.submit_job(s, clock.now(), ALICE, SPEC, "req-1")
    with db.session() as s:
        again = svc.submit_job(s, clock.now(), ALICE, SPEC, "req-1")
        other = svc.submit_job(s, clock.now(), ALICE, SPEC, "req-2")
    assert first == (first[0], True) and again == (first[0], False) and other[1] is True
    with db.session() as s:
        assert len(list(s.scalars(select(Job)))) == 2


def test_agents_cannot_submit_and_users_cannot_report_for_a_node(db: Database) -> None:
    clock = FakeClock(100.0)
    setup_cluster(db, clock)
    with db.session() as s, pytest.raises(Forbidden):
        svc.submit_job(s, clock.now(), Identity("agent", "n1"), SPEC, None)
    with db.session() as s, pytest.raises(Forbidden):
        process_heartbeat(s, clock.now(), ALICE, heartbeat("n1"))
    with db.session() as s, pytest.raises(Forbidden):
        process_heartbeat(s, clock.now(), Identity("agent", "n2"), heartbeat("n1"))


def test_bind_rechecks_devices_so_none_is_given_twice(db: Database) -> None:
    clock = FakeClock(100.0)
    setup_cluster(db, clock, nodes=("n1",))
    spec = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}
    with db.session() as s:
        a, _ = svc.submit_job(s, clock.now(), ALICE, spec, None)
        b, _ = svc.submit_job(s, clock.now(), ALICE, spec, None)
    cand = lambda j: Candidate(j, ("n1",), 1, (), 0, 0)  # noqa: E731 - both want n1's only device
    with db.session() as s:
        assert bind(s, clock.now(), a, cand(a)) is True
    with db.session() as s:
        assert bind(s, clock.now(), b, cand(b)) is False  # a stale decision binds nothing
    with db.session() as s:
        assert [r.devices for r in s.scalars(select(Rank))] == [[0]]
        assert s.get(Job, b).state == "PENDING"


def test_jobs_bound_in_one_batch_see_each_others_devices_taken(db: Database) -> None:
    """bind_all binds a decision in batches (one transaction each); within a batch a job sees the
    devices the jobs before it took, so a stale decision naming the same device twice binds it once."""
    clock = FakeClock(100.0)
    setup_cluster(db, clock, nodes=("n1",))
    spec = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}
    with db.session() as s:
        a, _ = svc.submit_job(s, clock.now(), ALICE, spec, None)
        b, _ = svc.submit_job(s, clock.now(), ALICE, spec, None)
    both = {j: Candidate(j, ("n1",), 1, (), 0, 0) for j in (a, b)}  # both want n1's only device
    out = bind_all(db, clock.now(), both)
    assert out.jobs == [a] and out.nodes == {"n1"}
    assert out.refused == {b: "devices on n1 became taken since the snapshot (0 free, 1 needed)"}
    with db.read() as s:
        assert [(r.job_id, r.devices) for r in s.scalars(select(Rank))] == [(a, [0])]
        assert (s.get(Job, a).state, s.get(Job, b).state) == ("BOUND", "PENDING")


def test_a_batch_that_fails_is_bound_again_one_job_at_a_time(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error in one job's bind rolls its batch back; the batch is bound again job by job, so the
    others are bound and the error reaches the caller only from the failing job alone."""
    clock = FakeClock(100.0)
    setup_cluster(db, clock, nodes=("n1", "n2"))
    spec = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}
    with db.session() as s:
        ok, _ = svc.submit_job(s, clock.now(), ALICE, spec, None)
        bad, _ = svc.submit_job(s, clock.now(), ALICE, spec, None)
    real = binder.try_bind

    def failing(s, now, job_id, cand, clock=None, holdings=None, disk_floor_bytes=0):  # type: ignore[no-untyped-def]
        out = real(s, now, job_id, cand, clock, holdings, disk_floor_bytes)
        if job_id == bad:
            raise RuntimeError("the database went away")
        return out

    monkeypatch.setattr(binder, "try_bind", failing)
    with pytest.raises(RuntimeError, match="went away"):
        bind_all(db, clock.now(), {ok: Candidate(ok, ("n1",), 1, (), 0, 0), bad: Candidate(bad, ("n2",), 1, (), 0, 0)})
    with db.read() as s:
        assert (s.get(Job, ok).state, s.get(Job, bad).state) == ("BOUND", "PENDING")
        assert [r.job_id for r in s.scalars(select(Rank))] == [ok]


@pytest.mark.parametrize("change", ["devices taken", "node down"])
def test_a_bind_that_fails_its_recheck_is_counted_and_explained_as_failed(db: Database, change: str) -> None:
    """Between the snapshot and the bind the world moves on (heartbeats run between the phases; the
    fence is the last call before binding): the chosen job stays PENDING, the cycle counts the failed
    bind, and the job's explanation says that the bind failed and why, not "bound"."""
    clock = FakeClock(100.0)
    setup_cluster(db, clock, nodes=("n1",))
    spec = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}
    with db.session() as s:
        chosen, _ = svc.submit_job(s, clock.now(), ALICE, spec, None)
        other, _ = svc.submit_job(s, clock.now(), ALICE, spec, None)  # waits: n1 has one device

    def meanwhile() -> bool:
        with db.session() as s:
            if change == "devices taken":  # a stale decision elsewhere took n1's only device
                assert bind(s, clock.now(), other, Candidate(other, ("n1",), 1, (), 0, 0)) is True
            else:
                s.get(Node, "n1").state = "down"
        return True

    report = run_cycle(db, settings(), clock.advance(1), fence=meanwhile)
    why = {"devices taken": "devices on n1 became taken since the snapshot (0 free, 1 needed)",
           "node down": "node n1 is not up any more"}[change]
    assert report.bound == [] and report.refused == {chosen: why}
    assert report.counts["bind_failed"] == 1 and report.counts["bound"] == 0
    assert "bind" in report.durations_s
    with db.read() as s:
        job = s.get(Job, chosen)
        assert job.state == "PENDING" and job.attempt == 0
        assert job.reason == job.explain["reason"] == f"bind failed: {why}"
        assert [(c["chosen"], c["reason"]) for c in job.explain["candidates"]] == [(False, f"bind failed: {why}")]
        assert list(s.scalars(select(Rank).where(Rank.job_id == chosen))) == []


def test_every_phase_of_the_cycle_is_timed_bind_included(db: Database) -> None:
    clock = FakeClock(100.0)
    setup_cluster(db, clock)
    with db.session() as s:
        svc.submit_job(s, clock.now(), ALICE, SPEC, None)
    report = run_cycle(db, settings(), clock.advance(1))
    assert list(report.durations_s) == ["expire", "limits", "usage", "dependencies", "snapshot", "decide", "bind", "replicate",
                                        "report", "thin"]
    assert report.counts["bound"] == 1 and report.counts["bind_failed"] == 0
    with db.read() as s:  # the cluster sample holds the phases that ran before it was written
        sample = s.scalars(select(ClusterSample)).one()
        assert list(sample.durations) == ["expire", "limits", "usage", "dependencies", "snapshot", "decide", "bind", "replicate"]


def bound_job(db: Database, spec: dict = SPEC) -> tuple[FakeClock, int]:  # type: ignore[type-arg]
    """A two-node cluster, alice's job submitted and bound by one cycle: (the clock, the job id)."""
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, spec, None)
    run_cycle(db, settings(), clock.advance(1))
    return clock, job_id


def test_a_job_goes_pending_bound_running_completed_through_cycle_and_heartbeats(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, SPEC, None)
    report = run_cycle(db, settings(), clock.advance(1))
    assert report.bound == [job_id]
    with db.session() as s:
        ranks = list(s.scalars(select(Rank).where(Rank.job_id == job_id).order_by(Rank.rank)))
        assert sorted(r.node for r in ranks) == ["n1", "n2"]  # one device each: one rank on each node
        assert s.get(Job, job_id).state == "BOUND"
    for state, code in (("STAGING", None), ("RUNNING", None), ("EXITED", 0)):
        clock.advance(1)
        for r in ranks:
            with db.session() as s:
                reply = process_heartbeat(s, clock.now(), Identity("agent", r.node), heartbeat(r.node, ranks=[
                    {"job_id": job_id, "attempt": 1, "rank": r.rank, "state": state, "exit_code": code}]))
            if state == "STAGING":  # still getting ready: the whole assignment again (rank 1 waits for the port)
                assert [a["rank"] for a in reply["assignments"]] == [r.rank]
            elif state == "RUNNING":  # running: nothing to tell it but where to mirror its checkpoints
                assert reply["assignments"] == [] and [p["name"] for p in reply["peers"]] == [{"n1": "n2", "n2": "n1"}[r.node]]
            else:
                assert reply["assignments"] == [] and "peers" not in reply
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job.state == "COMPLETED" and job.ended_at == clock.now()
        assert [e.kind for e in s.scalars(select(svc.Event).where(svc.Event.job_id == job_id).order_by(svc.Event.id))] == [
            "job.submit", "job.bind", "job.running", "job.completed"]


def test_a_silent_node_is_marked_down_and_its_job_requeued(db: Database) -> None:
    clock, job_id = bound_job(db)
    clock.advance(5)
    with db.session() as s:  # n1 keeps reporting, n2 goes silent
        process_heartbeat(s, clock.now(), Identity("agent", "n1"), heartbeat("n1"))
    run_cycle(db, settings(), clock.advance(6))  # n2 last seen 12 s ago > ttl 10 s
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job.state == "PENDING" and job.restarts == 1
        requeue = s.scalar(select(svc.Event).where(svc.Event.job_id == job_id, svc.Event.kind == "job.requeue"))
        assert "node n2 is down" in requeue.message
        assert {r.state for r in s.scalars(select(Rank).where(Rank.job_id == job_id))} == {"KILLING"}
        assert s.scalar(select(Replica).where(Replica.node == "n2")).node == "n2"  # data records kept


@pytest.mark.parametrize("then", ["the rank is reported stopped", "its node is declared down"])
def test_a_requeued_job_is_bound_again_only_once_its_last_attempts_ranks_have_stopped(db: Database, then: str) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock, nodes=("n1", "n2", "n3"))
    with db.session() as s:  # a copy of each shard on every node, kept there (the re-balance drops none)
        s.get(Dataset, "d").replicas_required = 3
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, SPEC, None)
    run_cycle(db, settings(), clock.advance(1))
    with db.session() as s:
        nodes = {r.rank: r.node for r in s.scalars(select(Rank).where(Rank.job_id == job_id))}
    restarted, other = nodes[0], nodes[1]
    for rank, n in nodes.items():
        with db.session() as s:
            process_heartbeat(s, clock.advance(0.1), Identity("agent", n), heartbeat(n, ranks=[
                {"job_id": job_id, "attempt": 1, "rank": rank, "state": "RUNNING"}]))
    with db.session() as s:  # rank 0's agent restarts: the job is requeued and rank 1 is told to stop
        process_heartbeat(s, clock.advance(1), Identity("agent", restarted),
                          heartbeat(restarted, replicas=[{"dataset": "d", "shard": i, "bytes": 1000, "sha256": SHA}
                                                         for i in (0, 1)]).model_copy(update={"incarnation": "new"}))
    with db.session() as s:
        assert s.get(Job, job_id).state == "PENDING"
        assert s.scalar(select(Rank.state).where(Rank.job_id == job_id, Rank.rank == 1)) == "KILLING"
    for n in ("n1", "n2", "n3"):  # every node still up and reporting; rank 1's node has not stopped it yet
        with db.session() as s:
            process_heartbeat(s, clock.advance(0.1), Identity("agent", n), heartbeat(n, ranks=[
                {"job_id": job_id, "attempt": 1, "rank": 1, "state": "RUNNING"}] if n == other else []))
    report = run_cycle(db, settings(), clock.advance(1))
    assert job_id not in report.bound  # two devices are free, but attempt 1's rank 1 still runs on an up node
    with db.session() as s:
        assert s.get(Job, job_id).attempt == 1
        # and `gsched explain` says what it waits for
        assert explain_view(s, s.get(Job, job_id))["stopping"] == [
            {"node": other, "rank": 1, "attempt": 1, "state": "KILLING"}]
    if then == "the rank is reported stopped":
        with db.session() as s:
            process_heartbeat(s, clock.advance(1), Identity("agent", other), heartbeat(other, ranks=[
                {"job_id": job_id, "attempt": 1, "rank": 1, "state": "KILLED", "exit_code": -15}]))
    else:  # silent past the TTL: its fence stopped the rank before the server declared it down
        clock.advance(6)
        for n in ("n1", "n2", "n3"):
            if n != other:
                with db.session() as s:
                    process_heartbeat(s, clock.now(), Identity("agent", n), heartbeat(n))
        run_cycle(db, settings(), clock.advance(6))  # the other node is down now (12 s > 10 s)
    with db.session() as s:
        assert explain_view(s, s.get(Job, job_id))["stopping"] == []  # stopped, or on a node that is down
    report = run_cycle(db, settings(), clock.advance(1))
    with db.session() as s:
        assert s.get(Job, job_id).state == "BOUND" and s.get(Job, job_id).attempt == 2
        assert len(list(s.scalars(select(Rank).where(Rank.job_id == job_id, Rank.attempt == 2)))) == 2


def test_past_max_restarts_a_job_fails_with_its_history(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock, nodes=("n1", "n2", "n3"))
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, {**SPEC, "limits": {"time": "1h", "max_restarts": 1}}, None)
    for attempt in (1, 2):
        run_cycle(db, settings(), clock.advance(1))
        with db.session() as s:
            nodes = sorted(r.node for r in s.scalars(select(Rank).where(Rank.job_id == job_id, Rank.attempt == attempt)))
        assert len(nodes) == 2, nodes
        victim = nodes[1]
        clock.advance(5)
        for n in ("n1", "n2", "n3"):  # every node but the victim keeps reporting
            if n != victim:
                with db.session() as s:
                    process_heartbeat(s, clock.now(), Identity("agent", n), heartbeat(n))
        run_cycle(db, settings(), clock.advance(6))  # the victim is past the 10 s TTL
        with db.session() as s:
            job = s.get(Job, job_id)
            if attempt == 1:
                assert job.state == "PENDING" and job.restarts == 1
                for n in ("n1", "n2", "n3"):  # the victim comes back; the stopped rank is reported gone
                    process_heartbeat(s, clock.now(), Identity("agent", n), heartbeat(n))
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job.state == "FAILED" and job.restarts == 1
        assert "gave up after 1 restarts (max_restarts=1)" in job.reason
        first, second = [e.message for e in s.scalars(
            select(svc.Event).where(svc.Event.job_id == job_id, svc.Event.kind.in_(("job.requeue", "job.failed")))
            .order_by(svc.Event.id))]
        assert "(restart 1)" in first and "earlier: " + first in second  # the failure carries the history
        assert {r.state for r in s.scalars(select(Rank).where(Rank.job_id == job_id, Rank.attempt == 2))} <= {
            "KILLING", "KILLED"}


def test_a_rank_whose_staging_failed_fails_the_job_with_the_agents_reason(db: Database) -> None:
    clock, job_id = bound_job(db)
    with db.session() as s:
        r = s.scalar(select(Rank).where(Rank.job_id == job_id, Rank.rank == 1))
        node = r.node
    why = "staging failed: shard d/1: every replica failed; last: d/1 from 127.0.0.1:9002: sha256 mismatch"
    with db.session() as s:
        process_heartbeat(s, clock.advance(1), Identity("agent", node), heartbeat(node, ranks=[
            {"job_id": job_id, "attempt": 1, "rank": 1, "state": "EXITED", "exit_code": 3, "error": why}]))
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job.state == "FAILED"
        assert job.reason.startswith(f"rank 1 on {node} exited with code 3") and why in job.reason


def test_a_rank_stopped_by_its_nodes_fence_requeues_the_job_without_using_a_retry(db: Database) -> None:
    clock, job_id = bound_job(db, {**SPEC, "limits": {"time": "1h", "retry_on_failure": 0}})
    with db.session() as s:
        node = s.scalar(select(Rank).where(Rank.job_id == job_id, Rank.rank == 1)).node
    why = f"stopped by node {node}'s fence: its agent was silent for over 6 s"
    with db.session() as s:  # the agent was frozen, came back before the TTL, and found its rank fenced
        process_heartbeat(s, clock.advance(1), Identity("agent", node), heartbeat(node, ranks=[
            {"job_id": job_id, "attempt": 1, "rank": 1, "state": "EXITED", "exit_code": -9, "error": why,
             "failure": "fenced"}]))
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job.state == "PENDING" and job.restarts == 1  # the node's doing: back to the queue, not FAILED
        requeue = s.scalar(select(svc.Event).where(svc.Event.job_id == job_id, svc.Event.kind == "job.requeue"))
        assert why in requeue.message and f"(rank 1 on {node})" in requeue.message


def test_cluster_history_is_thinned_after_a_day_and_dropped_after_90(db: Database) -> None:
    from scheduler.server.report import thin_history
    from scheduler.store.models import ClusterSample

    day = 86_400.0
    now = 200 * day
    times = ([now - 100 * day + k * 60 for k in range(30)]  # past the 90 days: all go
             + [now - 3 * day + k * 2 for k in range(900)]  # 30 min at one sample per 2 s, 3 days ago
             + [now - 3600 + k * 2 for k in range(900)])  # the last 30 min: kept whole
    with db.session() as s:
        for t in times:
            s.add(ClusterSample(time=t, devices_total=8, devices_busy=4, pending=1, running=1, durations={}))
    with db.session() as s:
        gone = thin_history(s, now)
    with db.session() as s:
        kept = sorted(s.scalars(select(ClusterSample.time)))
    recent = [t for t in kept if t >= now - day]
    old = [t for t in kept if t < now - day]
    assert len(recent) == 900
    assert all(t >= now - 90 * day for t in kept)
    # 30 minutes of old samples fall in 6 or 7 five-minute buckets (rounding or truncation): one each.
    assert 6 <= len(old) <= 7 and len({int(t // 300) for t in old}) >= 6
    assert gone == len(times) - len(kept)


def test_the_server_lists_only_the_checkpoints_the_job_keeps(db: Database) -> None:
    clock, job_id = bound_job(db, {**SPEC, "train": {"epochs": 5, "keep_checkpoints": 2}})
    with db.session() as s:
        node = s.scalar(select(Rank).where(Rank.job_id == job_id, Rank.rank == 0)).node
    running = {"job_id": job_id, "attempt": 1, "rank": 0, "state": "RUNNING"}
    for epoch in range(1, 5):
        hb = heartbeat(node, ranks=[running]).model_copy(update={"metrics": [
            MetricIn(job_id=job_id, attempt=1, line={"type": "checkpoint", "epoch": epoch, "path": f"/c/epoch-{epoch}.pt",
                                                     "bytes": 10, "mirrors": ["n3"]})]})
        with db.session() as s:
            process_heartbeat(s, clock.advance(1), Identity("agent", node), hb)
        with db.session() as s:
            kept = svc.job_detail(s, s.get(Job, job_id))["checkpoints"]
        assert [c["epoch"] for c in kept] == list(range(max(1, epoch - 1), epoch + 1))
    assert kept[-1]["nodes"] == [node, "n3"]


def test_exactly_one_server_holds_the_cycle_lease(db: Database) -> None:
    assert try_lead(db, "a", now=0.0, ttl_s=5) is True
    assert try_lead(db, "b", now=1.0, ttl_s=5) is False
    assert try_lead(db, "a", now=4.0, ttl_s=5) is True  # renewal
    assert holds(db, "a", 8.0) and not holds(db, "b", 8.0)
    assert try_lead(db, "b", now=8.5, ttl_s=5) is False  # a renewed until 9.0
    assert try_lead(db, "b", now=9.5, ttl_s=5) is True  # expired: b takes over
    assert not holds(db, "a", 9.6) and try_lead(db, "a", now=9.6, ttl_s=5) is False


def test_a_lost_nodes_shards_are_copied_again_together_onto_one_node_with_room(db: Database) -> None:
    """Re-replication keeps a data set's copy whole: the shards a dead node held all go to one node (in
    another rack than the surviving copy), and a node whose agent reports too little free disk is passed
    over."""
    from scheduler.server.replication import schedule_replication
    from scheduler.store.models import Node, Transfer

    clock = FakeClock(1000.0)
    with db.session() as s:
        s.add(Dataset(name="big", source="test", classes=2, image_shape=[8, 8, 1], replicas_required=2,
                      owner="admin", created_at=0))
        for i in range(4):
            s.add(Shard(dataset="big", index=i, bytes=1000, sha256=SHA, samples=10))
    whole = [{"dataset": "big", "shard": i, "bytes": 1000, "sha256": SHA} for i in range(4)]
    layout = {"n1": ("r1", whole), "n2": ("r2", []), "n3": ("r3", whole), "n4": ("r3", []), "n5": ("r2", [])}
    for node, (rack, reps) in layout.items():
        with db.session() as s:
            hb = heartbeat(node, replicas=reps, rack=rack).model_copy(update={"free_bytes": 10**9})
            if node == "n2":  # the least loaded by name, but its disk is nearly full
                hb = hb.model_copy(update={"free_bytes": 500})
            process_heartbeat(s, clock.now(), Identity("agent", node), hb)
    with db.session() as s:
        s.get(Node, "n3").state = "down"
    with db.session() as s:
        assert schedule_replication(s, clock.now(), concurrency=16) == 4
    with db.session() as s:
        planned = [(t.shard, t.src, t.dst) for t in s.scalars(select(Transfer).order_by(Transfer.shard))]
    # n2 has no room for a shard (500 bytes free): all four go together to n4 (n4 and n5 tie; by name)
    assert planned == [(i, "n1", "n4") for i in range(4)]


def test_the_cycle_keeps_when_a_job_began_waiting_for_locality_and_clears_it_at_bind(db: Database) -> None:
    """The locality wait counts from the first cycle the job waited (stored on the job), not from its
    submission: a job queued for a long time still gets its whole wait once it could run elsewhere."""
    clock = FakeClock(1000.0)
    with db.session() as s:
        svc.add_user(s, clock.now(), None, "alice", 1)
        s.add(Dataset(name="d", source="test", classes=2, image_shape=[8, 8, 1], replicas_required=1,
                      owner="alice", created_at=0))
        for i in (0, 1):
            s.add(Shard(dataset="d", index=i, bytes=1000, sha256=SHA, samples=10))
    whole = [{"dataset": "d", "shard": i, "bytes": 1000, "sha256": SHA} for i in (0, 1)]
    for node, reps in (("n1", whole), ("n2", [])):
        with db.session() as s:
            process_heartbeat(s, clock.now(), Identity("agent", node), heartbeat(node, replicas=reps))
    one = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}
    with db.session() as s:
        first, _ = svc.submit_job(s, clock.now(), ALICE, one, None)
    cfg = Settings(heartbeat_ttl_s=1000.0, policy=PolicyConfig(locality_wait_s=30))  # nodes stay up
    assert run_cycle(db, cfg, clock.advance(1)).bound == [first]  # on n1, where the data is
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, one, None)
        s.get(Job, job_id).pending_since = 0.0  # as if a backlog had kept it queued since t=0
    start = clock.advance(1)
    assert run_cycle(db, cfg, start).bound == []  # n2 is free but would stage: it waits
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job.locality_wait_since == start
        assert job.reason == f"waiting for locality until t={start + 30:.0f}s"
    assert run_cycle(db, cfg, clock.advance(29)).bound == []
    with db.session() as s:
        assert s.get(Job, job_id).locality_wait_since == start  # kept, not restarted
    assert run_cycle(db, cfg, clock.advance(1)).bound == [job_id]  # the wait is over: n2, staging
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job.locality_wait_since is None and job.transfer_bytes == 2000
        assert [r.node for r in s.scalars(select(Rank).where(Rank.job_id == job_id))] == ["n2"]


def test_the_migrations_build_exactly_the_schema_the_models_declare(db: Database) -> None:
    """Tables, columns, types, nullability and indexes of the head revision match scheduler/store/models.py,
    so a model changed without its migration (or a migration lost in a merge) is caught here."""
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []
