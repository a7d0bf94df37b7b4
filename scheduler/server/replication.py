"""Phase 7 of the cycle: plan re-replication, copies for shards with fewer healthy replicas than their
data set requires, at most a fixed number in flight cluster-wide (``schedule_replication``)."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.core.diskfloor import under_floor
from scheduler.core.lifecycle import NodeState, ReplicaState, TransferState
from scheduler.core.replicas import place_replicas
from scheduler.server.service import record
from scheduler.store.models import Dataset, Node, Replica, Shard, Transfer
from scheduler.store.room_reader import node_room

IN_FLIGHT = (TransferState.PENDING, TransferState.RUNNING)  # a re-replication copy not yet over
# A copy the server expects on a node (an upload of `data make`, a file `data add` links) counts as
# on its way for this long; one not reported by then is made again elsewhere.
STAGING_GRACE_S = 120.0


def schedule_replication(s: Session, now: float, concurrency: int, disk_floor_bytes: int = 0) -> int:
    """Plan copies for shards with fewer healthy replicas (on up nodes) than their data set requires.

    At most ``concurrency`` re-replication transfers are in flight cluster-wide, so training traffic
    is not starved.  Corrupt copies are replaced first on the same node (a repair), else elsewhere.
    A copy expected on a node (state STAGING, for ``STAGING_GRACE_S``) counts as one on its way.
    A drained node, or one whose reported free disk is under ``disk_floor_bytes``, takes no copy.
    """
    inflight = s.scalar(select(func.count()).select_from(Transfer).where(
        Transfer.job_id.is_(None), Transfer.state.in_(IN_FLIGHT))) or 0
    budget = concurrency - inflight
    if budget <= 0:
        return 0
    rows = s.execute(select(Node.name, Node.rack, Node.free_bytes, Node.drained_at)
                     .where(Node.state == NodeState.UP).order_by(Node.name)).all()
    up = [(name, rack) for name, rack, _, _ in rows]
    drained = {name for name, _, free, at in rows  # a source of copies, never a destination
               if at is not None or under_floor(free, disk_floor_bytes)}
    if not up:
        return 0
    room: dict[str, int] | None = None  # read once a copy is wanted: less transfers in flight and checkpoints
    up_names = {n for n, _ in up}
    inflight_keys = {(ds, i, dst) for ds, i, dst in s.execute(select(Transfer.dataset, Transfer.shard, Transfer.dst).where(
        Transfer.job_id.is_(None), Transfer.state.in_(IN_FLIGHT)))}
    # Plain column reads (no ORM objects): this runs every cycle over every replica in the cluster.
    node_bytes: dict[str, int] = defaultdict(int)
    sizes = {(ds, i): size for ds, i, size in s.execute(select(Shard.dataset, Shard.index, Shard.bytes))}
    reps: dict[tuple[str, int], list[tuple[str, str]]] = defaultdict(list)
    # Bytes of each data set per node (healthy copies and copies on their way): a lost node's shards
    # are re-made together on one node (place_replicas' group rule), not scattered shard by shard.
    ds_bytes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    arriving: dict[tuple[str, int], list[str]] = defaultdict(list)  # expected copies, within the grace
    for ds, i, node, state, updated in s.execute(select(Replica.dataset, Replica.shard, Replica.node, Replica.state,
                                                        Replica.updated_at)):
        reps[(ds, i)].append((node, state))
        if state == ReplicaState.STAGING and node in up_names and updated is not None and now - updated < STAGING_GRACE_S:
            arriving[(ds, i)].append(node)
        if state == ReplicaState.HEALTHY and node in up_names:
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
        healthy = [node for node, state in rs if state == ReplicaState.HEALTHY and node in up_names]
        if not healthy or len(healthy) >= want:
            continue
        pending_dst = [dst for (d, i, dst) in inflight_keys if d == ds and i == index]
        have = list(dict.fromkeys(healthy + pending_dst + arriving.get((ds, index), [])))
        if len(have) >= want:
            continue
        # Nodes holding a corrupt or missing copy come first: repair in place.
        repair = [node for node, state in rs if state in (ReplicaState.CORRUPT, ReplicaState.MISSING) and node in up_names
                  and node not in have]
        group = {n: b - (size if n in have else 0) for n, b in ds_bytes[ds].items()}
        if room is None:
            room = node_room(s, ((name, free) for name, _, free, _ in rows))
        plan = place_replicas([(index, size)], up, want, exclude=drained, existing={index: have}, node_bytes=node_bytes,
                              group_bytes=group, room=room)
        targets = [n for n in plan.get(index, []) if n not in have]
        targets = sorted(targets, key=lambda n: (n not in repair, n))
        for dst in targets[: want - len(have)]:
            if made >= budget:
                return made
            src = min(healthy, key=lambda n: (racks.get(n) != racks.get(dst), n))
            s.add(Transfer(job_id=None, dataset=ds, shard=index, src=src, dst=dst, bytes=size,
                           state=TransferState.PENDING, created_at=now))
            inflight_keys.add((ds, index, dst))
            node_bytes[dst] += size
            ds_bytes[ds][dst] += size
            if dst in room:
                room[dst] -= size
            record(s, now, "server", "replica.copy", f"{ds}/{index}: {src} -> {dst}", node=dst)
            made += 1
    return made
