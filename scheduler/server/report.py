"""Phase 8 of the cycle, the report: every pending job's explanation and one cluster sample are stored
(``write_report``); hourly, the cluster history is thinned (``thin_history``).

An explanation is what ``gsched explain`` shows: the job's factor, priority and queue position (and
how many of its user's own jobs are ahead of it, and how many are older: :func:`own_jobs_ahead`; how
many jobs of a lower priority are ahead of it: :func:`lower_ahead`), its
candidates with their costs and why each was or was not chosen, the reservation, and its reason; with
preemption on, for a job that has waited ``preempt_after_s`` and preempts nobody, why not
(``"preempts_nobody"``: ``policies.preemption.Plan.nobody``).
Each reason is stored twice: as its words (``"reason"``: the sentence people read, and for a pending
job the ``Job.reason`` column) and as data (``"why"``: ``Reason.as_dict()``, its kind, message and time;
None where there is no reason, as for a bound job or its chosen candidate).  Readers use the data.
"""

from __future__ import annotations

from collections import defaultdict
from operator import attrgetter
from typing import Any, cast

from sqlalchemy import Integer, Table, bindparam, delete, func, select
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session

from scheduler.core.lifecycle import ACTIVE, JobState
from scheduler.core.placement import Candidate, Decision
from scheduler.core.reasons import Reason, ReasonKind
from scheduler.core.snapshot import JobView, Snapshot
from scheduler.server.cyclestate import CycleMemory, CycleReport
from scheduler.store.binder import busy_devices
from scheduler.store.db import Database
from scheduler.store.models import ClusterSample, Job

# A pending job's explanation is rewritten when what it says changes (reason, queue position,
# candidates, reservation) and otherwise every EXPLAIN_REFRESH_S (its priority grows with age
# every cycle).  Rewriting thousands of unchanged explanations every cycle held the write lock for
# 100-200 ms a second, and heartbeats queued behind it.  Written in chunks of REPORT_CHUNK rows, one
# transaction each, so no heartbeat waits for more than one chunk.
EXPLAIN_REFRESH_S = 60.0
REPORT_CHUNK = 250

# A pending job the arbiter gave no reason (the contract says it always does).
UNDECIDED = Reason(ReasonKind.NEW, "waiting for the next cycle")


def write_report(db: Database, now: float, snap: Snapshot, candidates: dict[int, list[Candidate]],
                 decision: Decision, report: CycleReport, memory: CycleMemory, leader: str = "") -> int:
    """Store the pending jobs' explanations (factor, priority, queue position, candidates, reason) that
    changed or are older than ``EXPLAIN_REFRESH_S``, and one cluster sample.  Returns the rows written.
    executemany UPDATEs by id rather than one ORM object per job.

    A job the arbiter chose but whose bind failed (``report.refused``) is explained as still pending:
    its reason, and its chosen candidate's, is a ``bind_failed`` one, "bind failed: " and why.  For
    every job still pending the reason's words go to ``Job.reason`` and its data to ``explain["why"]``,
    in the same transaction, so the two always say the same.  ``memory.explained`` holds what each
    pending job's stored explanation says, and is replaced by this cycle's."""
    position = {job_id: i + 1 for i, job_id in enumerate(decision.order)}
    own = own_jobs_ahead(decision.order, snap)
    lower = lower_ahead(decision.order, decision.priorities)
    reservation = _reservation(decision)
    last = memory.explained
    kept: dict[int, tuple[str, float]] = {}
    explained: list[dict[str, Any]] = []
    for jv in snap.pending:
        chosen = decision.bindings.get(jv.id)
        failed = report.refused.get(jv.id)
        bound = chosen if failed is None else None  # the candidate the job is bound to now
        refusal = None if failed is None else Reason(ReasonKind.BIND_FAILED, f"bind failed: {failed}")
        cands = []
        for i, c in enumerate(candidates.get(jv.id, [])):
            why = None if c is bound else refusal if c is chosen else decision.candidate_reasons.get((jv.id, i))
            cands.append({"nodes": list(c.nodes), "ranks_per_node": {n: k // max(1, c.devices_per_rank)
                                                                       for n, k in c.devices_by_node().items()},
                          "local_fraction": round(c.local_fraction, 4), "transfer_bytes": c.transfer_bytes,
                          "transfer_cost_ms": c.transfer_cost_ms, "chosen": c is bound,
                          "reason": "chosen" if c is bound else "" if why is None else why.text(),
                          "why": None if why is None else why.as_dict()})
        if bound is not None:
            reason = None
        else:
            reason = refusal or decision.reasons.get(jv.id, UNDECIDED)
        text = "" if reason is None else reason.text()
        nobody = report.preempts_nobody.get(jv.id) if bound is None else None
        ahead, older = own.get(jv.id, (0, 0))
        passed = lower.get(jv.id, 0)
        what = repr((reason, position.get(jv.id), ahead, older, passed, cands, reservation, nobody))
        prev = last.get(jv.id)
        if prev is not None and prev[0] == what and now - prev[1] < EXPLAIN_REFRESH_S:
            kept[jv.id] = prev
            continue
        kept[jv.id] = (what, now)
        factor = float(decision.factors.get(jv.id, 1.0))
        priority = float(decision.priorities.get(jv.id, 0.0))
        explained.append({"_id": jv.id, "factor": factor, "priority": priority, "pending": bound is None,
                          "reason": text,
                          "explain": {"time": now, "factor": factor, "priority": priority,
                                      "queue_position": position.get(jv.id), "queue_length": len(decision.order),
                                      "own_ahead": ahead, "own_older": older, "lower_ahead": passed,
                                      "candidates": cands, "reason": text or "bound",
                                      "why": None if reason is None else reason.as_dict(),
                                      "reservation": reservation, "preempts_nobody": nobody}})
    memory.explained = kept  # jobs no longer pending are forgotten
    table = cast(Table, Job.__table__)
    for at in range(0, len(explained), REPORT_CHUNK):
        chunk = explained[at:at + REPORT_CHUNK]
        reasons = [{"_id": e["_id"], "reason": e["reason"]} for e in chunk if e["pending"]]
        with db.session() as s:
            s.execute(table.update().where(table.c.id == bindparam("_id"))
                      .values(factor=bindparam("factor"), priority=bindparam("priority"), explain=bindparam("explain")),
                      [{k: e[k] for k in ("_id", "factor", "priority", "explain")} for e in chunk])
            if reasons:  # only jobs still pending: a job cancelled since the snapshot keeps its own reason
                s.execute(table.update().where(table.c.id == bindparam("_id"), table.c.state == JobState.PENDING)
                          .values(reason=bindparam("reason")), reasons)
    with db.session() as s:
        _sample(s, now, snap, report, leader)
    return len(explained)


_AGE = attrgetter("pending_since_s", "submit_s", "id")


def own_jobs_ahead(order: list[int], snap: Snapshot) -> dict[int, tuple[int, int]]:
    """Per pending job in ``order``: how many of its user's pending jobs are ahead of it in the order,
    and how many of its user's pending jobs are older (pending longer, then submitted earlier, then a
    lower id).  More ahead than older: some of the user's newer jobs went first (each user's shorter
    jobs first, ``[policy] shortest_first``, or a tie broken by where jobs read and their size): ``gsched explain`` says
    so."""
    jobs = {jv.id: jv for jv in snap.pending}
    mine: dict[str, list[JobView]] = defaultdict(list)
    out: dict[int, tuple[int, int]] = {}
    for job_id in order:
        jv = jobs.get(job_id)
        if jv is not None:
            out[job_id] = (len(mine[jv.user]), 0)
            mine[jv.user].append(jv)
    for same in mine.values():
        if len(same) > 1:
            for older, jv in enumerate(sorted(same, key=_AGE)):
                out[jv.id] = (out[jv.id][0], older)
    return out


def lower_ahead(order: list[int], priorities: dict[int, float]) -> dict[int, int]:
    """Per job in ``order``: how many jobs ahead of it have a lower priority.  The arbiter's order is by
    priority but for the jobs it moves ahead: near-ties to the jobs that read locally, the smallest
    first, then the cheapest to place (``tie_window_s``, ``tie_fairshare``; a job that can only stage
    ordered ``stage_penalty`` of the factor lower, ``policies.twostage.break_ties_by_cost``), the job pending past
    ``max_wait_s``, and jobs others were preempted for; ``gsched explain`` says so.  (A user's own jobs
    swapped by ``shortest_first`` take the priorities of their places, so they pass nobody here.)
    Counted with a Fenwick tree over the distinct priorities: O(n log n); none moved, O(n)."""
    prio = [priorities.get(job_id, 0.0) for job_id in order]
    if all(a >= b for a, b in zip(prio, prio[1:], strict=False)):
        return dict.fromkeys(order, 0)
    rank = {p: i + 1 for i, p in enumerate(sorted(set(prio)))}
    size = len(rank)
    tree = [0] * (size + 1)  # tree[i]: jobs seen so far with priority ranks in i's range
    out: dict[int, int] = {}
    for job_id, p in zip(order, prio, strict=True):
        r = rank[p]
        i, seen = r - 1, 0
        while i > 0:  # jobs seen with a rank below r
            seen += tree[i]
            i -= i & -i
        out[job_id] = seen
        while r <= size:
            tree[r] += 1
            r += r & -r
    return out


def _sample(s: Session, now: float, snap: Snapshot, report: CycleReport, leader: str) -> None:
    busy = sum(len(v) for v in busy_devices(s).values())
    total = sum(n.devices for n in snap.nodes.values())
    running = s.scalar(select(func.count()).select_from(Job).where(Job.state.in_(ACTIVE))) or 0
    s.add(ClusterSample(time=now, devices_total=total, devices_busy=busy, pending=len(snap.pending) - len(report.bound),
                        running=running, durations={k: round(v, 6) for k, v in report.durations_s.items()},
                        leader=leader))


# The cluster history keeps one sample per cycle for a day, then one per 5 minutes for 90 days
# (a cycle every 2 s writes 43,200 rows a day; thinned, a day costs 288).
FULL_RESOLUTION_S = 86_400.0
COARSE_BUCKET_S = 300
KEEP_S = 90 * 86_400.0
THIN_EVERY_S = 3_600.0


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


def thin_history_if_due(db: Database, now: float, memory: CycleMemory) -> int | None:
    """``thin_history`` in a transaction of its own when ``THIN_EVERY_S`` have passed since
    ``memory.last_thinned`` (then stamped ``now``); returns the rows deleted, or None when not due."""
    if now - memory.last_thinned < THIN_EVERY_S:
        return None
    with db.session() as s:
        gone = thin_history(s, now)
    memory.last_thinned = now
    return gone
