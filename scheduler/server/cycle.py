"""One scheduling cycle, as numbered phases (each logs its count and duration):

1. expire: nodes silent past ``heartbeat_ttl_s`` go down; their jobs are requeued.
2. limits: jobs past their time limit end TIMEOUT.
3. usage: decayed per-user device-seconds are brought up to now.
4. snapshot: one immutable ``Snapshot`` is read from the database.
5. decide: stage 1 (per job, local) and stage 2 (the arbiter), pure functions of the snapshot.
6. bind: one transaction per chosen job, re-checking that its devices are still free.
7. replicate: copies are scheduled for under-replicated shards (bounded concurrency).
8. report: every pending job's explanation and a cluster sample are stored.

``run_cycle`` is called by APScheduler in the server (one at a time) and by tests with a fake clock.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Integer, Table, bindparam, delete, func, select, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session

from policies.registry import get_arbiter
from scheduler.core import lifecycle as st
from scheduler.core.decide import decide
from scheduler.core.fairshare import decay
from scheduler.core.placement import Candidate, Decision
from scheduler.core.replicas import place_replicas, reported_room
from scheduler.core.snapshot import JobView, NodeView, RunningView, ShardView, Snapshot
from scheduler.server.service import finish_job, record, requeue_job
from scheduler.store.db import Database
from scheduler.store.models import (
    Checkpoint,
    ClusterSample,
    Dataset,
    Device,
    Job,
    Node,
    Rank,
    Replica,
    Shard,
    ShardAssignment,
    Transfer,
    Usage,
    User,
)

log = logging.getLogger("gsched.cycle")


@dataclass
class CycleReport:
    time: float
    durations_s: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    bound: list[int] = field(default_factory=list)


def run_cycle(db: Database, settings: Any, now: float, leader: str = "",
              fence: Any = None, clock: Any = None, nudge: Any = None) -> CycleReport:
    """One cycle at time ``now``.  ``fence()``, when given, must still be true before binding
    (the leader's lease), so a server that lost the lease mid-cycle binds nothing.

    ``clock()``, when given, stamps each binding with the time it commits: heartbeats run between
    the cycle's phases, and a device a heartbeat freed after ``now`` must not look bound before it
    was free in the rank history.

    ``nudge(nodes)``, when given, is called with the nodes that got ranks (``scheduler.server.nudge``)."""
    report = CycleReport(time=now)

    def phase(name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        out = fn()
        report.durations_s[name] = time.perf_counter() - t0
        return out

    with db.session() as s:
        report.counts["expired"] = phase("expire", lambda: expire_nodes(s, now, settings.heartbeat_ttl_s))
    with db.session() as s:
        report.counts["timeouts"] = phase("limits", lambda: enforce_time_limits(s, now, settings.heartbeat_ttl_s))
    with db.session() as s:
        phase("usage", lambda: update_usage(s, now, settings.policy.usage_half_life_s))
    with db.read() as s:
        snap = phase("snapshot", lambda: build_snapshot(s, now))
    candidates, decision = phase("decide", lambda: decide(snap, settings.policy, get_arbiter(settings.policy.arbiter)))
    report.counts["pending"] = len(snap.pending)
    started = sorted(set(decision.waiting) & _new_waits(snap))  # jobs that began waiting this cycle
    if fence is not None and (decision.bindings or started) and not fence():
        log.warning("lost the scheduling lease during the cycle: binding nothing")
        return report
    placed: set[str] = set()
    for job_id, cand in decision.bindings.items():
        with db.session() as s:
            if bind(s, now, job_id, cand, clock):
                report.bound.append(job_id)
                placed.update(cand.nodes)
    report.counts["bound"] = len(report.bound)
    if nudge is not None and placed:
        nudge(sorted(placed))
    if started:  # the locality wait counts from the first cycle a job waited (policies.twostage)
        with db.session() as s:
            s.execute(update(Job).where(Job.id.in_(started), Job.state == st.PENDING,
                                        Job.locality_wait_since.is_(None)).values(locality_wait_since=now))
    with db.session() as s:
        report.counts["replications"] = phase(
            "replicate", lambda: schedule_replication(s, now, settings.replication_concurrency))
    report.counts["explained"] = phase("report", lambda: write_report(db, now, snap, candidates, decision, report,
                                                                      leader))
    if now - _last_thinned.get(db.url, float("-inf")) >= THIN_EVERY_S:
        with db.session() as s:
            report.counts["samples_thinned"] = thin_history(s, now)
        _last_thinned[db.url] = now
    log.info("cycle: %s %s", report.counts, {k: round(v * 1000, 1) for k, v in report.durations_s.items()})
    return report


def _new_waits(snap: Snapshot) -> set[int]:
    """Pending jobs that had not waited for locality yet in their current pending spell."""
    return {j.id for j in snap.pending if j.waiting_since_s is None}


# ------------------------------------------------------------------ 1. expire


def expire_nodes(s: Session, now: float, ttl_s: float) -> int:
    n = 0
    for node in s.scalars(select(Node).where(Node.state == "up", Node.last_seen < now - ttl_s)):
        node.state = "down"
        node.down_since = now
        n += 1
        record(s, now, "server", "node.down", f"{node.name}: no heartbeat for {now - node.last_seen:.0f}s", node=node.name)
        jobs = {r.job_id for r in s.scalars(select(Rank).where(Rank.node == node.name,
                                                              Rank.state.not_in(st.RANK_FINAL)))}
        for job_id in sorted(jobs):
            job = s.get(Job, job_id)
            if job is not None and job.state in st.ACTIVE:
                requeue_job(s, now, job, f"node {node.name} is down")
    return n


# ------------------------------------------------------------------ 2. limits


def enforce_time_limits(s: Session, now: float, failure_grace_s: float = 0.0) -> int:
    """End jobs past their time limit (TIMEOUT); settle rank failures whose grace has passed."""
    from scheduler.server.heartbeat import sync_job

    n = 0
    for job in s.scalars(select(Job).where(Job.state.in_(st.ACTIVE))):
        sync_job(s, now, job, failure_grace_s)
        if job.state not in st.ACTIVE:
            continue
        limit = int(job.spec.get("limits", {}).get("time", 3600))
        start = job.started_at
        if start is not None and now - start > limit:
            finish_job(s, now, job, st.TIMEOUT, f"ran past its time limit of {limit}s")
            n += 1
    return n


# ------------------------------------------------------------------ 3. usage


def update_usage(s: Session, now: float, half_life_s: float) -> None:
    """Decay each user's usage to ``now`` and add the device-seconds their live ranks used since."""
    rows = {u.user: u for u in s.scalars(select(Usage))}
    running: dict[str, int] = defaultdict(int)
    q = (select(Job.user, Rank.devices).join(Rank, Rank.job_id == Job.id)
         .where(Rank.state == st.R_RUNNING, Job.state == st.RUNNING))
    for user, devices in s.execute(q):
        running[user] += len(devices or [])
    for user in set(rows) | set(running):
        row = rows.get(user)
        if row is None:
            row = Usage(user=user, device_seconds=0.0, updated_at=now)
            s.add(row)
            continue
        dt = max(0.0, now - row.updated_at)
        row.device_seconds = decay(row.device_seconds, dt, half_life_s) + running[user] * dt
        row.updated_at = now


# ------------------------------------------------------------------ 4. snapshot


def busy_devices(s: Session) -> dict[str, set[int]]:
    busy: dict[str, set[int]] = defaultdict(set)
    for node, devices in s.execute(select(Rank.node, Rank.devices).where(Rank.state.not_in(st.RANK_FINAL))):
        busy[node].update(devices or [])
    return busy


def build_snapshot(s: Session, now: float) -> Snapshot:
    """Read the cluster into an immutable ``Snapshot`` (plain column reads, no ORM objects: at a
    thousand nodes and jobs this is the cycle's biggest read, and it runs in a read-only session)."""
    busy = busy_devices(s)
    healthy: dict[str, int] = defaultdict(int)
    for node, count in s.execute(select(Device.node, func.count()).where(Device.healthy.is_(True)).group_by(Device.node)):
        healthy[node] = count
    nodes = {}
    for name, rack in s.execute(select(Node.name, Node.rack).where(Node.state == "up").order_by(Node.name)):
        devs = healthy.get(name, 0)
        nodes[name] = NodeView(name=name, rack=rack, devices=devs, free=max(0, devs - len(busy[name])))
    shards: dict[str, list[ShardView]] = defaultdict(list)
    for ds, index, size, samples in s.execute(
            select(Shard.dataset, Shard.index, Shard.bytes, Shard.samples).order_by(Shard.dataset, Shard.index)):
        shards[ds].append(ShardView(ds, index, size, samples))
    replicas: dict[tuple[str, int], list[str]] = defaultdict(list)
    for ds, index, node in s.execute(
            select(Replica.dataset, Replica.shard, Replica.node).where(Replica.state == "healthy").order_by(Replica.node)):
        if node in nodes:
            replicas[(ds, index)].append(node)
    pending_ids = select(Job.id).where(Job.state == st.PENDING).scalar_subquery()
    ckpt_nodes: dict[int, tuple[str, ...]] = {}
    for job_id, ck_nodes in s.execute(select(Checkpoint.job_id, Checkpoint.nodes)
                                      .where(Checkpoint.job_id.in_(pending_ids))
                                      .order_by(Checkpoint.job_id, Checkpoint.epoch)):
        ckpt_nodes[job_id] = tuple(ck_nodes or ())
    pending_rows = s.execute(select(Job.id, Job.submitted_at, Job.pending_since, Job.locality_wait_since)
                             .where(Job.state == st.PENDING).order_by(Job.id)).all()
    by_job: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for job_id, node, devices in s.execute(select(Rank.job_id, Rank.node, Rank.devices)
                                           .where(Rank.state.not_in(st.RANK_FINAL))):
        by_job[job_id][node] += len(devices or [])
    running_rows = s.execute(select(Job.id, Job.submitted_at, Job.started_at).where(Job.id.in_(list(by_job)))).all()
    shapes = _job_shapes(s, [(r[0], r[1]) for r in pending_rows] + [(r[0], r[1]) for r in running_rows])
    pending = []
    for job_id, submitted_at, pending_since, waiting_since in pending_rows:
        shape = shapes[job_id]
        pending.append(JobView(id=job_id, user=shape.user, ranks=shape.ranks, devices_per_rank=shape.devices_per_rank,
                               dataset=shape.dataset, submit_s=submitted_at, pending_since_s=pending_since,
                               time_limit_s=shape.time_limit_s, prefer_nodes=ckpt_nodes.get(job_id, ()),
                               waiting_since_s=waiting_since))
    running = []
    for job_id, _submitted, started_at in running_rows:
        start = started_at or now
        running.append(RunningView(id=job_id, user=shapes[job_id].user,
                                   devices_by_node=tuple(sorted(by_job[job_id].items())),
                                   end_by_s=max(now, start + shapes[job_id].time_limit_s)))
    running.sort(key=lambda r: r.id)
    usage = dict(s.execute(select(Usage.user, Usage.device_seconds)).all())
    shares = dict(s.execute(select(User.name, User.shares)).all())
    return Snapshot(now_s=now, nodes=nodes, shards={k: tuple(v) for k, v in shards.items()},
                    replicas={k: tuple(v) for k, v in replicas.items()}, pending=tuple(pending),
                    running=tuple(running), usage=usage, shares=shares)


@dataclass(frozen=True)
class _JobShape:
    user: str
    ranks: int
    devices_per_rank: int
    dataset: str | None
    time_limit_s: float


# What the snapshot needs of a job's spec never changes after submit, so it is decoded once per job
# and database (the specs of two thousand pending jobs were a third of the snapshot's time).
_shapes: weakref.WeakKeyDictionary[Any, dict[tuple[int, float], _JobShape]] = weakref.WeakKeyDictionary()


def _job_shapes(s: Session, keys: list[tuple[int, float]]) -> dict[int, _JobShape]:
    """The shapes of jobs given as (id, submitted_at); the submit time guards against a reused id."""
    known = _shapes.setdefault(s.get_bind(), {})
    missing = [i for i, t in keys if (i, t) not in known]
    for start in range(0, len(missing), 500):
        for job_id, submitted_at, user, spec in s.execute(select(Job.id, Job.submitted_at, Job.user, Job.spec)
                                                          .where(Job.id.in_(missing[start:start + 500]))):
            res = spec.get("resources", {})
            known[(job_id, submitted_at)] = _JobShape(
                user=user, ranks=int(res.get("ranks", 1)), devices_per_rank=int(res.get("gpus_per_rank", 1)),
                dataset=spec.get("data", {}).get("dataset"),
                time_limit_s=float(spec.get("limits", {}).get("time", 3600)))
    if len(known) > 4 * max(len(keys), 1000):  # forget ended jobs now and then
        wanted = set(keys)
        for key in [k for k in known if k not in wanted]:
            del known[key]
    return {i: known[(i, t)] for i, t in keys if (i, t) in known}


# ------------------------------------------------------------------ 6. bind


def bind(s: Session, now: float, job_id: int, cand: Candidate, clock: Any = None) -> bool:
    """Bind one job to ``cand`` in the caller's transaction, or do nothing and return False.

    Re-checks that the job is still PENDING and that every device it needs is still free, so two
    cycles (or a stale decision) can never give a device twice.  The binding is stamped
    ``max(now, clock())`` taken after that check, so it never predates the release it relies on.
    """
    job = s.get(Job, job_id)
    if job is None or job.state != st.PENDING:
        return False
    busy = busy_devices(s)
    healthy: dict[str, list[int]] = defaultdict(list)
    for d in s.scalars(select(Device).where(Device.node.in_(cand.nodes), Device.healthy.is_(True)).order_by(Device.index)):
        healthy[d.node].append(d.index)
    up = {n.name for n in s.scalars(select(Node).where(Node.name.in_(cand.nodes), Node.state == "up"))}
    free = {n: [i for i in healthy[n] if i not in busy[n]] for n in cand.nodes}
    for node, need in cand.devices_by_node().items():
        if node not in up or len(free[node]) < need:
            return False
    if clock is not None:
        now = max(now, clock())
    job.attempt += 1
    st.transition(job, st.BOUND, f"bound to {', '.join(cand.nodes)}")
    job.locality_wait_since = None
    job.master_port = None
    job.transfer_bytes = cand.transfer_bytes
    job.transfer_cost_ms = cand.transfer_cost_ms
    job.local_fraction = cand.local_fraction
    job.progress = {}
    local_index: dict[str, int] = defaultdict(int)
    for rank, node in enumerate(cand.rank_nodes):
        devices = free[node][: cand.devices_per_rank]
        free[node] = free[node][cand.devices_per_rank:]
        s.add(Rank(job_id=job.id, attempt=job.attempt, rank=rank, local_rank=local_index[node], node=node,
                   devices=devices, state=st.R_ASSIGNED, bound_at=now))
        local_index[node] += 1
    dataset = job.spec.get("data", {}).get("dataset", "")
    for read in cand.reads:
        s.add(ShardAssignment(job_id=job.id, attempt=job.attempt, rank=read.rank, dataset=dataset, shard=read.shard,
                              node=read.node, source=read.source, bytes=read.bytes))
        if not read.local:
            s.add(Transfer(job_id=job.id, dataset=dataset, shard=read.shard, src=read.source, dst=read.node,
                           bytes=read.bytes, state="job", created_at=now))
    record(s, now, "server", "job.bind", f"attempt {job.attempt} on {', '.join(cand.nodes)}; "
           f"{cand.transfer_bytes} bytes to stage (~{cand.transfer_cost_ms} ms)", job_id=job.id)
    return True


# ------------------------------------------------------------------ 7. replicate


def schedule_replication(s: Session, now: float, concurrency: int) -> int:
    """Plan copies for shards with fewer healthy replicas (on up nodes) than their data set requires.

    At most ``concurrency`` re-replication transfers are in flight cluster-wide, so training traffic
    is not starved.  Corrupt copies are replaced first on the same node (a repair), else elsewhere.
    """
    inflight = s.scalar(select(func.count()).select_from(Transfer).where(
        Transfer.job_id.is_(None), Transfer.state.in_(("pending", "running")))) or 0
    budget = concurrency - inflight
    if budget <= 0:
        return 0
    rows = s.execute(select(Node.name, Node.rack, Node.free_bytes).where(Node.state == "up").order_by(Node.name)).all()
    up = [(name, rack) for name, rack, _ in rows]
    if not up:
        return 0
    room = reported_room((name, free) for name, _, free in rows)
    up_names = {n for n, _ in up}
    inflight_keys = {(ds, i, dst) for ds, i, dst in s.execute(select(Transfer.dataset, Transfer.shard, Transfer.dst).where(
        Transfer.job_id.is_(None), Transfer.state.in_(("pending", "running"))))}
    # Plain column reads (no ORM objects): this runs every cycle over every replica in the cluster.
    node_bytes: dict[str, int] = defaultdict(int)
    sizes = {(ds, i): size for ds, i, size in s.execute(select(Shard.dataset, Shard.index, Shard.bytes))}
    reps: dict[tuple[str, int], list[tuple[str, str]]] = defaultdict(list)
    # Bytes of each data set per node (healthy copies and copies on their way): a lost node's shards
    # are re-made together on one node (place_replicas' group rule), not scattered shard by shard.
    ds_bytes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for ds, i, node, state in s.execute(select(Replica.dataset, Replica.shard, Replica.node, Replica.state)):
        reps[(ds, i)].append((node, state))
        if state == "healthy" and node in up_names:
            node_bytes[node] += sizes.get((ds, i), 0)
            ds_bytes[ds][node] += sizes.get((ds, i), 0)
    for ds, i, dst in inflight_keys:
        ds_bytes[ds][dst] += sizes.get((ds, i), 0)
    required = dict(s.execute(select(Dataset.name, Dataset.replicas_required)).all())
    racks = dict(up)
    made = 0
    for (ds, index), size in sorted(sizes.items()):
        want = required.get(ds, 0)
        rs = reps.get((ds, index), [])
        healthy = [node for node, state in rs if state == "healthy" and node in up_names]
        if not healthy or len(healthy) >= want:
            continue
        pending_dst = [dst for (d, i, dst) in inflight_keys if d == ds and i == index]
        have = healthy + pending_dst
        if len(have) >= want:
            continue
        # Nodes holding a corrupt or missing copy come first: repair in place.
        repair = [node for node, state in rs if state in ("corrupt", "missing") and node in up_names
                  and node not in have]
        group = {n: b - (size if n in have else 0) for n, b in ds_bytes[ds].items()}
        plan = place_replicas([(index, size)], up, want, existing={index: have}, node_bytes=node_bytes,
                              group_bytes=group, room=room)
        targets = [n for n in plan.get(index, []) if n not in have]
        targets = sorted(targets, key=lambda n: (n not in repair, n))
        for dst in targets[: want - len(have)]:
            if made >= budget:
                return made
            src = min(healthy, key=lambda n: (racks.get(n) != racks.get(dst), n))
            s.add(Transfer(job_id=None, dataset=ds, shard=index, src=src, dst=dst, bytes=size,
                           state="pending", created_at=now))
            inflight_keys.add((ds, index, dst))
            node_bytes[dst] += size
            ds_bytes[ds][dst] += size
            if dst in room:
                room[dst] -= size
            record(s, now, "server", "replica.copy", f"{ds}/{index}: {src} -> {dst}", node=dst)
            made += 1
    return made


# ------------------------------------------------------------------ 8. report


# A pending job's explanation is rewritten when what it says changes (reason, queue position,
# candidates, reservation) and otherwise every EXPLAIN_REFRESH_S (its priority grows with age
# every cycle).  Rewriting thousands of unchanged explanations every cycle held the write lock for
# 100-200 ms a second, and heartbeats queued behind it.  Written in chunks of REPORT_CHUNK rows, one
# transaction each, so no heartbeat waits for more than one chunk.
EXPLAIN_REFRESH_S = 60.0
REPORT_CHUNK = 250
_explained: weakref.WeakKeyDictionary[Any, dict[int, tuple[str, float]]] = weakref.WeakKeyDictionary()


def write_report(db: Database, now: float, snap: Snapshot, candidates: dict[int, list[Candidate]],
                 decision: Decision, report: CycleReport, leader: str = "") -> int:
    """Store the pending jobs' explanations (factor, priority, queue position, candidates, reason) that
    changed or are older than ``EXPLAIN_REFRESH_S``, and one cluster sample.  Returns the rows written.
    executemany UPDATEs by id rather than one ORM object per job."""
    position = {job_id: i + 1 for i, job_id in enumerate(decision.order)}
    reservation = _reservation(decision)
    last = _explained.setdefault(db.engine, {})
    kept: dict[int, tuple[str, float]] = {}
    explained: list[dict[str, Any]] = []
    for jv in snap.pending:
        chosen = decision.bindings.get(jv.id)
        cands = []
        for i, c in enumerate(candidates.get(jv.id, [])):
            cands.append({"nodes": list(c.nodes), "ranks_per_node": {n: k // max(1, c.devices_per_rank)
                                                                       for n, k in c.devices_by_node().items()},
                          "local_fraction": round(c.local_fraction, 4), "transfer_bytes": c.transfer_bytes,
                          "transfer_cost_ms": c.transfer_cost_ms, "chosen": chosen is c,
                          "reason": "chosen" if chosen is c else decision.candidate_reasons.get((jv.id, i), "")})
        reason = "" if chosen is not None else decision.reasons.get(jv.id, "waiting for the next cycle")
        what = repr((reason, position.get(jv.id), cands, reservation))
        prev = last.get(jv.id)
        if prev is not None and prev[0] == what and now - prev[1] < EXPLAIN_REFRESH_S:
            kept[jv.id] = prev
            continue
        kept[jv.id] = (what, now)
        factor = float(decision.factors.get(jv.id, 1.0))
        priority = float(decision.priorities.get(jv.id, 0.0))
        explained.append({"_id": jv.id, "factor": factor, "priority": priority, "pending": chosen is None,
                          "reason": reason,
                          "explain": {"time": now, "factor": factor, "priority": priority,
                                      "queue_position": position.get(jv.id), "queue_length": len(decision.order),
                                      "candidates": cands, "reason": reason or "bound", "reservation": reservation}})
    _explained[db.engine] = kept  # jobs no longer pending are forgotten
    table = cast(Table, Job.__table__)
    for at in range(0, len(explained), REPORT_CHUNK):
        chunk = explained[at:at + REPORT_CHUNK]
        reasons = [{"_id": e["_id"], "reason": e["reason"]} for e in chunk if e["pending"]]
        with db.session() as s:
            s.execute(table.update().where(table.c.id == bindparam("_id"))
                      .values(factor=bindparam("factor"), priority=bindparam("priority"), explain=bindparam("explain")),
                      [{k: e[k] for k in ("_id", "factor", "priority", "explain")} for e in chunk])
            if reasons:  # only jobs still pending: a job cancelled since the snapshot keeps its own reason
                s.execute(table.update().where(table.c.id == bindparam("_id"), table.c.state == st.PENDING)
                          .values(reason=bindparam("reason")), reasons)
    with db.session() as s:
        _sample(s, now, snap, report, leader)
    return len(explained)


def _sample(s: Session, now: float, snap: Snapshot, report: CycleReport, leader: str) -> None:
    busy = sum(len(v) for v in busy_devices(s).values())
    total = sum(n.devices for n in snap.nodes.values())
    running = s.scalar(select(func.count()).select_from(Job).where(Job.state.in_(st.ACTIVE))) or 0
    s.add(ClusterSample(time=now, devices_total=total, devices_busy=busy, pending=len(snap.pending) - len(report.bound),
                        running=running, durations={k: round(v, 6) for k, v in report.durations_s.items()},
                        leader=leader))


# The cluster history keeps one sample per cycle for a day, then one per 5 minutes for 90 days
# (a cycle every 2 s writes 43,200 rows a day; thinned, a day costs 288).
FULL_RESOLUTION_S = 86_400.0
COARSE_BUCKET_S = 300
KEEP_S = 90 * 86_400.0
THIN_EVERY_S = 3_600.0
_last_thinned: dict[str, float] = {}


def thin_history(s: Session, now: float) -> int:
    """Drop cluster samples older than ``KEEP_S``; older than ``FULL_RESOLUTION_S``, keep only the first
    of each ``COARSE_BUCKET_S`` bucket.  Returns the rows deleted.  Runs hourly from the cycle."""
    old = now - FULL_RESOLUTION_S
    gone = s.execute(delete(ClusterSample).where(ClusterSample.time < now - KEEP_S))
    # CAST truncates (SQLite) or rounds (PostgreSQL): either way one fixed bucketing per database.
    bucket = sql_cast(ClusterSample.time / COARSE_BUCKET_S, Integer)
    firsts = select(func.min(ClusterSample.id)).where(ClusterSample.time < old).group_by(bucket)
    thinned = s.execute(delete(ClusterSample).where(ClusterSample.time < old, ClusterSample.id.not_in(firsts))
                        .execution_options(synchronize_session=False))
    return int(getattr(gone, "rowcount", 0) or 0) + int(getattr(thinned, "rowcount", 0) or 0)


def _reservation(decision: Decision) -> dict[str, Any] | None:
    if decision.reservation is None:
        return None
    job_id, nodes, start = decision.reservation
    return {"job": job_id, "nodes": nodes, "start_s": start}
