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
  rank process group in ``DIR/.gsched/pids`` that is still the rank's (``not_ours``: each is recorded
  with its leader's start time and the boot, so an id taken by another process since, or one from
  before the machine restarted, is left alone), lists them in ``DIR/.gsched/fenced`` and exits;
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
from dataclasses import dataclass
from pathlib import Path

TICK_S = 0.25
POLL_S = 0.2
FENCE_FRACTION = 0.6  # of the server's heartbeat TTL: how long a silent agent's ranks live on
FENCED = "fenced"
PIDS = "pids"  # DIR/.gsched/pids: the rank process groups the agent started, a Group.line each (agents/agent.py)
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
    """The process ids that begin the lines of ``path`` (none when it cannot be read)."""
    return set(read_groups(path))


@dataclass(frozen=True)
class Group:
    """A rank process group as the agent recorded it when it started the rank: its id, its leader's start
    time (clock ticks after boot, ``/proc/PID/stat``) and the boot it ran in.  A line of an older agent
    has the id alone (``start`` and ``boot`` None)."""

    pgid: int
    start: int | None = None
    boot: str | None = None

    def line(self) -> str:
        return f"{self.pgid} {self.start or 0} {self.boot or '-'}"


def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``): it changes when the machine restarts."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None when there is no such process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def record(pgid: int) -> Group:
    """The record of a process group the agent has just started, its leader alive."""
    return Group(pgid, start_ticks(pgid), boot_id())


def read_groups(path: Path) -> dict[int, Group]:
    """The process groups listed in ``path``, a line each (``Group.line``; an older agent's: the id alone)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    out: dict[int, Group] = {}
    for line in text.splitlines():
        words = line.split()
        if not words or not words[0].isdigit():
            continue
        pgid = int(words[0])
        if len(words) >= 3 and words[1].isdigit():
            out[pgid] = Group(pgid, int(words[1]) or None, None if words[2] == "-" else words[2])
        else:
            out[pgid] = Group(pgid)
    return out


def not_ours(g: Group) -> str | None:
    """Why process group ``g.pgid`` may now be somebody else's, or None when it is still the rank's.

    A process id comes back into use once its process is gone, and after a restart of the machine any
    id may name anything: a group recorded in another boot is never the rank's; one whose leader runs
    with another start time is a new process that took the id.  One whose leader is gone may still have
    members (a rank's loader workers): the kernel gives no process an id still used as a group's, so
    those members are the rank's.  An older agent's line (the id alone) is the rank's only when its
    leader runs with the ``GSCHED_JOB_ID`` every rank is started with."""
    if g.boot is not None and g.boot != boot_id():
        return "recorded before the machine restarted"
    now = start_ticks(g.pgid)
    if g.start is None and g.boot is None:
        try:
            env = Path(f"/proc/{g.pgid}/environ").read_bytes().split(b"\0")
        except OSError:
            return "recorded by an older agent, and its leader is gone: nothing shows it is a rank's"
        return None if any(v.startswith(b"GSCHED_JOB_ID=") for v in env) else "its process is not a rank's"
    if now is not None and now != g.start:
        return "its id was taken by another process"
    return None


def kill_group(g: Group) -> bool:
    """SIGKILL the rank process group ``g`` if it is still the rank's (``not_ours``); whether a signal went."""
    return not_ours(g) is None and sigkill_group(g.pgid)


def sigkill_group(pgid: int) -> bool:
    """SIGKILL process group ``pgid``, already known to be the rank's; whether a signal went."""
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


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
    stopped = [pgid for pgid, g in sorted(read_groups(pids_file).items()) if kill_group(g)]
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
