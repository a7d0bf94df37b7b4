"""Arbiter ``flow``: a Quincy-style min-cost flow over jobs -> candidates -> nodes, then gang repair.

The network (integer costs, networkx ``network_simplex``):

- each pending job ``j`` with candidates supplies ``D_j`` units, one per device it needs;
- ``j -> candidate c`` (capacity ``D_j``, cost per unit
  ``ceil(cost_weight * transfer_cost_ms(c) * (1 + priority_j / max priority) / D_j)``): staging data
  for a higher-priority job weighs more, so when jobs compete for the nodes holding their data, the
  higher-priority one gets the cheap placement;
- ``c -> node n`` (capacity: the devices ``c`` uses on ``n``, cost 0);
- ``node n -> sink`` (capacity: free devices of ``n``, cost 0);
- ``j -> sink`` directly, "unscheduled" (capacity ``D_j``, cost per unit ``M + round(10 * priority)``
  where ``M`` exceeds every candidate's unit cost): leaving a device unplaced always costs more than
  staging data for it, and costs more for higher-priority jobs, so under contention they win.

A flow can split one job over several candidates or place part of a gang, so the flow is only a guide
(honestly: a relaxation, not a gang-exact optimum).  **Repair**: jobs are taken in order of the share of
their devices the flow routed through one candidate (largest first, then priority); each binds the
candidate with the most flow that still fits the devices left, whole.  Then, so that no device is left
idle that a waiting job could use, the remaining jobs in priority order take their cheapest fitting
candidate, or one stage 1 re-proposes over what is left.  No locality wait, no reservation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.common import FreeLedger, busy_reason, devices_busy, not_taken
from scheduler.core.fairshare import queue_order
from scheduler.core.placement import Candidate, Decision
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import JobView, Snapshot
from scheduler.core.stage1 import (
    Stage1Index,
    build_index,
    candidate_key,
    infeasible_reason,
    missing_data_reason,
    propose,
)


def solve_flow(
    jobs: Sequence[JobView],
    candidates: Mapping[int, Sequence[Candidate]],
    free: Mapping[str, int],
    prios: Mapping[int, float],
    cfg: PolicyConfig,
) -> dict[tuple[int, int], int]:
    """Units of flow through each (job id, candidate index), from the network described above."""
    import networkx as nx  # lazily: only this arbiter needs it

    unit: dict[tuple[int, int], int] = {}
    top = max((prios[j.id] for j in jobs), default=0.0)
    for job in jobs:
        weight = 1.0 + (prios[job.id] / top if top > 0 else 0.0)
        for i, c in enumerate(candidates.get(job.id, ())):
            unit[(job.id, i)] = -(-round(cfg.cost_weight * c.transfer_cost_ms * weight) // job.devices)
    big_m = max(unit.values(), default=0) + 1
    g = nx.DiGraph()
    total = 0
    for job in jobs:
        dj = job.devices
        total += dj
        g.add_node(("j", job.id), demand=-dj)
        g.add_edge(("j", job.id), "sink", capacity=dj, weight=big_m + round(10 * prios[job.id]))
        for i, c in enumerate(candidates.get(job.id, ())):
            g.add_edge(("j", job.id), ("c", job.id, i), capacity=dj, weight=unit[(job.id, i)])
            for n, dv in c.device_items():
                if free.get(n, 0) > 0:
                    g.add_edge(("c", job.id, i), ("n", n), capacity=dv, weight=0)
    for n, f in free.items():
        if f > 0 and g.has_node(("n", n)):
            g.add_edge(("n", n), "sink", capacity=f, weight=0)
    g.add_node("sink", demand=total)
    if total == 0:
        return {}
    _, flow = nx.network_simplex(g)
    out: dict[tuple[int, int], int] = {}
    for job in jobs:
        for succ, units in flow[("j", job.id)].items():
            if succ != "sink" and units > 0:
                out[(job.id, succ[2])] = units
    return out


class FlowArbiter:
    name = "flow"

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
        runnable: list[JobView] = []
        for job in ordered:
            why = infeasible_reason(job, index) or missing_data_reason(job, snap, index)
            if why is not None:
                d.reasons[job.id] = why
            else:
                runnable.append(job)
        flow = solve_flow([j for j in runnable if candidates.get(j.id)], candidates, ledger.free, prios, cfg)

        rank = {j.id: pos for pos, j in enumerate(ordered)}

        def share(job: JobView) -> float:
            return max((u for (jid, _), u in flow.items() if jid == job.id), default=0) / job.devices

        by_job: dict[int, list[tuple[int, int]]] = {}
        for (jid, i), u in flow.items():
            by_job.setdefault(jid, []).append((u, i))
        for job in sorted((j for j in runnable if j.id in by_job), key=lambda j: (-share(j), rank[j.id])):
            cands = candidates[job.id]
            for _, i in sorted(by_job[job.id], key=lambda ui: (-ui[0], candidate_key(cands[ui[1]]))):
                if ledger.fits(cands[i]):
                    ledger.take(cands[i])
                    d.bindings[job.id] = cands[i]
                    break

        for job in runnable:  # work-conserving pass, in priority order
            if job.id in d.bindings:
                continue
            cands = list(candidates.get(job.id, ()))
            fitting = [c for c in cands if ledger.fits(c)]
            if not fitting and ledger.may_fit(job.ranks, job.devices_per_rank):
                fitting = propose(job, snap, cfg, index, free=ledger.free, quick=True)
            if not fitting:
                d.reasons[job.id] = devices_busy(job.devices, ledger.total)
                continue
            best = min(fitting, key=candidate_key)
            ledger.take(best)
            d.bindings[job.id] = best

        for job in runnable:
            chosen = d.bindings.get(job.id)
            for i, c in enumerate(candidates.get(job.id, ())):
                if c is chosen:
                    continue
                d.candidate_reasons[(job.id, i)] = busy_reason(c, ledger.free) or not_taken("the flow chose another")
        return d
