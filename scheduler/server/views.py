"""Read-only views shared by the API and the CLI's JSON output: queue, share, explain, events."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.core.errors import Unprocessable
from scheduler.core.lifecycle import FINAL, PREEMPTING_EVENT, RANK_FINAL, JobState, NodeState
from scheduler.core.policy_config import PolicyConfig
from scheduler.server.accounts import share_tree_rows
from scheduler.server.auth import Identity
from scheduler.server.jobfilter import JobFilter
from scheduler.server.service import node_rows, pending_why, queue_rows
from scheduler.store.models import Event, Job, Node, Rank


def share_rows(s: Session, now: float, policy: PolicyConfig) -> list[dict[str, Any]]:
    """Like ``sshare``: each user's account, shares, decayed usage (device-seconds, as of now) and
    factor over the account tree (``norm_shares`` is the user's part of the whole machine)."""
    rows = [r for r in share_tree_rows(s, now, policy) if r["user"] is not None]
    return [{"user": r["user"], "account": r["account"], "shares": r["raw_shares"], "norm_shares": r["norm_shares"],
             "usage": r["raw_usage"], "effective_usage": r["effective_usage"], "factor": r["factor"]}
            for r in sorted(rows, key=lambda r: r["user"])]


def _page(rows: list[dict[str, Any]], where: JobFilter) -> tuple[list[dict[str, Any]], int | None]:
    """The rows of one page, and the ``after`` of the next (None: no more)."""
    if len(rows) > where.limit:
        rows = rows[:where.limit]
        return rows, rows[-1]["id"]
    return rows, None


def queue_view(s: Session, now: float, policy: PolicyConfig, include_done: bool = False,
               where: JobFilter | None = None, disk_floor_bytes: int = 0) -> dict[str, Any]:
    """``GET /v1/jobs``: the jobs ``where`` picks (one page; ``next`` the ``after`` of the next), each
    user's share and the nodes."""
    where = where or JobFilter()
    jobs, after = _page(queue_rows(s, include_done=include_done, where=where), where)
    return {"time": now, "jobs": jobs, "next": after, "users": share_rows(s, now, policy), "nodes": node_rows(s, disk_floor_bytes)}


def history_view(s: Session, now: float, where: JobFilter) -> dict[str, Any]:
    """``GET /v1/history``: ended jobs ``where`` picks (any final state when it names none), one page."""
    if not where.states:
        where = JobFilter(**{**where.__dict__, "states": tuple(sorted(FINAL))})
    elif not set(where.states) <= FINAL:
        raise Unprocessable(f"state: history lists ended jobs ({', '.join(sorted(FINAL))})", "state")
    jobs, after = _page(queue_rows(s, include_done=True, where=where), where)
    return {"time": now, "jobs": jobs, "next": after}


def explain_view(s: Session, job: Job, disk_floor_bytes: int = 0) -> dict[str, Any]:
    """``gsched explain``: the last cycle's explanation of ``job``.  ``reason`` is the job's reason now
    and ``pending_reason`` the last cycle's words; ``why`` (with ``reason_kind`` and ``reason_at_s``)
    is the job's reason as data while it is pending (``service.pending_why``), else None.  Each
    candidate has its ``reason`` words and, as data, its ``why``.  ``preemptions``: while the job is
    pending, the words of each ``job.preempting`` event since it last became pending (the jobs preempted
    for it, and why), oldest first; ``preempts_nobody``: while it is pending, with preemption on, why the
    last cycle preempted nobody for it although it had waited ``preempt_after_s`` (None otherwise).
    ``left_out``: while the job is pending, the up nodes that take no new ranks now, each ``{"node",
    "reason"}`` (drained, or free disk under ``disk_floor_bytes``).
    ``stopping``: while the job is pending, its ranks of the last attempt not stopped yet on nodes that
    are up (``stopping_ranks``): the cycle binds it again only once there are none."""
    ex = job.explain or {}
    why = pending_why(job)
    preemptions = [] if job.state != JobState.PENDING else list(s.scalars(
        select(Event.message).where(Event.job_id == job.id, Event.kind == PREEMPTING_EVENT,
                                    Event.time >= job.pending_since).order_by(Event.id)))
    return {"job": job.id, "state": job.state, "user": job.user, "factor": ex.get("factor", job.factor),
            "priority": ex.get("priority", job.priority), "queue_position": ex.get("queue_position"),
            "queue_length": ex.get("queue_length"), "own_ahead": ex.get("own_ahead"),
            "own_older": ex.get("own_older"), "lower_ahead": ex.get("lower_ahead"), "reason": job.reason, "pending_reason": ex.get("reason", ""),
            "why": why, "reason_kind": why["kind"] if why else None, "reason_at_s": why.get("at_s") if why else None,
            "candidates": ex.get("candidates", []), "reservation": ex.get("reservation"),
            "preemptions": preemptions,
            "preempts_nobody": ex.get("preempts_nobody") if job.state == JobState.PENDING else None,
            "left_out": left_out_nodes(s, disk_floor_bytes) if job.state == JobState.PENDING else [],
            "stopping": stopping_ranks(s, job),
            "decided_at": ex.get("time"), "transfer_bytes": job.transfer_bytes,
            "transfer_cost_ms": job.transfer_cost_ms, "local_fraction": job.local_fraction}


def stopping_ranks(s: Session, job: Job) -> list[dict[str, Any]]:
    """A pending job's ranks that have not stopped yet on nodes that are up, each ``{"node", "rank",
    "attempt", "state"}``: the rule of ``scheduler.store.snapshot_reader`` (Slurm's COMPLETING), which
    keeps such a job out of the cycle until they are gone, so two attempts never run at once."""
    if job.state != JobState.PENDING:
        return []
    rows = s.execute(select(Rank.node, Rank.rank, Rank.attempt, Rank.state).join(Node, Node.name == Rank.node)
                     .where(Rank.job_id == job.id, Rank.state.not_in(RANK_FINAL), Node.state == NodeState.UP)
                     .order_by(Rank.node, Rank.rank))
    return [{"node": node, "rank": rank, "attempt": attempt, "state": state} for node, rank, attempt, state in rows]


def left_out_nodes(s: Session, disk_floor_bytes: int) -> list[dict[str, str]]:
    """The up nodes the snapshot leaves out (``scheduler.store.snapshot_reader``), with why: drained
    (its reason) or under the disk floor (``scheduler.core.diskfloor.floor_reason``)."""
    out = []
    for n in node_rows(s, disk_floor_bytes):
        if n["state"] != NodeState.UP:
            continue
        why = ([f"drained: {n['drain_reason'] or 'no reason given'}"] if n["drained"] else []) + (
            [n["low_disk"]] if n["low_disk"] else [])
        if why:
            out.append({"node": n["name"], "reason": "; ".join(why)})
    return out


def events_view(s: Session, who: Identity, job_id: int | None, limit: int) -> list[dict[str, Any]]:
    q = select(Event)
    if job_id is not None:
        q = q.where(Event.job_id == job_id)
    rows = list(s.scalars(q.order_by(Event.id.desc()).limit(limit)))
    return [{"id": e.id, "time": e.time, "actor": e.actor, "kind": e.kind, "job": e.job_id, "node": e.node,
             "message": e.message} for e in reversed(rows)]
