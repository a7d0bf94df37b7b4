"""The scheduling cycle in a process of its own, beside the HTTP server.

In one interpreter the cycle (a snapshot of thousands of pending jobs, both stages, the report) held
the GIL for a few hundred milliseconds every second, and every heartbeat and submit answered in that
time waited for it: one agent alone saw a p99 of about 100 ms.  The cycle reads and writes only the
database, so it moves to a child process: the server's timer (APScheduler) still decides when a cycle
runs and sends the child one message per cycle; the child takes or renews the scheduling lease, runs
``run_cycle`` (which nudges the agents it bound ranks on: ``scheduler/server/nudge.py``) and answers whether
it leads.  The child keeps the ``CycleMemory`` its cycles share (``scheduler/server/cyclestate.py``).
Writes of the two processes are serialised: under SQLite by ``Database``'s writer lock (a ``flock``)
and ``BEGIN IMMEDIATE``, under PostgreSQL by its row locks.

The child is started with ``spawn`` (no copy of the server's threads or sockets), restarted on the next
cycle if it dies, and exits when the server closes its end of the pipe or dies.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from typing import Any

from scheduler.core.clock import Clock
from scheduler.protocol.peers import peer_context
from scheduler.server.cycle import run_cycle
from scheduler.server.cyclestate import CycleMemory
from scheduler.server.nudge import nudge_nodes
from scheduler.store.db import Database
from scheduler.store.leader import holds, try_lead

log = logging.getLogger("gsched.server")


class CycleProcess:
    def __init__(self, settings: Any, server_id: str) -> None:
        self.settings = settings
        self.server_id = server_id
        self._proc: Any = None
        self._conn: Any = None

    def run(self) -> bool | None:
        """Run one cycle in the child; returns whether this server leads, or None if the child died."""
        if self._proc is not None and not self._proc.is_alive():
            log.error("the cycle process died between cycles (exit code %s); starting a new one", self._proc.exitcode)
            self._discard()
        if self._proc is None:
            self._start()
        try:
            self._conn.send("cycle")
            return bool(self._conn.recv())  # waits without the GIL while the child works
        except (EOFError, OSError):
            code = self._proc.exitcode if self._proc is not None else None
            log.error("the cycle process died (exit code %s); a new one runs the next cycle", code)
            self._discard()
            return None

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(timeout=10)
        self._discard()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.settings, self.server_id, os.getpid()),
                                 name="gsched-cycle", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        log.info("cycle process started (pid %d)", self._proc.pid)

    def _discard(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None


def _serve(conn: Any, settings: Any, server_id: str, parent_pid: int) -> None:
    """The child: one cycle per message until the server closes the pipe or goes away.  It owns the
    ``CycleMemory`` its cycles share (the caches of the snapshot and the report)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s cycle[%(name)s] %(message)s")
    db = Database(settings.db_url)
    peer_tls = peer_context(settings.peer_ca or None)  # nudges to agents serving HTTPS
    clock = Clock()
    memory = CycleMemory()
    leading = False
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return  # the server is gone
            if msg is None or os.getppid() != parent_pid:
                return
            try:
                now = clock.now()
                now_leading = try_lead(db, server_id, now, settings.lease_ttl_s)
                if now_leading != leading:
                    log.info("%s the scheduling lease (%s)", "took" if now_leading else "lost", server_id)
                leading = now_leading
                if leading:
                    run_cycle(db, settings, now, leader=server_id, fence=lambda: holds(db, server_id, clock.now()),
                              clock=clock.now, nudge=lambda nodes: nudge_nodes(db, nodes, peer_tls), memory=memory)
            except Exception:
                log.exception("cycle failed")
            conn.send(leading)
            try:
                db.checkpoint()  # the server's HTTP process leaves the WAL to us (Database.autocheckpoint)
            except Exception:
                log.exception("WAL checkpoint failed")
    finally:
        db.dispose()
