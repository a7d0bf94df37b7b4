"""Baseline arbiter ``fifo``: strict first-in, first-out, like a simple queue.

Jobs go in submit order (``submit_s``, then id).  Each takes its first (cheapest) stage-1 candidate
that fits the devices left, or a placement stage 1 re-proposes over them.  If the head of the queue
fits nowhere, the queue stops: every later job waits behind it (head-of-line blocking, on purpose:
that is the baseline's known weakness).  Jobs that can never run or whose data is unreadable are
skipped with their reason instead of blocking the queue forever.  No locality wait, no reservation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.common import FreeLedger, busy_reason, devices_busy, not_taken
from scheduler.core.fairshare import queue_order
from scheduler.core.placement import Candidate, Decision
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.reasons import Reason, ReasonKind
from scheduler.core.snapshot import Snapshot
from scheduler.core.stage1 import Stage1Index, build_index, infeasible_reason, missing_data_reason, propose


class FifoArbiter:
    name = "fifo"

    def arbitrate(
        self,
        snap: Snapshot,
        candidates: Mapping[int, Sequence[Candidate]],
        cfg: PolicyConfig,
        index: Stage1Index | None = None,
    ) -> Decision:
        index = index if index is not None else build_index(snap)
        _, prios, factors = queue_order(snap, cfg)
        fifo = sorted(snap.pending, key=lambda j: (j.submit_s, j.id))
        d = Decision(order=[j.id for j in fifo], factors=factors, priorities=prios)
        ledger = FreeLedger(index)
        head: int | None = None
        for job in fifo:
            if head is not None:
                d.reasons[job.id] = Reason(ReasonKind.QUEUE_ORDER, f"behind job {head} in the FIFO queue")
                continue
            why = infeasible_reason(job, index) or missing_data_reason(job, snap, index)
            if why is not None:
                d.reasons[job.id] = why
                continue
            chosen: Candidate | None = None
            for i, c in enumerate(candidates.get(job.id, ())):
                busy = busy_reason(c, ledger.free)
                if busy is None and chosen is None:
                    chosen = c
                elif busy is not None:
                    d.candidate_reasons[(job.id, i)] = busy
                else:
                    d.candidate_reasons[(job.id, i)] = not_taken("an earlier candidate fit first")
            if chosen is None and ledger.may_fit(job.ranks, job.devices_per_rank):
                again = propose(job, snap, cfg, index, free=ledger.free, quick=True)
                chosen = again[0] if again else None
            if chosen is None:
                d.reasons[job.id] = devices_busy(job.devices, ledger.total)
                head = job.id
                continue
            ledger.take(chosen)
            d.bindings[job.id] = chosen
        return d
