"""What a job's owner (or an admin) does to a job besides cancelling it, as Slurm's ``scontrol`` does:
hold and release a pending job, requeue an active one, change a job's name and time limit.

Each call runs in the caller's write transaction, checks that ``who`` owns the job (or is an admin),
records an event in ``who``'s name, and returns the job's summary fields the CLI prints.  A request
that does not fit the job's state is a ``Conflict`` (409) saying what the state is and what is allowed.
"""

from __future__ import annotations

import re
from typing import Any

from scheduler.core.errors import Conflict, Unprocessable
from scheduler.core.jobspec import MAX_TIME_S, NAME_PATTERN
from scheduler.core.lifecycle import ACTIVE, JobState
from scheduler.core.reasons import Reason, ReasonKind
from scheduler.server.auth import Identity
from scheduler.server.service import get_job, require_owner
from scheduler.store.effects import move, record
from scheduler.store.models import Job


def _out(job: Job) -> dict[str, Any]:
    return {"id": job.id, "name": job.name, "state": job.state, "held_by": job.held_by, "reason": job.reason,
            "time_limit_s": job.parsed_spec.time_limit_s}


def _owned(s: Any, who: Identity, job_id: int) -> Job:
    job = get_job(s, job_id)
    require_owner(job, who)
    return job


def hold_job(s: Any, now: float, who: Identity, job_id: int) -> dict[str, Any]:
    """Keep a PENDING job out of scheduling until ``release_job``; holding a held job changes nothing."""
    job = _owned(s, who, job_id)
    if job.state != JobState.PENDING:
        raise Conflict(f"job {job_id} is {job.state}: only a PENDING job can be held")
    if job.held_by is None:
        why = Reason(ReasonKind.HELD, f"held by {who.name} (gsched release {job_id})")
        job.held_by = who.name
        job.reason = why.text()
        job.explain = {**(job.explain or {}), "why": why.as_dict()}
        record(s, now, who.actor, "job.hold", why.message, job_id=job.id)
    return _out(job)


def release_job(s: Any, now: float, who: Identity, job_id: int) -> dict[str, Any]:
    """Let a held job be scheduled again (from the next cycle); releasing one not held changes nothing."""
    job = _owned(s, who, job_id)
    if job.held_by is not None:
        why = Reason(ReasonKind.NEW, f"released by {who.name}")
        job.held_by = None
        job.reason = why.text()
        job.explain = {**(job.explain or {}), "why": why.as_dict()}
        record(s, now, who.actor, "job.release", why.message, job_id=job.id)
    return _out(job)


def requeue_job_by(s: Any, now: float, who: Identity, job_id: int) -> dict[str, Any]:
    """Stop an active job's ranks and put it back in the queue (it resumes from its last checkpoint).
    The requeue counts as a restart, but never fails the job for having too many."""
    job = _owned(s, who, job_id)
    if job.state not in ACTIVE:
        raise Conflict(f"job {job_id} is {job.state}: only a BOUND, STAGING or RUNNING job can be requeued")
    move(s, now, job, JobState.PENDING, f"requeued by {who.name}", max_restarts=job.restarts + 1)
    return _out(job)


def update_job(s: Any, now: float, who: Identity, job_id: int, name: str | None,
               time_limit_s: int | None) -> dict[str, Any]:
    """Rename a PENDING job and change its time limit; an active job's time limit may only go down."""
    job = _owned(s, who, job_id)
    if job.state not in ACTIVE and job.state != JobState.PENDING:
        raise Conflict(f"job {job_id} is {job.state}: only a PENDING or active job can be updated")
    spec = dict(job.spec or {})
    changes = []
    if name is not None and name != job.name:
        if job.state != JobState.PENDING:
            raise Conflict(f"job {job_id} is {job.state}: only a PENDING job can be renamed", "name")
        if not re.fullmatch(NAME_PATTERN, name):
            raise Unprocessable(f"name: {name!r} is not a job name (letters, digits, _ . -; at most 64)", "name")
        changes.append(f"name {job.name} -> {name}")
        job.name = spec["name"] = name
    if time_limit_s is not None:
        old = job.parsed_spec.time_limit_s
        if not 1 <= time_limit_s <= MAX_TIME_S:
            raise Unprocessable(f"time_limit_s: must be between 1 second and {MAX_TIME_S // 86400} days",
                                "time_limit_s")
        if job.state != JobState.PENDING and time_limit_s > old:
            raise Conflict(f"job {job_id} is {job.state}: its time limit may only go down (now {old} s)",
                           "time_limit_s")
        if time_limit_s != old:
            changes.append(f"time limit {old} s -> {time_limit_s} s")
            spec["limits"] = {**spec.get("limits", {}), "time": time_limit_s}
    if changes:
        job.spec = spec
        job.spec_rev = (job.spec_rev or 0) + 1
        record(s, now, who.actor, "job.update", "; ".join(changes), job_id=job.id)
    return _out(job)
