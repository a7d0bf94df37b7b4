"""Re-balancing a data set's layout toward the shape its jobs have, on SQLite and PostgreSQL alike.

The binder notes how many nodes each bound job spans on its data set; the cycle's replication phase
moves the layout toward ``lay_out(..., span=observed)``: copies first, within the concurrency bound,
surplus copies dropped only once the target's copies are healthy and no job reads them.  Agents are
played by ``Agents``: each heartbeat reports its files, makes the copies it was ordered at once and
deletes what it was told to, as a real agent does over several heartbeats.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import select

from scheduler.core.clock import FakeClock
from scheduler.core.policy_config import PolicyConfig
from scheduler.protocol.messages import Heartbeat
from scheduler.server import service as svc
from scheduler.server.auth import Identity
from scheduler.server.config import Settings
from scheduler.server.cycle import run_cycle
from scheduler.server.heartbeat import process_heartbeat
from scheduler.server.replication import schedule_replication
from scheduler.store.db import Database
from scheduler.store.models import Dataset, Event, Job, Node, Replica, Shard, ShardAssignment, Transfer
from tests.db.test_store import ALICE, SHA

SIZE = 1000


class Agents:
    """The nodes' agents: the shard files each holds, and the copies each finished since it last beat."""

    def __init__(self, db: Database, clock: FakeClock, files: dict[str, set[int]], devices: int = 2) -> None:
        self.db, self.clock, self.files, self.devices = db, clock, files, devices
        self.done: dict[str, list[int]] = {n: [] for n in files}

    def beat(self, node: str) -> dict[str, Any]:
        hb = Heartbeat.model_validate({
            "node": node, "rack": "r1", "address": f"127.0.0.1:{9000 + int(node[-1])}", "incarnation": f"inc-{node}",
            "devices": [{"index": i} for i in range(self.devices)], "free_bytes": 10**11,
            "replicas": [{"dataset": "d", "shard": i, "bytes": SIZE, "sha256": SHA} for i in sorted(self.files[node])],
            "transfers": [{"id": t, "state": "done", "bytes": SIZE} for t in self.done[node]]})
        self.done[node] = []
        with self.db.session() as s:
            reply = process_heartbeat(s, self.clock.now(), Identity("agent", node), hb)
        for t in reply["transfers"]:  # copied at once; reported done at the next heartbeat
            self.files[node].add(t["shard"])
            self.done[node].append(t["id"])
        for d in reply["delete"]:
            self.files[node].discard(d["shard"])
        return reply

    def beat_all(self) -> None:
        for node in sorted(self.files):
            self.beat(node)


def make_dataset(db: Database, replicas: int, span: int = 1, shards: int = 4) -> None:
    with db.session() as s:
        svc.add_user(s, 0.0, None, "alice", 1)
        s.add(Dataset(name="d", source="test", classes=2, image_shape=[8, 8, 1], replicas_required=replicas,
                      span=span, owner="alice", created_at=0))
        for i in range(shards):
            s.add(Shard(dataset="d", index=i, bytes=SIZE, sha256=SHA, samples=10))


def layout(db: Database) -> dict[int, list[str]]:
    """Shard -> nodes with a healthy copy."""
    out: dict[int, list[str]] = {}
    with db.session() as s:
        for r in s.scalars(select(Replica).where(Replica.state == "healthy").order_by(Replica.shard, Replica.node)):
            out.setdefault(r.shard, []).append(r.node)
    return out


def planned(db: Database) -> list[tuple[int, str, str]]:
    """Re-replication copies in flight: (shard, src, dst)."""
    with db.session() as s:
        return [(t.shard, t.src, t.dst) for t in s.scalars(select(Transfer).where(
            Transfer.job_id.is_(None), Transfer.state.in_(("pending", "running"))).order_by(Transfer.shard))]


def test_one_copy_whose_jobs_span_two_nodes_is_striped_in_the_background_never_below_one_healthy(db: Database) -> None:
    """R = 1, 4 shards whole on n1; nodes of 2 devices; a job of 2 ranks x 2 devices spans n1 and n2:
    its rank on n1 reads 0 and 1 there, its rank on n2 stages 2 and 3 onto n2.  Target for span 2:
    stripe {0, 2} stays on n1 (it holds it), stripe {1, 3} goes to n2.  Shard 3 is on its way to n2
    with the rank's staging, so only 1 is copied (once: concurrency 1); n1's copies of 1 and 3, and the
    copy of 2 the rank left on n2, go only once n2's stripe is healthy and the job that reads them is
    over."""
    clock = FakeClock(1000.0)
    make_dataset(db, replicas=1)
    agents = Agents(db, clock, {"n1": {0, 1, 2, 3}, "n2": set()})
    agents.beat_all()
    gang = {"name": "g", "resources": {"ranks": 2, "gpus_per_rank": 2}, "data": {"dataset": "d"},
            "train": {"epochs": 1}, "limits": {"time": "1h"}}
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, gang, None)
    cfg = Settings(heartbeat_ttl_s=10**6, replication_concurrency=1, policy=replace(PolicyConfig(locality_wait_s=0)))
    assert run_cycle(db, cfg, clock.advance(1)).bound == [job_id]
    with db.session() as s:
        d = s.get(Dataset, "d")
        assert (d.job_spans, d.span) == ([2], 2)  # noted at bind; taken by the cycle's replication phase
        assert [e.message for e in s.scalars(select(Event).where(Event.kind == "data.span"))] == [
            "d: span 1 -> 2, the span most of its latest 1 jobs had; re-balancing toward it"]
    with db.session() as s:
        assert sorted((a.rank, a.shard, a.node, a.source) for a in s.scalars(select(ShardAssignment))) == [
            (0, 0, "n1", "n1"), (0, 1, "n1", "n1"), (1, 2, "n2", "n1"), (1, 3, "n2", "n1")]
    assert planned(db) == [(1, "n1", "n2")]  # not 3: the rank on n2 brings it

    for _ in range(3):  # n2 makes its copy of 1 while the rank is still staging 2 and 3: 3 is not planned
        agents.beat_all()
        with db.session() as s:
            schedule_replication(s, clock.advance(1), concurrency=1)
    assert layout(db) == {0: ["n1"], 1: ["n1", "n2"], 2: ["n1"], 3: ["n1"]}
    assert planned(db) == []

    agents.files["n2"] |= {2, 3}  # the rank on n2 staged its shards; the agent keeps and reports them
    seen: list[dict[int, list[str]]] = []
    for _ in range(4):  # n2 makes its copy; the job still reads n1's and n2's: nothing is dropped
        agents.beat_all()
        with db.session() as s:
            schedule_replication(s, clock.advance(1), concurrency=1)
        seen.append(layout(db))
    assert layout(db) == {0: ["n1"], 1: ["n1", "n2"], 2: ["n1", "n2"], 3: ["n1", "n2"]}
    assert planned(db) == []
    with db.session() as s:  # the only copy made between nodes: shards 2 and 3 crossed once, staged
        assert [(t.shard, t.dst) for t in s.scalars(select(Transfer).where(Transfer.job_id.is_(None)))] == [(1, "n2")]

    with db.session() as s:  # the job ends (its ranks' reports are not what this test is about)
        s.get(Job, job_id).state = "COMPLETED"
    for _ in range(3):
        with db.session() as s:
            schedule_replication(s, clock.advance(1), concurrency=1)
        seen.append(layout(db))
        agents.beat_all()  # a node lists a dropped copy until it acts on the order: it does not come back
        seen.append(layout(db))
    assert layout(db) == {0: ["n1"], 1: ["n2"], 2: ["n1"], 3: ["n2"]}
    assert agents.files == {"n1": {0, 2}, "n2": {1, 3}}
    assert all(len(step.get(i, [])) >= 1 for step in seen for i in range(4))  # never below R healthy
    with db.session() as s:  # the target reached is its own target: nothing more moves
        assert schedule_replication(s, clock.advance(1), concurrency=4) == 0
        assert s.scalars(select(Transfer).where(Transfer.state == "delete")).all() == []


def test_a_lost_stripe_is_made_again_as_a_stripe_on_another_node(db: Database) -> None:
    """R = 2, span 2: copy 0 whole on n1, copy 1 striped {0, 2} on n2 and {1, 3} on n3.  n3 is lost:
    shards 1 and 3 are copied to n4, not to n2 (which holds the other stripe of the same copy; the
    group rule alone would have made copy 1 whole there)."""
    clock = FakeClock(1000.0)
    make_dataset(db, replicas=2, span=2)
    agents = Agents(db, clock, {"n1": {0, 1, 2, 3}, "n2": {0, 2}, "n3": {1, 3}, "n4": set()})
    agents.beat_all()
    with db.session() as s:
        s.get(Node, "n3").state = "down"
    with db.session() as s:
        assert schedule_replication(s, clock.advance(1), concurrency=16) == 2
    assert planned(db) == [(1, "n1", "n4"), (3, "n1", "n4")]


def test_a_data_set_no_job_has_read_keeps_the_layout_it_was_registered_with(db: Database) -> None:
    """Registered in place on n1 with span 2 (one-device nodes): whole on n1, unlike lay_out's stripes.
    Until a job reads it nothing moves: re-balancing follows the jobs seen, not the guess at creation."""
    clock = FakeClock(1000.0)
    make_dataset(db, replicas=1, span=2)
    agents = Agents(db, clock, {"n1": {0, 1, 2, 3}, "n2": set()}, devices=1)
    agents.beat_all()
    with db.session() as s:
        assert schedule_replication(s, clock.advance(1), concurrency=4) == 0
        assert s.scalars(select(Transfer)).all() == []


def _staged_and_over(db: Database, clock: FakeClock, agents: Agents, cache_bytes: int) -> int:
    """The striping scene of the first test, run to the end of its job with a node cache of
    ``cache_bytes``: returns the job's id.  n2 ends holding 1 and 3 (its stripe) and 2 (staged)."""
    gang = {"name": "g", "resources": {"ranks": 2, "gpus_per_rank": 2}, "data": {"dataset": "d"},
            "train": {"epochs": 1}, "limits": {"time": "1h"}}
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, gang, None)
    cfg = Settings(heartbeat_ttl_s=10**6, replication_concurrency=1, node_cache_gb=cache_bytes / 10**9,
                   policy=replace(PolicyConfig(locality_wait_s=0)))
    assert run_cycle(db, cfg, clock.advance(1)).bound == [job_id]
    agents.files["n2"] |= {2, 3}  # the rank on n2 staged its shards
    for _ in range(4):
        agents.beat_all()
        with db.session() as s:
            schedule_replication(s, clock.advance(1), concurrency=1, cache_bytes=cache_bytes)
    with db.session() as s:
        s.get(Job, job_id).state = "COMPLETED"
    return job_id


def test_the_node_cache_keeps_copies_no_layout_needs_up_to_its_size_the_least_recently_read_dropped_first(
        db: Database) -> None:
    """node_cache_gb: the copies the re-balance no longer needs (n1's old copies of 1 and 3 once n2's
    stripe holds them, the copy of 2 the rank staged on n2) stay, up to the cache's size per node; over
    it, the least recently read go first.  n1's copy of 3 was read (a job bound to read it there) after
    its copy of 1: with room for one copy, 1 goes and 3 stays."""
    clock = FakeClock(1000.0)
    make_dataset(db, replicas=1)
    agents = Agents(db, clock, {"n1": {0, 1, 2, 3}, "n2": set()})
    agents.beat_all()
    _staged_and_over(db, clock, agents, cache_bytes=10 * SIZE)
    for _ in range(3):  # room for every surplus copy: nothing is dropped
        with db.session() as s:
            schedule_replication(s, clock.advance(1), concurrency=1, cache_bytes=10 * SIZE)
        agents.beat_all()
    assert layout(db) == {0: ["n1"], 1: ["n1", "n2"], 2: ["n1", "n2"], 3: ["n1", "n2"]}
    with db.session() as s:
        assert s.scalars(select(Transfer).where(Transfer.state == "delete")).all() == []
        s.get(Replica, ("d", 3, "n1")).last_read_at = clock.advance(1)  # read there most recently

    for _ in range(3):  # room for one copy on each node: n1 keeps 3 (read last), drops 1; n2 keeps 2
        with db.session() as s:
            schedule_replication(s, clock.advance(1), concurrency=1, cache_bytes=SIZE)
        agents.beat_all()
    assert agents.files == {"n1": {0, 2, 3}, "n2": {1, 2, 3}}
    assert layout(db) == {0: ["n1"], 1: ["n2"], 2: ["n1", "n2"], 3: ["n1", "n2"]}

    for _ in range(3):  # no cache: the layout alone, as without one
        with db.session() as s:
            schedule_replication(s, clock.advance(1), concurrency=1, cache_bytes=0)
        agents.beat_all()
    assert agents.files == {"n1": {0, 2}, "n2": {1, 3}}


def test_the_node_cache_gives_its_bytes_back_before_its_node_would_reach_the_disk_floor(db: Database) -> None:
    """With a 5 GB floor, n2 reporting 6 GB free keeps no cached copy (its room is under twice the
    floor); reporting 20 GB, it keeps them again."""
    clock = FakeClock(1000.0)
    make_dataset(db, replicas=1)
    agents = Agents(db, clock, {"n1": {0, 1, 2, 3}, "n2": set()})
    agents.beat_all()
    _staged_and_over(db, clock, agents, cache_bytes=10 * SIZE)

    def cycles(free_n2: int) -> None:
        for _ in range(3):
            with db.session() as s:
                s.get(Node, "n2").free_bytes = free_n2
            with db.session() as s:
                schedule_replication(s, clock.advance(1), concurrency=1, disk_floor_bytes=5 * 10**9,
                                     cache_bytes=10 * SIZE)
            agents.beat("n2")

    cycles(20 * 10**9)
    assert agents.files["n2"] == {1, 2, 3}
    cycles(6 * 10**9)
    assert agents.files["n2"] == {1, 3}  # its stripe stays; the cached copy of 2 went
    assert layout(db) == {0: ["n1"], 1: ["n1", "n2"], 2: ["n1"], 3: ["n1", "n2"]}


def test_a_bound_job_notes_the_copies_it_reads_where_they_lie(db: Database) -> None:
    """The binder writes last_read_at on each copy a job reads on its own node (the cache's recency);
    a copy a rank stages gets its time when it is reported."""
    clock = FakeClock(1000.0)
    make_dataset(db, replicas=1)
    agents = Agents(db, clock, {"n1": {0, 1, 2, 3}, "n2": set()})
    agents.beat_all()
    _staged_and_over(db, clock, agents, cache_bytes=0)  # bound at 1001
    with db.read() as s:
        read = {(r.shard, r.node): r.last_read_at for r in s.scalars(select(Replica))}
    assert read[(0, "n1")] == read[(1, "n1")] == 1001.0  # rank 0 reads them on n1
    assert read[(2, "n1")] is None and read[(3, "n1")] is None  # staged from there, not read there
    assert read[(2, "n2")] is None and read[(3, "n2")] is None  # made by the staging: their time is updated_at
