"""``python -m benchmarks.soak [--minutes 30] [--seed 0]``: random multi-user churn on a real local cluster.

A real ``gsched server`` (SQLite) and ``NODES`` agents of ``DEVICES`` CPU devices on loopback, in
single-team mode (the ranks run as the agents' account).  For ``--minutes``, ``USERS`` users submit and
cancel jobs at random: mostly ``[run]`` jobs (``["sleep", "N"]`` or ``["true"]``, one or two ranks) and,
with ``--resnet`` of the submits, a short built-in ResNet job with a checkpoint per epoch (one at a time:
the machine's cores are few).  Meanwhile, on a seeded plan:

- agent crashes (SIGKILL of the agent alone, restarted a second later: the new agent stops the ranks
  its predecessor left) and node deaths (``kill_node``: the agent and its ranks, back after 2 s to
  two heartbeat TTLs);
- one server kill (SIGKILL) and restart;
- one agent paused (SIGSTOP) past the heartbeat TTL, then resumed (SIGCONT).

Then churn stops, every node is brought back and the queue drains (``--drain-s``).  The report:

- submitted, completed, cancelled, FAILED (with their reasons), TIMEOUT;
- lost: jobs neither final nor able to progress at the end of the drain (still not final);
- duplicated: jobs two of whose attempts had live rank processes at once, seen by sampling this
  machine's processes (their ``GSCHED_JOB_ID`` and ``GSCHED_ATTEMPT``) every ``SAMPLE_S``;
- double-held: (node, device) pairs held by two rank rows at once in the server's database (each
  row holds its devices from ``bound_at`` to ``ended_at``, or to the end while it has none), for
  ranks of different jobs or attempts;
- tracebacks in the server's and agents' logs.

Exit status 1 when anything was lost, duplicated or double-held.  Every process runs on this
machine's cores; the figures are about correctness, not speed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.cli.localcluster import LocalCluster, NodeSpec
from scheduler.core.lifecycle import FINAL
from scheduler.protocol.http import ServerError

NODES, DEVICES, USERS = 4, 2, 3
MAX_ACTIVE = 14  # jobs not yet final, beyond which users hold back their submits
SAMPLE_S = 0.5
TINY_SOURCE = "synthetic:classes=4,samples=480,size=8,seed=5"
REPORT_KEYS = ("submitted", "completed", "cancelled", "failed", "timeout", "lost", "duplicated", "duplicated_while_paused",
               "double_held", "unknown_jobs", "tracebacks", "agent_crashes", "node_kills", "server_kills", "pauses")


@dataclass
class Options:
    minutes: float = 30.0
    seed: int = 0
    resnet: float = 0.05  # share of submits that are ResNet jobs (at most one active at a time)
    drain_s: float = 300.0
    ttl_s: float = 8.0
    heartbeat_s: float = 1.0
    keep: bool = False  # keep the cluster's directory (logs, database) afterwards
    # Pause an agent past its TTL: the node's fence (agents/fence.py) must stop its ranks before the
    # server places its jobs again elsewhere; a duplicate seen while it is paused is counted apart
    # (duplicated_while_paused) and fails the run like any other.  The smoke test runs without one.
    pause: bool = True


# ---------------------------------------------------------------- what the checks read

Interval = tuple[float, float, tuple[int, int, int]]  # (from, to, (job, attempt, rank))


def double_held(rows: Iterable[tuple[int, int, int, str, Any, float, float | None]],
                end: float) -> list[tuple[str, int, tuple[int, int, int], tuple[int, int, int]]]:
    """Rank rows ``(job, attempt, rank, node, devices, bound_at, ended_at)`` -> every (node, device)
    held by two rows of different jobs or attempts at once: ``(node, device, row, other row)``.  A row
    holds its devices from ``bound_at`` to ``ended_at`` (``end`` while it has none); touching ends
    (one ends when the next is bound) are not an overlap."""
    held: dict[tuple[str, int], list[Interval]] = defaultdict(list)
    for job, attempt, rank, node, devices, bound_at, ended_at in rows:
        devs = json.loads(devices) if isinstance(devices, str) else devices
        for dev in devs or []:
            held[(node, int(dev))].append((bound_at, end if ended_at is None else ended_at, (job, attempt, rank)))
    out = []
    for (node, dev), spans in sorted(held.items()):
        spans.sort()
        for i, (_start, stop, who) in enumerate(spans):
            for later_start, _stop, other in spans[i + 1:]:
                if later_start >= stop:
                    break
                if other[:2] != who[:2]:
                    out.append((node, dev, who, other))
    return out


def rank_rows(db_path: Path) -> list[tuple[int, int, int, str, Any, float, float | None]]:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        return list(conn.execute("SELECT job_id, attempt, rank, node, devices, bound_at, ended_at FROM ranks"))
    finally:
        conn.close()


class ProcessWatch(threading.Thread):
    """Samples this machine's rank processes of one cluster every ``SAMPLE_S``: a job whose ranks of
    two attempts are alive in one sample ran twice at once (``seen``: job -> first such sample)."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True, name="soak-watch")
        self.root = str(root.resolve()).encode()
        self.stop = threading.Event()
        self.samples = 0
        self.live_jobs: set[int] = set()  # every job seen with a live rank (proves the sampling sees them)
        self.ranks_on: Counter[str] = Counter()  # node -> live rank processes in the latest sample
        self.seen: dict[int, dict[str, Any]] = {}
        self.paused: str | None = None  # the node whose agent is paused now (the soak sets it)

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        live: dict[int, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
        ranks_on: Counter[str] = Counter()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                env = dict(v.split(b"=", 1) for v in (d / "environ").read_bytes().split(b"\0") if b"=" in v)
                if not env.get(b"GSCHED_SHARD_LIST", b"").startswith(self.root) or b"GSCHED_JOB_ID" not in env:
                    continue
                if "State:\tZ" in (d / "status").read_text():
                    continue
            except (OSError, ValueError):
                continue
            node = env[b"GSCHED_SHARD_LIST"].decode(errors="replace").split("/nodes/", 1)[-1].split("/", 1)[0]
            live[int(env[b"GSCHED_JOB_ID"])][int(env.get(b"GSCHED_ATTEMPT", b"0"))].add(node)
            ranks_on[node] += 1
        self.ranks_on = ranks_on
        self.samples += 1
        self.live_jobs.update(live)
        for job, attempts in live.items():
            if len(attempts) > 1 and job not in self.seen:
                self.seen[job] = {"at": time.time(), "attempts": {a: sorted(n) for a, n in sorted(attempts.items())},
                                  "paused": self.paused}


# ---------------------------------------------------------------- the run


@dataclass
class Soak:
    opts: Options
    c: LocalCluster
    rng: random.Random
    watch: ProcessWatch
    tokens: dict[str, str] = field(default_factory=dict)
    owner: dict[int, str] = field(default_factory=dict)  # job id -> user
    kind: dict[int, str] = field(default_factory=dict)  # job id -> "run" | "resnet"
    unsent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (user, body) to retry as it was
    states: dict[int, str] = field(default_factory=dict)  # the last poll
    counts: Counter[str] = field(default_factory=Counter)
    down: dict[str, float] = field(default_factory=dict)  # node -> when it comes back
    paused: str | None = None
    resume_at: float = 0.0
    server_back_at: float | None = None  # while the server is down: when it is started again
    t0: float = 0.0
    n_req: int = 0

    def say(self, text: str) -> None:
        print(f"[soak {time.monotonic() - self.t0:6.0f}s] {text}", flush=True)

    # ------------------------------------------------------------ users
    def body(self, user: str) -> dict[str, Any]:
        self.n_req += 1
        rid = f"soak-{self.opts.seed}-{self.n_req}"
        active_resnet = any(self.kind.get(j) == "resnet" and s not in FINAL for j, s in self.states.items())
        if self.rng.random() < self.opts.resnet and not active_resnet and not any(
                b["spec"].get("train") for _, b in self.unsent):
            spec: dict[str, Any] = {
                "name": f"{user}-resnet", "resources": {"ranks": self.rng.choice([1, 2]), "gpus_per_rank": 1},
                "data": {"dataset": "tiny"},
                "train": {"epochs": 3, "batch_size": 32, "lr": 0.05, "seed": self.rng.randrange(100)},
                "limits": {"time": 900}}
        else:
            roll = self.rng.random()
            seconds = self.rng.randint(20, 40) if roll > 0.9 else self.rng.randint(1, 15)
            command = ["true"] if roll < 0.15 else ["sleep", str(seconds)]
            spec = {"name": f"{user}-{command[0]}",
                    "resources": {"ranks": self.rng.choice([1, 1, 1, 2]), "gpus_per_rank": self.rng.choice([1, 1, 2])},
                    "run": {"command": command, "grace_s": 1}, "limits": {"time": 600}}
        return {"spec": spec, "client_request_id": rid}

    def submit(self, user: str, body: dict[str, Any]) -> None:
        try:
            job = int(self.c.client(self.tokens[user]).post("/v1/jobs", body)["id"])
        except ServerError as e:
            if e.status == 0 or e.status >= 500:  # no answer: the same request again later
                self.unsent.append((user, body))
                self.counts["submit_retries"] += 1
                return
            raise
        if job not in self.owner:
            self.owner[job] = user
            self.kind[job] = "resnet" if body["spec"].get("train") else "run"
            self.states[job] = "PENDING"

    def churn(self) -> None:
        """One tick of the users: retry what went unanswered, then each may submit and may cancel."""
        retry, self.unsent = self.unsent, []
        for user, body in retry:
            self.submit(user, body)
        active = sum(1 for s in self.states.values() if s not in FINAL)
        for user in self.tokens:
            if active < MAX_ACTIVE and self.rng.random() < 0.45:
                self.submit(user, self.body(user))
                active += 1
            mine = sorted(j for j, s in self.states.items() if self.owner[j] == user and s not in FINAL)
            if mine and self.rng.random() < 0.06:
                job = self.rng.choice(mine)
                try:
                    self.c.client(self.tokens[user]).post(f"/v1/jobs/{job}/cancel")
                    self.counts["cancel_requests"] += 1
                except ServerError as e:
                    if e.status not in (0, 409) and e.status < 500:  # 409: it ended meanwhile
                        raise

    def poll(self) -> bool:
        try:
            jobs = self.c.admin().get("/v1/jobs", all="true")["jobs"]
        except ServerError:
            return False
        for j in jobs:
            if j["id"] in self.owner:
                self.states[j["id"]] = j["state"]
        return True

    def progress(self) -> None:
        by = Counter(self.states.values())
        self.say(f"submitted {len(self.owner)}, " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(by.items()))
                 + (f"; down {sorted(self.down)}" if self.down else "") + (f"; paused {self.paused}" if self.paused else ""))

    # ------------------------------------------------------------ faults
    def up_nodes(self) -> list[str]:
        return [n for n in self.c.nodes if n not in self.down and n != self.paused]

    def fault(self, what: str) -> None:
        now = time.monotonic()
        node = self.rng.choice(self.up_nodes())
        if what == "pause":  # the node running most ranks: a pause that cuts nothing off proves nothing
            node = max(self.up_nodes(), key=lambda n: (self.watch.ranks_on[n], self.rng.random()))
        if what == "crash":
            self.say(f"agent crash: SIGKILL agent-{node} (its ranks live on), restart in 1 s")
            self.c.kill(f"agent-{node}", signal.SIGKILL)
            self.down[node] = now + 1.0
            self.counts["agent_crashes"] += 1
        elif what == "node":
            back = self.rng.uniform(2.0, 2 * self.opts.ttl_s)
            self.say(f"node death: kill_node {node} (agent and ranks), back in {back:.0f} s")
            self.c.kill_node(node)
            self.down[node] = now + back
            self.counts["node_kills"] += 1
        elif what == "pause":
            hold = self.opts.ttl_s + 4.0
            self.say(f"pause: SIGSTOP agent-{node} ({self.watch.ranks_on[node]} live ranks) for {hold:.0f} s "
                     f"(TTL {self.opts.ttl_s:.0f} s)")
            self.c.procs[f"agent-{node}"].send_signal(signal.SIGSTOP)
            self.paused, self.resume_at = node, now + hold
            self.watch.paused = node
            self.counts["pauses"] += 1
        elif what == "server":
            self.say("server kill: SIGKILL, restarted in 3 s (users go on submitting and cancelling)")
            self.c.kill("server", signal.SIGKILL)
            self.counts["server_kills"] += 1
            self.server_back_at = now + 3.0

    def mend(self, everything: bool = False) -> None:
        now = time.monotonic()
        if self.server_back_at is not None and (everything or now >= self.server_back_at):
            self.c.start_server(wait=False)  # requests fail until it answers, and are tried again
            self.server_back_at = None
            self.say("server started again")
        for node, at in sorted(self.down.items()):
            if everything or now >= at:
                self.c.start_agent(node)
                del self.down[node]
                self.say(f"agent-{node} restarted")
        if self.paused and (everything or now >= self.resume_at):
            self.c.procs[f"agent-{self.paused}"].send_signal(signal.SIGCONT)
            self.say(f"resume: SIGCONT agent-{self.paused}")
            self.paused = self.watch.paused = None

    def plan(self, span_s: float) -> list[tuple[float, str]]:
        """When each fault comes, in seconds from the start: the pause at a third, the server kill at
        three fifths, and a crash or node death about every 40 s in between (at least one of each)."""
        kinds = ["crash", "node"] + [self.rng.choice(["crash", "node"]) for _ in range(round(span_s / 40) - 2)]
        faults = [(span_s * self.rng.uniform(0.1, 0.9), kind) for kind in kinds]
        pause = [(span_s / 3, "pause")] if self.opts.pause else []
        return sorted([*faults, *pause, (span_s * 0.6, "server")])

    # ------------------------------------------------------------ the whole run
    def run(self) -> dict[str, Any]:
        span_s = self.opts.minutes * 60
        plan = self.plan(span_s)
        self.t0 = time.monotonic()
        self.say(f"churn for {span_s:.0f} s on {len(self.c.nodes)} nodes x {DEVICES} devices, {len(self.tokens)} users; "
                 f"faults: {', '.join(f'{w}@{t:.0f}s' for t, w in plan)}")
        last_poll = last_print = 0.0
        while (elapsed := time.monotonic() - self.t0) < span_s:
            self.mend()
            if plan and elapsed >= plan[0][0]:
                if self.paused or self.server_back_at or len(self.up_nodes()) < len(self.c.nodes) - 1:
                    plan[0] = (plan[0][0] + 2.0, plan[0][1])  # at most two nodes away, one fault at a time
                else:
                    self.fault(plan.pop(0)[1])
            if elapsed - last_poll >= 2.0 and self.poll():
                last_poll = elapsed
            self.churn()
            if elapsed - last_print >= 30.0:
                last_print = elapsed
                self.progress()
            time.sleep(1.0)
        for _t, what in plan:  # faults postponed past the end still happen, once each
            self.mend(everything=True)
            self.fault(what)
            time.sleep(self.opts.ttl_s + 5.0 if what == "pause" else 1.0)
        self.mend(everything=True)
        return self.drain()

    def drain(self) -> dict[str, Any]:
        self.say(f"churn over: draining for up to {self.opts.drain_s:.0f} s")
        deadline = time.monotonic() + self.opts.drain_s
        last_print = time.monotonic()
        while time.monotonic() < deadline:
            while self.unsent:
                retry, self.unsent = self.unsent, []
                for user, body in retry:
                    self.submit(user, body)
            if self.poll() and all(s in FINAL for s in self.states.values()):
                break
            if time.monotonic() - last_print >= 30.0:
                last_print = time.monotonic()
                self.progress()
            time.sleep(2.0)
        self.say("drained" if all(s in FINAL for s in self.states.values()) else "drain period over")
        return self.account()

    def account(self) -> dict[str, Any]:
        docs = {j: self.c.job(j) for j in sorted(self.owner)}
        by = Counter(d["state"] for d in docs.values())
        failed = defaultdict(list)
        for j, d in docs.items():
            if d["state"] == "FAILED":
                failed[d["reason"][:160]].append(j)
        lost = {j: {"state": d["state"], "reason": d["reason"],
                    "events": [f"{e['kind']}: {e['message']}" for e in d["events"][-4:]]}
                for j, d in docs.items() if d["state"] not in FINAL}
        listed = {j["id"] for j in self.c.admin().get("/v1/jobs", all="true")["jobs"]}
        return {"submitted": len(docs), "unknown_jobs": sorted(listed - set(docs)), "completed": by["COMPLETED"], "cancelled": by["CANCELLED"],
                "failed": by["FAILED"], "failed_reasons": {r: ids for r, ids in failed.items()},
                "timeout": by["TIMEOUT"], "lost": len(lost), "lost_jobs": lost,
                "resnet_jobs": sum(1 for k in self.kind.values() if k == "resnet"),
                "resnet_completed": sum(1 for j, k in self.kind.items() if k == "resnet" and docs[j]["state"] == "COMPLETED"),
                "restarts": sum(d["restarts"] for d in docs.values()),
                "cancel_requests": self.counts["cancel_requests"], "submit_retries": self.counts["submit_retries"],
                **{k: self.counts[k] for k in ("agent_crashes", "node_kills", "server_kills", "pauses")}}


def tracebacks(root: Path) -> dict[str, int]:
    out = {}
    for log in sorted(root.glob("*.log")):
        n = log.read_text(errors="replace").count("Traceback (most recent call last)")
        if n:
            out[log.stem] = n
    return out


def soak(opts: Options) -> dict[str, Any]:
    """Run the whole soak (see the module docstring); the report as a dict of ``REPORT_KEYS`` and more."""
    rng = random.Random(opts.seed)
    root = Path(tempfile.mkdtemp(prefix="gsched-soak-"))
    c = LocalCluster(root, [NodeSpec(f"s{i}", rack=f"r{i % 2}", gpus=DEVICES) for i in range(NODES)],
                     heartbeat_s=opts.heartbeat_s, ttl_s=opts.ttl_s, cycle_s=0.5,
                     extra_env={"GSCHED_RUN_AS_AGENT_USER": "1"})
    watch = ProcessWatch(root)
    wall0 = time.monotonic()
    try:
        c.start()
        if opts.resnet > 0:
            c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "4", "--replicas", "2")
        s = Soak(opts, c, rng, watch)
        for i in range(USERS):
            s.tokens[f"user{i}"] = c.add_user(f"user{i}")
        watch.start()
        report = s.run()
        watch.stop.set()
        watch.join()
        report["double_held_pairs"] = double_held(rank_rows(c.home / "gsched.db"), time.time())
        report["double_held"] = len(report["double_held_pairs"])
        report["duplicated_jobs"] = watch.seen
        report["duplicated"] = len(watch.seen)
        report["duplicated_while_paused"] = sum(1 for d in watch.seen.values() if d["paused"])
        report["process_samples"] = watch.samples
        report["jobs_seen_live"] = len(watch.live_jobs)
        report["tracebacks"] = tracebacks(root)
    finally:
        watch.stop.set()
        c.close()
        if opts.keep:
            print(f"[soak] kept {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    report["wall_s"] = round(time.monotonic() - wall0)
    return report


def print_report(r: dict[str, Any]) -> None:
    print("[soak] report", flush=True)
    for key in (*REPORT_KEYS[:5], "resnet_jobs", "resnet_completed", "restarts", "cancel_requests",
                "submit_retries", *REPORT_KEYS[5:], "process_samples", "jobs_seen_live", "wall_s"):
        value = r[key]
        if isinstance(value, dict | list):
            value = sum(value.values()) if isinstance(value, dict) else len(value)
        print(f"  {key}: {value}", flush=True)
    for reason, ids in r["failed_reasons"].items():
        print(f"  FAILED {len(ids)}x: {reason} (jobs {ids[:10]})", flush=True)
    for job, doc in r["lost_jobs"].items():
        print(f"  LOST job {job}: {doc['state']} ({doc['reason']}); last events {doc['events']}", flush=True)
    for job, doc in r["duplicated_jobs"].items():
        print(f"  DUPLICATED job {job}: attempts alive at once (nodes) {doc['attempts']}"
              + (f", while agent-{doc['paused']} was paused" if doc["paused"] else ""), flush=True)
    if r["unknown_jobs"]:
        print(f"  UNKNOWN jobs (a submit that made two): {r['unknown_jobs'][:20]}", flush=True)
    for node, dev, a, b in r["double_held_pairs"][:20]:
        print(f"  DOUBLE-HELD {node} device {dev}: (job, attempt, rank) {a} and {b}", flush=True)
    for name, n in r["tracebacks"].items():
        print(f"  tracebacks in {name}.log: {n}", flush=True)
    print(f"[soak] {'FAIL' if failed(r) else 'OK'}: lost {r['lost']}, duplicated {r['duplicated']}, "
          f"double-held {r['double_held']}, unknown jobs {len(r['unknown_jobs'])}", flush=True)


def failed(r: dict[str, Any]) -> bool:
    return bool(r["lost"] or r["duplicated"] or r["double_held"] or r["unknown_jobs"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n", 1)[0])
    d = Options()
    p.add_argument("--minutes", type=float, default=d.minutes, help="how long the churn lasts (default 30)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--resnet", type=float, default=d.resnet, help="share of submits that are ResNet jobs")
    p.add_argument("--drain-s", type=float, default=d.drain_s, help="how long the queue may take to drain")
    p.add_argument("--ttl-s", type=float, default=d.ttl_s, help="the heartbeat TTL (a node silent this long is down)")
    p.add_argument("--keep", action="store_true", help="keep the cluster's directory (logs, database)")
    p.add_argument("--no-pause", action="store_true",
                   help="pause no agent (by default one is paused past the TTL: its ranks must be fenced)")
    a = p.parse_args(argv)
    r = soak(Options(minutes=a.minutes, seed=a.seed, resnet=a.resnet, drain_s=a.drain_s, ttl_s=a.ttl_s, keep=a.keep,
                     pause=not a.no_pause))
    print_report(r)
    return 1 if failed(r) else 0


if __name__ == "__main__":
    sys.exit(main())
