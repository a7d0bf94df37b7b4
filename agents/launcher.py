"""One rank on this node: stage its shards, wait for the rendezvous port, run the process, report.

A ``RankRunner`` is a thread owned by the agent.  The agent reads ``report()`` into each heartbeat
and calls ``update(assignment)`` with the ``Assignment`` the server sends back (the rendezvous port
arrives that way) and ``kill()`` when told to stop the rank.  The rank process is the built-in
workload, started with a ``RankSpec`` file (scheduler/protocol/rankspec.py) made from the assignment.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agents.dataserver import checkpoint_dir, checkpoint_path
from agents.rankfail import RENDEZVOUS, rendezvous_failure
from agents.shardfile import background_priority, shard_path
from agents.staging import StagingError, fetch
from scheduler.protocol.messages import Assignment, ShardSource
from scheduler.protocol.rankspec import RankSpec
from scheduler.protocol.states import RANK_FINAL, RankState

log = logging.getLogger("gsched.agent.rank")
KILL_GRACE_S = 10.0


class RendezvousError(RuntimeError):
    """Rank 0 got no rendezvous port: an infrastructure failure of this node, not of the job."""


class RankRunner(threading.Thread):
    def __init__(self, agent: Any, assignment: Assignment) -> None:
        super().__init__(name=f"rank-{assignment.job_id}.{assignment.rank}", daemon=True)
        self.agent = agent
        self.a = assignment
        self.key = assignment.key
        self._state = RankState.STAGING
        self.exit_code: int | None = None
        self.error = ""
        self.failure = ""  # "rendezvous": the node's fault, not the job's (agents/rankfail.py)
        self.staged = 0
        self.staging_total = 0
        self.rate = 0.0
        self.staging_s = 0.0
        self.master_port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._killed = threading.Event()
        self._lock = threading.Lock()
        root = agent.data_dir / ".gsched" / "jobs" / str(self.a.job_id) / f"attempt-{self.a.attempt}"
        root.mkdir(parents=True, exist_ok=True)
        self.run_dir = root
        self.log_path = root / f"rank-{self.a.rank}.log"
        self.metrics_path = root / "metrics.jsonl"
        self.log_offset = 0
        self.metrics_offset = 0
        self._held: list[dict[str, Any]] = []
        self._mirroring: threading.Thread | None = None

    @property
    def state(self) -> RankState:
        return self._state

    @state.setter
    def state(self, value: RankState) -> None:
        """A new state is reported at once (the agent heartbeats now), not at the next tick: the server
        learns that ranks run, or that devices are free, without waiting ``heartbeat_s``."""
        changed = value != self._state
        self._state = value
        if changed:
            self.agent.report_soon()

    # ------------------------------------------------------------ called by the agent
    def update(self, assignment: Assignment) -> None:
        with self._lock:
            self.a = assignment

    def kill(self) -> None:
        self._killed.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            threading.Thread(target=self._reap, args=(proc,), daemon=True).start()

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            proc.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)

    def drained(self) -> bool:
        """Whether every metric line and all log text of an ended rank has been handed over."""
        if self._held or (self._mirroring is not None and self._mirroring.is_alive()):
            return False
        try:
            if self.a.rank == 0 and self.metrics_path.stat().st_size > self.metrics_offset:
                return False
        except OSError:
            pass
        try:
            return self.log_path.stat().st_size <= self.log_offset
        except OSError:
            return True

    def report(self) -> dict[str, Any]:
        state = self.state
        if self._killed.is_set() and state in RANK_FINAL:
            state = RankState.KILLED
        elif state == RankState.EXITED and not self.drained():
            state = RankState.RUNNING  # its last metrics and logs go out first, then its exit
        return {"job_id": self.key[0], "attempt": self.key[1], "rank": self.key[2], "state": state,
                "exit_code": self.exit_code, "log_tail": self.log_tail(), "staged_bytes": self.staged,
                "staging_total": self.staging_total, "staging_rate_bps": self.rate, "staging_s": self.staging_s,
                "master_port": self.master_port, "error": self.error[-4000:], "failure": self.failure}

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, self.log_path.stat().st_size - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def new_log_text(self, limit: int = 32768) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                data = f.read(limit)
        except OSError:
            return ""
        self.log_offset += len(data)
        return data.decode(errors="replace")

    def new_metric_lines(self) -> list[dict[str, Any]]:
        """Metric lines written since the last call, in order.

        A checkpoint line is held back (with everything after it) until the checkpoint has been
        copied to another node in a background thread, so the server only ever records mirrored
        checkpoints and the heartbeat never waits on a copy.
        """
        if self.a.rank != 0:
            return []
        if self._mirroring is not None:
            if self._mirroring.is_alive():
                return []
            self._mirroring = None
        try:
            with open(self.metrics_path, "rb") as f:
                f.seek(self.metrics_offset)
                data = f.read()
        except OSError:
            data = b""
        end = data.rfind(b"\n") + 1
        self.metrics_offset += end
        for raw in data[:end].splitlines():
            try:
                self._held.append(json.loads(raw))
            except ValueError:
                continue
        out: list[dict[str, Any]] = []
        while self._held:
            line = self._held[0]
            if line.get("type") == "checkpoint" and "mirrors" not in line:
                self._mirroring = threading.Thread(target=self._mirror, args=(line,), daemon=True)
                self._mirroring.start()
                break
            out.append(self._held.pop(0))
        return out

    def _mirror(self, line: dict[str, Any]) -> None:
        background_priority()  # the next epoch is training on these cores
        keep = self.a.knobs().keep_checkpoints  # as many as the rank keeps (it was launched with these)
        line["mirrors"] = self.agent.mirror_checkpoint(self.a.job_id, Path(str(line.get("path", ""))), keep)

    # ------------------------------------------------------------ the rank's life
    def run(self) -> None:
        try:
            paths = self._stage()
            if self._killed.is_set():
                self.state = RankState.KILLED
                return
            resume = self._stage_checkpoint()
            self.state = RankState.READY
            port = self._rendezvous()
            if port is None:
                self.state = RankState.KILLED
                return
            self._launch(paths, resume, port)
        except RendezvousError as e:
            self.error, self.failure = str(e), RENDEZVOUS
            log.error("job %s rank %s: %s", self.key[0], self.key[2], self.error)
            self.exit_code = 3
            self.state = RankState.EXITED
        except StagingError as e:
            self.error = f"staging failed: {e}"
            log.error("job %s rank %s: %s", self.key[0], self.key[2], self.error)
            self.exit_code = 3
            self.state = RankState.EXITED
        except Exception as e:  # noqa: BLE001 - report every failure to the server, never die silently
            log.exception("rank %s failed", self.key)
            self.error = f"agent error: {e}"
            self.exit_code = 4
            self.state = RankState.EXITED
        finally:
            if self.master_port is not None:  # rank 0's store is gone with it: the port can go to another job
                self.agent.ports.release(self.master_port)

    def _stage(self) -> list[str]:
        todo = []
        paths = []
        for sh in self.a.shards:
            path = shard_path(self.agent.data_dir, sh.dataset, sh.index)
            paths.append(str(path))
            if self._on_disk(sh, path):
                continue
            todo.append((sh, path))
        self.staging_total = sum(sh.bytes for sh, _ in todo)
        done_before = 0
        t0 = time.monotonic()
        for sh, path in todo:
            if self._killed.is_set():
                break
            with self.agent.flights.hold(sh.dataset, sh.index):
                if self._on_disk(sh, path):  # another rank of this node staged it meanwhile
                    self.staging_total -= sh.bytes
                    log.info("job %s: shard %s/%s already staged on this node by another rank", self.key[0],
                             sh.dataset, sh.index)
                    continue
                done_before = self._fetch(sh, path, done_before, t0)
        if todo:
            self.staging_s = time.monotonic() - t0
            self.staged = done_before
        return paths

    def _on_disk(self, sh: ShardSource, path: Path) -> bool:
        return path.is_file() and self.agent.local_sha(sh.dataset, sh.index, path) == sh.sha256

    def _fetch(self, sh: ShardSource, path: Path, done_before: int, t0: float) -> int:
        """Stage one shard from its source, else its alternates; returns the bytes staged so far."""
        sources = [sh.source_address] + [a for a in sh.alternates if a != sh.source_address]
        last_error: Exception | None = None
        for address in sources:
            if not address:
                continue
            try:
                def progress(done: int, total: int, rate: float, base: int = done_before) -> None:
                    self.staged = base + done
                    self.rate = self.staged / max(time.monotonic() - t0, 1e-6)
                    self.agent.show_progress(self.key, self.staged, self.staging_total, self.rate)

                n = fetch(address, f"shards/{sh.dataset}/{sh.index}", ("get", sh.dataset, sh.index),
                          path, sh.sha256, self.agent.peer_key or "", progress, throttle=self.agent.throttle)
                self.agent.note_shard(sh.dataset, sh.index, path, sh.sha256)
                done_before += n
                last_error = None
                break
            except StagingError as e:
                last_error = e
                log.warning("job %s: %s; trying another replica", self.key[0], e)
        if last_error is not None:
            raise StagingError(f"shard {sh.dataset}/{sh.index}: every replica failed; last: {last_error}")
        return done_before

    def _stage_checkpoint(self) -> str | None:
        resume = self.a.resume
        if resume is None:
            return None
        job_id = self.a.job_id
        name = Path(resume.path).name
        local = checkpoint_path(self.agent.data_dir, job_id, name)
        if local.is_file():
            return str(local)
        for node, address in zip(resume.nodes, resume.addresses, strict=False):
            if node == self.agent.node or not address:
                continue
            try:
                fetch(address, f"checkpoints/{job_id}/{name}", ("ckpt", job_id, name), local, None,
                      self.agent.peer_key or "")
                return str(local)
            except StagingError as e:
                log.warning("checkpoint %s from %s: %s", name, node, e)
        raise StagingError(f"checkpoint {name} could not be fetched from {resume.nodes}")

    def _rendezvous(self) -> int | None:
        """Rank 0: a port from the agent's range, held until this rank ends (agents/ports.py); it waits
        a bounded time for one to come free.  Other ranks: the port rank 0 reported, as the server
        passes it on."""
        if self.a.rank == 0:
            ports = self.agent.ports
            deadline = time.monotonic() + self.agent.rendezvous_wait_s
            while not self._killed.is_set():
                self.master_port = ports.take(self.key)
                if self.master_port is not None:
                    return self.master_port
                if time.monotonic() >= deadline:
                    held = len(ports.held())
                    raise RendezvousError(
                        f"rendezvous failed: no free rendezvous port in {ports} on {self.agent.node} after "
                        f"{self.agent.rendezvous_wait_s:g} s ({held} held by this node's jobs, "
                        f"{ports.size - held} in use by other processes)")
                time.sleep(0.5)
            return None
        while not self._killed.is_set():
            with self._lock:
                port = self.a.master_port
            if port:
                return int(port)
            time.sleep(0.1)
        return None

    def _launch(self, paths: list[str], resume: str | None, port: int) -> None:
        a = self.a
        spec = RankSpec(job_id=a.job_id, shards=paths, num_classes=a.num_classes,
                        checkpoint_dir=str(checkpoint_dir(self.agent.data_dir, a.job_id)),
                        metrics_path=str(self.metrics_path), resume_from=resume, train=a.knobs())
        spec_path = self.run_dir / f"rank-{a.rank}.spec.json"
        spec_path.write_text(json.dumps(workload_spec(spec), indent=1))
        env = dict(os.environ)
        threads = str(self.agent.threads_per_rank(len(a.devices)))
        env.update({
            "MASTER_ADDR": a.master_addr or "127.0.0.1", "MASTER_PORT": str(port),
            "RANK": str(a.rank), "LOCAL_RANK": str(a.local_rank), "WORLD_SIZE": str(a.world_size),
            "LOCAL_WORLD_SIZE": str(a.local_world_size), "GSCHED_JOB_ID": str(a.job_id),
            "GSCHED_DEVICES": ",".join(str(d) for d in a.devices), "PYTHONUNBUFFERED": "1",
            # The rank's CPU threads: torch's own pool (GSCHED_THREADS) and OpenMP's for whatever
            # else reads it, as torchrun sets OMP_NUM_THREADS for its ranks.
            "GSCHED_THREADS": threads, "OMP_NUM_THREADS": threads,
        })
        if self.agent.net_iface:  # which interface gloo and NCCL bind on multi-homed hosts
            env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = self.agent.net_iface
        if self.agent.device_kind == "cuda":
            # NVML (the agent's inventory) numbers devices in PCI bus order; CUDA's default is fastest
            # first. With this, index i means the same device to the agent, the server and the rank.
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in a.devices)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
        if self._killed.is_set():
            self.state = RankState.KILLED
            return
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen([sys.executable, "-m", "agents.workloads.resnet_ddp", "--spec", str(spec_path)],
                                         stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=str(self.run_dir),
                                         start_new_session=True)
        self.agent.remember_pid(self.proc.pid)
        self.state = RankState.RUNNING
        log.info("job %s rank %s started (pid %s, devices %s)", a.job_id, a.rank, self.proc.pid, a.devices)
        code = self.proc.wait()
        self.agent.forget_pid(self.proc.pid)
        if self._killed.is_set():
            _signal_group(self.proc, signal.SIGKILL)  # loader workers left behind, if any
        if code != 0 and not self._killed.is_set():
            sign = rendezvous_failure(self.log_tail(16384))
            if sign:
                self.error, self.failure = f"rendezvous failed on port {port}: {sign}", RENDEZVOUS
        self.exit_code = code
        self.state = RankState.KILLED if self._killed.is_set() else RankState.EXITED
        log.info("job %s rank %s exited with %s", a.job_id, a.rank, code)


def workload_spec(spec: RankSpec) -> dict[str, Any]:
    """The rank spec file's JSON: ``spec`` as ``model_dump``, what the workload reads with ``RankSpec``
    (agents/workloads/resnet_ddp/spec.py)."""
    return spec.model_dump(mode="json")


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

