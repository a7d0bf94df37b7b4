"""What binding a candidate means, device by device: the bookkeeping the server's binder and the
simulator share.

``plan_binding(cand, healthy, busy, up)`` checks a chosen candidate against the devices as they are at
bind time (every node of the gang up, each with as many free healthy devices as the candidate puts on
it) and, when it fits, gives each rank, in rank order, the lowest free device indexes of its node and
its local rank there; the reads that are not local are the shards to stage.  When it does not fit it
returns why, in words for the job's explanation: the server re-checks this inside the transaction that
writes the binding (scheduler/store/binder.py), so two cycles can never give a device twice; the
simulator, whose decisions are never stale, treats a refusal as a bug (scheduler/sim/simulator.py).

Pure: no session, no clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence, Set
from dataclasses import dataclass

from scheduler.core.placement import Candidate, ShardRead


@dataclass(frozen=True, slots=True)
class RankSlot:
    rank: int
    node: str
    local_rank: int  # among the job's ranks on this node, in rank order
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BindPlan:
    ranks: tuple[RankSlot, ...]
    staging: tuple[ShardRead, ...]  # the reads that are not local: shards to copy to the rank's node

    def devices_by_node(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        for slot in self.ranks:
            out[slot.node].extend(slot.devices)
        return dict(out)


def plan_binding(cand: Candidate, healthy: Mapping[str, Sequence[int]], busy: Mapping[str, Set[int]],
                 up: Collection[str]) -> BindPlan | str:
    """The ranks' devices and the reads to stage for ``cand``, or why it cannot be bound now.

    ``healthy``: node -> its healthy device indexes (ascending); ``busy``: node -> indexes that ranks
    hold; ``up``: the nodes that are up.  Refusals: ``"node N is not up any more"``, ``"devices on N
    became taken|unhealthy since the snapshot (F free, K needed)"`` (taken when enough devices are
    healthy, else unhealthy)."""
    free = {n: [i for i in healthy.get(n, ()) if i not in busy.get(n, frozenset())] for n in cand.nodes}
    for node, need in cand.devices_by_node().items():
        if node not in up:
            return f"node {node} is not up any more"
        if len(free[node]) < need:
            why = "taken" if len(healthy.get(node, ())) >= need else "unhealthy"
            return f"devices on {node} became {why} since the snapshot ({len(free[node])} free, {need} needed)"
    slots = []
    local_index: dict[str, int] = defaultdict(int)
    for rank, node in enumerate(cand.rank_nodes):
        devices, free[node] = free[node][: cand.devices_per_rank], free[node][cand.devices_per_rank:]
        slots.append(RankSlot(rank, node, local_index[node], tuple(devices)))
        local_index[node] += 1
    return BindPlan(tuple(slots), tuple(r for r in cand.reads if not r.local))
