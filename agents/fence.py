"""The node's fence: a node whose agent stops answering stops its own ranks before the server runs them elsewhere.

The server declares a node down when it has heard nothing from it for ``heartbeat_ttl_s`` and puts its
jobs back in the queue.  If the agent was only frozen (SIGSTOP, a hung process, a paused VM) or died
alone, its rank processes would run on beside the job's next attempt: two attempts writing the same
checkpoints.  A process can fence its peers only while it runs, so the fence is a small process of its
own (``python -m agents.fence``), in its own session, that a frozen or killed agent does not take with it:

- the agent *claims* the node when it starts: it writes ``DIR/.gsched/lease`` (its pid and a
  CLOCK_MONOTONIC time) and rewrites it every ``TICK_S`` from a thread of its own, whether or not the
  server answers (a server that is down or restarting fences nothing);
- once the server has said its TTL, the agent starts the watchdog, which reads the lease every
  ``POLL_S``.  When the lease is older than ``after_s`` (``FENCE_FRACTION`` of the TTL: the ranks are
  gone before the server can declare the node down and bind the jobs elsewhere), it SIGKILLs every
  rank process group in ``DIR/.gsched/pids``, lists them in ``DIR/.gsched/fenced`` and exits;
- the watchdog exits without killing anything when the lease is gone (the agent stopped cleanly) or
  names another pid (a new agent claimed the node; it stops the ranks its predecessor left itself).

An agent that comes back after its ranks were fenced reports them ended with ``failure = "fenced"``
(the node's doing, not the job's: the server requeues the job, as after a rendezvous failure, when it
has not already) and starts a new watchdog.  The lease is rewritten in place (``pwrite`` over the same
bytes), so a full disk does not stop the ticks.  A node cut off from the network while its agent runs
is not fenced: its ranks run on until it is heard from again, and the server then stops them (as Slurm
does for a node that returns).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TICK_S = 0.25
POLL_S = 0.2
FENCE_FRACTION = 0.6  # of the server's heartbeat TTL: how long a silent agent's ranks live on
FENCED = "fenced"
PIDS = "pids"  # DIR/.gsched/pids: the rank process groups the agent started (agents/agent.py keeps it)
_WIDTH = 64  # the lease is always this many bytes, rewritten in place


def _lease_text(pid: int, t: float) -> bytes:
    return f"{pid} {t:.3f}".encode().ljust(_WIDTH)


def read_lease(path: Path) -> tuple[int, float] | None:
    """(pid, monotonic time) of the lease, or None when there is none or it cannot be read whole."""
    try:
        pid, t = path.read_bytes().split()
        return int(pid), float(t)
    except (OSError, ValueError):
        return None


def read_pids(path: Path) -> set[int]:
    """The process ids listed in ``path``, one a line (none when it cannot be read)."""
    try:
        return {int(x) for x in path.read_text().split() if x.isdigit()}
    except OSError:
        return set()


class Fence:
    """The agent's side: the lease it keeps fresh, and the watchdog process it keeps running."""

    def __init__(self, state_dir: Path) -> None:
        self.lease = state_dir / "lease"
        self.fenced_file = state_dir / FENCED
        self.after_s: float | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._warned = False

    def claim(self) -> None:
        """Write the lease now (a watchdog left by a previous agent sees another pid and exits) and
        keep it fresh from a thread of its own."""
        self._fd = os.open(self.lease, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self.tick()
        try:  # what a watchdog fenced before this agent started: its ranks are gone, and their pids may come back
            self.fenced_file.unlink()
        except FileNotFoundError:
            pass
        self._thread = threading.Thread(target=self._ticks, name="fence-lease", daemon=True)
        self._thread.start()

    def tick(self) -> None:
        if self._fd is None:
            return
        try:
            os.pwrite(self._fd, _lease_text(os.getpid(), time.monotonic()), 0)
        except OSError as e:
            if not self._warned:
                self._warned = True
                print(f"gsched agent: cannot renew the fence lease {self.lease}: {e}", file=sys.stderr)

    def _ticks(self) -> None:
        while not self._stop.wait(TICK_S):
            self.tick()
            with self._lock:
                if self.watchdog is not None and self.watchdog.poll() is not None and self.after_s is not None:
                    self._spawn()  # it fenced (this agent was frozen) or was killed: a new one

    def arm(self, ttl_s: float) -> None:
        """Run the watchdog for the server's TTL (again when the TTL changes)."""
        after = round(FENCE_FRACTION * ttl_s, 3)
        with self._lock:
            if self._stop.is_set() or (after == self.after_s and self.watchdog is not None):
                return
            self.after_s = after
            self._end_watchdog()
            self._spawn()

    def _spawn(self) -> None:
        assert self.after_s is not None
        self.watchdog = subprocess.Popen(
            [sys.executable, "-m", "agents.fence", str(self.lease.parent), str(self.after_s), str(os.getpid())],
            stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)

    def _end_watchdog(self) -> None:
        w, self.watchdog = self.watchdog, None
        if w is not None and w.poll() is None:
            w.terminate()
            try:
                w.wait(5)
            except subprocess.TimeoutExpired:
                w.kill()

    def fenced(self, pgid: int, code: int | None) -> bool:
        """Whether the watchdog stopped the process group ``pgid``, whose leader ended with ``code``."""
        return code == -signal.SIGKILL and pgid in read_pids(self.fenced_file)

    def close(self) -> None:
        """The agent stops cleanly: the lease goes (the watchdog exits) and so does the watchdog."""
        self._stop.set()
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                try:
                    self.lease.unlink()
                except FileNotFoundError:
                    pass
            self._end_watchdog()


def watch(state_dir: Path, after_s: float, agent_pid: int) -> str:
    """The watchdog's loop; returns why it ended: "released", "replaced" or "fenced"."""
    lease, pids_file = state_dir / "lease", state_dir / PIDS
    seen = time.monotonic()  # a lease that cannot be read at all ages from here
    while True:
        now = time.monotonic()
        got = read_lease(lease)
        if got is None and not lease.exists():
            return "released"
        if got is not None:
            if got[0] != agent_pid:
                return "replaced"
            seen = got[1]
        if now - seen > after_s:
            break
        time.sleep(POLL_S)
    stopped = []
    for pgid in sorted(read_pids(pids_file)):
        try:
            os.killpg(pgid, signal.SIGKILL)
            stopped.append(pgid)
        except (ProcessLookupError, PermissionError):
            pass
    with open(state_dir / FENCED, "a") as f:
        f.write("".join(f"{p}\n" for p in stopped))
    print(f"gsched fence: agent {agent_pid} silent for {now - seen:.1f} s (over {after_s:g} s): "
          f"stopped rank process group(s) {', '.join(map(str, stopped)) or 'none'}", file=sys.stderr, flush=True)
    return "fenced"


def main(argv: list[str]) -> int:
    state_dir, after_s, agent_pid = Path(argv[0]), float(argv[1]), int(argv[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    watch(state_dir, after_s, agent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
