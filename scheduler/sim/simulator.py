"""Trace-driven simulation: replay a job trace through the real scheduling code with a fake clock.

Contract
--------
:func:`simulate` replays one trace under one policy and returns a :class:`SimResult`; :func:`main` is
``gsched simulate``.  Every scheduling decision is made by :func:`scheduler.core.decide.decide`, the very
function the server's cycle calls, over a :class:`~scheduler.core.snapshot.Snapshot` built in memory each
simulated cycle: no scheduling logic is copied here.  Only the world around the scheduler is modelled
(arrivals, staging, run times, node failures).  Deterministic: the same trace, options and seed give
the same numbers (nothing reads the wall clock or an unseeded random source).

The model (every assumption is ours; the traces carry no data or model information)
--------------------------------------------------------------------------------------
- **Cluster** (``--nodes N --devices-per-node G --racks K``): nodes ``n0000``...; node ``i`` is in
  rack ``r{i * K // N}`` (contiguous blocks).  Bandwidths are :class:`PolicyConfig`'s defaults.
- **Jobs**: a trace row ``job_id,submit_time_s,user,num_gpus,duration_s`` (extra columns ignored)
  becomes a job of ``num_gpus`` ranks of one device each (at least 1).  A job wider than the whole
  cluster is **clipped** to the cluster's device count (its duration kept); clipped jobs are counted
  and reported.  **Time limits** (``--estimates``): ``exact`` (the default) gives each job its true
  remaining run time (perfect estimates); ``users`` gives it what users write in a job script: its run
  time times a factor drawn log-uniformly from 1 to 8 (seeded by ``--seed``, the same for every
  policy), rounded up to the next of the usual values (:data:`USUAL_LIMITS_S`: 15 and 30 minutes; 1,
  2, 4, 8 and 12 hours; 1, 2, 3, 5, 7, 14 and 30 days; whole days beyond), kept for every run of the
  job (a restart declares the same limit).  What the arbiters read of them: the reservation and
  backfill (when running jobs end, ``RunningView.end_by_s`` = last start + limit with ``users``),
  ``[policy] shortest_first`` (each user's jobs by devices x limit) and ``[policy] tie_shortest_first``
  (tied jobs that read locally, by devices x limit).
- **Data** (``--data datasets=40,shards=16,shard_mb=512,zipf=1.1,replicas=3,vary=0,cache_gb=0``):
  ``datasets`` data sets ``d000``... of ``shards`` shards of ``shard_mb`` MB (times a per-data-set
  factor drawn uniformly from ``[1-vary, 1+vary]``).  Their ``replicas`` copies are placed by
  :func:`scheduler.core.replicas.lay_out` (the code of ``gsched data``) with the span the server gives
  a new data set (``default_span``), data set by data set: each copy whole on one node, except one copy
  on nodes of one device, striped over the nodes; the copies on the least-loaded nodes by bytes.  Each job reads one
  data set drawn with Zipf popularity (``P(d_k) ~ 1/(k+1)^zipf``) from a generator seeded by
  ``--seed``, so every policy sees the same jobs reading the same data.  ``--data none`` turns the
  data model off: jobs read nothing, every read counts as local and nothing is moved (for data-blind
  comparisons with other simulators).  ``cache_gb`` > 0 keeps staged shards on the destination node as extra copies (as a server with
  ``node_cache_gb`` does: scheduler/server/replication.py), at most that many GB per node, least
  recently used evicted first; 0 (the default) discards them after the job, i.e.
  every job stages its missing bytes again.  Jobs bound in one cycle that need the same missing
  shard on the same node move its bytes once (the agent fetches a shard once for every rank of its
  node that needs it, ``agents.staging.ShardFlights``); the later ones count it as a local read.
- **Run time** = staging time + remaining trace duration.  Staging time is the bound candidate's
  ``transfer_cost_ms`` (the cost model's estimate: missing shards fetched one after another at the
  same-rack or cross-rack bandwidth; no link contention).  Devices are held from bind to end; which
  devices, and which reads are staged, is ``scheduler.core.binding.plan_binding``, the server's
  binder's own bookkeeping.
- **Cycles**: like the server's periodic cycle, decisions happen on ticks of ``--cycle-s`` simulated
  seconds (default 10).  A cycle is scheduled at the next tick after anything changes (arrival,
  completion, failure, recovery, re-replication) and at the tick after a pending job's locality wait
  expires (the arbiter's ``waiting`` starts are kept per job, as the server keeps them).  A cycle
  that cannot bind anything (no pending job needs at most the free devices; every rank has one
  device) is skipped: it could not change anything.
- **Fair share**: usage is accrued as the server's ``update_usage`` accrues it (:func:`fairshare.accrue`:
  decayed with ``usage_half_life_s``, plus the devices each user holds); every user has one share.
- **Preemption** (``[policy] preempt``, off by default): each cycle first asks
  :func:`policies.preemption.plan_preemptions` (the arbiter layer's own plan) for victims; each stops at
  once (the grace is taken as 0), keeps the work of its last checkpoint (one per ``epoch_s`` of running,
  600 s by default) and loses the rest (counted in ``preempted_device_s``), and is pending again with its
  age.  While jobs are pending a cycle runs at least every 60 s, so waits pass ``preempt_after_s``.
- **Failures** (``--failures rate=0.5,down_s=3600,checkpoint_s=1800,rereplicate_s=600``): each node
  fails as a Poisson process of ``rate`` failures per node-day (its own seeded generator, so every
  policy sees the same failures) and returns ``down_s`` later with its disk intact.  Jobs with a rank
  on it go back to pending (a restart) and keep only the progress of their last checkpoint (every
  ``checkpoint_s`` seconds of running; 0: none, all progress is lost).  If the node is still down
  ``rereplicate_s`` after it failed, each shard that lost a copy gets a new one, placed by
  ``place_replicas`` over the up nodes, a data set's lost shards together on one node (copied
  instantly; its bytes are counted apart from jobs').

Metrics (per policy)
--------------------
JCT = completion - submit; queueing delay = time spent pending (all attempts; mean, p50, p99, max); makespan = last
completion - first submit; utilisation = device-seconds held / device-seconds of up nodes over the
makespan; local fraction = 1 - bytes staged / bytes read, over every attempt's reads; bytes moved
(and the part across racks) by jobs' staging; restarts = requeues after node failures.
**Jain's index** over users' share-normalised device time, counted against their demand: time is cut
in one-hour windows; in each window every user with demand (devices held + devices of their pending
jobs, integrated over the window) is entitled to a max-min fair part of the device-seconds actually
used (shares as weights, capped by the demand); ``x_u`` = device-seconds received / entitlement; Jain
``(sum x)^2 / (n sum x^2)`` per window, averaged over windows weighted by device-seconds used.  (Raw
device time per user would mostly measure how much work each tenant submitted, not the scheduler.)
A window is *gang-bound* (:func:`gang_bound`) when a user asking for more than their part holds or
waits for a job wider than the part that their narrower jobs cannot make up for: running, the job gives
them more than their part, waiting, less, so the window's Jain stays below 1 whatever the policy (short
of starting and stopping the gang within the hour).  The result also gives the share of used device
time in such windows and Jain over the others, to tell a policy's unfairness from the trace's.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import heapq
import json
import math
import random
import sys
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from policies.preemption import plan_preemptions
from policies.registry import get_arbiter
from scheduler.core.accounts import max_min_split
from scheduler.core.binding import plan_binding
from scheduler.core.clock import FakeClock
from scheduler.core.decide import decide
from scheduler.core.errors import BadRequest
from scheduler.core.fairshare import accrue
from scheduler.core.placement import Candidate
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.replicas import default_span, lay_out, place_replicas
from scheduler.core.snapshot import JobView, NodeView, RunningView, ShardView, Snapshot

MB = 1_000_000
GB = 1_000_000_000
FAIRNESS_WINDOW_S = 3600.0
JSON_FIELDS = ("policy", "jobs", "mean_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "mean_queue_s",
               "p50_queue_s", "p99_queue_s", "max_queue_s",
               "makespan_s", "utilization", "local_fraction", "bytes_moved", "cross_rack_bytes", "jain",
               "restarts", "gang_bound_share", "jain_unbound")


# ------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class TraceJob:
    key: str  # the trace's job_id
    submit_s: float
    user: str
    gpus: int
    duration_s: float


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 16
    devices_per_node: int = 8
    racks: int = 2

    def layout(self) -> list[tuple[str, str]]:
        """(node, rack) of every node: contiguous blocks of nodes per rack."""
        if self.nodes <= 0 or self.devices_per_node <= 0 or self.racks <= 0:
            raise BadRequest("--nodes, --devices-per-node and --racks must be positive")
        racks = min(self.racks, self.nodes)
        return [(f"n{i:04d}", f"r{i * racks // self.nodes:02d}") for i in range(self.nodes)]


def _parse_kv(text: str | None, what: str, allowed: Mapping[str, type]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in allowed:
            valid = ", ".join(f"{k}=..." for k in allowed)
            raise BadRequest(f"{what}: cannot read {part!r}; expected comma-separated {valid}")
        try:
            out[key] = allowed[key](value.strip())
        except ValueError:
            raise BadRequest(f"{what}: {key} must be a {allowed[key].__name__}, got {value!r}") from None
    return out


@dataclass(frozen=True)
class DataSpec:
    datasets: int = 40
    shards: int = 16
    shard_mb: float = 512.0
    zipf: float = 1.1
    replicas: int = 3
    vary: float = 0.0
    cache_gb: float = 0.0
    none: bool = False  # no data model: jobs read nothing, so every read is local and nothing moves

    @classmethod
    def parse(cls, text: str | None) -> DataSpec:
        """``--data``: ``none``, or comma-separated ``key=value`` overrides of the defaults."""
        if text is not None and text.strip().lower() == "none":
            return cls(none=True)
        kw = _parse_kv(text, "--data", {f.name: (int if f.type == "int" else float) for f in fields(cls)
                                              if f.name != "none"})
        spec = cls(**kw)
        if spec.datasets < 1 or spec.shards < 1 or spec.replicas < 1 or spec.shard_mb <= 0:
            raise BadRequest("--data: datasets, shards, replicas and shard_mb must be positive")
        if not 0 <= spec.vary < 1 or spec.zipf < 0 or spec.cache_gb < 0:
            raise BadRequest("--data: vary must be in [0, 1); zipf and cache_gb must not be negative")
        return spec


@dataclass(frozen=True)
class FailureSpec:
    rate: float = 0.0  # failures per node per day
    down_s: float = 3600.0
    checkpoint_s: float = 1800.0
    rereplicate_s: float = 600.0

    @classmethod
    def parse(cls, text: str | None) -> FailureSpec:
        spec = cls(**_parse_kv(text, "--failures", {f.name: float for f in fields(cls)}))
        if spec.rate < 0 or spec.down_s <= 0 or spec.checkpoint_s < 0 or spec.rereplicate_s < 0:
            raise BadRequest("--failures: rate, checkpoint_s, rereplicate_s >= 0 and down_s > 0 required")
        return spec


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceJob]:
    """The trace's rows in submit order (ties: file order).  Raises BadRequest naming the bad row."""
    p = Path(path)
    if not p.is_file():
        raise BadRequest(f"--trace: no such file {str(p)!r}")
    out: list[TraceJob] = []
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        need = {"job_id", "submit_time_s", "user", "num_gpus", "duration_s"}
        missing = need - set(reader.fieldnames or ())
        if missing:
            raise BadRequest(f"{p}: missing column(s) {', '.join(sorted(missing))}; expected {', '.join(sorted(need))}")
        for line, row in enumerate(reader, start=2):
            try:
                out.append(TraceJob(row["job_id"], float(row["submit_time_s"]), row["user"] or "-",
                                    max(1, int(float(row["num_gpus"]))), max(1.0, float(row["duration_s"]))))
            except (TypeError, ValueError):
                raise BadRequest(f"{p}:{line}: cannot read row {row!r}") from None
            if limit is not None and len(out) >= limit:
                break
    order = sorted(range(len(out)), key=lambda i: (out[i].submit_s, i))
    return [out[i] for i in order]


# ------------------------------------------------------------------ results


@dataclass
class SimResult:
    policy: str
    jobs: int
    mean_jct_s: float
    p50_jct_s: float
    p95_jct_s: float
    p99_jct_s: float
    mean_queue_s: float
    p50_queue_s: float
    p99_queue_s: float
    max_queue_s: float
    makespan_s: float
    utilization: float
    local_fraction: float
    bytes_moved: int
    cross_rack_bytes: int
    jain: float
    restarts: int
    gang_bound_share: float = 0.0  # share of the used device time that fell in gang-bound windows
    jain_unbound: float = 1.0  # Jain over the other windows only
    # Not in the JSON: for the table caption, the plot and tests.
    clipped: int = 0
    unfinished: int = 0
    cycles: int = 0
    replication_bytes: int = 0
    preemptions: int = 0  # with [policy] preempt
    preempted_device_s: float = 0.0  # device-seconds of work lost to preemption
    jcts_s: list[float] = field(default_factory=list)
    schedule: dict[str, tuple[float, float]] = field(default_factory=dict)  # trace job_id -> (start, end)

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in JSON_FIELDS}


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of ``values``; 0 for none."""
    if not values:
        return 0.0
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


ESTIMATES = ("exact", "users")  # --estimates: the jobs' time limits (the module doc)
# The time limits users write, in seconds: 15 and 30 minutes, 1-12 hours, 1-30 days
USUAL_LIMITS_S = (900, 1800, 3600, 7200, 14400, 28800, 43200, 86400, 2 * 86400, 3 * 86400, 5 * 86400,
                  7 * 86400, 14 * 86400, 30 * 86400)


def user_limit(run_s: float, factor: float) -> float:
    """The time limit a user writes for a job that runs ``run_s``: ``run_s * factor`` rounded up to the
    next of :data:`USUAL_LIMITS_S`, or to whole days beyond the last."""
    want = run_s * factor
    i = bisect.bisect_left(USUAL_LIMITS_S, want)
    if i < len(USUAL_LIMITS_S):
        return float(USUAL_LIMITS_S[i])
    return math.ceil(want / 86400) * 86400.0


def jain_index(xs: Sequence[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n sum x^2)``; 1.0 for no or all-zero values."""
    sq = sum(x * x for x in xs)
    if not xs or sq <= 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * sq)


def gang_bound(demand: Mapping[str, float], fair: Mapping[str, float], jobs: Mapping[str, Mapping[int, int]],
               window_s: float) -> bool:
    """Whether a window is *gang-bound*: some user asked for more than their max-min part (``demand``
    above ``fair``, device-seconds), held or waited for a job wider than that part (its devices over the
    whole window come to more), and their jobs no wider than the part (``jobs``: devices -> how many,
    held or pending in the window) cannot fill it.  That user gets their part only if a wide job runs
    for a fraction of the window: through the window it gives them more than their part, waiting it
    leaves them less; a gang scheduler that starts and stops jobs only when they end or are preempted
    cannot do better there, so the window's Jain is held below 1 by the trace's gang widths, not the
    policy.  Counted conservatively: every job the user had in the window counts as there all along."""
    for u, part_s in fair.items():
        if demand[u] <= part_s * (1 + 1e-9):
            continue
        part = part_s / window_s  # in devices, through the window
        mine = jobs.get(u, {})
        wide = any(width > part * (1 + 1e-9) for width in mine)
        narrow = sum(width * n for width, n in mine.items() if width <= part * (1 + 1e-9))
        if wide and narrow < part * (1 - 1e-9):
            return True
    return False


# ------------------------------------------------------------------ the simulation


@dataclass
class _Job:
    id: int
    key: str
    user: str
    devices: int
    dataset: str | None  # None: no data model (``--data none``)
    submit_s: float
    remaining_s: float
    pending_since_s: float
    view: JobView | None = None
    attempt: int = 0
    bound_s: float = 0.0
    run_start_s: float = 0.0
    end_s: float = 0.0
    dbn: dict[str, int] = field(default_factory=dict)  # devices held per node
    devs: dict[str, list[int]] = field(default_factory=dict)  # which ones
    queue_s: float = 0.0
    first_start_s: float | None = None
    age_since_s: float | None = None  # when it first became pending: a preempted job keeps its age
    limit_s: float | None = None  # the time limit it declares (``--estimates users``); None: exact
    preempted_at: list[float] = field(default_factory=list)


_END, _RECOVER, _REREPLICATE, _FAIL, _ARRIVE, _CYCLE = range(6)  # same-time events in this order


class Simulation:
    """One policy over one trace (build it, call :meth:`run` once)."""

    def __init__(self, trace: Sequence[TraceJob], cfg: PolicyConfig, cluster: ClusterSpec, data: DataSpec,
                 failures: FailureSpec | None = None, seed: int = 0, cycle_s: float = 10.0,
                 shares: Mapping[str, float] | None = None, epoch_s: float = 600.0,
                 estimates: str = "exact") -> None:
        if cycle_s <= 0:
            raise BadRequest("--cycle-s must be positive")
        if estimates not in ESTIMATES:
            raise BadRequest(f"--estimates: {estimates!r} is not one of {', '.join(ESTIMATES)}")
        self.estimates = estimates
        self.cfg, self.data, self.cycle_s = cfg, data, cycle_s
        self.failures = failures or FailureSpec()
        self.seed = seed
        self.clock = FakeClock(0.0)
        layout = cluster.layout()
        self.racks = dict(layout)
        self.node_names = [n for n, _ in layout]
        self.devices = dict.fromkeys(self.node_names, cluster.devices_per_node)
        self.healthy = {n: tuple(range(cluster.devices_per_node)) for n in self.node_names}  # device indexes
        self.busy: dict[str, set[int]] = {n: set() for n in self.node_names}  # indexes ranks hold
        self.up = set(self.node_names)
        self.total_devices = cluster.nodes * cluster.devices_per_node
        self._build_data(layout)
        self._build_jobs(trace)
        users = sorted({j.user for j in self.jobs.values()})
        self.shares = {u: float((shares or {}).get(u, 1.0)) for u in users}
        self.usage = dict.fromkeys(users, 0.0)
        self.held = dict.fromkeys(users, 0)
        self.pend_dev = dict.fromkeys(users, 0)
        self.widths: dict[str, Counter[int]] = {u: Counter() for u in users}  # devices of each job held or pending
        self.t_acct = 0.0
        self.pending: dict[int, _Job] = {}
        self.running: dict[int, _Job] = {}
        self.events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.next_cycle: float | None = None
        self._replica_view: dict[tuple[str, int], tuple[str, ...]] | None = None
        # metrics
        self.busy_ds = 0.0
        self.capacity_ds = 0.0
        self.read_bytes = 0
        self.moved_bytes = 0
        self.staged_this_cycle: set[tuple[str, str, int]] = set()  # (node, data set, shard)
        self.cross_bytes = 0
        self.replication_bytes = 0
        self.restarts = 0
        self.epoch_s = epoch_s  # with [policy] preempt: a checkpoint every epoch_s of running
        self.preemptions = 0
        self.lost_ds = 0.0  # device-seconds of work lost to preemption (since each victim's checkpoint)
        self.cycles = 0
        self.windows: dict[int, tuple[dict[str, float], dict[str, float]]] = {}
        # window -> user -> devices -> the most jobs of that many devices the user held or had pending at once
        self.present: dict[int, dict[str, Counter[int]]] = {}
        self.done: list[_Job] = []

    # ---------------------------------------------------------- setup

    def _limit_of(self, job: _Job) -> float:
        """The time limit ``job`` declares now: its declared one, or (exact estimates) what is left to run."""
        return job.remaining_s if job.limit_s is None else job.limit_s

    def _end_by(self, j: _Job, now: float) -> float:
        """When the arbiter expects running job ``j`` to end: its true end with exact estimates, else its
        last start plus its time limit (not before ``now``)."""
        return max(now, j.end_s if j.limit_s is None else j.bound_s + j.limit_s)

    def _build_data(self, layout: list[tuple[str, str]]) -> None:
        d = self.data
        rng = random.Random(f"{self.seed}:datasets")
        self.shards: dict[str, tuple[ShardView, ...]] = {}
        self.homes: dict[tuple[str, int], list[str]] = {}
        node_bytes: dict[str, int] = dict.fromkeys(self.node_names, 0)
        for k in range(0 if d.none else d.datasets):
            name = f"d{k:03d}"
            factor = 1.0 + (rng.uniform(-d.vary, d.vary) if d.vary > 0 else 0.0)
            size = max(1, int(d.shard_mb * MB * factor))
            self.shards[name] = tuple(ShardView(name, i, size, 1000) for i in range(d.shards))
            span = default_span(d.replicas, len(layout), d.shards, max(self.devices.values(), default=1))  # as the server
            plan = lay_out([(i, size) for i in range(d.shards)], layout, d.replicas, span=span, node_bytes=node_bytes)
            for i, holders in plan.items():
                self.homes[(name, i)] = list(holders)
                for n in holders:
                    node_bytes[n] += size
        self.shard_bytes = {(s.dataset, s.index): s.bytes for ss in self.shards.values() for s in ss}
        self.cache: dict[str, OrderedDict[tuple[str, int], int]] = {n: OrderedDict() for n in self.node_names}
        self.cache_bytes = dict.fromkeys(self.node_names, 0)

    def _build_jobs(self, trace: Sequence[TraceJob]) -> None:
        names = sorted(self.shards)
        cum: list[float] = []
        acc = 0.0
        for k in range(len(names)):
            acc += 1.0 / (k + 1) ** self.data.zipf
            cum.append(acc)
        rng = random.Random(f"{self.seed}:popularity")
        self.jobs: dict[int, _Job] = {}
        self.clipped = 0
        self.t0 = min((t.submit_s for t in trace), default=0.0)
        for i, t in enumerate(trace, start=1):
            ds = names[min(bisect.bisect_left(cum, rng.random() * acc), len(names) - 1)] if names else None
            devices = t.gpus
            if devices > self.total_devices:
                devices = self.total_devices
                self.clipped += 1
            submit = t.submit_s - self.t0
            self.jobs[i] = _Job(i, t.key, t.user, devices, ds, submit, t.duration_s, submit)
        if self.estimates == "users":
            est = random.Random(f"{self.seed}:estimates")
            for job in self.jobs.values():
                job.limit_s = user_limit(job.remaining_s, 2.0 ** est.uniform(0.0, 3.0))

    # ---------------------------------------------------------- events and accounting

    def _push(self, t: float, kind: int, data: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, data))

    def _request_cycle(self, t: float) -> None:
        tick = math.ceil(t / self.cycle_s - 1e-9) * self.cycle_s
        if self.next_cycle is None or tick < self.next_cycle:
            self.next_cycle = tick
            self._push(tick, _CYCLE, tick)

    def _account(self, t: float) -> None:
        """Bring usage (decayed, as the server's update_usage) and every integral up to ``t``."""
        t0 = self.t_acct
        if t <= t0:
            return
        dt = t - t0
        hl = self.cfg.usage_half_life_s
        for u in self.usage:
            self.usage[u] = accrue(self.usage[u], self.held[u], dt, hl)  # as the server's update_usage
        self.busy_ds += sum(self.held.values()) * dt
        self.capacity_ds += sum(self.devices[n] for n in self.up) * dt
        active = [u for u, h in self.held.items() if h or self.pend_dev[u]]
        a = t0
        while a < t:
            w = int(a // FAIRNESS_WINDOW_S)
            b = min(t, (w + 1) * FAIRNESS_WINDOW_S)
            recv, dem = self.windows.setdefault(w, (defaultdict(float), defaultdict(float)))
            present = self.present.setdefault(w, {})
            for u in active:
                recv[u] += self.held[u] * (b - a)
                dem[u] += (self.held[u] + self.pend_dev[u]) * (b - a)
                seen = present.setdefault(u, Counter())
                for width, n in self.widths[u].items():
                    if n > seen[width]:
                        seen[width] = n
            a = b
        self.t_acct = t

    def _make_pending(self, job: _Job, t: float, keep_age: bool = False) -> None:
        job.pending_since_s = t
        if job.age_since_s is None:
            job.age_since_s = t
        job.view = JobView(id=job.id, user=job.user, ranks=job.devices, devices_per_rank=1, dataset=job.dataset,
                           submit_s=job.submit_s, pending_since_s=job.age_since_s if keep_age else t,
                           time_limit_s=self._limit_of(job))
        self.pending[job.id] = job
        self.pend_dev[job.user] += job.devices
        self.widths[job.user][job.devices] += 1

    # ---------------------------------------------------------- the snapshot and the cycle

    def replica_view(self) -> dict[tuple[str, int], tuple[str, ...]]:
        """(data set, shard) -> up nodes holding a copy (home copies and cached ones), by name."""
        if self._replica_view is None:
            view: dict[tuple[str, int], set[str]] = {k: {n for n in v if n in self.up} for k, v in self.homes.items()}
            for n, entries in self.cache.items():
                if n in self.up:
                    for k in entries:
                        view[k].add(n)
            self._replica_view = {k: tuple(sorted(v)) for k, v in view.items()}
        return self._replica_view

    def snapshot(self, now: float) -> Snapshot:
        """The frozen view one cycle decides over, built as ``cycle.build_snapshot`` builds it."""
        nodes = {n: NodeView(n, self.racks[n], self.devices[n], self.devices[n] - len(self.busy[n]))
                 for n in self.node_names if n in self.up}
        pending = tuple(v for v in (self.pending[i].view for i in sorted(self.pending)) if v is not None)
        if self.cfg.preempt:
            running = tuple(self._preemption_view(j, now) for j in (self.running[i] for i in sorted(self.running)))
        else:
            running = tuple(RunningView(j.id, j.user, tuple(sorted(j.dbn.items())), self._end_by(j, now))
                            for j in (self.running[i] for i in sorted(self.running)))
        return Snapshot(now_s=now, nodes=nodes, shards=self.shards, replicas=self.replica_view(),
                        pending=pending, running=running, usage=dict(self.usage), shares=self.shares)

    def _checkpointed_s(self, j: _Job, now: float) -> float:
        """Seconds of ``j``'s current run its last checkpoint holds: one checkpoint per ``epoch_s`` of
        running since its run started (after staging); 0 before the first."""
        if self.epoch_s <= 0:
            return 0.0
        return math.floor(max(0.0, now - j.run_start_s) / self.epoch_s) * self.epoch_s

    def _preemption_view(self, j: _Job, now: float) -> RunningView:
        """A running job with what preemption reads: its last start (its run, after staging), its last
        checkpoint (one per ``epoch_s`` of running), and how often it was preempted in the last hour."""
        kept = self._checkpointed_s(j, now)
        return RunningView(j.id, j.user, tuple(sorted(j.dbn.items())), self._end_by(j, now), started_s=j.bound_s,
                           checkpoint_s=j.run_start_s + kept if kept > 0 else None,
                           preemptions_last_hour=sum(1 for p in j.preempted_at if now - p < 3600.0),
                           preemptions=len(j.preempted_at))

    def _preempt(self, job: _Job, now: float) -> None:
        """The victim stops (grace taken as 0), keeps the work of its last checkpoint, loses the rest,
        and is pending again with its age."""
        ran = max(0.0, now - job.run_start_s)
        kept = min(self._checkpointed_s(job, now), job.remaining_s)
        self.lost_ds += (min(ran, job.remaining_s) - kept) * job.devices
        job.remaining_s = max(0.0, job.remaining_s - kept)
        self._release(job)
        job.preempted_at.append(now)
        self.preemptions += 1
        self._make_pending(job, now, keep_age=True)

    def _cycle(self, now: float) -> None:
        self.next_cycle = None
        if not self.pending:
            return
        free = sum(self.devices[n] - len(self.busy[n]) for n in self.up)
        if min(j.devices for j in self.pending.values()) > free and not self.cfg.preempt:
            return  # nothing could be bound: the cycle would change nothing
        self.cycles += 1
        snap = self.snapshot(now)
        if self.cfg.preempt:
            plans = plan_preemptions(snap, self.cfg)
            for p in plans:
                for victim in p.victims:
                    self._preempt(self.running[victim], now)
                preemptor = self.pending[p.job]
                if preemptor.view is not None:
                    preemptor.view = replace(preemptor.view, preempting=True)
            if plans:
                snap = self.snapshot(now)
            # waits pass preempt_after_s and runs pass min_runtime_s without an event: look again
            self._request_cycle(now + max(self.cycle_s, 60.0))
        _, decision = decide(snap, self.cfg, get_arbiter(self.cfg.arbiter))
        self.staged_this_cycle = set()
        for job_id in sorted(decision.bindings):
            self._bind(self.pending[job_id], decision.bindings[job_id], now)
        for job_id, since in decision.waiting.items():  # kept until the job binds or is requeued
            job = self.pending[job_id]
            if job.view is not None and job.view.waiting_since_s is None:
                job.view = replace(job.view, waiting_since_s=since)
        # a wait ends at locality_wait_s, and a longer one (with preemption) at locality_wait; past the
        # first, an uncontended cycle ends it (policies/twostage.py take_idle)
        waits = {self.cfg.locality_wait_s, self.cfg.locality_wait}
        wake = [j.view.waiting_since_s + w for j in self.pending.values()
                if j.view is not None and j.view.waiting_since_s is not None for w in waits]
        later = [w for w in wake if w > now]
        if later:
            self._request_cycle(min(later))

    def _bind(self, job: _Job, cand: Candidate, now: float) -> None:
        del self.pending[job.id]
        self.pend_dev[job.user] -= job.devices
        plan = plan_binding(cand, self.healthy, self.busy, self.up)  # the server's binder's bookkeeping
        if isinstance(plan, str):
            raise AssertionError(f"job {job.id}: the decision over-commits: {plan}")
        job.devs = plan.devices_by_node()
        for n, devs in job.devs.items():
            self.busy[n].update(devs)
        self.held[job.user] += job.devices
        job.dbn = {n: len(devs) for n, devs in job.devs.items()}
        job.attempt += 1
        job.queue_s += now - job.pending_since_s
        if job.first_start_s is None:
            job.first_start_s = now
        job.bound_s = now
        job.run_start_s = now + cand.transfer_cost_ms / 1000.0
        job.end_s = job.run_start_s + job.remaining_s
        self.running[job.id] = job
        self._push(job.end_s, _END, (job.id, job.attempt))
        if job.dataset is None:
            return  # no data model: nothing read, nothing staged
        staging = set(plan.staging)
        for r in cand.reads:
            self.read_bytes += r.bytes
            fetched = (r.node, job.dataset, r.shard)
            if r in staging and fetched not in self.staged_this_cycle:
                self.staged_this_cycle.add(fetched)  # later jobs of this cycle read it off the node's disk
                self.moved_bytes += r.bytes
                if self.racks.get(r.source) != self.racks.get(r.node):
                    self.cross_bytes += r.bytes
                self._cache_put(r.node, (job.dataset, r.shard), r.bytes)
            else:
                self._cache_touch(r.node, (job.dataset, r.shard))

    def _cache_put(self, node: str, key: tuple[str, int], nbytes: int) -> None:
        limit = self.data.cache_gb * GB
        if limit <= 0 or nbytes > limit or node in self.homes.get(key, ()):
            return
        entries = self.cache[node]
        if key in entries:
            entries.move_to_end(key)
            return
        while self.cache_bytes[node] + nbytes > limit and entries:
            _, b = entries.popitem(last=False)
            self.cache_bytes[node] -= b
        entries[key] = nbytes
        self.cache_bytes[node] += nbytes
        self._replica_view = None

    def _cache_touch(self, node: str, key: tuple[str, int]) -> None:
        entries = self.cache[node]
        if key in entries:
            entries.move_to_end(key)

    def _release(self, job: _Job) -> None:
        for n, devs in job.devs.items():
            if n in self.up:
                self.busy[n].difference_update(devs)
        self.held[job.user] -= job.devices
        left = self.widths[job.user]
        left[job.devices] -= 1
        if not left[job.devices]:
            del left[job.devices]
        del self.running[job.id]
        job.dbn, job.devs = {}, {}

    # ---------------------------------------------------------- failures

    def _fail_rng(self, node: str) -> random.Random:
        if not hasattr(self, "_fail_rngs"):
            self._fail_rngs: dict[str, random.Random] = {}
        if node not in self._fail_rngs:
            self._fail_rngs[node] = random.Random(f"{self.seed}:failures:{node}")
        return self._fail_rngs[node]

    def _schedule_failure(self, node: str, after: float) -> None:
        if self.failures.rate > 0:
            gap = self._fail_rng(node).expovariate(self.failures.rate / 86400.0)
            self._push(after + gap, _FAIL, node)

    def _fail(self, node: str, now: float) -> None:
        victims = sorted(j.id for j in self.running.values() if node in j.dbn)
        for jid in victims:
            job = self.running[jid]
            self._release(job)
            ran = max(0.0, now - job.run_start_s)
            ck = self.failures.checkpoint_s
            kept = math.floor(ran / ck) * ck if ck > 0 else 0.0
            job.remaining_s = max(0.0, job.remaining_s - min(kept, job.remaining_s))
            self.restarts += 1
            self._make_pending(job, now)
        self.up.discard(node)
        self.busy[node] = set()
        self._replica_view = None
        self._push(now + self.failures.down_s, _RECOVER, node)
        if self.failures.rereplicate_s < self.failures.down_s:
            self._push(now + self.failures.rereplicate_s, _REREPLICATE, (node, now))

    def _rereplicate(self, node: str) -> None:
        if node in self.up:
            return
        up = [(n, self.racks[n]) for n in self.node_names if n in self.up]
        if not up:
            return
        node_bytes: dict[str, int] = dict.fromkeys(self.up, 0)
        ds_bytes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for k, holders in self.homes.items():
            for n in holders:
                if n in node_bytes:
                    node_bytes[n] += self.shard_bytes[k]
                    ds_bytes[k[0]][n] += self.shard_bytes[k]
        for key in sorted(k for k, v in self.homes.items() if node in v):
            live = [n for n in self.homes[key] if n in self.up]
            if not live or len(live) >= self.data.replicas:
                continue
            size = self.shard_bytes[key]
            plan = place_replicas([(key[1], size)], up, self.data.replicas, existing={key[1]: live},
                                  node_bytes=node_bytes, group_bytes=ds_bytes[key[0]])
            for n in plan.get(key[1], []):
                if n not in live:
                    self.homes[key].append(n)
                    node_bytes[n] += size
                    ds_bytes[key[0]][n] += size
                    self.replication_bytes += size
        self._replica_view = None

    # ---------------------------------------------------------- the loop

    def run(self, policy: str) -> SimResult:
        for job in self.jobs.values():
            self._push(job.submit_s, _ARRIVE, job.id)
        for n in self.node_names:
            self._schedule_failure(n, 0.0)
        finished = 0
        total = len(self.jobs)
        while self.events and finished < total:
            t, kind, _, data = heapq.heappop(self.events)
            self._account(t)
            self.clock.t = t
            if kind == _CYCLE:
                if data == self.next_cycle:
                    self._cycle(t)
                continue
            if kind == _ARRIVE:
                self._make_pending(self.jobs[data], t)
            elif kind == _END:
                ended = self.running.get(data[0])
                if ended is None or ended.attempt != data[1]:
                    continue  # a stale end: the job was requeued since
                self._release(ended)
                self.done.append(ended)
                finished += 1
            elif kind == _FAIL:
                if data not in self.up:
                    continue
                self._fail(data, t)
            elif kind == _RECOVER:
                self.up.add(data)
                self._replica_view = None
                self._schedule_failure(data, t)
            elif kind == _REREPLICATE:
                self._rereplicate(data[0])
            if self.pending:
                self._request_cycle(t)
        return self._result(policy)

    def _result(self, policy: str) -> SimResult:
        done = sorted(self.done, key=lambda j: j.id)
        jcts = [j.end_s - j.submit_s for j in done]
        queues = [j.queue_s for j in done]
        first = min((j.submit_s for j in self.jobs.values()), default=0.0)
        last = max((j.end_s for j in done), default=first)
        jain_num = jain_den = 0.0
        free_num = free_den = 0.0  # the windows that are not gang-bound (see gang_bound)
        for w in sorted(self.windows):
            recv, dem = self.windows[w]
            used = sum(recv.values())
            if used <= 0:
                continue
            fair = max_min_split(dem, used, self.shares)  # flat: the metric knows no accounts
            j = jain_index([recv[u] / fair[u] for u in sorted(fair) if fair[u] > 0])
            jain_num += j * used
            jain_den += used
            if not gang_bound(dem, fair, self.present.get(w, {}), FAIRNESS_WINDOW_S):
                free_num += j * used
                free_den += used
        return SimResult(
            policy=policy,
            jobs=len(done),
            mean_jct_s=round(sum(jcts) / len(jcts), 3) if jcts else 0.0,
            p50_jct_s=round(percentile(jcts, 50), 3),
            p95_jct_s=round(percentile(jcts, 95), 3),
            p99_jct_s=round(percentile(jcts, 99), 3),
            mean_queue_s=round(sum(queues) / len(done), 3) if done else 0.0,
            p50_queue_s=round(percentile(queues, 50), 3),
            p99_queue_s=round(percentile(queues, 99), 3),
            max_queue_s=round(max(queues, default=0.0), 3),
            makespan_s=round(last - first, 3),
            utilization=round(self.busy_ds / self.capacity_ds, 6) if self.capacity_ds > 0 else 0.0,
            local_fraction=round(1 - self.moved_bytes / self.read_bytes, 6) if self.read_bytes else 1.0,
            bytes_moved=self.moved_bytes,
            cross_rack_bytes=self.cross_bytes,
            jain=round(jain_num / jain_den, 6) if jain_den > 0 else 1.0,
            gang_bound_share=round(1 - free_den / jain_den, 6) if jain_den > 0 else 0.0,
            jain_unbound=round(free_num / free_den, 6) if free_den > 0 else 1.0,
            restarts=self.restarts,
            clipped=self.clipped,
            unfinished=len(self.jobs) - len(done),
            cycles=self.cycles,
            replication_bytes=self.replication_bytes,
            preemptions=self.preemptions,
            preempted_device_s=round(self.lost_ds, 3),
            jcts_s=jcts,
            schedule={j.key: (round(j.bound_s, 3), round(j.end_s, 3)) for j in done},
        )


def simulate(trace: Sequence[TraceJob], policy: str, cluster: ClusterSpec | None = None,
             data: DataSpec | None = None, failures: FailureSpec | None = None, seed: int = 0,
             cycle_s: float = 10.0, cfg: PolicyConfig | None = None, epoch_s: float = 600.0,
             estimates: str = "exact") -> SimResult:
    """Replay ``trace`` with the arbiter ``policy`` (a registry name) and return its metrics.

    ``cfg`` gives the other policy knobs (its ``arbiter`` is replaced by ``policy``); with ``cfg.preempt``
    jobs checkpoint every ``epoch_s`` seconds of running and a preempted one loses the work since.
    ``estimates``: the jobs' time limits, ``exact`` or ``users`` (the module doc).  Pure apart from
    CPU time: the same arguments give the same result.
    """
    try:
        get_arbiter(policy)
    except ValueError as e:
        raise BadRequest(f"--policy: {e}") from None
    base = cfg or PolicyConfig()
    sim = Simulation(trace, replace(base, arbiter=policy), cluster or ClusterSpec(), data or DataSpec(),
                     failures, seed, cycle_s, epoch_s=epoch_s, estimates=estimates)
    return sim.run(policy)


# ------------------------------------------------------------------ output


def _fmt_s(v: float) -> str:
    if v >= 86400:
        return f"{v / 86400:.2f} d"
    if v >= 3600:
        return f"{v / 3600:.2f} h"
    return f"{v:.1f} s"


def _fmt_bytes(v: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if v >= size:
            return f"{v / size:.2f} {unit}"
    return f"{v:.0f} B"


def print_table(results: Sequence[SimResult], caption: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gsched simulate", caption=caption)
    table.add_column("metric")
    for r in results:
        table.add_column(r.policy, justify="right")
    rows: list[tuple[str, Any]] = [
        ("jobs completed", lambda r: f"{r.jobs}" + (f" ({r.unfinished} unfinished)" if r.unfinished else "")),
        ("mean JCT", lambda r: _fmt_s(r.mean_jct_s)),
        ("p50 JCT", lambda r: _fmt_s(r.p50_jct_s)),
        ("p95 JCT", lambda r: _fmt_s(r.p95_jct_s)),
        ("p99 JCT", lambda r: _fmt_s(r.p99_jct_s)),
        ("mean queueing", lambda r: _fmt_s(r.mean_queue_s)),
        ("p50 / p99 / max queueing", lambda r: f"{_fmt_s(r.p50_queue_s)} / {_fmt_s(r.p99_queue_s)} / "
                                               f"{_fmt_s(r.max_queue_s)}"),
        ("makespan", lambda r: _fmt_s(r.makespan_s)),
        ("utilisation", lambda r: f"{r.utilization:.3f}"),
        ("local-read fraction", lambda r: f"{r.local_fraction:.3f}"),
        ("bytes moved", lambda r: _fmt_bytes(r.bytes_moved)),
        ("  across racks", lambda r: _fmt_bytes(r.cross_rack_bytes)),
        ("Jain (share-normalised)", lambda r: f"{r.jain:.3f}"),
        ("  gang-bound time", lambda r: f"{r.gang_bound_share:.1%}"),
        ("  Jain elsewhere", lambda r: f"{r.jain_unbound:.3f}"),
        ("restarts", lambda r: f"{r.restarts}"),
        ("re-replicated", lambda r: _fmt_bytes(r.replication_bytes)),
        ("cycles run", lambda r: f"{r.cycles}"),
    ]
    for name, fn in rows:
        table.add_row(name, *(fn(r) for r in results))
    Console().print(table)


def plot(results: Sequence[SimResult], path: str) -> None:
    """JCT CDF per policy (log time axis) and bytes moved per policy, into one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in results:
        xs = sorted(max(x, 1e-3) for x in r.jcts_s)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax1.step(xs, ys, where="post", label=r.policy)
    ax1.set_xscale("log")
    ax1.set_xlabel("job completion time (s)")
    ax1.set_ylabel("fraction of jobs")
    ax1.set_title("JCT distribution")
    ax1.legend()
    names = [r.policy for r in results]
    ax2.bar(names, [r.bytes_moved / GB for r in results], label="all")
    ax2.bar(names, [r.cross_rack_bytes / GB for r in results], label="across racks")
    ax2.set_ylabel("GB staged")
    ax2.set_title("bytes moved")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    """``gsched simulate``: replay the trace under each policy and print the results side by side."""
    trace = load_trace(args.trace, getattr(args, "limit", None))
    cluster = ClusterSpec(args.nodes, args.devices_per_node, args.racks)
    data = DataSpec.parse(args.data)
    failures = FailureSpec.parse(args.failures)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if not policies:
        raise BadRequest("--policy: name at least one policy, e.g. --policy twostage,fairshare")
    cycle_s = float(getattr(args, "cycle_s", 10.0) or 10.0)
    cfg = getattr(args, "policy_cfg", None)  # gsched simulate --config: the server's [policy] knobs
    estimates = getattr(args, "estimates", None) or "exact"
    results = [simulate(trace, p, cluster, data, failures, args.seed, cycle_s, cfg=cfg, estimates=estimates)
               for p in policies]
    if args.plot:
        plot(results, args.plot)
    if args.json:
        print(json.dumps([r.as_json() for r in results], indent=2))
    else:
        r0 = results[0]
        caption = (f"{len(trace)} jobs from {args.trace}; {cluster.nodes} nodes x {cluster.devices_per_node} "
                   f"devices in {min(cluster.racks, cluster.nodes)} racks; data {'none' if data.none else data}; seed {args.seed}; "
                   f"time limits {'exact' if estimates == 'exact' else 'as users write them'}; "
                   f"{r0.clipped} job(s) wider than the cluster clipped to {cluster.nodes * cluster.devices_per_node}")
        print_table(results, caption)
    if args.plot:
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
