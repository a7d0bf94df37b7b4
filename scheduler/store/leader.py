"""Leader election over the database: exactly one server runs scheduling cycles.

Every server serves the API; the one holding the ``cycle`` lease also schedules.  ``try_lead``
takes the lease when it is free or expired, or renews it when already held, in one conditional
UPDATE (atomic on PostgreSQL and SQLite alike), so two servers can never both believe they lead
for the same instant.  A leader renews before every cycle; a cycle is far shorter than the lease,
and ``holds`` is checked again before binding (a fence), so no two cycles overlap even when a
leader stalls: it loses the lease, notices, and binds nothing.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from scheduler.store.db import Database
from scheduler.store.models import Lease

CYCLE = "cycle"


def try_lead(db: Database, me: str, now: float, ttl_s: float) -> bool:
    with db.session() as s:
        res = s.execute(update(Lease).where(Lease.name == CYCLE, (Lease.holder == me) | (Lease.expires_at < now))
                        .values(holder=me, expires_at=now + ttl_s))
        if res.rowcount == 1:  # type: ignore[attr-defined]
            return True
        if s.get(Lease, CYCLE) is not None:
            return False
    try:
        with db.session() as s:
            s.add(Lease(name=CYCLE, holder=me, expires_at=now + ttl_s, acquired_at=now))
        return True
    except IntegrityError:
        return False


def holds(db: Database, me: str, now: float) -> bool:
    """Whether ``me`` holds the lease at ``now``: a read, which never waits for the write lock."""
    with db.read() as s:
        lease = s.scalar(select(Lease).where(Lease.name == CYCLE))
        return lease is not None and lease.holder == me and lease.expires_at > now


def release(db: Database, me: str) -> None:
    with db.session() as s:
        s.execute(update(Lease).where(Lease.name == CYCLE, Lease.holder == me).values(expires_at=0.0))


def current(db: Database) -> tuple[str, float] | None:
    with db.session() as s:
        lease = s.get(Lease, CYCLE)
        return (lease.holder, lease.expires_at) if lease else None
