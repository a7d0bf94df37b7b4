"""Read the cluster into one immutable ``Snapshot`` (scheduler.core.snapshot), the view a cycle decides over.

Plain column reads, no ORM objects: at a thousand nodes and jobs this is the cycle's biggest read, and
it runs in a read-only session.  The simulator builds the same ``Snapshot`` from its own world
(scheduler.sim.simulator); tests check that both read one world alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from scheduler.core.accounts import AccountView
from scheduler.core.diskfloor import under_floor
from scheduler.core.jobspec import stored
from scheduler.core.lifecycle import (
    ACTIVE,
    PREEMPT_EVENT,
    PREEMPTING_EVENT,
    RANK_FINAL,
    JobState,
    NodeState,
    ReplicaState,
)
from scheduler.core.snapshot import JobView, NodeView, RunningView, ShardView, Snapshot
from scheduler.store.binder import busy_devices
from scheduler.store.models import (
    Account,
    Checkpoint,
    Device,
    Event,
    Job,
    Node,
    Rank,
    Replica,
    Shard,
    Usage,
    User,
)

SHAPE_CHUNK = 500  # job ids per query when shapes are read


@dataclass(frozen=True)
class JobShape:
    """What the cycle needs of a job's stored spec (read through ``jobspec.stored``, so with its defaults)."""

    user: str
    ranks: int
    devices_per_rank: int
    dataset: str | None
    time_limit_s: float
    preemptible: bool = True  # [limits] preemptible


@dataclass
class JobShapes:
    """The shapes of jobs, read once per revision of a job's spec: decoding the specs of two thousand
    pending jobs was a third of the snapshot's time.

    Keyed by (job id, submitted_at, spec_rev): the submit time guards against a reused id, the
    revision (bumped by ``gsched update``) against a changed spec.  One per database
    (the cycle process keeps one in its ``CycleMemory``); ended jobs are forgotten now and then."""

    known: dict[tuple[int, float, int], JobShape] = field(default_factory=dict)

    def read(self, s: Session, keys: list[tuple[int, float, int]]) -> dict[int, JobShape]:
        """The shapes of the jobs given as (id, submitted_at, spec_rev), reading those not known yet."""
        known = self.known
        missing = [i for i, t, r in keys if (i, t, r) not in known]
        for start in range(0, len(missing), SHAPE_CHUNK):
            for job_id, submitted_at, rev, user, spec in s.execute(
                    select(Job.id, Job.submitted_at, Job.spec_rev, Job.user, Job.spec)
                    .where(Job.id.in_(missing[start:start + SHAPE_CHUNK]))):
                known[(job_id, submitted_at, rev)] = _shape(user, spec)
        if len(known) > 4 * max(len(keys), 1000):  # forget ended jobs now and then
            wanted = set(keys)
            for key in [k for k in known if k not in wanted]:
                del known[key]
        return {i: known[(i, t, r)] for i, t, r in keys if (i, t, r) in known}

    def of(self, job: Job) -> JobShape:
        """The shape of a job already loaded."""
        key = (job.id, job.submitted_at, job.spec_rev or 0)
        shape = self.known.get(key)
        if shape is None:
            shape = self.known[key] = _shape(job.user, job.spec)
        return shape


def _shape(user: str, doc: dict[str, Any]) -> JobShape:
    spec = stored(doc)
    return JobShape(user=user, ranks=spec.resources.ranks, devices_per_rank=spec.resources.gpus_per_rank,
                    dataset=spec.dataset, time_limit_s=float(spec.time_limit_s),
                    preemptible=spec.limits.preemptible)


def _within_array_caps(s: Session, rows: Sequence[Any]) -> list[Any]:
    """The pending rows the cycle may consider: an array's jobs (``submit --array 0-9%N``) only while
    fewer than N of them are active, and then only as many as would make N, lowest id first, so one
    cycle cannot start more.  Rows are (id, ..., array_job_id, array_max_running), oldest id first."""
    capped = {r[-2] for r in rows if r[-2] is not None and r[-1] is not None}
    if not capped:
        return list(rows)
    active = dict(s.execute(select(Job.array_job_id, func.count()).where(
        Job.array_job_id.in_(sorted(capped)), Job.state.in_(ACTIVE)).group_by(Job.array_job_id)).all())
    room = {a: 0 for a in capped}
    out = []
    for r in rows:
        array, cap = r[-2], r[-1]
        if array is not None and cap is not None:
            if active.get(array, 0) + room[array] >= cap:
                continue
            room[array] += 1
        out.append(r)
    return out


def _preemption_facts(s: Session, now: float, job_ids: list[int]
                      ) -> tuple[dict[int, float], dict[int, tuple[int, int]]]:
    """For jobs holding devices: when each one's newest checkpoint was recorded, and how often it was
    preempted (``job.preempt`` events) in the hour before ``now`` and in all."""
    if not job_ids:
        return {}, {}
    ckpt = {job: float(t) for job, t in s.execute(
        select(Checkpoint.job_id, func.max(Checkpoint.created_at))
        .where(Checkpoint.job_id.in_(job_ids)).group_by(Checkpoint.job_id))}
    recent = func.sum(case((Event.time > now - 3600.0, 1), else_=0))
    preempted = {int(job or 0): (int(hour or 0), int(n)) for job, hour, n in s.execute(
        select(Event.job_id, recent, func.count())
        .where(Event.kind == PREEMPT_EVENT, Event.job_id.in_(job_ids))
        .group_by(Event.job_id))}
    return ckpt, preempted


def build_snapshot(s: Session, now: float, shapes: JobShapes | None = None, disk_floor_bytes: int = 0,
                   preemption: bool = True) -> Snapshot:
    """The cluster at ``now``: up nodes with their healthy and free devices, every shard and its healthy
    copies on up nodes, pending jobs (oldest id first) with the nodes of their last checkpoint (but not
    those whose last attempt still has ranks stopping on a node that is up), running
    jobs with their devices per node and when they must end, each user's usage and shares, and the account tree.
    ``shapes``: the caller's ``JobShapes`` (a fresh one reads every spec).  Drained nodes are left out
    (no new ranks; their copies are not read).  A node whose reported free disk is under
    ``disk_floor_bytes`` (``scheduler.core.diskfloor``) is in with no devices: it takes no new ranks,
    and its copies are still read by ranks elsewhere (staging writes only on the rank's node).
    ``preemption``: read what only ``policies.preemption`` uses (running jobs' newest checkpoints and
    recent preemptions, pending jobs' ``preempting``); the cycle asks for it only with ``[policy]
    preempt`` on, and without it those fields keep their defaults."""
    shapes = shapes if shapes is not None else JobShapes()
    busy = busy_devices(s)
    healthy: dict[str, int] = defaultdict(int)
    for node, count in s.execute(select(Device.node, func.count()).where(Device.healthy.is_(True)).group_by(Device.node)):
        healthy[node] = count
    nodes = {}
    up = set()  # drained ones too: their agents still stop ranks (see the pending jobs below)
    for name, rack, free_bytes, drained_at in s.execute(select(Node.name, Node.rack, Node.free_bytes, Node.drained_at)
                                                        .where(Node.state == NodeState.UP).order_by(Node.name)):
        up.add(name)
        if drained_at is not None:  # a drained node takes no new ranks
            continue
        # nor does one whose disk is under the floor; it stays in as a node of no devices, so that the
        # copies it holds are still read (staged from) by ranks placed elsewhere
        devs = 0 if under_floor(free_bytes, disk_floor_bytes) else healthy.get(name, 0)
        nodes[name] = NodeView(name=name, rack=rack, devices=devs, free=max(0, devs - len(busy[name])))
    shards: dict[str, list[ShardView]] = defaultdict(list)
    for ds, index, size, samples in s.execute(
            select(Shard.dataset, Shard.index, Shard.bytes, Shard.samples).order_by(Shard.dataset, Shard.index)):
        shards[ds].append(ShardView(ds, index, size, samples))
    replicas: dict[tuple[str, int], list[str]] = defaultdict(list)
    for ds, index, node in s.execute(
            select(Replica.dataset, Replica.shard, Replica.node).where(Replica.state == ReplicaState.HEALTHY).order_by(Replica.node)):
        if node in nodes:
            replicas[(ds, index)].append(node)
    pending_ids = select(Job.id).where(Job.state == JobState.PENDING).scalar_subquery()
    ckpt_nodes: dict[int, tuple[str, ...]] = {}
    for job_id, ck_nodes in s.execute(select(Checkpoint.job_id, Checkpoint.nodes)
                                      .where(Checkpoint.job_id.in_(pending_ids))
                                      .order_by(Checkpoint.job_id, Checkpoint.epoch)):
        ckpt_nodes[job_id] = tuple(ck_nodes or ())
    pending_rows = _within_array_caps(s, s.execute(
        select(Job.id, Job.submitted_at, Job.pending_since, Job.locality_wait_since, Job.spec_rev,
               Job.array_job_id, Job.array_max_running)
        # held, or waiting for its dependencies: not scheduled
        .where(Job.state == JobState.PENDING, Job.held_by.is_(None), Job.deps_met.is_(True))
        .order_by(Job.id)).all())
    by_job: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    last_start: dict[int, float] = {}  # when the job's live ranks started (bound, if not started yet)
    for job_id, node, devices, bound_at, rank_started in s.execute(
            select(Rank.job_id, Rank.node, Rank.devices, Rank.bound_at, Rank.started_at)
            .where(Rank.state.not_in(RANK_FINAL))):
        by_job[job_id][node] += len(devices or [])
        t = rank_started if rank_started is not None else bound_at
        if t is not None:
            last_start[job_id] = max(last_start.get(job_id, t), t)
    running_rows = s.execute(select(Job.id, Job.submitted_at, Job.started_at, Job.spec_rev, Job.state)
                             .where(Job.id.in_(list(by_job)))).all()
    shape_of = shapes.read(s, [(r[0], r[1], r[4]) for r in pending_rows] + [(r[0], r[1], r[3]) for r in running_rows])
    # pending jobs that others were preempted for since they became pending (scheduler.server.preempt)
    preempting = set(s.scalars(select(Event.job_id).join(Job, Job.id == Event.job_id).where(
        Event.kind == PREEMPTING_EVENT, Job.state == JobState.PENDING, Event.time >= Job.pending_since))
    ) if preemption else set()
    # A requeued job waits until its last attempt's ranks have stopped on every node that is up (as
    # Slurm's COMPLETING): two attempts never run at once, and a preempted job resumes from the checkpoint
    # it wrote on SIGTERM.  On a node that is down they are the node's fence's (agents/fence.py): gone
    # before the TTL that declared it down.
    pending = []
    for job_id, submitted_at, pending_since, waiting_since, _rev, _array, _cap in pending_rows:
        stopping = by_job.get(job_id)
        if stopping is not None and not up.isdisjoint(stopping):
            continue
        shape = shape_of[job_id]
        pending.append(JobView(id=job_id, user=shape.user, ranks=shape.ranks, devices_per_rank=shape.devices_per_rank,
                               dataset=shape.dataset, submit_s=submitted_at, pending_since_s=pending_since,
                               time_limit_s=shape.time_limit_s, prefer_nodes=ckpt_nodes.get(job_id, ()),
                               waiting_since_s=waiting_since, preempting=job_id in preempting))
    running = []
    ckpt_s, preempted = _preemption_facts(s, now, [r[0] for r in running_rows]) if preemption else ({}, {})
    for job_id, _submitted, started_at, _rev, state in running_rows:
        start = started_at or now
        attempt_start = last_start.get(job_id, start)
        newest = ckpt_s.get(job_id)
        last_hour, ever = preempted.get(job_id, (0, 0))
        running.append(RunningView(id=job_id, user=shape_of[job_id].user,
                                   devices_by_node=tuple(sorted(by_job[job_id].items())),
                                   end_by_s=max(now, start + shape_of[job_id].time_limit_s),
                                   started_s=attempt_start,
                                   checkpoint_s=newest if newest is not None and newest >= attempt_start else None,
                                   preemptible=shape_of[job_id].preemptible,
                                   preemptions_last_hour=last_hour, preemptions=ever,
                                   stopping=state not in ACTIVE))
    running.sort(key=lambda r: r.id)
    usage = dict(s.execute(select(Usage.user, Usage.device_seconds)).all())
    shares = dict(s.execute(select(User.name, User.shares)).all())
    accounts = {name: AccountView(name, parent, acc_shares)
                for name, parent, acc_shares in s.execute(select(Account.name, Account.parent, Account.shares))}
    user_account = {name: acc for name, acc in s.execute(select(User.name, User.account)) if acc is not None}
    return Snapshot(now_s=now, nodes=nodes, shards={k: tuple(v) for k, v in shards.items()},
                    replicas={k: tuple(v) for k, v in replicas.items()}, pending=tuple(pending),
                    running=tuple(running), usage=usage, shares=shares,
                    accounts=accounts, user_account=user_account)
