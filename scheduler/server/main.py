"""``gsched server``: migrations, bootstrap, the cycle timer (APScheduler) and the HTTP API (uvicorn).

Start-up is idempotent: migrations bring the schema to head; the first start writes
``$GSCHED_HOME/admin.token`` (mode 0600) and creates the users listed in the config's ``[users]``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.core.clock import Clock
from scheduler.server.config import Settings
from scheduler.store.db import Database

log = logging.getLogger("gsched.server")

POKE_DELAY_S = 0.2


@dataclass
class ServerContext:
    settings: Settings
    db: Database
    clock: Clock = field(default_factory=Clock)
    scheduler: Any = None
    cycler: Any = None  # the CycleProcess that runs the cycles, set by serve
    heartbeats: Any = None  # WriteBatchers, made by create_app
    submits: Any = None
    server_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    _cycle_lock: threading.Lock = field(default_factory=threading.Lock)
    _leader: bool = False
    _poked_for: float | None = None  # monotonic time of the cycle a poke asked for
    _cycle_ended: float = 0.0  # monotonic
    _cycle_took: float = 0.0

    def is_leader(self) -> bool:
        return self._leader

    def poke(self) -> None:
        """Ask for a cycle soon (after a submit or freed devices); coalesced with the timer.

        A poke only ever brings the next cycle earlier: a stream of submits must not keep pushing
        it back, and while one poke's cycle is due no other poke touches the timer."""
        sched = self.scheduler
        if sched is None:
            return
        from datetime import datetime, timedelta

        now = time.monotonic()
        if self._poked_for is not None and now < self._poked_for:
            return  # an earlier poke's cycle is still to come
        # At least as long after the last cycle as that cycle took: under a stream of submits the
        # cycle process would otherwise run back to back over a long queue and take a whole core from
        # the server and its clients (Slurm's sched_min_interval plays the same part).
        delay = max(POKE_DELAY_S, self._cycle_ended + self._cycle_took - now)
        try:
            job = sched.get_job("cycle")
            target = datetime.now().astimezone() + timedelta(seconds=delay)
            if job is not None and job.next_run_time is not None and job.next_run_time <= target:
                return
            sched.modify_job("cycle", next_run_time=target)
            self._poked_for = now + delay
        except Exception:  # the job may be running right now; the next tick picks the change up
            pass

    def cycle(self) -> None:
        """One cycle, run by the cycle process (``serve`` sets ``cycler``; scheduler/server/cycleproc.py)."""
        if not self._cycle_lock.acquire(blocking=False):
            return
        started = time.monotonic()
        try:
            leading = self.cycler.run()
            if leading is not None:  # None: the child died; the lease stays as it was until it expires
                self._leader = leading
        except Exception:
            log.exception("cycle failed")
        finally:
            self._cycle_ended = time.monotonic()
            self._cycle_took = self._cycle_ended - started
            self._cycle_lock.release()


def bootstrap(db: Database, settings: Settings, clock: Clock) -> None:
    from sqlalchemy import select

    from scheduler.server import service as svc
    from scheduler.store.models import User

    home = settings.home
    home.mkdir(parents=True, exist_ok=True)
    token_file = home / "admin.token"
    with db.session() as s:
        svc.peer_key(s)
        # A restarted server has heard nothing for a while: give every up node a full TTL to report
        # again before declaring it down, so a server restart never requeues healthy jobs.
        from sqlalchemy import update

        from scheduler.store.models import Node

        s.execute(update(Node).where(Node.state == "up").values(last_seen=clock.now()))
        has_admin = s.scalar(select(User).where(User.role == "admin")) is not None
        if not has_admin:
            token = svc.add_user(s, clock.now(), None, "admin", 1.0, role="admin")
            _write_secret(token_file, token)
            log.info("admin token written to %s", token_file)
        for name, shares in settings.users.items():
            if s.get(User, name) is None:
                token = svc.add_user(s, clock.now(), None, name, shares)
                _write_secret(home / f"{name}.token", token)
                log.info("user %s created; token in %s", name, home / f"{name}.token")


def _write_secret(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def make_context(settings: Settings, clock: Clock | None = None) -> ServerContext:
    db = Database(settings.db_url, autocheckpoint=False)  # the cycle process checkpoints
    db.upgrade()
    ctx = ServerContext(settings=settings, db=db, clock=clock or Clock())
    bootstrap(db, settings, ctx.clock)
    return ctx


def serve(settings: Settings) -> None:
    import uvicorn
    from apscheduler.schedulers.background import BackgroundScheduler

    from scheduler.server.app import create_app

    settings.home.mkdir(parents=True, exist_ok=True)
    ctx = make_context(settings)
    from scheduler.server.cycleproc import CycleProcess

    ctx.cycler = CycleProcess(settings, ctx.server_id)
    sched = BackgroundScheduler(daemon=True)
    sched.add_job(ctx.cycle, "interval", seconds=settings.cycle_interval_s, id="cycle", max_instances=1,
                  coalesce=True, misfire_grace_time=None)
    ctx.scheduler = sched
    sched.start()
    app = create_app(ctx)
    log.info("gsched server on %s://%s:%d (db %s)", settings.scheme, settings.host, settings.port,
             _redact(settings.db_url))
    tls: dict[str, Any] = (
        {"ssl_certfile": settings.tls_cert, "ssl_keyfile": settings.tls_key} if settings.tls_cert else {})
    from scheduler.server.connections import limited_protocol

    http = limited_protocol(settings.header_timeout_s, settings.max_connections, settings.max_connections_per_client)
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", access_log=False, http=http,
                    **tls)
    finally:
        sched.shutdown(wait=False)
        with ctx._cycle_lock:  # a running cycle ends before the process that runs it stops
            ctx.cycler.close()
        for batcher in (ctx.heartbeats, ctx.submits):
            batcher.close()
        if ctx.is_leader():
            from scheduler.store.leader import release

            release(ctx.db, ctx.server_id)
        ctx.db.dispose()


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


