"""The server's part of the agents' job retention (``gsched agent --job-retention``): which of the jobs
whose directories a node holds have ended, and how long ago.  The agent removes a directory once its
job ended longer ago than its retention; it never learns more than that (agents/retention.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.core.lifecycle import FINAL
from scheduler.protocol.messages import Ended
from scheduler.store.models import Job

CHUNK = 1000  # ids per query (SQLite limits bound parameters)


def ended_jobs(s: Session, now: float, job_ids: list[int]) -> list[dict[str, Any]]:
    """For the heartbeat's ``job_dirs``: each job among ``job_ids`` in a final state, with ``ago_s``,
    the seconds since it ended (0 at least), in id order.  A job the server does not know, or one not
    ended, is left out: its directory is kept.  Reads only."""
    out = []
    ids = sorted(set(job_ids))
    for i in range(0, len(ids), CHUNK):
        for job_id, ended_at in s.execute(select(Job.id, Job.ended_at).where(
                Job.id.in_(ids[i:i + CHUNK]), Job.state.in_(sorted(FINAL)), Job.ended_at.is_not(None)).order_by(Job.id)):
            out.append(Ended(job_id=job_id, ago_s=max(0.0, now - (ended_at or now))).model_dump())
    return out
