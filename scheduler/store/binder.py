"""Bind: a chosen job gets its ranks, its devices and its shard reads, in a transaction that first
checks again that all of it is still possible.

The decision was made over a snapshot; heartbeats and other writes run between the cycle's phases, so
by the time a job is bound its devices may have been taken, its node may be down, or the job may have
been cancelled.  ``try_bind`` re-checks each of these inside the transaction that writes the binding,
so two cycles (or a stale decision) can never give a device twice, and says which one failed.
``busy_devices`` is the one reading of which devices ranks hold, shared with the snapshot.

``bind_all`` binds a cycle's decision in transactions of up to ``BIND_BATCH`` jobs: one write lock and
one commit per batch, the devices read once per batch (``Holdings``) and kept up to date as its jobs
take them.  A 500-job burst bound one job per transaction, each waiting its turn for the write lock
behind the heartbeats: most of its bind phase was that wait.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from scheduler.core.binding import BindPlan, plan_binding
from scheduler.core.diskfloor import under_floor
from scheduler.core.jobspec import stored
from scheduler.core.lifecycle import RANK_FINAL, JobState, NodeState, RankState, TransferState
from scheduler.core.placement import Candidate
from scheduler.core.replicas import seen_spans
from scheduler.store.db import Database
from scheduler.store.effects import bind_job
from scheduler.store.models import Dataset, Device, Job, Node, Rank, Replica, ShardAssignment, Transfer

log = logging.getLogger("gsched.binder")
BIND_BATCH = 64  # jobs bound in one transaction: bounds how long a batch holds the write lock


def busy_devices(s: Session) -> dict[str, set[int]]:
    """Node -> the indexes of its devices that ranks not yet final hold."""
    busy: dict[str, set[int]] = defaultdict(set)
    for node, devices in s.execute(select(Rank.node, Rank.devices).where(Rank.state.not_in(RANK_FINAL))):
        busy[node].update(devices or [])
    return busy


@dataclass
class Holdings:
    """The devices as a binding re-checks them, read inside the binding's transaction: each node's
    healthy device indexes (ascending), the indexes ranks hold, and which nodes are up (and not
    drained).  ``take`` adds a new binding's devices, so the next job of the same transaction sees
    them held without reading again."""

    healthy: dict[str, list[int]]
    busy: dict[str, set[int]]
    up: set[str]
    nodes: frozenset[str]
    free_bytes: dict[str, int | None] = field(default_factory=dict)  # as each node's agent last reported

    @classmethod
    def read(cls, s: Session, nodes: Iterable[str]) -> Holdings:
        names = sorted(set(nodes))
        healthy: dict[str, list[int]] = defaultdict(list)
        for node, index in s.execute(select(Device.node, Device.index).where(
                Device.node.in_(names), Device.healthy.is_(True)).order_by(Device.node, Device.index)):
            healthy[node].append(index)
        up: set[str] = set()
        free: dict[str, int | None] = {}
        for name, state, drained_at, free_bytes in s.execute(select(Node.name, Node.state, Node.drained_at,
                                                                    Node.free_bytes).where(Node.name.in_(names))):
            free[name] = free_bytes
            if state == NodeState.UP and drained_at is None:  # drained since the snapshot: not up here
                up.add(name)
        return cls(healthy, busy_devices(s), up, frozenset(names), free)

    def take(self, plan: BindPlan) -> None:
        for node, devices in plan.devices_by_node().items():
            self.busy.setdefault(node, set()).update(devices)


def try_bind(s: Session, now: float, job_id: int, cand: Candidate, clock: Callable[[], float] | None = None,
             holdings: Holdings | None = None, disk_floor_bytes: int = 0) -> str | None:
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
    (``Dataset.job_spans``).  A node whose reported free disk fell under ``disk_floor_bytes`` since
    the snapshot refuses the bind.

    ``holdings``: the devices as read earlier in this same transaction (covering ``cand.nodes``), kept
    up to date with the bindings made since (``bind_all``); read here when not given.
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
    if holdings is None or not holdings.nodes.issuperset(cand.nodes):
        holdings = Holdings.read(s, cand.nodes)
    for name in sorted(cand.nodes):
        if under_floor(holdings.free_bytes.get(name), disk_floor_bytes):
            return f"node {name}'s free disk fell under the floor (disk_floor_gb) since the snapshot"
    plan = plan_binding(cand, holdings.healthy, holdings.busy, holdings.up)
    if isinstance(plan, str):
        return plan
    if clock is not None:
        now = max(now, clock())
    bind_job(s, now, job, cand)  # PENDING -> BOUND (lifecycle): attempt + 1, the job.bind event
    holdings.take(plan)
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
    local: dict[str, list[int]] = defaultdict(list)  # the copies read where they lie: the node cache's recency
    for read in cand.reads:
        if read.source == read.node:
            local[read.node].append(read.shard)
    for node, shards in sorted(local.items()):
        s.execute(update(Replica).where(Replica.dataset == dataset, Replica.node == node, Replica.shard.in_(shards))
                  .values(last_read_at=now).execution_options(synchronize_session=False))
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
    """``try_bind`` each of ``bindings``, in their order, in transactions of up to ``BIND_BATCH`` jobs.

    A batch whose transaction fails (an error, not a refusal: a refusal writes nothing) is rolled
    back whole and bound again one job per transaction, so one failing job never takes the others
    with it; an error binding a job alone propagates, as it always did."""
    out = Bound()
    items = list(bindings.items())
    for at in range(0, len(items), BIND_BATCH):
        batch = items[at:at + BIND_BATCH]
        try:
            got = _bind_batch(db, now, batch, clock, disk_floor_bytes)
        except Exception as e:
            if len(batch) == 1:
                raise
            log.warning("binding %d jobs in one transaction failed (%s): binding each alone", len(batch), e)
            got = {}
            for one in batch:
                got.update(_bind_batch(db, now, [one], clock, disk_floor_bytes))
        for job_id, cand in batch:
            why = got[job_id]
            if why is None:
                out.jobs.append(job_id)
                out.nodes.update(cand.nodes)
            else:
                out.refused[job_id] = why
    return out


def _bind_batch(db: Database, now: float, batch: list[tuple[int, Candidate]],
                clock: Callable[[], float] | None, disk_floor_bytes: int = 0) -> dict[int, str | None]:
    """Bind ``batch`` in one transaction: its jobs read in one query (held, so ``try_bind``'s ``get``
    finds them), the devices of all their nodes once."""
    with db.session() as s:
        ids = [job_id for job_id, _ in batch]
        held = list(s.scalars(select(Job).where(Job.id.in_(ids))))
        holdings = Holdings.read(s, {n for _, cand in batch for n in cand.nodes})
        got = {job_id: try_bind(s, now, job_id, cand, clock, holdings, disk_floor_bytes) for job_id, cand in batch}
        del held
    return got


def start_locality_waits(s: Session, now: float, job_ids: Iterable[int]) -> None:
    """Stamp ``now`` as the start of the locality wait of those of ``job_ids`` still PENDING that have
    none yet (the wait counts from the first cycle a job waited: policies.twostage)."""
    s.execute(update(Job).where(Job.id.in_(list(job_ids)), Job.state == JobState.PENDING,
                                Job.locality_wait_since.is_(None)).values(locality_wait_since=now))
