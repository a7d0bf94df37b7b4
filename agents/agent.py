"""``gsched agent``: the node daemon.

Every ``heartbeat_s`` it reports the node (devices, shard inventory, ranks, logs, metrics, transfer
results) to the server and acts on the reply: start the ranks it was given, kill the ones it was told
to stop, copy the replicas it was asked to hold.  It also serves its shards and checkpoints to peers
(``agents.dataserver``).  Rank processes are recorded in ``DIR/.gsched/pids``; an agent that starts
after a crash stops the ranks its predecessor left behind, so a returning node never runs stale work.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from agents.dataserver import DataServer, checkpoint_path
from agents.devices import Devices
from agents.fence import PIDS, Fence, Group, not_ours, read_groups, record, sigkill_group
from agents.inventory import ShardInventory, cpu_count, free_bytes
from agents.launcher import RankRunner
from agents.ports import DEFAULT_RANGE, PortRangeError, RendezvousPorts, parse_range
from agents.retention import JobRetention
from agents.runas import agent_account
from agents.shardfile import shard_path
from agents.staging import ShardFlights, StagingError, fetch
from agents.throttle import Throttle
from scheduler.protocol.http import send
from scheduler.protocol.messages import HeartbeatReply, TransferOrder
from scheduler.protocol.peers import PEER_CA_HINT, advertised, peer_context, peer_url, untrusted
from scheduler.protocol.servererror import ServerError
from scheduler.protocol.servers import Servers
from scheduler.protocol.states import RANK_FINAL, TransferState
from scheduler.protocol.tickets import ticket_headers

log = logging.getLogger("gsched.agent")
FULL_INVENTORY_EVERY_S = 10.0
_ENDED = (TransferState.DONE, TransferState.FAILED)  # a copy's result, reported once
_REPORTED = (*_ENDED, TransferState.RUNNING)


class ServerUnavailable(RuntimeError):
    pass


class Agent:
    def __init__(self, servers: list[str], node: str, rack: str, gpus: str, data_dir: Path, host: str = "127.0.0.1",
                 port: int = 0, token: str | None = None, heartbeat_s: float = 2.0,
                 threads_per_rank: int | None = None, scrub_interval_s: float = 60.0,
                 net_iface: str | None = None, ca: str | None = None, rendezvous_ports: str = DEFAULT_RANGE,
                 rendezvous_wait_s: float = 30.0, max_transfers: int = 4, max_transfer_mbps: float = 0.0,
                 job_retention_s: float | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None) -> None:
        self.servers = Servers(servers, ca)  # with ca: verifies an HTTPS server against it
        self.peer_tls = peer_context(ca)  # and HTTPS peers (scheduler/protocol/peers.py)
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("--tls-cert and --tls-key go together: give both to serve data over HTTPS, or neither")
        self.node = node
        self.rack = rack
        self.data_dir = data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / ".gsched").mkdir(exist_ok=True)
        self.device_source = Devices(gpus)
        self.devices = self.device_source.poll()
        self.device_kind = self.devices[0]["kind"] if self.devices else "cpu"
        self.heartbeat_s = heartbeat_s
        self.scrub_interval_s = scrub_interval_s
        self.net_iface = net_iface
        self._threads = threads_per_rank
        # Each agent starts at its own place in the range: agents sharing a host that were given the same
        # range then rarely meet (each should still get its own range: docs/agents-systemd.md).
        first, last = parse_range(rendezvous_ports)
        self.ports = RendezvousPorts(first, last, start=secrets.randbelow(last - first + 1))
        self.rendezvous_wait_s = rendezvous_wait_s
        self.incarnation = uuid.uuid4().hex
        self.inventory = ShardInventory(self.data_dir)
        self.retention = JobRetention(self.data_dir, job_retention_s)  # finished jobs' directories
        self.flights = ShardFlights()  # one transfer per shard when ranks of this node need it at once
        self.throttle = Throttle(max_transfers, max_transfer_mbps)  # copies in flight, bandwidth
        self.peer_key: str | None = None
        self.peers: dict[str, str] = {}
        self.ranks: dict[tuple[int, int, int], RankRunner] = {}
        self.transfers: dict[int, dict[str, Any]] = {}
        self.pending_metrics: list[dict[str, Any]] = []
        self.pending_logs: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._last_full = 0.0
        self._last_scrub = time.monotonic()
        self._last_progress_log = 0.0
        self._pids_lock = threading.Lock()
        self.fence = Fence(self.data_dir / ".gsched")  # agents/fence.py
        self.data = DataServer(host, port, self.data_dir, node, lambda: self.peer_key, self.note_shard,
                               on_nudge=self.report_soon, throttle=self.throttle,
                               tls=(tls_cert, tls_key) if tls_cert and tls_key else None)
        self.address = advertised(host, self.data.port, self.data.tls)
        self.token = token or self._find_token()

    # ------------------------------------------------------------ credentials
    def _find_token(self) -> str:
        saved = self.data_dir / ".gsched" / "agent.token"
        if saved.is_file():
            return saved.read_text().strip()
        admin = os.environ.get("GSCHED_TOKEN", "")
        home_token = Path(os.environ.get("GSCHED_HOME", "~/.gsched")).expanduser() / "admin.token"
        if not admin.startswith("gsu_") and home_token.is_file():
            admin = home_token.read_text().strip()
        if not admin:
            raise SystemExit("gsched agent: no agent token: pass --token or set GSCHED_AGENT_TOKEN "
                             "(an admin makes one with `gsched agent-token create NODE`)")
        reply = self._post("/v1/agent-tokens", {"node": self.node}, token=admin)
        fd = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(reply["token"])
        return str(reply["token"])

    # ------------------------------------------------------------ HTTP to the server
    def _post(self, path: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
        """POST JSON to the first server that takes it (any failure but a refused token fails over to
        the next).  A refused token (401, 403) ends the agent; no server taking it raises
        ``ServerUnavailable`` saying what each one did."""
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token or self.token}"}
        try:
            raw = self.servers.send("POST", path, json.dumps(body).encode(), headers, 15,
                                    fail_over=lambda e, last: e.status not in (401, 403))
        except ServerError as e:
            if e.status in (401, 403):
                raise SystemExit(f"gsched agent: the server refused this agent's token ({e.status}): "
                                 f"{e.message[:500]}") from None
            raise ServerUnavailable(e.message) from None
        return dict(json.loads(raw))

    # ------------------------------------------------------------ helpers used by runners
    def threads_per_rank(self, devices: int) -> int:
        if self._threads:
            return self._threads
        return max(1, cpu_count() * devices // max(1, len(self.devices)))

    def local_sha(self, dataset: str, shard: int, path: Path) -> str | None:
        sha = self.inventory.sha(dataset, shard)
        if sha is None:
            self.inventory.scan()
            sha = self.inventory.sha(dataset, shard)
        return sha

    def report_soon(self) -> None:
        """Heartbeat now rather than at the next tick (a rank changed state, or the server nudged)."""
        self._wake.set()

    def note_shard(self, dataset: str, shard: int, path: Path, sha256: str) -> None:
        self.inventory.note(dataset, shard, path, sha256)
        self._last_full = 0.0  # report the new replica with the next heartbeat
        self._wake.set()

    def show_progress(self, key: tuple[int, int, int], done: int, total: int, rate: float) -> None:
        now = time.monotonic()
        if now - self._last_progress_log < 1.0 and done < total:
            return
        self._last_progress_log = now
        width = 30
        filled = int(width * done / total) if total else width
        eta = (total - done) / rate if rate > 0 else 0.0
        log.info("staging job %s rank %s [%s%s] %s/%s MB %.1f MB/s ETA %.0fs", key[0], key[2], "#" * filled,
                 "." * (width - filled), f"{done / 1e6:.1f}", f"{total / 1e6:.1f}", rate / 1e6, eta)

    def mirror_checkpoint(self, job_id: int, path: Path, keep: int = 0, sha256: str = "") -> list[str]:
        """Copy a fresh checkpoint to one other up node (the server's order: another rack first) before
        the server records it; with ``sha256`` the receiving node keeps the copy only if it matches."""
        if not path.is_file() or not self.peer_key:
            return []
        for node, address in list(self.peers.items()):
            if node == self.node:
                continue
            name = path.name
            try:
                checkpoint_path(self.data_dir, job_id, name)
                with open(path, "rb") as f:
                    send(peer_url(address, f"checkpoints/{job_id}/{name}"), "PUT", f,
                         {**ticket_headers(self.peer_key, "ckpt", job_id, name),
                          "Content-Length": str(path.stat().st_size), "X-Gsched-Keep": str(max(0, int(keep))),
                          **({"X-Gsched-Sha256": sha256} if sha256 else {})},
                         timeout_s=60, context=self.peer_tls)
                return [node]
            except (ServerError, OSError, ValueError) as e:
                log.warning("mirroring %s to %s failed: %s%s", name, node, e,
                            f" ({PEER_CA_HINT})" if untrusted(e) else "")
        return []

    # ------------------------------------------------------------ pids of rank process groups
    def _pids_file(self) -> Path:
        return self.data_dir / ".gsched" / PIDS

    def remember_pid(self, pid: int) -> None:
        """Note the process group of a rank just started (with its leader's start time and the boot:
        agents/fence.py ``not_ours``), for the fence and for the next agent's ``kill_leftovers``."""
        with self._pids_lock:
            groups = read_groups(self._pids_file())
            groups[pid] = record(pid)
            self._write_groups(groups)

    def forget_pid(self, pid: int) -> None:
        with self._pids_lock:
            groups = read_groups(self._pids_file())
            groups.pop(pid, None)
            self._write_groups(groups)

    def _write_groups(self, groups: dict[int, Group]) -> None:
        self._pids_file().write_text("".join(f"{g.line()}\n" for _, g in sorted(groups.items())))

    def kill_leftovers(self) -> None:
        """Stop the rank process groups a previous agent on this node left running; never a group whose
        id another process has taken since (fence.not_ours)."""
        for pgid, g in sorted(read_groups(self._pids_file()).items()):
            why = not_ours(g)
            if why is not None:
                log.info("left process group %s alone: %s", pgid, why)
            elif sigkill_group(pgid):  # not_ours said it is the rank's: not asked again
                log.warning("stopped rank process group %s left by a previous agent", pgid)
        self._pids_file().write_text("")

    # ------------------------------------------------------------ the loop
    def heartbeat(self) -> HeartbeatReply:
        now = time.monotonic()
        self.devices = self.device_source.poll()  # health may change between heartbeats (ECC, XID)
        body: dict[str, Any] = {"node": self.node, "rack": self.rack, "address": self.address,
                                "incarnation": self.incarnation, "devices": self.devices,
                                "free_bytes": free_bytes(self.data_dir)}
        # _last_full is set before the scan: a shard noted while it runs (note_shard, from the data
        # server's threads) sets it back to 0, so the next heartbeat, which note_shard wakes, reports it
        # (set after the scan, it overwrote that request and the shard waited for the next full report)
        if now - self._last_scrub >= self.scrub_interval_s:
            self._last_scrub = self._last_full = now
            body["replicas"] = self.inventory.scan(rehash=True)
        elif now - self._last_full >= FULL_INVENTORY_EVERY_S:
            self._last_full = now
            body["replicas"] = self.inventory.scan()
        dirs = self.retention.due(now)
        if dirs is not None:
            body["job_dirs"] = dirs
        runners = list(self.ranks.values())
        body["ranks"] = [r.report() for r in runners]
        for r in runners:
            text = r.new_log_text()
            if text:
                self.pending_logs.append({"job_id": r.key[0], "attempt": r.key[1], "rank": r.key[2], "text": text})
            for line in r.new_metric_lines():
                self.pending_metrics.append({"job_id": r.key[0], "attempt": r.key[1], "line": line})
        body["logs"] = self.pending_logs[:512]
        body["metrics"] = self.pending_metrics[:512]
        body["transfers"] = [{"id": t, **{k: v for k, v in st.items() if k in ("state", "bytes", "reason")}}
                             for t, st in self.transfers.items() if st["state"] in _REPORTED]
        reply = HeartbeatReply.model_validate(self._post("/v1/agent/heartbeat", body))
        del self.pending_logs[: len(body["logs"])]
        del self.pending_metrics[: len(body["metrics"])]
        for t in body["transfers"]:
            if t["state"] in _ENDED:
                self.transfers.pop(t["id"], None)
        self.apply(reply, ended={r.key for r, said in zip(runners, body["ranks"], strict=True)
                                 if said["state"] in RANK_FINAL})
        self.retention.apply(reply.ended, live={key[0] for key in self.ranks})
        return reply

    def apply(self, reply: HeartbeatReply, ended: set[tuple[int, int, int]]) -> None:
        """Act on a heartbeat's reply.  ``ended``: the ranks that heartbeat reported EXITED or KILLED
        (a rank that exited with logs or metrics still to hand over was reported RUNNING)."""
        self.peer_key = reply.peer_key or self.peer_key
        if reply.peers is not None:  # sent while this node runs ranks: where to mirror checkpoints, best first
            self.peers = {p.name: p.address for p in reply.peers}
        if reply.heartbeat_s is not None:
            self.heartbeat_s = reply.heartbeat_s
        if reply.ttl_s is not None:
            self.fence.arm(reply.ttl_s)
        wanted = set()
        for a in reply.assignments:
            wanted.add(a.key)
            runner = self.ranks.get(a.key)
            if runner is None:
                runner = RankRunner(self, a)
                self.ranks[a.key] = runner
                log.info("job %s attempt %s rank %s assigned (devices %s, %d shards)", a.job_id, a.attempt,
                         a.rank, a.devices, len(a.shards))
                runner.start()
            else:
                runner.update(a)
        killed = set()
        for k in reply.kill:
            key = (k.job_id, k.attempt, k.rank)
            killed.add(key)
            runner = self.ranks.get(key)
            if runner is not None:
                runner.kill()
        # Forget ranks the server has recorded as over: reported final, and no longer assigned.  Going
        # by what was reported, not by the runner's state now: a rank the server saw RUNNING gets no
        # assignment back, and one that exited since must stay until its exit has been reported.
        for key in ended:
            if key not in wanted and key not in killed:
                self.ranks.pop(key, None)
        for t in reply.transfers:
            if t.id not in self.transfers:
                self.transfers[t.id] = {"state": TransferState.RUNNING, "bytes": 0, "reason": ""}
                threading.Thread(target=self._replicate, args=(t,), daemon=True).start()
        for d in reply.delete:
            try:
                shard_path(self.data_dir, d.dataset, d.shard).unlink(missing_ok=True)
                self._last_full = 0.0
            except (OSError, ValueError) as e:
                log.warning("could not delete %s/%s: %s", d.dataset, d.shard, e)

    def _replicate(self, t: TransferOrder) -> None:
        status = self.transfers[t.id]
        try:
            path = shard_path(self.data_dir, t.dataset, t.shard)
            def progress(done: int, total: int, rate: float) -> None:
                status["bytes"] = done  # reported RUNNING with the bytes so far: `gsched data ls` shows them

            n = fetch(t.source_address, f"shards/{t.dataset}/{t.shard}", ("get", t.dataset, t.shard), path, t.sha256,
                      self.peer_key or "", progress, throttle=self.throttle, context=self.peer_tls)
            self.note_shard(t.dataset, t.shard, path, t.sha256)
            status.update(state=TransferState.DONE, bytes=n)
            log.info("replica %s/%s copied from %s (%d bytes)", t.dataset, t.shard, t.source, n)
        except (StagingError, ValueError) as e:
            status.update(state=TransferState.FAILED, reason=str(e)[:2000])
            log.warning("replica copy %s/%s failed: %s", t.dataset, t.shard, e)
        self._wake.set()

    def run(self) -> None:
        self.fence.claim()  # before anything else: a watchdog its predecessor left sees another pid and exits
        self.kill_leftovers()
        self.data.start()
        self.inventory.scan()
        log.info("agent %s (rack %s) serving data on %s, %d %s device(s), data dir %s", self.node, self.rack,
                 self.address, len(self.devices), self.device_kind, self.data_dir)
        me = agent_account()
        if me.uid != 0:  # agents/runas.py: it cannot switch accounts
            log.warning("agent runs as %s, not root: it runs [run] jobs only as %s (a job mapped to another "
                        "account fails; run the agent as root, or the server with run_as_agent_user = true)",
                        me.name, me.name)
        failures = 0
        while not self._stop.is_set():
            try:
                self.heartbeat()
                if failures:
                    log.info("server reachable again")
                failures = 0
            except ServerUnavailable as e:
                failures += 1
                if failures in (1, 10) or failures % 60 == 0:
                    log.warning("heartbeat failed (%d): %s", failures, e)
            self._wake.wait(self.heartbeat_s)
            self._wake.clear()
        self.shutdown()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def shutdown(self) -> None:
        for r in list(self.ranks.values()):
            r.kill()
        deadline = time.monotonic() + 15
        for r in list(self.ranks.values()):
            if r.proc is not None:
                try:
                    r.proc.wait(max(0.1, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001
                    pass
        self.fence.close()
        self.data.stop()


def main(args: Any) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s agent[%(name)s] %(message)s")
    token = args.token or os.environ.get("GSCHED_AGENT_TOKEN")
    servers = [s for s in (args.server or os.environ.get("GSCHED_SERVER", "http://127.0.0.1:8470")).split(",") if s]
    try:
        agent = Agent(servers, args.node, args.rack, args.gpus, Path(args.data_dir), host=args.host, port=args.port,
                      token=token, heartbeat_s=args.heartbeat_s, threads_per_rank=args.threads_per_rank,
                      scrub_interval_s=args.scrub_interval_s, net_iface=args.net_iface,
                      ca=args.ca or os.environ.get("GSCHED_CA"), rendezvous_ports=args.rendezvous_ports,
                      rendezvous_wait_s=args.rendezvous_wait_s, max_transfers=args.max_transfers,
                      max_transfer_mbps=args.max_transfer_mbps,
                      job_retention_s=getattr(args, "job_retention_s", None),
                      tls_cert=getattr(args, "tls_cert", None), tls_key=getattr(args, "tls_key", None))
    except (PortRangeError, ValueError) as e:
        print(f"gsched agent: {e}", file=sys.stderr)
        return 2

    def _term(signum: int, _frame: Any) -> None:
        log.info("signal %s: stopping ranks and exiting", signum)
        agent.stop()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    agent.run()
    return 0
