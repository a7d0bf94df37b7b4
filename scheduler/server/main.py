"""``gsched server``: migrations, bootstrap, the cycle timer (APScheduler) and the HTTP API (uvicorn).

Start-up is idempotent: migrations bring the schema to head; the first start writes
``$GSCHED_HOME/admin.token`` (mode 0600) and creates the users listed in the config's ``[users]``.
What the running server holds is a ``ServerContext`` (``scheduler.server.context``).
"""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from typing import Any

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import select, update

from scheduler.core.clock import Clock
from scheduler.core.lifecycle import NodeState
from scheduler.server import service as svc
from scheduler.server.app import create_app
from scheduler.server.config import Settings
from scheduler.server.connections import limited_protocol
from scheduler.server.context import ServerContext
from scheduler.server.cycleproc import CycleProcess
from scheduler.store.db import Database
from scheduler.store.leader import release
from scheduler.store.models import Node, User

log = logging.getLogger("gsched.server")


def bootstrap(db: Database, settings: Settings, clock: Clock) -> None:
    home = settings.home
    home.mkdir(parents=True, exist_ok=True)
    token_file = home / "admin.token"
    with db.session() as s:
        svc.peer_key(s)
        # A restarted server has heard nothing for a while: give every up node a full TTL to report
        # again before declaring it down, so a server restart never requeues healthy jobs.
        s.execute(update(Node).where(Node.state == NodeState.UP).values(last_seen=clock.now()))
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
    settings.home.mkdir(parents=True, exist_ok=True)
    ctx = make_context(settings)
    ctx.cycler = CycleProcess(settings, ctx.server_id)
    sched = BackgroundScheduler(daemon=True)
    sched.add_job(ctx.cycle, "interval", seconds=settings.cycle_interval_s, id="cycle", max_instances=1,
                  coalesce=True, misfire_grace_time=None)
    ctx.scheduler = sched
    sched.start()
    app = create_app(ctx)
    # What is made so far (modules, the app, its routes and models: about 130,000 objects) lives as long
    # as the process.  Frozen, the collector no longer walks it: a full collection took 70-90 ms with
    # it and 5-30 ms without, and at 1,000 heartbeats a second every request waited for each one.
    gc.collect()
    gc.freeze()
    log.info("gsched server on %s://%s:%d (db %s)", settings.scheme, settings.host, settings.port,
             _redact(settings.db_url))
    tls: dict[str, Any] = (
        {"ssl_certfile": settings.tls_cert, "ssl_keyfile": settings.tls_key} if settings.tls_cert else {})
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
            release(ctx.db, ctx.server_id)
        ctx.db.dispose()


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
