"""Read-only views shared by the API and the CLI's JSON output: queue, share, explain, events."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.core.policy_config import PolicyConfig
from scheduler.server.accounts import share_tree_rows
from scheduler.server.auth import Identity
from scheduler.server.service import node_rows, pending_why, queue_rows
from scheduler.store.models import Event, Job


def share_rows(s: Session, now: float, policy: PolicyConfig) -> list[dict[str, Any]]:
    """Like ``sshare``: each user's account, shares, decayed usage (device-seconds, as of now) and
    factor over the account tree (``norm_shares`` is the user's part of the whole machine)."""
    rows = [r for r in share_tree_rows(s, now, policy) if r["user"] is not None]
    return [{"user": r["user"], "account": r["account"], "shares": r["raw_shares"], "norm_shares": r["norm_shares"],
             "usage": r["raw_usage"], "effective_usage": r["effective_usage"], "factor": r["factor"]}
            for r in sorted(rows, key=lambda r: r["user"])]


def queue_view(s: Session, now: float, policy: PolicyConfig, include_done: bool = False) -> dict[str, Any]:
    return {"time": now, "jobs": queue_rows(s, include_done=include_done), "users": share_rows(s, now, policy),
            "nodes": node_rows(s)}


def explain_view(s: Session, job: Job) -> dict[str, Any]:
    """``gsched explain``: the last cycle's explanation of ``job``.  ``reason`` is the job's reason now
    and ``pending_reason`` the last cycle's words; ``why`` (with ``reason_kind`` and ``reason_at_s``)
    is the job's reason as data while it is pending (``service.pending_why``), else None.  Each
    candidate has its ``reason`` words and, as data, its ``why``."""
    ex = job.explain or {}
    why = pending_why(job)
    return {"job": job.id, "state": job.state, "user": job.user, "factor": ex.get("factor", job.factor),
            "priority": ex.get("priority", job.priority), "queue_position": ex.get("queue_position"),
            "queue_length": ex.get("queue_length"), "reason": job.reason, "pending_reason": ex.get("reason", ""),
            "why": why, "reason_kind": why["kind"] if why else None, "reason_at_s": why.get("at_s") if why else None,
            "candidates": ex.get("candidates", []), "reservation": ex.get("reservation"),
            "decided_at": ex.get("time"), "transfer_bytes": job.transfer_bytes,
            "transfer_cost_ms": job.transfer_cost_ms, "local_fraction": job.local_fraction}


def events_view(s: Session, who: Identity, job_id: int | None, limit: int) -> list[dict[str, Any]]:
    q = select(Event)
    if job_id is not None:
        q = q.where(Event.job_id == job_id)
    rows = list(s.scalars(q.order_by(Event.id.desc()).limit(limit)))
    return [{"id": e.id, "time": e.time, "actor": e.actor, "kind": e.kind, "job": e.job_id, "node": e.node,
             "message": e.message} for e in reversed(rows)]
