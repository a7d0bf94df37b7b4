"""``ServerContext``: what one running server holds (settings, database, clock, the cycle timer) and
``poke``, which asks for a cycle soon.

Made by ``scheduler.server.main.make_context``; ``serve`` sets the timer and the cycle process, and
``scheduler.server.app.create_app`` the group-commit batchers and the gate's token cache.  Routes reach it
as ``request.app.state.ctx`` (``scheduler.server.routes.base.context``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
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
    identities: Any = None  # the gate's token cache (app.Identities), made by create_app
    settled: Any = None  # what each node's last whole heartbeat wrote (quiet.Settled), made by create_app
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
