"""Group commit (scheduler/store/batching.py), transactions and savepoints, the report's unchanged
explanations, and SQLite's writer lock between processes: on SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
from sqlalchemy import event, func, select

from scheduler.core.clock import FakeClock
from scheduler.core.errors import Unprocessable
from scheduler.core.policy_config import PolicyConfig
from scheduler.protocol.messages import Heartbeat
from scheduler.server import service as svc
from scheduler.server.auth import Identity
from scheduler.server.config import Settings
from scheduler.server.cycle import run_cycle
from scheduler.server.cyclestate import CycleMemory
from scheduler.server.heartbeat import process_heartbeat
from scheduler.server.report import EXPLAIN_REFRESH_S
from scheduler.store.batching import WriteBatcher
from scheduler.store.db import Database
from scheduler.store.models import Dataset, Event, Job, Shard

SHA = "ab" * 32


def events(db: Database) -> list[str]:
    with db.read() as s:
        return sorted(s.scalars(select(Event.message).where(Event.kind == "test")))


def write(tag: str):  # type: ignore[no-untyped-def]
    def call(s, now):  # type: ignore[no-untyped-def]
        svc.record(s, now, "test", "test", tag)
        return tag
    return call


def test_calls_queued_together_commit_in_one_batch_and_each_gets_its_answer(db: Database) -> None:
    batcher = WriteBatcher(db, FakeClock(5.0).now, "t")
    gate, entered = threading.Event(), threading.Event()

    def first(s, now):  # type: ignore[no-untyped-def]
        entered.set()
        gate.wait(10)
        return write("first")(s, now)

    f0 = batcher.submit(first)
    assert entered.wait(10)
    rest = [batcher.submit(write(f"c{i}")) for i in range(10)]  # queued while the first batch runs
    gate.set()
    assert f0.result(10) == "first"
    assert [f.result(10) for f in rest] == [f"c{i}" for i in range(10)]
    batcher.close()
    assert (batcher.batches, batcher.calls) == (2, 11)  # the ten queued calls shared one transaction
    assert events(db) == sorted(["first"] + [f"c{i}" for i in range(10)])


def test_a_refused_call_gets_its_error_and_its_neighbours_land(db: Database) -> None:
    batcher = WriteBatcher(db, FakeClock(5.0).now, "t")
    gate, entered = threading.Event(), threading.Event()
    hold = batcher.submit(lambda s, now: entered.set() or gate.wait(10))
    assert entered.wait(10)

    def refuse(s, now):  # type: ignore[no-untyped-def]
        raise Unprocessable("resources.ranks: no", "resources.ranks")

    a, bad, b = batcher.submit(write("a")), batcher.submit(refuse), batcher.submit(write("b"))
    gate.set()
    hold.result(10)
    assert a.result(10) == "a" and b.result(10) == "b"
    with pytest.raises(Unprocessable, match="resources.ranks"):
        bad.result(10)
    batcher.close()
    assert batcher.batches == 2  # the refusal did not split the batch
    assert events(db) == ["a", "b"]


def test_a_call_that_breaks_the_batch_is_run_alone_and_nothing_lands_twice(db: Database) -> None:
    batcher = WriteBatcher(db, FakeClock(5.0).now, "t")
    gate = threading.Event()
    hold = batcher.submit(lambda s, now: gate.wait(10))

    def broken(s, now):  # type: ignore[no-untyped-def]
        svc.record(s, now, "test", "test", "half-written")
        s.flush()
        raise RuntimeError("a bug in the middle of a write")

    def refuses_after_writing(s, now):  # type: ignore[no-untyped-def]
        svc.record(s, now, "test", "test", "also half-written")
        raise Unprocessable("too late to refuse")

    a, bad, late, b = (batcher.submit(write("a")), batcher.submit(broken), batcher.submit(refuses_after_writing),
                       batcher.submit(write("b")))
    gate.set()
    hold.result(10)
    assert a.result(10) == "a" and b.result(10) == "b"
    with pytest.raises(RuntimeError, match="a bug"):
        bad.result(10)
    with pytest.raises(Unprocessable):
        late.result(10)
    batcher.close()
    assert events(db) == ["a", "b"]  # each once; the broken calls' writes rolled back


def test_a_released_savepoint_does_not_commit_the_transaction_around_it(db: Database) -> None:
    """With the sqlite3 module's own transaction handling, a SAVEPOINT issued first started the
    transaction and its RELEASE committed it: the rollback below then undid only the later write."""
    with pytest.raises(RuntimeError), db.session() as s:
        with s.begin_nested():
            svc.record(s, 1.0, "test", "test", "inside the savepoint")
        svc.record(s, 1.0, "test", "test", "after it")
        s.flush()
        raise RuntimeError("roll the whole transaction back")
    assert events(db) == []


def test_a_read_session_sees_one_state_from_its_first_statement(db: Database) -> None:
    with db.session() as s:
        svc.record(s, 1.0, "test", "test", "one")
    with db.read() as r:
        first = r.scalar(select(func.count()).select_from(Event).where(Event.kind == "test"))
        with db.session() as s:
            svc.record(s, 2.0, "test", "test", "two")
        again = r.scalar(select(func.count()).select_from(Event).where(Event.kind == "test"))
    if db.is_sqlite:
        assert first == again == 1  # one snapshot (PostgreSQL's READ COMMITTED sees each statement anew)
    else:
        assert (first, again) == (1, 2)


def _cluster(db: Database, now: float) -> None:
    with db.session() as s:
        svc.add_user(s, now, None, "admin", 1, role="admin")
        svc.add_user(s, now, None, "alice", 1)
        s.add(Dataset(name="d", source="test", classes=2, image_shape=[8, 8, 1], replicas_required=1,
                      owner="admin", created_at=0))
        s.add(Shard(dataset="d", index=0, bytes=1000, sha256=SHA, samples=10))
    for n in ("n1", "n2"):
        with db.session() as s:
            process_heartbeat(s, now, Identity("agent", n), Heartbeat.model_validate({
                "node": n, "rack": "r1", "address": f"127.0.0.1:{9000 + int(n[-1])}", "incarnation": n,
                "devices": [{"index": 0}],
                "replicas": [{"dataset": "d", "shard": 0, "bytes": 1000, "sha256": SHA}]}))


def test_the_report_rewrites_an_explanation_only_when_it_changes_or_grows_old(db: Database) -> None:
    clock = FakeClock(100.0)
    _cluster(db, clock.now())
    spec = {"name": "j", "resources": {"ranks": 2, "gpus_per_rank": 1}, "data": {"dataset": "d"},
            "train": {"epochs": 1}, "limits": {"time": "1h"}}
    with db.session() as s:
        first, _ = svc.submit_job(s, clock.now(), Identity("user", "alice"), spec, None)
        second, _ = svc.submit_job(s, clock.now(), Identity("user", "alice"), spec, None)
    cfg = Settings(heartbeat_ttl_s=10_000.0, policy=PolicyConfig(locality_wait_s=0))
    memory = CycleMemory()  # what the cycle process keeps from one cycle to the next

    report = run_cycle(db, cfg, clock.now(), memory=memory)
    assert report.bound == [first] and report.counts["explained"] == 2  # both new
    for rank, node in enumerate(("n1", "n2")):  # the first job's ranks run: its end is now estimated
        with db.session() as s:
            process_heartbeat(s, clock.now(), Identity("agent", node), Heartbeat.model_validate({
                "node": node, "rack": "r1", "address": f"127.0.0.1:{9000 + int(node[-1])}", "incarnation": node,
                "devices": [{"index": 0}], "replicas": None,
                "ranks": [{"job_id": first, "attempt": 1, "rank": rank, "state": "RUNNING"}]}))
    clock.advance(1.0)
    assert run_cycle(db, cfg, clock.now(), memory=memory).counts["explained"] == 1  # first in the queue now: new words
    with db.read() as s:
        waiting = s.get(Job, second)
        assert waiting.state == "PENDING" and waiting.explain["time"] == 101.0
        reason = waiting.reason

    clock.advance(1.0)
    assert run_cycle(db, cfg, clock.now(), memory=memory).counts["explained"] == 0  # the same words: not rewritten
    with db.read() as s:
        assert s.get(Job, second).explain["time"] == 101.0 and s.get(Job, second).reason == reason

    clock.advance(EXPLAIN_REFRESH_S)
    assert run_cycle(db, cfg, clock.now(), memory=memory).counts["explained"] == 1  # old enough: refreshed
    with db.read() as s:
        assert s.get(Job, second).explain["time"] == clock.now()

    with db.session() as s:  # a third job queues behind the second: the second's words do not change
        third, _ = svc.submit_job(s, clock.now(), Identity("user", "alice"), spec, None)
    clock.advance(1.0)
    report = run_cycle(db, cfg, clock.now(), memory=memory)
    assert report.counts["explained"] == 1  # only the new one
    with db.read() as s:
        assert s.get(Job, third).explain["queue_position"] == 2


def _writer(url: str, tag: str, n: int, out: object) -> None:
    db = Database(url)
    try:
        for i in range(n):
            with db.session() as s:  # read, then write: the pattern that needs the lock from the start
                count = s.scalar(select(func.count()).select_from(Event))
                svc.record(s, float(i), "test", "test", f"{tag}-{i}-{count}")
        out.put("ok")  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001
        out.put(repr(e))  # type: ignore[attr-defined]
    finally:
        db.dispose()


def test_two_processes_writing_one_sqlite_database_never_fail_or_lose_a_write(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'two.db'}"
    Database(url).upgrade()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, tag, 150, out)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    answers = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert answers == ["ok", "ok"]
    db = Database(url)
    with db.read() as s:
        counts = sorted(int(m.rsplit("-", 1)[1]) for m in s.scalars(select(Event.message).where(Event.kind == "test")))
    db.dispose()
    assert counts == list(range(300))  # each write saw every earlier one: serialised, none lost


def test_a_batch_of_submits_writes_its_events_at_commit_and_a_rollback_loses_them(db: Database) -> None:
    from sqlalchemy import event

    _cluster(db, 100.0)
    spec = {"name": "j", "resources": {"ranks": 1, "gpus_per_rank": 1}, "data": {"dataset": "d"},
            "train": {"epochs": 1}, "limits": {"time": "1h"}}
    alice = Identity("user", "alice")
    inserts: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda conn, cur, stmt, params, ctx, many: inserts.append(
        stmt.split()[2]) if stmt.lstrip().upper().startswith("INSERT") else None)
    with db.session() as s:
        ids = [svc.submit_job(s, 100.0, alice, spec, None)[0] for _ in range(5)]
    # the events go in after every job, at commit, in one statement (an executemany)
    assert inserts == ["jobs"] * 5 + ["events"]
    with db.read() as s:
        assert sorted(s.scalars(select(Event.job_id).where(Event.kind == "job.submit"))) == ids

    class Boom(Exception):
        pass

    with pytest.raises(Boom), db.session() as s:
        lost = svc.submit_job(s, 100.0, alice, spec, None)[0]
        raise Boom
    with db.read() as s:
        assert s.get(Job, lost) is None
        assert s.scalar(select(func.count()).select_from(Event).where(Event.job_id == lost)) == 0


def test_after_commit_hooks_run_once_the_batch_committed_and_never_for_a_batch_rolled_back(db: Database) -> None:
    batcher = WriteBatcher(db, FakeClock(5.0).now, "t")
    ran: list[str] = []

    def hooked(tag: str, fail: bool = False):  # type: ignore[no-untyped-def]
        def call(s, now):  # type: ignore[no-untyped-def]
            write(tag)(s, now)
            s.info.setdefault("after_commit", []).append(lambda: ran.append(f"{tag}: {events(db)}"))
            if fail:
                raise RuntimeError("after writing")
            return tag
        return call

    try:
        assert batcher.submit(hooked("kept")).result(timeout=10) == "kept"
        with pytest.raises(RuntimeError):
            batcher.submit(hooked("lost", fail=True)).result(timeout=10)
    finally:
        batcher.close()
    assert ran == ["kept: ['kept']"]  # run after the commit (a new read sees the write); the failed call's never
    assert events(db) == ["kept"]


SUBMIT = {"name": "j", "resources": {"ranks": 1, "gpus_per_rank": 1}, "limits": {"time": "1h"},
          "run": {"command": ["true"]}}
ALICE = Identity("user", "alice")


def _users_and_a_node(db: Database) -> None:
    with db.session() as s:
        svc.add_user(s, 1.0, None, "alice", 1)
        process_heartbeat(s, 1.0, Identity("agent", "n1"), Heartbeat.model_validate(
            {"node": "n1", "address": "127.0.0.1:9", "incarnation": "a", "devices": [{"index": 0}]}))


def stage(request_id: str | None):  # type: ignore[no-untyped-def]
    """What the submit route queues: the job staged, its id read after the commit."""
    def call(s, now):  # type: ignore[no-untyped-def]
        job, created = svc.stage_job(s, now, ALICE, SUBMIT, request_id, single_team=True)
        return job, created
    return call


def test_a_batchs_submits_are_written_at_its_commit_with_their_ids_and_events(db: Database) -> None:
    _users_and_a_node(db)
    batcher = WriteBatcher(db, FakeClock(5.0).now, "t")
    gate, entered = threading.Event(), threading.Event()
    hold = batcher.submit(lambda s, now: entered.set() or gate.wait(10))
    assert entered.wait(10)
    futures = [batcher.submit(stage(rid)) for rid in (None, "r1", None, "r1")]  # the last: a retry of the second
    gate.set()
    hold.result(10)
    out = [f.result(10) for f in futures]
    batcher.close()
    assert batcher.batches == 2
    ids = [job.id for job, _ in out]
    assert [created for _, created in out] == [True, True, True, False]
    assert ids[3] == ids[1] and len(set(ids)) == 3 and all(isinstance(i, int) for i in ids)
    with db.read() as s:
        assert sorted(s.scalars(select(Job.id))) == sorted(set(ids))
        assert sorted(s.scalars(select(Event.job_id).where(Event.kind == "job.submit"))) == sorted(set(ids))


def test_new_rows_of_one_flush_get_their_ids_in_the_order_they_were_added(db: Database) -> None:
    """Five submits staged in one transaction: their ids follow the order they were staged in, one after
    the other, and a job written later gets a greater one.  On PostgreSQL the ids are taken from the
    sequence in one statement before the flush, and the rows are written by one short INSERT run per
    row (no RETURNING, no statement with every row's parameters in it: db._number_new_rows)."""
    _users_and_a_node(db)
    seen: list[tuple[str, bool]] = []

    def note(conn, cursor, statement, params, context, executemany):  # type: ignore[no-untyped-def]
        seen.append((statement, executemany))

    event.listen(db.engine, "before_cursor_execute", note)
    try:
        with db.session() as s:
            jobs = [stage(None)(s, 2.0)[0] for _ in range(5)]
    finally:
        event.remove(db.engine, "before_cursor_execute", note)
    ids = [j.id for j in jobs]
    assert ids == list(range(ids[0], ids[0] + 5))
    with db.session() as s:
        later = svc.submit_job(s, 3.0, ALICE, SUBMIT, None, single_team=True)[0]
    assert later > ids[-1]
    inserts = [(stmt, many) for stmt, many in seen if stmt.startswith("INSERT INTO jobs")]
    if not db.is_sqlite:
        assert len(inserts) == 1 and inserts[0][1] and "RETURNING" not in inserts[0][0] and "nextval" in " ".join(st for st, _ in seen)
        assert inserts[0][0].count("VALUES (") == 1


def test_two_transactions_racing_with_one_request_id_store_one_job(db: Database) -> None:
    """Under PostgreSQL two transactions can both find no job with the id and both insert one: the
    second's commit fails on the unique (user, client_request_id), its batch runs each call alone, and
    the retry finds the first's job.  (Under SQLite the writer lock runs the transactions one after
    the other: the second finds the first's job, as the test of a plain retry shows.)"""
    if db.is_sqlite:
        pytest.skip("SQLite's writer lock serialises the two transactions: they cannot race")
    _users_and_a_node(db)
    batcher = WriteBatcher(db, FakeClock(5.0).now, "t")

    runs: list[bool] = []

    def racing(s, now):  # type: ignore[no-untyped-def]
        job, created = stage("r1")(s, now)
        runs.append(created)
        if len(runs) == 1:  # staged, not written: now the other transaction commits the same request
            with db.session() as other:
                svc.submit_job(other, now, ALICE, SUBMIT, "r1", single_team=True)
        return job, created

    try:
        job, created = batcher.submit(racing).result(30)
    finally:
        batcher.close()
    with db.read() as s:
        stored = list(s.scalars(select(Job.id)))
    assert runs == [True, False]  # the conflict ran the call again, and it found the other's job
    assert (stored, created) == ([job.id], False)
