"""The room for new copies as read from a real database (SQLite and PostgreSQL, ``db``): a running
job's checkpoints, a transfer in flight and an upload of ``data make`` not yet reported take their bytes
off the nodes' reported free disk."""

from __future__ import annotations

from sqlalchemy import select

from scheduler.core.clock import FakeClock
from scheduler.core.lifecycle import STAGING_GRACE_S, RankState, ReplicaState, TransferState
from scheduler.server import service as svc
from scheduler.server.cycle import run_cycle
from scheduler.store.db import Database
from scheduler.store.models import Checkpoint, Dataset, Rank, Replica, Shard, Transfer
from scheduler.store.room_reader import node_room
from tests.db.test_store import ALICE, SPEC, settings, setup_cluster

GB = 10**9
MB = 10**6
ONE = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}  # keep_checkpoints: the default, 3


def test_a_running_jobs_checkpoints_and_transfers_in_flight_are_taken_off_the_room(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)
    assert run_cycle(db, settings(), clock.advance(1)).bound == [job_id]
    with db.read() as s:
        node = s.scalars(select(Rank.node).where(Rank.job_id == job_id, Rank.rank == 0)).one()
    mirror = "n2" if node == "n1" else "n1"
    with db.session() as s:
        for epoch, size in ((0, 400 * MB), (1, 500 * MB)):  # the last one recorded counts: 500 MB
            s.add(Checkpoint(job_id=job_id, epoch=epoch, path=f"/x/epoch-{epoch:04d}.pt", nodes=[node, mirror],
                             bytes=size, created_at=clock.now()))
        s.add(Transfer(job_id=None, dataset="d", shard=0, src=node, dst=mirror, bytes=1 * GB, done_bytes=400 * MB,
                       state=TransferState.RUNNING, created_at=clock.now()))
        s.add(Transfer(job_id=None, dataset="d", shard=1, src=node, dst=mirror, bytes=1 * GB, done_bytes=0,
                       state=TransferState.DONE, created_at=clock.now()))  # over: nothing more to arrive
    with db.read() as s:
        room = node_room(s, clock.now(), [(node, 10 * GB), (mirror, 10 * GB)])
    # rank 0's node: 10 GB - 3 x 500 MB = 8.5 GB; the mirror: the same less 600 MB still to arrive
    assert room == {node: 8500 * MB, mirror: 7900 * MB}
    with db.session() as s:  # rank 0 has exited: the job writes no more checkpoints, its reserve goes
        s.scalars(select(Rank).where(Rank.job_id == job_id)).one().state = RankState.EXITED
    with db.read() as s:
        assert node_room(s, clock.now(), [(node, 10 * GB)]) == {node: 10 * GB}


def test_the_uploads_a_data_make_expects_take_room_until_reported_or_given_up(db: Database) -> None:
    """``data make`` places its copies and the CLI uploads them: until a node reports a copy (HEALTHY) its
    bytes are on their way and a second placement must not count them as free; one not reported within
    STAGING_GRACE_S is made again elsewhere by the replication phase and no longer takes room."""
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    with db.session() as s:
        s.add(Dataset(name="up", source="test", classes=2, image_shape=[8, 8, 1], replicas_required=1, owner="alice",
                      created_at=clock.now()))
        for i, size in enumerate((2 * GB, 3 * GB, 1 * GB)):
            s.add(Shard(dataset="up", index=i, bytes=size, sha256="0" * 64, samples=10))
        s.add(Replica(dataset="up", shard=0, node="n1", state=ReplicaState.STAGING, updated_at=clock.now()))
        s.add(Replica(dataset="up", shard=1, node="n1", state=ReplicaState.STAGING, updated_at=clock.now()))
        s.add(Replica(dataset="up", shard=2, node="n2", state=ReplicaState.HEALTHY, updated_at=clock.now()))
    with db.read() as s:
        assert node_room(s, clock.now(), [("n1", 10 * GB), ("n2", 10 * GB)]) == {"n1": 5 * GB, "n2": 10 * GB}
    with db.session() as s:  # shard 1 landed and was reported
        s.get(Replica, ("up", 1, "n1")).state = ReplicaState.HEALTHY
    with db.read() as s:
        assert node_room(s, clock.now(), [("n1", 10 * GB)]) == {"n1": 8 * GB}
        assert node_room(s, clock.advance(STAGING_GRACE_S + 1), [("n1", 10 * GB)]) == {"n1": 10 * GB}
