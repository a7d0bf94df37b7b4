"""The disk floor in the cycle, on a real database (SQLite and PostgreSQL, ``db``) with a fake clock: a
node whose agent reports free disk under ``disk_floor_gb`` takes no new ranks (the snapshot leaves it
out), no re-replication copy and no copy of a new data set; ``gsched nodes`` and ``gsched explain``
say why; once it reports more it takes work again."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select

from scheduler.core.clock import FakeClock
from scheduler.server import service as svc
from scheduler.server.api_models import DatasetIn
from scheduler.server.auth import Identity
from scheduler.server.cycle import run_cycle
from scheduler.server.datastore import register_dataset
from scheduler.server.heartbeat import process_heartbeat
from scheduler.server.replication import schedule_replication
from scheduler.server.views import explain_view
from scheduler.store.db import Database
from scheduler.store.models import Dataset, Event, Job, Transfer
from tests.db.test_store import ALICE, SHA, SPEC, heartbeat, settings, setup_cluster

MB = 1_000_000
FLOOR = 30 * MB  # disk_floor_gb = 0.03
ONE = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}
LOW = "low disk: 12.0 MB free, under the 30.0 MB floor (disk_floor_gb)"


def report_free(db: Database, clock: FakeClock, node: str, free_bytes: int) -> None:
    with db.session() as s:
        hb = heartbeat(node).model_copy(update={"free_bytes": free_bytes})
        process_heartbeat(s, clock.now(), Identity("agent", node), hb)


def test_a_node_under_the_floor_takes_no_rank_and_says_why_until_it_has_room_again(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)  # n1 and n2, one device each, both holding data set d
    floor = replace(settings(), disk_floor_gb=0.03)
    report_free(db, clock, "n1", 12 * MB)  # under the floor
    report_free(db, clock, "n2", 200 * MB)
    with db.session() as s:
        first, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)
        second, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)
    report = run_cycle(db, floor, clock.advance(1))
    assert report.bound == [first]  # one free device left in the snapshot: n2's
    with db.read() as s:
        assert svc.job_detail(s, s.get(Job, first))["ranks"][0]["node"] == "n2"
        rows = {n["name"]: n for n in svc.node_rows(s, floor.disk_floor_bytes)}
        assert rows["n1"]["low_disk"] == LOW and rows["n2"]["low_disk"] == ""
        doc = explain_view(s, s.get(Job, second), floor.disk_floor_bytes)
    assert doc["state"] == "PENDING" and doc["left_out"] == [{"node": "n1", "reason": LOW}]
    report_free(db, clock, "n1", 40 * MB)  # room again: n1 takes the second job
    assert run_cycle(db, floor, clock.advance(1)).bound == [second]
    with db.read() as s:
        assert svc.job_detail(s, s.get(Job, second))["ranks"][0]["node"] == "n1"


def test_no_copy_goes_to_a_node_under_the_floor(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)  # n1 and n2 hold data set d (2 shards of 1000 bytes)
    for n, free in (("n1", 200 * MB), ("n2", 200 * MB), ("n3", 12 * MB)):  # n3 holds nothing: the least loaded
        report_free(db, clock, n, free)
    with db.session() as s:  # a new data set of 2 copies: n1 and n2, not the emptier n3
        out = register_dataset(s, clock.now(), ALICE, DatasetIn(
            name="e", classes=2, image_shape=[8, 8, 1], replicas=2,
            shards=[{"index": 0, "bytes": MB, "sha256": SHA, "samples": 10}]), FLOOR)
    assert sorted(u["node"] for u in out["uploads"]) == ["n1", "n2"]
    with db.session() as s:  # d now wants 3 copies: n3 is the only node without one, and takes none
        s.get(Dataset, "d").replicas_required = 3
    with db.session() as s:
        assert schedule_replication(s, clock.now(), 16, FLOOR) == 0
        assert s.scalars(select(Transfer)).all() == []
    with db.session() as s:  # without the floor both shards would be copied to n3
        assert schedule_replication(s, clock.now(), 16, 0) == 2
        assert {t.dst for t in s.scalars(select(Transfer))} == {"n3"}


def test_crossing_the_floor_is_an_event_and_a_node_under_it_is_no_mirror_peer(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    with db.session() as s:
        svc.submit_job(s, clock.now(), ALICE, ONE, None)
    run_cycle(db, settings(), clock.advance(1))  # a rank on n1 (by name): its heartbeat names mirror peers

    def beat(node: str, free_bytes: int) -> dict:  # type: ignore[type-arg]
        with db.session() as s:
            hb = heartbeat(node).model_copy(update={"free_bytes": free_bytes})
            return process_heartbeat(s, clock.advance(1), Identity("agent", node), hb, disk_floor_bytes=FLOOR)

    assert [p["name"] for p in beat("n1", 200 * MB)["peers"]] == ["n2"]
    beat("n2", 12 * MB)
    assert beat("n1", 200 * MB)["peers"] == []  # n2 is under the floor: no mirror there
    beat("n2", 40 * MB)
    with db.read() as s:
        events = [(e.kind, e.node, e.message) for e in s.scalars(select(Event).where(Event.kind.like("node.%disk%"))
                                                                 .order_by(Event.id))]
    assert events == [("node.low_disk", "n2", LOW), ("node.disk_ok", "n2", "n2: free disk above the floor again")]



def test_the_copies_on_a_node_under_the_floor_are_still_read(db: Database) -> None:
    """n1 holds the only copy of d and is under the floor: a job of d runs on n2, staging from n1."""
    clock = FakeClock(1000.0)
    setup_cluster(db, clock, nodes=("n1",))
    report_free(db, clock, "n1", 12 * MB)
    report_free(db, clock, "n2", 200 * MB)  # holds nothing
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)
    assert run_cycle(db, replace(settings(), disk_floor_gb=0.03), clock.advance(1)).bound == [job_id]
    with db.read() as s:
        doc = svc.job_detail(s, s.get(Job, job_id))
    assert [r["node"] for r in doc["ranks"]] == ["n2"]
    assert {(sh["source"], sh["local"]) for sh in doc["shards"]} == {("n1", False)}


def test_a_node_that_falls_under_the_floor_between_snapshot_and_bind_gets_no_rank(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock, nodes=("n1",))
    report_free(db, clock, "n1", 200 * MB)
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)

    def n1_fills_up() -> bool:  # called after the decision, before binding (as the leader's lease check)
        report_free(db, clock, "n1", 12 * MB)
        return True

    report = run_cycle(db, replace(settings(), disk_floor_gb=0.03), clock.advance(1), fence=n1_fills_up)
    assert report.bound == []
    assert report.refused == {job_id: "node n1's free disk fell under the floor (disk_floor_gb) since the snapshot"}
