"""Baseline arbiter ``backfill``: what Slurm's priority/multifactor plus sched/backfill do, data-blind.

- **Order**: priority = fair share + age (:func:`scheduler.core.fairshare.queue_order`, the same
  order as ``twostage`` without its tie-break by transfer cost).
- **Placement**: the data-blind packing of :func:`scheduler.core.stage1.propose_packed` over the
  devices left (fewest nodes, most free first), as ``fairshare`` places; Slurm knows no data.
- **One reservation**: the first job in that order that fits nowhere gets the earliest start at which
  running jobs (and jobs bound earlier in this cycle) free enough devices, by their time limits
  (:func:`policies.reservation.plan_reservation`; in the simulator the limits are the exact run times).
- **Backfill**: every later job starts if it fits the free devices and either ends by the reserved
  start (``now + time_limit_s <= start``) or leaves the reserved devices alone.  No locality wait, no
  starvation bound beyond the one reservation (it is a baseline: Slurm's own ``bf_*`` knobs are
  not modelled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.common import FreeLedger, devices_busy, holds_reservation, not_taken, reserved_for
from policies.reservation import Reservation, plan_reservation
from scheduler.core.fairshare import queue_order
from scheduler.core.placement import Candidate, Decision
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import Snapshot
from scheduler.core.stage1 import (
    Stage1Index,
    build_index,
    infeasible_reason,
    missing_data_reason,
    propose_packed,
)


class BackfillArbiter:
    """Slurm-style backfill (see the module docstring)."""

    name = "backfill"

    def arbitrate(
        self,
        snap: Snapshot,
        candidates: Mapping[int, Sequence[Candidate]],
        cfg: PolicyConfig,
        index: Stage1Index | None = None,
    ) -> Decision:
        index = index if index is not None else build_index(snap)
        ordered, prios, factors = queue_order(snap, cfg)
        d = Decision(order=[j.id for j in ordered], factors=factors, priorities=prios)
        ledger = FreeLedger(index)
        bound_ends: list[tuple[float, dict[str, int]]] = []
        res: Reservation | None = None
        now = snap.now_s
        for job in ordered:
            why = infeasible_reason(job, index) or missing_data_reason(job, snap, index)
            if why is not None:
                d.reasons[job.id] = why
                continue
            long_job = res is not None and now + job.time_limit_s > res.start_s
            avail = ledger.avail if long_job else ledger.free
            chosen = None
            if ledger.may_fit(job.ranks, job.devices_per_rank):
                chosen = propose_packed(job, snap, cfg, index, free=avail)
            if chosen is None:
                if res is not None:
                    if long_job and propose_packed(job, snap, cfg, index, free=ledger.free) is not None:
                        d.reasons[job.id] = reserved_for(res.job_id, res.start_s)
                    else:
                        d.reasons[job.id] = devices_busy(job.devices, ledger.total)
                    continue
                reason = devices_busy(job.devices, ledger.total)
                res = plan_reservation(job, snap, cfg, index, ledger.free, bound_ends)
                if res is not None:
                    ledger.hold(res.held)
                    d.reservation = (res.job_id, dict(res.need), res.start_s)
                    reason = holds_reservation(reason, res.start_s)
                d.reasons[job.id] = reason
                continue
            for i, _ in enumerate(candidates.get(job.id, ())):
                d.candidate_reasons[(job.id, i)] = not_taken("the backfill baseline ignores data: packed on fewest nodes")
            ledger.take(chosen)
            d.bindings[job.id] = chosen
            bound_ends.append((now + job.time_limit_s, chosen.devices_by_node()))
        return d
