"""One scheduling cycle, as numbered phases (each is timed into ``durations_s`` and logs its count):

1. expire: nodes silent past ``heartbeat_ttl_s`` go down; their jobs are requeued.
2. limits: jobs past their time limit end TIMEOUT.
3. usage: decayed per-user device-seconds are brought up to now; then dependencies: pending jobs whose
   ``--dependency`` is met are let in, those whose dependency can never be met end FAILED.
4. snapshot: one immutable ``Snapshot`` is read from the database.
5. decide: stage 1 (per job, local) and stage 2 (the configured arbiter), pure functions of the snapshot.
6. preempt (``[policy] preempt`` on): victims of ``policies.preemption.plan_preemptions`` go back to
   PENDING and their ranks are stopped; their devices go to the preemptor once free (a later cycle).
7. bind: the chosen jobs in transactions of up to ``BIND_BATCH`` jobs, each job re-checking that its
   devices are still free; a bind that fails its re-check is counted (``bind_failed``) and its job
   explained as such.
8. replicate: copies are scheduled for under-replicated shards (bounded concurrency); planned without
   the write lock, and planned again in a write transaction only when there is something to write.
9. report: every pending job's explanation and a cluster sample are stored.
10. thin: hourly, the cluster history is thinned.

This module is the phase list and nothing else: the work of each phase is in ``upkeep`` (1-3),
``scheduler.store.snapshot_reader`` (4), ``scheduler.core.decide`` (5), ``preempt`` (6),
``scheduler.store.binder`` (7), ``replication`` (8) and ``report`` (9, 10).  ``run_cycle`` is called by the cycle process (one at a time,
with the ``CycleMemory`` it keeps) and by tests with a fake clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from policies.preemption import preemption_plan
from policies.registry import get_arbiter
from scheduler.core.decide import decide
from scheduler.core.snapshot import Snapshot
from scheduler.server.cyclestate import CycleMemory, CycleReport
from scheduler.server.preempt import act_on_preemptions
from scheduler.server.replication import schedule_replication
from scheduler.server.report import thin_history_if_due, write_report
from scheduler.server.upkeep import enforce_time_limits, expire_nodes, settle_dependencies, update_usage
from scheduler.store.binder import bind_all, start_locality_waits
from scheduler.store.db import Database
from scheduler.store.snapshot_reader import build_snapshot

log = logging.getLogger("gsched.cycle")
T = TypeVar("T")


def run_cycle(db: Database, settings: Any, now: float, leader: str = "", fence: Callable[[], bool] | None = None,
              clock: Callable[[], float] | None = None, nudge: Callable[[list[str]], Any] | None = None,
              memory: CycleMemory | None = None) -> CycleReport:
    """One cycle at time ``now``.  ``fence()``, when given, must still be true before binding
    (the leader's lease), so a server that lost the lease mid-cycle binds nothing.

    ``clock()``, when given, stamps each binding with the time it commits: heartbeats run between
    the cycle's phases, and a device a heartbeat freed after ``now`` must not look bound before it
    was free in the rank history.

    ``nudge(nodes)``, when given, is called with the nodes that got ranks (``scheduler.server.nudge``).

    ``memory``: what the caller's earlier cycles on this database left (``CycleMemory``); a fresh one
    when omitted."""
    memory = memory if memory is not None else CycleMemory()
    report = CycleReport(time=now)

    def phase(name: str, fn: Callable[[], T]) -> T:
        t0 = time.perf_counter()
        out = fn()
        report.durations_s[name] = time.perf_counter() - t0
        return out

    with db.session() as s:  # 1
        report.counts["expired"] = phase("expire", lambda: expire_nodes(s, now, settings.heartbeat_ttl_s))
    with db.session() as s:  # 2
        report.counts["timeouts"] = phase(
            "limits", lambda: enforce_time_limits(s, now, settings.heartbeat_ttl_s, memory.shapes))
    with db.session() as s:  # 3
        phase("usage", lambda: update_usage(s, now, settings.policy.usage_half_life_s))
        report.counts["dependencies"] = phase("dependencies", lambda: settle_dependencies(s, now))
    with db.read() as s:  # 4
        snap = phase("snapshot", lambda: build_snapshot(s, now, memory.shapes, settings.disk_floor_bytes,
                                                        preemption=settings.policy.preempt))
    arbiter = get_arbiter(settings.policy.arbiter)  # 5
    candidates, decision = phase("decide", lambda: decide(snap, settings.policy, arbiter))
    report.counts["pending"] = len(snap.pending)
    started = sorted(set(decision.waiting) & _new_waits(snap))  # jobs that began waiting this cycle
    preemption = preemption_plan(snap, settings.policy)  # empty unless [policy] preempt
    plans, report.preempts_nobody = preemption.preemptions, preemption.nobody
    if fence is not None and (decision.bindings or started or plans) and not fence():
        log.warning("lost the scheduling lease during the cycle: binding nothing")
        return report
    if plans:  # 6
        def preempt_phase() -> dict[int, dict[str, Any]]:
            with db.session() as s:
                return act_on_preemptions(s, snap, plans)

        report.preemptions = phase("preempt", preempt_phase)
        report.counts["preempted"] = sum(len(p["victims"]) for p in report.preemptions.values())

    def bind_phase() -> list[str]:  # 7
        bound = bind_all(db, now, decision.bindings, clock, settings.disk_floor_bytes)
        report.bound, report.refused = bound.jobs, bound.refused
        if started:  # the locality wait counts from the first cycle a job waited (policies.twostage)
            with db.session() as s:
                start_locality_waits(s, now, started)
        return sorted(bound.nodes)

    placed = phase("bind", bind_phase)
    report.counts["bound"] = len(report.bound)
    report.counts["bind_failed"] = len(report.refused)
    for job_id, why in report.refused.items():
        log.warning("job %d: bind failed: %s", job_id, why)
    if nudge is not None and placed:
        nudge(placed)
    report.counts["replications"] = phase("replicate", lambda: _replicate(db, now, settings))  # 8
    report.counts["explained"] = phase(  # 9
        "report", lambda: write_report(db, now, snap, candidates, decision, report, memory, leader))
    thinned = phase("thin", lambda: thin_history_if_due(db, now, memory))  # 10
    if thinned is not None:
        report.counts["samples_thinned"] = thinned
    log.info("cycle: %s %s", report.counts, {k: round(v * 1000, 1) for k, v in report.durations_s.items()})
    return report


def _replicate(db: Database, now: float, settings: Any) -> int:
    """Phase 8.  Planned first in a read session, which takes no write lock: in a steady cluster it
    plans nothing (it reads every node and replica to learn so, tens of milliseconds at 5,000 nodes,
    and under SQLite's write lock every heartbeat waited for it).  Only when the plan writes anything is
    it made again, from the start, in a write transaction, so what is written is planned on what the
    transaction sees."""
    def plan(s: Any) -> int:
        return schedule_replication(s, now, settings.replication_concurrency, settings.disk_floor_bytes,
                                    settings.node_cache_bytes)

    with db.read() as s, s.no_autoflush:
        made = plan(s)
        if not (s.new or s.dirty or s.deleted):
            return made
    with db.session() as s:
        return plan(s)


def _new_waits(snap: Snapshot) -> set[int]:
    """Pending jobs that had not waited for locality yet in their current pending spell."""
    return {j.id for j in snap.pending if j.waiting_since_s is None}
