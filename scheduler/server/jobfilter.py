"""Which jobs a listing wants (``GET /v1/jobs``, ``GET /v1/history``), applied in SQL on the server:
``gsched queue --user bob --state pending`` reads bob's pending jobs, not the newest few hundred jobs
filtered in the client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, or_

from scheduler.core.errors import Unprocessable
from scheduler.core.lifecycle import JobState
from scheduler.store.models import Job


@dataclass(frozen=True)
class JobFilter:
    """Jobs of ``user``, in one of ``states`` (empty: any), named ``name``, with an id above ``after``,
    ended in [``since``, ``until``) or (``ended_after``) not ended or ended since; at most ``limit``
    of them, oldest id first."""

    user: str | None = None
    states: tuple[JobState, ...] = ()
    name: str | None = None
    since: float | None = None
    until: float | None = None
    ended_after: float | None = None  # jobs not ended, or ended at or after this time
    after: int = 0
    limit: int = 5000

    @classmethod
    def of(cls, *, states: str | None = None, **kw: Any) -> JobFilter:
        """A filter from query parameters; ``states`` comma-separated, any case (422 naming a bad one)."""
        wanted = []
        for word in (states or "").split(","):
            if word.strip():
                try:
                    wanted.append(JobState(word.strip().upper()))
                except ValueError:
                    raise Unprocessable(f"state: no job state {word.strip()!r} (known: "
                                        f"{', '.join(s.value for s in JobState)})", "state") from None
        return cls(states=tuple(wanted), **kw)

    def apply(self, q: Select[Any]) -> Select[Any]:
        """``q`` (a select of ``Job``) narrowed to these jobs, ordered by id, one more than ``limit``
        (so the caller knows whether there is a next page)."""
        if self.user:
            q = q.where(Job.user == self.user)
        if self.states:
            q = q.where(Job.state.in_(self.states))
        if self.name:
            q = q.where(Job.name == self.name)
        if self.since is not None:
            q = q.where(Job.ended_at >= self.since)
        if self.until is not None:
            q = q.where(Job.ended_at < self.until)
        if self.ended_after is not None:
            q = q.where(or_(Job.ended_at.is_(None), Job.ended_at >= self.ended_after))
        if self.after:
            q = q.where(Job.id > self.after)
        return q.order_by(Job.id).limit(self.limit + 1)
