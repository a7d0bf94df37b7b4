"""Baseline arbiter ``fairshare``: fair-share order, placement blind to data.

Jobs go in fair-share priority order (the same order as ``twostage``).  Each gets the data-blind
packing of :func:`scheduler.core.stage1.propose_packed` over the devices left: fewest nodes, most free
first, ties by node name; where the data is plays no part (its reads and costs are still reported,
and are local only by chance).  No locality wait and no reservation: a job that does not fit is
skipped and smaller jobs behind it go ahead (so big gangs can starve under this baseline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.common import FreeLedger, devices_busy, not_taken
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


class FairShareArbiter:
    name = "fairshare"

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
        for job in ordered:
            why = infeasible_reason(job, index) or missing_data_reason(job, snap, index)
            if why is not None:
                d.reasons[job.id] = why
                continue
            chosen = None
            if ledger.may_fit(job.ranks, job.devices_per_rank):
                chosen = propose_packed(job, snap, cfg, index, free=ledger.free)
            if chosen is None:
                d.reasons[job.id] = devices_busy(job.devices, ledger.total)
                continue
            for i, _ in enumerate(candidates.get(job.id, ())):
                d.candidate_reasons[(job.id, i)] = not_taken(
                    "the fairshare baseline ignores data: packed on fewest nodes"
                )
            ledger.take(chosen)
            d.bindings[job.id] = chosen
        return d
