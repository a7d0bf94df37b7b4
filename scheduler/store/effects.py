"""Carries out the lifecycle's moves on a session: the one place a job's state changes in the database.

``move(s, now, job, to, reason, **context)`` asks ``scheduler.core.lifecycle.plan`` for the move's
effects (it raises ``IllegalTransition`` for a move the table does not hold, before anything changes)
and applies them in order in the caller's transaction; it commits nothing.  ``bind_job`` is the move
a binder makes once it has re-checked a candidate's devices.  ``record`` adds an audit event
(``record_at_commit`` as the transaction commits).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.core.lifecycle import (
    RANK_FINAL,
    CloseStaging,
    Effect,
    JobState,
    RankState,
    Record,
    SetFields,
    StopRanks,
    TransferState,
    plan,
)
from scheduler.core.placement import Candidate
from scheduler.store.db import AT_COMMIT
from scheduler.store.models import Event, Job, Node, Rank, Transfer


def record(s: Session, now: float, actor: str, kind: str, message: str = "",
           job_id: int | None = None, node: str | None = None) -> None:
    """Add one event to the audit log (``gsched events``, a job's history)."""
    s.add(Event(time=now, actor=actor, kind=kind, message=message, job_id=job_id, node=node))


def record_at_commit(s: Session, now: float, actor: str, kind: str, message: str = "",
                     job_id: int | None = None, node: str | None = None, job: Job | None = None) -> None:
    """``record``, but the event joins the session only as its transaction commits (``Database``
    adds them then): a group commit's submits write their events in one INSERT at the end, where each
    was written by the next submit's flush, a statement (a round trip to PostgreSQL) each.  Lost with
    the transaction when it rolls back, as any write; not seen by a query of the same transaction.
    ``job``: a job added but not flushed yet, whose id the event takes once the commit's flush gave it one."""
    row = {"time": now, "actor": actor, "kind": kind, "message": message, "node": node,
           "job_id": job.id if job is not None else job_id}
    if job is not None and job.id is None:
        s.info.setdefault(AT_COMMIT, []).append(lambda: {**row, "job_id": job.id})
    else:
        s.info.setdefault(AT_COMMIT, []).append(row)


def move(s: Session, now: float, job: Job, to: JobState, reason: str, **context: Any) -> None:
    """Move ``job`` to ``to`` at ``now``: plan the move (``lifecycle.plan``, same ``context``) and apply it."""
    apply(s, now, job, plan(job, to, reason, now, **context))


def bind_job(s: Session, now: float, job: Job, cand: Candidate) -> None:
    """PENDING -> BOUND on ``cand``: bumps ``job.attempt`` (the new ranks' attempt), records the bind.

    The caller has checked that the candidate's devices are free, and adds the attempt's ranks, shard
    reads and staging transfers itself."""
    move(s, now, job, JobState.BOUND, f"bound to {', '.join(cand.nodes)}", nodes=cand.nodes,
         transfer_bytes=cand.transfer_bytes, transfer_cost_ms=cand.transfer_cost_ms,
         local_fraction=cand.local_fraction)


def apply(s: Session, now: float, job: Job, effects: list[Effect]) -> None:
    """Carry out ``effects`` (from ``lifecycle.plan``) on ``job`` in order, in the caller's transaction."""
    for effect in effects:
        if isinstance(effect, SetFields):
            for name, value in effect.fields.items():
                setattr(job, name, value)
        elif isinstance(effect, StopRanks):
            stop_ranks(s, job)
        elif isinstance(effect, Record):
            record(s, now, effect.actor, effect.kind, effect.message, job_id=job.id)
        elif isinstance(effect, CloseStaging):
            close_staging(s, now, job)
        else:  # pragma: no cover - a new kind of effect must be handled here
            raise TypeError(f"unknown effect {effect!r}")


def stop_ranks(s: Session, job: Job) -> None:
    """Ask the agents to stop every live rank of the job (they report KILLED; devices free then).

    A rank that never started is marked KILLING too: its agent may already be staging it."""
    for r in s.scalars(select(Rank).where(Rank.job_id == job.id, Rank.state.not_in(RANK_FINAL))):
        r.state = RankState.KILLING


def close_staging(s: Session, now: float, job: Job) -> None:
    """Once every rank runs, the job's staged shards have arrived: count their bytes per node pair.
    A job without a data set stages nothing (its binding made no transfers), so nothing is read."""
    if not job.parsed_spec.dataset:
        return
    for t in s.scalars(select(Transfer).where(Transfer.job_id == job.id, Transfer.state == TransferState.JOB)):
        t.state, t.ended_at = TransferState.DONE, now
        node = s.get(Node, t.dst)
        if node is not None:
            node.staged_bytes += t.bytes
