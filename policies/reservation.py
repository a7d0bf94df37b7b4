"""The one reservation of the arbiters that hold one (``twostage``, ``backfill``): when and where a
gang that fits nowhere now could start, as running jobs end by their time limits.

Contract: :func:`plan_reservation` is pure (a snapshot, the devices free after this cycle's earlier
bindings and those bindings' ends in; a :class:`Reservation` or None out) and keeps nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import JobView, Snapshot
from scheduler.core.stage1 import Stage1Index, propose


@dataclass(frozen=True)
class Reservation:
    job_id: int
    need: dict[str, int]  # node -> devices the reserved job will use at start_s
    start_s: float
    held: dict[str, int]  # node -> devices free now that long backfill jobs must leave alone


def plan_reservation(
    job: JobView,
    snap: Snapshot,
    cfg: PolicyConfig,
    index: Stage1Index,
    free_now: Mapping[str, int],
    bound_ends: Sequence[tuple[float, dict[str, int]]],
) -> Reservation | None:
    """When and where ``job`` could start as running jobs end by their time limits (None: never seen).

    ``free_now``: devices free after this cycle's earlier bindings; ``bound_ends``: (end_s, devices by
    node) of the jobs bound earlier in this cycle.  Releases are applied in time order; at each time
    where enough ranks fit, stage 1 is asked for a placement over the devices free then.
    """
    dpr = job.devices_per_rank
    future = {n: f for n, f in free_now.items() if f > 0}
    cap = sum(f // dpr for f in future.values())
    events = [(r.end_by_s, dict(r.devices_by_node)) for r in snap.running] + list(bound_ends)
    events.sort(key=lambda e: e[0])
    for i, (t, dbn) in enumerate(events):
        for n, dv in dbn.items():
            if n not in index.devices:
                continue  # node is gone; its devices come back with it, not with this job's end
            old = future.get(n, 0)
            new = min(old + dv, index.devices[n])
            future[n] = new
            cap += new // dpr - old // dpr
        if i + 1 < len(events) and events[i + 1][0] == t:
            continue
        if cap < job.ranks:
            continue
        cands = propose(job, snap, cfg, index, free=future)
        if not cands:
            continue
        need = cands[0].devices_by_node()
        held = {}
        for n, d in need.items():
            released = future[n] - free_now.get(n, 0)
            h = min(free_now.get(n, 0), max(0, d - released))
            if h > 0:
                held[n] = h
        return Reservation(job.id, need, max(t, snap.now_s), held)
    return None
