"""A real cluster on this machine: one ``gsched server`` and N ``gsched agent`` processes on loopback.

Used by ``gsched demo`` and by the integration tests.  Every process is started in its own session
and stopped (SIGTERM, then SIGKILL) by ``close()``, which is also registered with ``atexit``.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.ports import RendezvousPorts
from scheduler.core.lifecycle import NodeState
from scheduler.protocol.client import Client

# Ports for the servers (and other listeners) this process starts, taken as agents take rendezvous
# ports (agents/ports.py): from a range below Linux's ephemeral one, checked bindable, never handed out
# twice by this process, each process starting at its own place.  A port found by binding port 0 and
# letting it go could be drawn by any outgoing connection on the machine before the server binds it.
FREE_PORTS = RendezvousPorts(30400, 31599, start=os.getpid())
# A port checked bindable can still be taken by another process doing the same before its server binds
# it (two test workers, whose pids are neighbours, walk the range one step apart); so each port is also
# claimed with an exclusive lock on a file named after it, which every process using free_port() honours.
# The lock lives as long as its descriptor: until release_port(), or until this process ends, however.
PORT_CLAIMS = Path(tempfile.gettempdir()) / "gsched-ports"
_claims: dict[int | str, int] = {}  # port (or block name) -> the descriptor holding its claim


def _claim(port: int | str) -> bool:
    """Claim ``port`` (or a block of them, by name) for this process; False if another process holds
    it.  Where the claim files cannot be made (another user's directory), it goes unclaimed, as before
    claims existed."""
    try:
        PORT_CLAIMS.mkdir(mode=0o1777, exist_ok=True)
        fd = os.open(PORT_CLAIMS / str(port), os.O_RDONLY | os.O_CREAT, 0o444)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _claims[port] = fd
    return True


def free_port() -> int:
    """A port no server or test of this machine's gsched processes is using or about to use."""
    while True:
        port = FREE_PORTS.take(object())
        if port is None:
            raise RuntimeError(f"no free port in {FREE_PORTS}")
        if _claim(port):
            return port


def release_port(port: int | str) -> None:
    """Give up this process's claim on ``port`` or a block (once nothing of it listens there)."""
    fd = _claims.pop(port, None)
    if fd is not None:
        os.close(fd)


@dataclass
class NodeSpec:
    name: str
    rack: str = "rack0"
    gpus: int | str = 1  # a count of CPU devices, or "auto" (NVML)
    host: str = "127.0.0.1"  # address the agent binds and advertises
    netns: str | None = None  # run the agent inside this network namespace (multi-host tests)
    iface: str | None = None  # interface the ranks use for gloo/NCCL
    rendezvous_ports: str | None = None  # default: a block of its own (rendezvous_block())
    rendezvous_wait_s: float | None = None
    max_transfer_mbps: float | None = None  # the agent's bandwidth bound (default: none)
    job_retention: str | None = None  # the agent's --job-retention (default: the agent's, 7d)


# The agents of one machine must not share a range of rendezvous ports (each would check a port is free,
# hand it out, and another agent could hand it out too before the rank binds it): each gets a block of
# its own, from 29500-30399, the next block of this process that no other process has claimed (as
# free_port() claims ports; the cluster gives its agents' blocks back when it closes); a process starts
# at its own block.  When every block is claimed (more than 18 agents at once) the next is shared.
RENDEZVOUS_BASE = 29500
RENDEZVOUS_EACH = 50
RENDEZVOUS_BLOCKS = 18
_next_block = os.getpid() % RENDEZVOUS_BLOCKS


def rendezvous_block() -> str:
    """The next block of rendezvous ports for an agent this process starts, as ``FIRST-LAST``, claimed
    (:func:`release_port` with that text gives it back) unless every block is claimed."""
    global _next_block
    block = ""
    for _ in range(RENDEZVOUS_BLOCKS):
        first = RENDEZVOUS_BASE + RENDEZVOUS_EACH * _next_block
        _next_block = (_next_block + 1) % RENDEZVOUS_BLOCKS
        block = f"{first}-{first + RENDEZVOUS_EACH - 1}"
        if block not in _claims and _claim(block):
            return block
    return block


class LocalCluster:
    def __init__(self, root: Path, nodes: list[NodeSpec], *, heartbeat_s: float = 0.5, ttl_s: float = 6.0,
                 cycle_s: float = 0.5, threads_per_rank: int = 1, db: str | None = None,
                 extra_env: dict[str, str] | None = None, scrub_interval_s: float = 60.0,
                 config: str | None = None, servers: int = 1, server_host: str = "127.0.0.1",
                 server_netns: str | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.home = self.root / "home"
        self.nodes = {n.name: n for n in nodes}
        self.ports = [free_port() for _ in range(servers)]
        self.port = self.ports[0]
        self.server_host = server_host
        self.server_netns = server_netns
        self.urls = [f"http://{server_host}:{p}" for p in self.ports]
        self.url = ",".join(self.urls)  # clients and agents fail over along this list
        self.heartbeat_s = heartbeat_s
        self.threads_per_rank = threads_per_rank
        self.scrub_interval_s = scrub_interval_s
        self.config = config
        self.env = {**os.environ, "GSCHED_HOME": str(self.home), "GSCHED_SERVER": self.url,
                    "GSCHED_CYCLE_INTERVAL_S": str(cycle_s), "GSCHED_HEARTBEAT_TTL_S": str(ttl_s),
                    "GSCHED_HEARTBEAT_S": str(heartbeat_s), "PYTHONUNBUFFERED": "1",
                    # the CLI's config file (`gsched login`): the cluster's own, never the user's
                    "XDG_CONFIG_HOME": str(self.root / "xdg-config"),
                    # every agent of an embedded cluster reports the same disk: a floor of 1 GB rather
                    # than the server's 5 GB lets the demo and the tests run where a machine has little
                    # room (a test that means the floor sets its own)
                    "GSCHED_DISK_FLOOR_GB": "1", **(extra_env or {})}
        self.env.pop("GSCHED_TOKEN", None)
        if db:
            self.env["GSCHED_DB"] = db
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.blocks: list[str] = []  # rendezvous blocks rendezvous_block() gave this cluster's agents
        atexit.register(self.close)

    # ------------------------------------------------------------ processes
    def _spawn(self, name: str, args: list[str], netns: str | None = None) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")
        prefix = ["ip", "netns", "exec", netns] if netns else []
        proc = subprocess.Popen([*prefix, sys.executable, "-m", "scheduler.cli", *args], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=str(self.root))
        self.procs[name] = proc
        return proc

    def start_server(self, wait: bool = True, index: int = 0) -> None:
        """Start server ``index`` (0 is "server", 1 is "server1", ...: standbys on one database)."""
        args = ["server", "--host", self.server_host, "--port", str(self.ports[index])]
        if self.config:
            args += ["--config", self.config]
        self._spawn(self.server_name(index), args, self.server_netns)
        if wait:
            self.wait_for(lambda: self.health(index) is not None, 60, f"server {index} to answer")

    @staticmethod
    def server_name(index: int) -> str:
        return "server" if index == 0 else f"server{index}"

    def health(self, index: int = 0) -> dict[str, Any] | None:
        try:
            return dict(Client(self.urls[index], timeout_s=2).get("/v1/health"))
        except Exception:  # noqa: BLE001
            return None

    def leader(self) -> int | None:
        """Index of the server that holds the scheduling lease, if any answers so."""
        for i in range(len(self.ports)):
            h = self.health(i)
            if h and h.get("leader"):
                return i
        return None

    def data_dir(self, node: str) -> Path:
        return self.root / "nodes" / node

    def rendezvous_ports(self, node: str) -> str:
        """The node's range: its own, or a block given once and kept (a restarted agent keeps it)."""
        spec = self.nodes[node]
        if not spec.rendezvous_ports:
            spec.rendezvous_ports = rendezvous_block()
            self.blocks.append(spec.rendezvous_ports)
        return spec.rendezvous_ports

    def start_agent(self, node: str) -> None:
        spec = self.nodes[node]
        wait = [] if spec.rendezvous_wait_s is None else ["--rendezvous-wait-s", str(spec.rendezvous_wait_s)]
        if spec.max_transfer_mbps is not None:
            wait += ["--max-transfer-mbps", str(spec.max_transfer_mbps)]
        if spec.job_retention is not None:
            wait += ["--job-retention", spec.job_retention]
        self._spawn(f"agent-{node}", ["agent", "--server", self.url, "--node", node, "--rack", spec.rack,
                                      "--gpus", str(spec.gpus), "--data-dir", str(self.data_dir(node)),
                                      "--heartbeat-s", str(self.heartbeat_s),
                                      "--threads-per-rank", str(self.threads_per_rank),
                                      "--scrub-interval-s", str(self.scrub_interval_s), "--host", spec.host,
                                      "--rendezvous-ports", self.rendezvous_ports(node), *wait,
                                      *(["--net-iface", spec.iface] if spec.iface else [])], spec.netns)

    def start(self) -> LocalCluster:
        for i in range(len(self.ports)):
            self.start_server(index=i)
        for name in self.nodes:
            self.start_agent(name)
        self.wait_for(lambda: len([n for n in self.admin().get("/v1/nodes") if n["state"] == NodeState.UP]) == len(self.nodes),
                      60, "every agent to report")
        return self

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(name)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, sig) if sig == signal.SIGKILL else proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def kill_node(self, node: str) -> None:
        """A node dies: SIGKILL its agent and every rank process it started (found by data dir)."""
        self.kill(f"agent-{node}", signal.SIGKILL)
        marker = str(self.data_dir(node).resolve()).encode()
        for pid in self.rank_pids():
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes() or _shard_list_under(pid, marker):
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def rank_pids(self) -> list[int]:
        """Live rank processes started by this cluster's agents (read from /proc): the built-in's, and
        every process of a [run] job's command (each has the GSCHED_SHARD_LIST its agent set)."""
        root = str(self.root.resolve()).encode()
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes()
                ours = (b"agents.workloads.resnet_ddp" in cmd and root in cmd) or _shard_list_under(int(d.name), root)
                if ours and "State:\tZ" not in (d / "status").read_text():
                    pids.append(int(d.name))
            except OSError:
                continue
        return pids

    def close(self) -> None:
        for name in sorted(self.procs, key=lambda n: n.startswith("server")):  # agents first, servers last
            proc = self.procs[name]
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.procs.clear()
        for pid in self.rank_pids():  # ranks of agents that were SIGKILLed
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for port in self.ports:  # its servers and agents are gone: another process may have their ports
            release_port(port)
        for block in self.blocks:
            release_port(block)
        self.blocks.clear()

    # ------------------------------------------------------------ clients and commands
    def admin_token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

    def admin(self) -> Client:
        return Client(self.url, self.admin_token())

    def client(self, token: str) -> Client:
        return Client(self.url, token)

    def add_user(self, name: str, shares: float = 1.0, unix_user: str = "") -> str:
        body: dict[str, Any] = {"name": name, "shares": shares}
        if unix_user:
            body["unix_user"] = unix_user
        return str(self.admin().post("/v1/users", body)["token"])

    def cli(self, *args: str, token: str | None = None, check: bool = True, timeout: float = 300,
            env: dict[str, str | None] | None = None, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``gsched ARGS`` against this cluster; ``env``: variables to set (None: to unset)."""
        run_env = dict(self.env)
        run_env.setdefault("COLUMNS", "150")
        if token:
            run_env["GSCHED_TOKEN"] = token
        for k, v in (env or {}).items():
            if v is None:
                run_env.pop(k, None)
            else:
                run_env[k] = v
        out = subprocess.run([sys.executable, "-m", "scheduler.cli", *args], env=run_env, capture_output=True,
                             text=True, timeout=timeout, cwd=str(self.root), input=input)
        if check and out.returncode != 0:
            raise RuntimeError(f"gsched {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        return out

    def job(self, job_id: int, token: str | None = None) -> dict[str, Any]:
        c = self.client(token) if token else self.admin()
        return dict(c.get(f"/v1/jobs/{job_id}"))

    def wait_job(self, job_id: int, states: set[str] | str, timeout: float = 300,
                 interval: float = 0.25) -> dict[str, Any]:
        wanted = {states} if isinstance(states, str) else set(states)
        self.wait_for(lambda: self.job(job_id)["state"] in wanted, timeout, f"job {job_id} to reach {sorted(wanted)}",
                      diagnose=lambda: json.dumps({k: v for k, v in self.job(job_id).items()
                                                   if k in ("state", "reason", "ranks", "progress")}, indent=1),
                      interval=interval)
        return self.job(job_id)

    def wait_for(self, pred: Callable[[], Any], timeout: float, what: str,
                 diagnose: Callable[[], str] | None = None, interval: float = 0.25) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                out = pred()
            except Exception:  # noqa: BLE001 - keep polling through transient errors
                out = None
            if out:
                return out
            time.sleep(interval)
        detail = ""
        if diagnose is not None:
            try:
                detail = diagnose()
            except Exception as e:  # noqa: BLE001
                detail = f"(diagnosis failed: {e})"
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}\n{detail}\n{self.tail_logs()}")

    def tail_logs(self, n: int = 15) -> str:
        parts = []
        for log in sorted(self.root.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-n:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)


def _shard_list_under(pid: int, root: bytes) -> bool:
    """Whether process ``pid`` is a rank (or a child of one) whose GSCHED_SHARD_LIST lies under ``root``."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(v.startswith(b"GSCHED_SHARD_LIST=" + root) for v in env)
