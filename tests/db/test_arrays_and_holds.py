"""Job arrays, holds, dependencies and drained nodes in the cycle, on a real database built by the
migrations (SQLite and PostgreSQL alike, ``db``) with a fake clock: what the snapshot lets in, what
the binder binds and what an agent is told."""

from __future__ import annotations

from scheduler.core.clock import FakeClock
from scheduler.server import jobcontrol
from scheduler.server import service as svc
from scheduler.server.auth import Identity
from scheduler.server.cycle import run_cycle
from scheduler.server.drain import drain_node, resume_node
from scheduler.server.heartbeat import process_heartbeat
from scheduler.store.db import Database
from scheduler.store.models import Job
from tests.db.test_store import ALICE, SPEC, heartbeat, settings, setup_cluster

ONE = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}


def states(db: Database, ids: list[int]) -> list[str]:
    with db.read() as s:
        return [s.get(Job, i).state for i in ids]


def test_an_array_makes_one_job_per_index_and_keeps_to_its_cap(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)  # n1 and n2, one device each: room for two jobs
    with db.session() as s:
        first, created = svc.submit_job(s, clock.now(), ALICE, ONE, "arr-1", array="0-2%1")
        ids = svc.array_members(s, first)
    assert created and ids[0] == first and len(ids) == 3
    with db.read() as s:
        rows = [(s.get(Job, i).array_job_id, s.get(Job, i).array_index, s.get(Job, i).array_count) for i in ids]
    assert rows == [(first, 0, 3), (first, 1, 3), (first, 2, 3)]
    report = run_cycle(db, settings(), clock.advance(1))
    assert report.bound == [first]  # %1: one at a time, though both nodes are free
    run_cycle(db, settings(), clock.advance(1))
    assert states(db, ids) == ["BOUND", "PENDING", "PENDING"]
    with db.read() as s:
        node = svc.job_detail(s, s.get(Job, first))["ranks"][0]["node"]
    with db.session() as s:  # the agent of that node is told the rank's place in the array
        reply = process_heartbeat(s, clock.now(), Identity("agent", node), heartbeat(node))
    (assignment,) = reply["assignments"]
    assert assignment["env"] == {"GSCHED_ARRAY_JOB_ID": str(first), "GSCHED_ARRAY_INDEX": "0",
                                 "GSCHED_ARRAY_COUNT": "3"}
    with db.session() as s:  # once the first ends, the next may start
        svc.cancel_job(s, clock.advance(1), ALICE, first)
    assert run_cycle(db, settings(), clock.advance(1)).bound == [ids[1]]
    with db.session() as s:  # the same request again: the same array, no new jobs
        assert svc.submit_job(s, clock.now(), ALICE, ONE, "arr-1", array="0-2%1") == (first, False)
        assert svc.array_members(s, first) == ids


def test_held_dependent_and_drained_are_left_out(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    admin = Identity("admin", "admin")
    with db.session() as s:
        held, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)
        jobcontrol.hold_job(s, clock.now(), ALICE, held)
        first, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)
        after, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None, dependency=f"afterany:{first}")
        drain_node(s, clock.now(), admin, "n1", "maintenance")
    report = run_cycle(db, settings(), clock.advance(1))
    assert report.bound == [first]  # not the held one, not the dependent one
    with db.read() as s:
        assert svc.job_detail(s, s.get(Job, first))["ranks"][0]["node"] == "n2"  # not the drained n1
    with db.session() as s:  # n2's device stays busy until its agent reports the rank killed
        svc.cancel_job(s, clock.advance(1), ALICE, first)
        jobcontrol.release_job(s, clock.now(), ALICE, held)
        resume_node(s, clock.now(), admin, "n1")
    report = run_cycle(db, settings(), clock.advance(1))  # the dependency is met from this cycle on
    assert len(report.bound) == 1 and set(report.bound) <= {held, after}  # n1's one device, to one of them
    with db.read() as s:
        assert s.get(Job, after).deps_met and s.get(Job, held).held_by is None
