"""``gsched data add`` whose link step fails rolls its registration back, server side, on SQLite and
PostgreSQL alike: the name is free again, the copies it linked get delete orders, nothing else stored
changes; refused (naming why) once a copy is healthy or a job reads the data set."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from scheduler.core.clock import FakeClock
from scheduler.core.errors import Conflict
from scheduler.server import service as svc
from scheduler.server.api_models import AbandonIn, DatasetIn
from scheduler.server.auth import Identity
from scheduler.server.datastore import abandon_registration, register_dataset, scan_tickets
from scheduler.server.heartbeat import process_heartbeat
from scheduler.store.db import Database
from scheduler.store.models import Dataset, Event, Replica, Shard, Transfer
from tests.db.test_store import ALICE, SHA, SPEC, heartbeat

OTHER_SHA = "cd" * 32


def in_place(name: str, shard_1_on: tuple[str, ...] = ("n1",)) -> DatasetIn:
    """Two files on n1 as shards 0 and 1 (shard 1 on ``shard_1_on``), one copy each."""
    files = [{"shard": 0, "node": "n1", "path": "team-files/0.tar"}]
    files += [{"shard": 1, "node": n, "path": "team-files/1.tar"} for n in shard_1_on]
    return DatasetIn.model_validate({
        "name": name, "source": "in place: n1:team-files", "classes": 2, "image_shape": [], "replicas": 1,
        "shards": [{"index": i, "bytes": 1000, "sha256": SHA, "samples": 10} for i in (0, 1)], "in_place": files})


def stored_rows(db: Database) -> dict[str, Any]:
    with db.session() as s:
        return {"datasets": sorted((d.name, d.replicas_required) for d in s.scalars(select(Dataset))),
                "shards": sorted((x.dataset, x.index, x.sha256) for x in s.scalars(select(Shard))),
                "replicas": sorted((r.dataset, r.shard, r.node, r.state) for r in s.scalars(select(Replica))),
                "transfers": sorted((t.dataset, t.shard, t.dst, t.state) for t in s.scalars(select(Transfer)))}


@pytest.fixture
def clock(db: Database) -> FakeClock:
    clock = FakeClock(1000.0)
    with db.session() as s:
        svc.add_user(s, clock.now(), None, "alice", 1)
        s.add(Dataset(name="d", source="test", classes=2, image_shape=[8, 8, 1], replicas_required=1,
                      owner="alice", created_at=0))
        s.add(Shard(dataset="d", index=0, bytes=1000, sha256=OTHER_SHA, samples=10))
    with db.session() as s:
        process_heartbeat(s, clock.now(), Identity("agent", "n1"), heartbeat(
            "n1", replicas=[{"dataset": "d", "shard": 0, "bytes": 1000, "sha256": OTHER_SHA}]))
    return clock


def test_a_failed_link_that_leaves_a_shard_without_a_copy_rolls_the_registration_back(db: Database,
                                                                                  clock: FakeClock) -> None:
    before = stored_rows(db)
    with db.session() as s:
        links = register_dataset(s, clock.now(), ALICE, in_place("team"))["links"]
    assert [(x["shard"], x["node"]) for x in links] == [(0, "n1"), (1, "n1")]
    # shard 0 was linked; shard 1's file changed after it was hashed, and its agent refused the link
    why = "node n1: team-files/1.tar no longer has the bytes registered (sha256 abababababab)"
    with db.session() as s:
        out = abandon_registration(s, clock.advance(1), ALICE, "team", AbandonIn.model_validate(
            {"linked": [{"shard": 0, "node": "n1"}], "failed": [{"shard": 1, "node": "n1"}], "reason": why}))
    assert out == {"name": "team", "rolled_back": True, "why": "shard 1 has no copy", "dropped": 2}
    after = stored_rows(db)
    # nothing of "team" is left but orders to remove what may have been linked; "d" is as it was
    assert after["transfers"] == [("team", 0, "n1", "delete"), ("team", 1, "n1", "delete")]
    assert {k: v for k, v in after.items() if k != "transfers"} == {k: v for k, v in before.items() if k != "transfers"}
    with db.session() as s:
        assert [e.message for e in s.scalars(select(Event).where(Event.kind == "data.abandon"))] == [
            f"team: registration rolled back, shard 1 has no copy: {why}"]
        assert scan_tickets(s, clock.now(), ALICE, "team", ["n1"])["name"] == "team"  # the name is free
    with db.session() as s:  # n1's agent is told to drop the links (the files they link to stay)
        reply = process_heartbeat(s, clock.advance(1), Identity("agent", "n1"), heartbeat("n1"))
    assert reply["delete"] == [{"dataset": "team", "shard": 0}, {"dataset": "team", "shard": 1}]


def test_a_failed_link_of_a_shard_linked_on_another_node_keeps_the_registration(db: Database,
                                                                                clock: FakeClock) -> None:
    with db.session() as s:
        process_heartbeat(s, clock.now(), Identity("agent", "n2"), heartbeat("n2"))
    with db.session() as s:
        register_dataset(s, clock.now(), ALICE, in_place("team", shard_1_on=("n1", "n2")))
    before = stored_rows(db)
    with db.session() as s:
        out = abandon_registration(s, clock.now(), ALICE, "team", AbandonIn.model_validate(
            {"linked": [{"shard": 0, "node": "n1"}, {"shard": 1, "node": "n2"}],
             "failed": [{"shard": 1, "node": "n1"}], "reason": "changed"}))
    assert out["rolled_back"] is False and "the cycle makes the missing copies" in out["why"]
    assert stored_rows(db) == before


def test_no_roll_back_while_a_job_reads_it(db: Database, clock: FakeClock) -> None:
    with db.session() as s:
        register_dataset(s, clock.now(), ALICE, in_place("team"))
    with db.session() as s:
        svc.submit_job(s, clock.now(), ALICE, {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1},
                                                 "data": {"dataset": "team"}}, None)
    before = stored_rows(db)
    with db.session() as s, pytest.raises(Conflict, match=r"job 1 reads it \(gsched cancel 1 first\)"):
        abandon_registration(s, clock.now(), ALICE, "team",
                             AbandonIn.model_validate({"failed": [{"shard": 1, "node": "n1"}]}))
    assert stored_rows(db) == before
