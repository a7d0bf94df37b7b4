"""Reads what ``scheduler.core.room`` needs to tell the room each node has for new shard copies:
transfers in flight to it, uploads expected on it and the checkpoints of jobs running now.  Called by the cycle's replication
phase and by ``gsched data make`` (``scheduler.server.datastore``), in their own transactions."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.core.jobspec import stored
from scheduler.core.lifecycle import RANK_FINAL, STAGING_GRACE_S, ReplicaState, TransferState
from scheduler.core.room import Checkpointing, arriving_bytes, checkpoint_reserve, placement_room
from scheduler.store.models import Checkpoint, Job, Rank, Replica, Shard, Transfer

IN_FLIGHT = (TransferState.PENDING, TransferState.RUNNING)


def node_room(s: Session, now: float, free_bytes: Iterable[tuple[str, int | None]]) -> dict[str, int]:
    """``place_replicas``' ``room`` for the nodes of ``free_bytes`` (node, free bytes reported): less the
    bytes still to arrive by staging and re-replication transfers in flight and by the uploads of ``data
    make`` not yet reported (copies in state STAGING for ``STAGING_GRACE_S``, each whole), and the
    checkpoint reserve of every job with a live rank 0 (``scheduler.core.room``).  Reads only; the same
    answer until the database changes."""
    moving = [(dst, total, done) for dst, total, done in s.execute(
        select(Transfer.dst, Transfer.bytes, Transfer.done_bytes).where(Transfer.state.in_(IN_FLIGHT)))]
    moving += [(node, size, 0) for node, size in s.execute(
        select(Replica.node, Shard.bytes)
        .join(Shard, (Shard.dataset == Replica.dataset) & (Shard.index == Replica.shard))
        .where(Replica.state == ReplicaState.STAGING, Replica.updated_at > now - STAGING_GRACE_S))]
    return placement_room(free_bytes, arriving_bytes(moving), checkpoint_reserve(running_checkpoints(s)))


def running_checkpoints(s: Session) -> list[Checkpointing]:
    """For each job whose rank 0 is live and which has recorded a checkpoint: its ``keep_checkpoints``,
    its last checkpoint's size and count, and the nodes holding them (that checkpoint's, and rank 0's)."""
    rank0 = dict(s.execute(select(Rank.job_id, Rank.node).where(Rank.rank == 0, Rank.state.not_in(RANK_FINAL))).all())
    if not rank0:
        return []
    ids = sorted(rank0)
    counted = (select(Checkpoint.job_id, func.count().label("n"), func.max(Checkpoint.id).label("last"))
               .where(Checkpoint.job_id.in_(ids)).group_by(Checkpoint.job_id).subquery())
    counts: dict[int, int] = {}
    last: dict[int, tuple[int, tuple[str, ...]]] = {}
    for job_id, n, size, nodes in s.execute(select(Checkpoint.job_id, counted.c.n, Checkpoint.bytes, Checkpoint.nodes)
                                            .join(counted, Checkpoint.id == counted.c.last)):
        counts[job_id] = int(n)
        last[job_id] = (int(size or 0), tuple(nodes or ()))
    keep: dict[int, int] = defaultdict(int)
    for job_id, spec in s.execute(select(Job.id, Job.spec).where(Job.id.in_(list(last)))):
        keep[job_id] = stored(spec).knobs.keep_checkpoints
    return [Checkpointing(keep=keep[j], last_bytes=size, recorded=counts.get(j, 0), nodes=(rank0[j], *nodes))
            for j, (size, nodes) in sorted(last.items())]
