"""One rank on this node: stage its shards, wait for the rendezvous port, run the process, report.

A ``RankRunner`` is a thread owned by the agent.  The agent reads ``report()`` into each heartbeat
and calls ``update(assignment)`` with the ``Assignment`` the server sends back (the rendezvous port
arrives that way) and ``kill()`` when told to stop the rank.

There is one way to start a rank: a command, in its own process group, as the job's Unix account
(agents/runas.py), with torchrun's and gsched's environment (agents/rankenv.py).  A ``[run]`` job's
command is the user's own; the built-in workload's is ``python -m agents.workloads.resnet_ddp --spec
FILE``, with a ``RankSpec`` file (scheduler/protocol/rankspec.py) made from the assignment.  Stopping
a rank is SIGTERM to its group, then SIGKILL after the job's ``grace_s`` (the built-in's: 10 s).
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

from agents.ckptverify import choose
from agents.ckptwatch import CheckpointWatch, copy_checkpoint
from agents.dataserver import checkpoint_dir, checkpoint_path
from agents.fence import FENCED
from agents.rankenv import RankFacts, rank_env
from agents.rankfail import RENDEZVOUS, rendezvous_failure
from agents.runas import Account, AccountError, agent_account, own, resolve, share
from agents.shardfile import background_priority, prune_checkpoints, sha256_file, shard_path
from agents.staging import StagingError, fetch
from scheduler.protocol.messages import Assignment, ShardSource
from scheduler.protocol.rankspec import RankSpec
from scheduler.protocol.runspec import RunTable
from scheduler.protocol.states import RANK_FINAL, RankState

log = logging.getLogger("gsched.agent.rank")
KILL_GRACE_S = 10.0


class RendezvousError(RuntimeError):
    """Rank 0 got no rendezvous port: an infrastructure failure of this node, not of the job."""


class StartError(RuntimeError):
    """The rank's command could not be started here (its workdir is missing, its program not found,
    its account unknown): the job's fault, reported with the node and the path."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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
        self.account: Account | None = None  # whom the rank runs as, once known (run())
        self.out_dir = root.parent / "out"  # a [run] job's GSCHED_CHECKPOINT_DIR
        self.watch: CheckpointWatch | None = None  # rank 0 of a [run] job: its checkpoint files

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

    def grace_s(self) -> float:
        """How long a rank has between SIGTERM and SIGKILL: its ``[run] grace_s``, the built-in's 10 s."""
        try:
            run = self.a.command()
        except ValueError:
            run = None
        return run.grace_s if run is not None else KILL_GRACE_S

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            proc.wait(self.grace_s())
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)

    def drained(self) -> bool:
        """Whether every metric line and all log text of an ended rank has been handed over."""
        if self._held or (self._mirroring is not None and self._mirroring.is_alive()):
            return False
        if self.watch is not None and self.watch.pending():
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
            size = self.log_path.stat().st_size
        except OSError:
            return ""
        return _read_at(self.log_path, max(0, size - n), n).decode(errors="replace")

    def new_log_text(self, limit: int = 32768) -> str:
        data = _read_at(self.log_path, self.log_offset, limit)
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
        data = _read_at(self.metrics_path, self.metrics_offset, 1 << 24)
        end = data.rfind(b"\n") + 1
        self.metrics_offset += end
        for raw in data[:end].splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(line, dict):
                continue
            if self.a.run is not None and line.get("type") == "checkpoint":
                continue  # a [run] job's checkpoints are the files in its checkpoint dir, taken below
            self._held.append(line)
        if self.watch is not None:
            ended = self.state in RANK_FINAL  # nothing is being written any more: take every new file
            for name, number in self.watch.scan(final=ended):
                dest = checkpoint_path(self.agent.data_dir, self.a.job_id, f"epoch-{number:04d}.pt")
                self._held.append({"type": "checkpoint", "epoch": number, "path": str(dest),
                                   "file": name, "_from": str(self.out_dir / name)})
        out: list[dict[str, Any]] = []
        while self._held:
            line = self._held[0]
            if line.pop("_dropped", False):
                self._held.pop(0)  # a file that changed while it was copied: its next version is taken later
                continue
            if line.get("type") == "checkpoint" and "mirrors" not in line:
                self._mirroring = threading.Thread(target=self._mirror, args=(line,), daemon=True)
                self._mirroring.start()
                break
            out.append(self._held.pop(0))
        return out

    def _mirror(self, line: dict[str, Any]) -> None:
        background_priority()  # the next epoch is training on these cores
        keep = self.a.knobs().keep_checkpoints  # as many as the rank keeps (it was launched with these)
        path = Path(str(line.get("path", "")))
        source = line.pop("_from", None)
        if source is not None:  # a [run] job's file: copied into the store first, as the agent's
            account = self.account or agent_account()
            size = copy_checkpoint(Path(source), path, account.uid if account.switch else None)
            if size is None:
                line["_dropped"] = True
                return
            share(path, account, 0o640)
            line["bytes"] = size
            prune_checkpoints(path.parent, keep)
        try:
            line["sha256"] = sha256_file(path)  # recorded by the server: every copy is checked against it
        except OSError:
            line["_dropped"] = True  # pruned (or never written) before it could be hashed: not recorded
            return
        line["mirrors"] = self.agent.mirror_checkpoint(self.a.job_id, path, keep, line["sha256"])

    # ------------------------------------------------------------ the rank's life
    def run(self) -> None:
        try:
            self._prepare()
            paths = self._stage()
            if self._killed.is_set():
                self.state = RankState.KILLED
                return
            resume = self._stage_checkpoint()
            if resume is not None and self.a.run is not None and self.account is not None:
                share(Path(resume), self.account, 0o640)  # the job's group may read it, not change it
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
        except StartError as e:
            self.error = str(e)
            log.error("job %s rank %s: %s", self.key[0], self.key[2], self.error)
            self._note(self.error)
            self.exit_code = e.exit_code
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

    def _prepare(self) -> None:
        """Whom the rank runs as, and its directories given to that account: the attempt's directory
        (logs, metric lines, the shard list) and a [run] job's checkpoint dir are its own (0700); the
        mirrored checkpoints it resumes from are the agent's, readable by its group (0750)."""
        try:
            run = self.a.command()
        except ValueError as e:
            raise StartError(str(e)) from None
        try:
            account = resolve(self.a.run_as, self.agent.node, self.a.user) if run is not None else agent_account()
        except AccountError as e:
            raise StartError(f"cannot run as the job's account: {e}") from None
        self.account = account
        if run is None:
            return
        job_dir = self.run_dir.parent
        if account.switch:
            job_dir.chmod(0o711)  # the agent's: only the account's own directories below can be read
        own(self.run_dir, account, 0o700)
        self.out_dir.mkdir(exist_ok=True)
        own(self.out_dir, account, 0o700)
        store = checkpoint_dir(self.agent.data_dir, self.a.job_id)
        store.mkdir(parents=True, exist_ok=True)
        share(store, account, 0o750)
        for f in store.iterdir():
            if f.is_file() and not f.is_symlink():
                share(f, account, 0o640)
        for f in (self.log_path, self.metrics_path):
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            os.close(fd)
            own(f, account, 0o600)
        if self.a.rank == 0:
            first = (self.a.resume.epoch if self.a.resume is not None else 0) + 1
            self.watch = CheckpointWatch(self.out_dir, account.uid if account.switch else None, first)
            self.watch.prime()

    def _note(self, text: str) -> None:
        """Add a line of the agent's to the rank's log (what ``gsched logs`` shows with its output)."""
        try:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "ab") as f:
                f.write(f"gsched: {text}\n".encode())
        except OSError:
            pass

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
                          path, sh.sha256, self.agent.peer_key or "", progress, throttle=self.agent.throttle,
                          context=self.agent.peer_tls)
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
        """The newest recorded checkpoint whose copy here (fetched if need be) matches the sha256 the
        server recorded; a newer one that fails its check is skipped for the one before it, and each
        skip becomes a ``checkpoint_skipped`` line (an event on the server).  Nothing unverified is
        loaded: StagingError when no candidate verifies (agents/ckptverify.py)."""
        resume = self.a.resume
        if resume is None:
            return None
        job_id = self.a.job_id

        def fetch_one(address: str, name: str, dest: Path, sha: str) -> None:
            fetch(address, f"checkpoints/{job_id}/{name}", ("ckpt", job_id, name), dest, sha,
                  self.agent.peer_key or "", context=self.agent.peer_tls)

        choice = choose([resume, *self.a.resume_older], lambda name: checkpoint_path(self.agent.data_dir, job_id, name),
                        fetch_one, self.agent.node)
        for c, why in choice.skipped:
            text = f"checkpoint epoch {c.epoch} skipped: {why}"
            log.warning("job %s rank %s: %s", job_id, self.a.rank, text)
            self._note(text)
            self._held.append({"type": "checkpoint_skipped", "epoch": c.epoch, "reason": why[:300]})
        if choice.checkpoint is None or choice.path is None:
            raise StagingError(f"no checkpoint of job {job_id} could be verified: "
                               + "; ".join(f"epoch {c.epoch}: {why}" for c, why in choice.skipped))
        if self.watch is not None:  # a [run] job's next checkpoint is numbered on from the one it loads
            self.watch.next_epoch = choice.checkpoint.epoch + 1
        return str(choice.path)

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
        run = a.command()
        account = self.account or agent_account()
        shard_list = self.run_dir / f"rank-{a.rank}.shards"
        _write_own(shard_list, "".join(p + "\n" for p in paths), account)
        if run is None:  # the built-in workload, as one such command
            ckpt_dir = str(checkpoint_dir(self.agent.data_dir, a.job_id))
            spec = RankSpec(job_id=a.job_id, shards=paths, num_classes=a.num_classes, checkpoint_dir=ckpt_dir,
                            metrics_path=str(self.metrics_path), resume_from=resume, train=a.knobs())
            spec_path = self.run_dir / f"rank-{a.rank}.spec.json"
            spec_path.write_text(json.dumps(workload_spec(spec), indent=1))
            argv = [sys.executable, "-m", "agents.workloads.resnet_ddp", "--spec", str(spec_path)]
            cwd, extra = str(self.run_dir), {}
        else:
            ckpt_dir = str(self.out_dir)
            argv, cwd, extra = run.argv(), run.workdir or str(self.run_dir), dict(run.env)
            if not os.path.isdir(cwd):
                raise StartError(f"run.workdir {cwd} does not exist on node {self.agent.node}")
        facts = RankFacts(job_id=a.job_id, attempt=a.attempt, rank=a.rank, local_rank=a.local_rank,
                          world_size=a.world_size, local_world_size=a.local_world_size, group_rank=a.group_rank,
                          group_world_size=a.group_world_size, master_addr=a.master_addr, master_port=port,
                          devices=a.devices, device_kind=self.agent.device_kind,
                          threads=self.agent.threads_per_rank(len(a.devices)),
                          dataset=a.dataset or (a.shards[0].dataset if a.shards else ""), shards=paths,
                          shard_list=str(shard_list), checkpoint_dir=ckpt_dir, resume_from=resume or "",
                          metrics_file=str(self.metrics_path))
        env = rank_env(os.environ, facts, extra, account.env(), self.agent.net_iface, a.env)
        if self._killed.is_set():
            self.state = RankState.KILLED
            return
        self._start(argv, cwd, env, account, run)
        assert self.proc is not None
        self.agent.remember_pid(self.proc.pid)
        self.state = RankState.RUNNING
        log.info("job %s rank %s started (pid %s, devices %s%s)", a.job_id, a.rank, self.proc.pid, a.devices,
                 f", as {account.name}" if account.switch else "")
        code = self.proc.wait()
        self.agent.forget_pid(self.proc.pid)
        if self._killed.is_set():
            _signal_group(self.proc, signal.SIGKILL)  # loader workers left behind, if any
        if code != 0 and not self._killed.is_set() and self.agent.fence.fenced(self.proc.pid, code):
            self.error = (f"stopped by node {self.agent.node}'s fence: its agent was silent for over "
                          f"{self.agent.fence.after_s:g} s")
            self.failure = FENCED
        elif code != 0 and not self._killed.is_set():
            sign = rendezvous_failure(self.log_tail(16384))
            if sign:
                self.error, self.failure = f"rendezvous failed on port {port}: {sign}", RENDEZVOUS
        self.exit_code = code
        self.state = RankState.KILLED if self._killed.is_set() else RankState.EXITED
        log.info("job %s rank %s exited with %s", a.job_id, a.rank, code)

    def _start(self, argv: list[str], cwd: str, env: dict[str, str], account: Account, run: RunTable | None) -> None:
        """Start ``argv`` in ``cwd``, its output appended to the rank's log, in a process group of its
        own, as ``account``; raises ``StartError`` when it cannot be started (the node and path named)."""
        ids: dict[str, Any] = {}
        if account.switch:
            ids = {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups), "umask": 0o022}
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "ab") as logf:
            try:
                self.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env, cwd=cwd, start_new_session=True, **ids)
            except OSError as e:
                if run is None:
                    raise
                who = f" as {account.name}" if account.switch else ""
                what = e.strerror or str(e)
                where = f"in run.workdir {cwd}" if e.filename == cwd else f"{argv[0]!r} in {cwd}"
                raise StartError(f"could not start {where} on node {self.agent.node}{who}: {what}",
                                 126 if isinstance(e, PermissionError) else 127) from None


def workload_spec(spec: RankSpec) -> dict[str, Any]:
    """The rank spec file's JSON: ``spec`` as ``model_dump``, what the workload reads with ``RankSpec``
    (agents/workloads/resnet_ddp/spec.py)."""
    return spec.model_dump(mode="json")


def _read_at(path: Path, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``path`` from ``offset``, never through a symlink (the file may be in a
    directory the job's account owns); b"" when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        return f.read(limit)


def _write_own(path: Path, text: str, account: Account) -> None:
    """Write ``path`` (never through a symlink) and give it to ``account``, readable by it alone."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    own(path, account, 0o600)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

