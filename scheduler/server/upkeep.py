"""The cycle's first three phases: bring the stored world up to ``now`` before the snapshot is read.

1. ``expire_nodes``: nodes silent past the heartbeat TTL go down, and their active jobs are requeued;
2. ``enforce_time_limits``: each active job's state is settled from its ranks (``heartbeat.sync_job``:
   rank failures whose grace has passed), and jobs past their time limit end TIMEOUT;
3. ``update_usage``: each user's decayed device-seconds are brought up to ``now``;
4. ``settle_dependencies``: a pending job whose ``--dependency`` is now met may be scheduled, and one
   whose dependency can never be met ends FAILED, saying which and why.

Each runs in the caller's transaction and returns what it changed.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.core import dependency as dep
from scheduler.core.fairshare import accrue
from scheduler.core.lifecycle import ACTIVE, RANK_FINAL, JobState, NodeState, RankState
from scheduler.core.reasons import Reason, ReasonKind
from scheduler.server.heartbeat import ranks_of, sync_job
from scheduler.server.service import finish_job, record, requeue_job
from scheduler.store.models import Job, Node, Rank, Usage
from scheduler.store.snapshot_reader import JobShapes


def expire_nodes(s: Session, now: float, ttl_s: float) -> int:
    """Mark down the up nodes last seen more than ``ttl_s`` before ``now`` and requeue the active jobs
    with ranks on them; returns how many nodes went down."""
    n = 0
    for node in s.scalars(select(Node).where(Node.state == NodeState.UP, Node.last_seen < now - ttl_s)):
        node.state = NodeState.DOWN
        node.down_since = now
        n += 1
        record(s, now, "server", "node.down", f"{node.name}: no heartbeat for {now - node.last_seen:.0f}s", node=node.name)
        jobs = {r.job_id for r in s.scalars(select(Rank).where(Rank.node == node.name,
                                                              Rank.state.not_in(RANK_FINAL)))}
        for job_id in sorted(jobs):
            job = s.get(Job, job_id)
            if job is not None and job.state in ACTIVE:
                requeue_job(s, now, job, f"node {node.name} is down")
    return n


def enforce_time_limits(s: Session, now: float, failure_grace_s: float = 0.0, shapes: JobShapes | None = None) -> int:
    """End jobs past their time limit (TIMEOUT); settle rank failures whose grace has passed.  Returns
    how many jobs timed out.  ``shapes``: where the jobs' time limits are read (a fresh one: each spec)."""
    shapes = shapes if shapes is not None else JobShapes()
    n = 0
    active = list(s.scalars(select(Job).where(Job.state.in_(ACTIVE))))
    ranks = ranks_of(s, active)  # one query, not one per job
    for job in active:
        sync_job(s, now, job, failure_grace_s, ranks[job.id])
        if job.state not in ACTIVE:
            continue
        limit = int(shapes.of(job).time_limit_s)
        start = job.started_at
        if start is not None and now - start > limit:
            finish_job(s, now, job, JobState.TIMEOUT, f"ran past its time limit of {limit}s")
            n += 1
    return n


def update_usage(s: Session, now: float, half_life_s: float) -> None:
    """Decay each user's usage to ``now`` and add the device-seconds their live ranks used since."""
    rows = {u.user: u for u in s.scalars(select(Usage))}
    running: dict[str, int] = defaultdict(int)
    q = (select(Job.user, Rank.devices).join(Rank, Rank.job_id == Job.id)
         .where(Rank.state == RankState.RUNNING, Job.state == JobState.RUNNING))
    for user, devices in s.execute(q):
        running[user] += len(devices or [])
    for user in set(rows) | set(running):
        row = rows.get(user)
        if row is None:
            row = Usage(user=user, device_seconds=0.0, updated_at=now)
            s.add(row)
            continue
        dt = max(0.0, now - row.updated_at)
        row.device_seconds = accrue(row.device_seconds, running[user], dt, half_life_s)
        row.updated_at = now


def settle_dependencies(s: Session, now: float) -> int:
    """Decide each pending job that waits for its dependencies: met, it is scheduled from this cycle
    on; never to be met, it ends FAILED with the reason.  Returns how many were decided."""
    waiting = list(s.scalars(select(Job).where(Job.state == JobState.PENDING, Job.deps_met.is_(False))))
    if not waiting:
        return 0
    named = {int(job) for j in waiting for _, job in (j.dependency or [])}
    states = dict(s.execute(select(Job.id, Job.state).where(Job.id.in_(sorted(named)))).all())
    n = 0
    for job in waiting:
        verdict, words = dep.verdict(job.dependency or [], states)
        if verdict == dep.MET:
            why = Reason(ReasonKind.NEW, words)
            job.deps_met = True
            job.reason = why.text()
            job.explain = {**(job.explain or {}), "why": why.as_dict()}
            record(s, now, "server", "job.dependency", words, job_id=job.id)
            n += 1
        elif verdict == dep.NEVER:
            finish_job(s, now, job, JobState.FAILED, words)
            n += 1
        elif job.reason != words:  # still waiting, for fewer jobs than before
            job.reason = words
            job.explain = {**(job.explain or {}), "why": Reason(ReasonKind.DEPENDENCY, words).as_dict()}
    return n
