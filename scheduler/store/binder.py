"""Bind: a chosen job gets its ranks, its devices and its shard reads, in one transaction that first
checks again that all of it is still possible.

The decision was made over a snapshot; heartbeats and other writes run between the cycle's phases, so
by the time a job is bound its devices may have been taken, its node may be down, or the job may have
been cancelled.  ``try_bind`` re-checks each of these inside the transaction that writes the binding,
so two cycles (or a stale decision) can never give a device twice, and says which one failed.
``busy_devices`` is the one reading of which devices ranks hold, shared with the snapshot.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from scheduler.core.binding import plan_binding
from scheduler.core.diskfloor import under_floor
from scheduler.core.jobspec import stored
from scheduler.core.lifecycle import RANK_FINAL, JobState, NodeState, RankState, TransferState
from scheduler.core.placement import Candidate
from scheduler.core.replicas import seen_spans
from scheduler.store.db import Database
from scheduler.store.effects import bind_job
from scheduler.store.models import Dataset, Device, Job, Node, Rank, ShardAssignment, Transfer


def busy_devices(s: Session) -> dict[str, set[int]]:
    """Node -> the indexes of its devices that ranks not yet final hold."""
    busy: dict[str, set[int]] = defaultdict(set)
    for node, devices in s.execute(select(Rank.node, Rank.devices).where(Rank.state.not_in(RANK_FINAL))):
        busy[node].update(devices or [])
    return busy


def try_bind(s: Session, now: float, job_id: int, cand: Candidate, clock: Callable[[], float] | None = None,
             disk_floor_bytes: int = 0) -> str | None:
    """Bind one job to ``cand`` in the caller's transaction and return None; or write nothing and return
    why not, in words for the job's explanation:

    - the job is gone or no longer PENDING (cancelled since the snapshot, say);
    - a node of ``cand`` is not up any more, or its free disk fell under ``disk_floor_bytes``;
    - a node has fewer free healthy devices than ``cand`` puts on it (taken, or found unhealthy, since
      the snapshot).

    The check and the ranks' devices are ``scheduler.core.binding.plan_binding``'s (the simulator binds
    with it too).  A bound job is BOUND with attempt + 1; each rank gets the lowest free device indexes
    of its node, in rank order, and is stamped ``max(now, clock())`` taken after the check, so a binding never predates
    the release it relies on.  Its shard reads are stored, a transfer for each read that is not local,
    and a ``job.bind`` event, and the data set it reads notes how many nodes it spans
    (``Dataset.job_spans``).
    """
    job = s.get(Job, job_id)
    if job is None:
        return "the job is gone"
    if job.state != JobState.PENDING:
        return f"the job is {job.state} now, no longer PENDING"
    if job.held_by is not None:
        return f"the job is held by {job.held_by} now"
    if not job.deps_met:
        return "the job waits for its dependencies"
    healthy: dict[str, list[int]] = defaultdict(list)
    for d in s.scalars(select(Device).where(Device.node.in_(cand.nodes), Device.healthy.is_(True)).order_by(Device.index)):
        healthy[d.node].append(d.index)
    up = {n.name for n in s.scalars(select(Node).where(Node.name.in_(cand.nodes), Node.state == NodeState.UP,
                                                   Node.drained_at.is_(None)))}  # drained since the snapshot
    for name, free in s.execute(select(Node.name, Node.free_bytes).where(Node.name.in_(cand.nodes)).order_by(Node.name)):
        if under_floor(free, disk_floor_bytes):
            return f"node {name}'s free disk fell under the floor (disk_floor_gb) since the snapshot"
    plan = plan_binding(cand, healthy, busy_devices(s), up)
    if isinstance(plan, str):
        return plan
    if clock is not None:
        now = max(now, clock())
    bind_job(s, now, job, cand)  # PENDING -> BOUND (lifecycle): attempt + 1, the job.bind event
    for slot in plan.ranks:
        s.add(Rank(job_id=job.id, attempt=job.attempt, rank=slot.rank, local_rank=slot.local_rank, node=slot.node,
                   devices=list(slot.devices), state=RankState.ASSIGNED, bound_at=now))
    dataset = stored(job.spec).dataset or ""
    for read in cand.reads:
        s.add(ShardAssignment(job_id=job.id, attempt=job.attempt, rank=read.rank, dataset=dataset, shard=read.shard,
                              node=read.node, source=read.source, bytes=read.bytes))
    for read in plan.staging:
        s.add(Transfer(job_id=job.id, dataset=dataset, shard=read.shard, src=read.source, dst=read.node,
                       bytes=read.bytes, state=TransferState.JOB, created_at=now))
    read_set = s.get(Dataset, dataset) if dataset else None
    if read_set is not None:  # the shape its jobs have: the cycle's re-balance lays the data set out for it
        read_set.job_spans = seen_spans(read_set.job_spans or [], len({slot.node for slot in plan.ranks}))
    return None


def bind(s: Session, now: float, job_id: int, cand: Candidate, clock: Callable[[], float] | None = None) -> bool:
    """``try_bind``, answering only whether the job was bound."""
    return try_bind(s, now, job_id, cand, clock) is None


@dataclass
class Bound:
    """What binding one decision did: the jobs bound (in the decision's order), why each other one was
    not, and the nodes that got ranks."""

    jobs: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)


def bind_all(db: Database, now: float, bindings: Mapping[int, Candidate], clock: Callable[[], float] | None = None,
             disk_floor_bytes: int = 0) -> Bound:
    """``try_bind`` each of ``bindings`` in a transaction of its own, in their order."""
    out = Bound()
    for job_id, cand in bindings.items():
        with db.session() as s:
            why = try_bind(s, now, job_id, cand, clock, disk_floor_bytes)
        if why is None:
            out.jobs.append(job_id)
            out.nodes.update(cand.nodes)
        else:
            out.refused[job_id] = why
    return out


def start_locality_waits(s: Session, now: float, job_ids: Iterable[int]) -> None:
    """Stamp ``now`` as the start of the locality wait of those of ``job_ids`` still PENDING that have
    none yet (the wait counts from the first cycle a job waited: policies.twostage)."""
    s.execute(update(Job).where(Job.id.in_(list(job_ids)), Job.state == JobState.PENDING,
                                Job.locality_wait_since.is_(None)).values(locality_wait_since=now))
