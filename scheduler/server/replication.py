"""Phase 7 of the cycle: copies between nodes for the data sets' layouts (``schedule_replication``).

Each data set has a *target* layout: ``scheduler.core.replicas.lay_out`` for its R copies and its span,
given the copies it has now (``held=``), so a layout that has the shape is its own target.  Its span
follows its jobs: the node count most of its latest jobs spanned (``observed_span`` of
``Dataset.job_spans``, which the binder writes); before any job, the span it was made with.  Two steps:

1. **Missing copies**: a shard with fewer healthy copies (on up nodes) than R gets new ones, on the
   target's nodes (a lost node's copies are made again in the shape the data set had, a stripe as a
   stripe), a corrupt copy repaired in place first.
2. **Re-balance**, once some job has read the data set (before, its layout is what it was made or
   registered with): with the concurrency left, copies the target has and the layout lacks are made;
   a copy the target does not have is dropped once every copy the target has of that shard is healthy
   and R healthy copies stay without it, and never while a job not yet over reads it; with a node
   cache (``node_cache_gb``) each node keeps the most recently read of those copies up to its size
   (``_keep_cached``).

At most ``concurrency`` copies are in flight cluster-wide, so training traffic is not starved.  A data
set with a copy on a drained node is not re-balanced (it gets missing copies only) until the node is
resumed or gone: a drain takes no new work, and moving its data away is not what it asked for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Row, func, null, select
from sqlalchemy.orm import Session

from scheduler.core.diskfloor import under_floor
from scheduler.core.lifecycle import ACTIVE, STAGING_GRACE_S, NodeState, ReplicaState, TransferState
from scheduler.core.replicas import lay_out, observed_span, place_replicas
from scheduler.server.service import record
from scheduler.store.models import Dataset, Job, Node, Replica, Shard, ShardAssignment, Transfer
from scheduler.store.room_reader import node_room

IN_FLIGHT = (TransferState.PENDING, TransferState.RUNNING)  # a re-replication copy not yet over


@dataclass
class _Copies:
    """What the phase reads once: the up nodes, every copy, the copies on their way, the data sets."""

    up: list[tuple[str, str]]
    drained: set[str]
    room: dict[str, int]
    sizes: dict[tuple[str, int], int]
    reps: dict[tuple[str, int], list[tuple[str, str]]]
    arriving: dict[tuple[str, int], list[str]]
    inflight: set[tuple[str, int, str]]
    node_bytes: dict[str, int]
    ds_bytes: dict[str, dict[str, int]]
    required: dict[str, int]
    span: dict[str, int]
    in_use: set[tuple[str, int, str]]
    seen: set[str] = field(default_factory=set)  # data sets some job has read: those are re-balanced
    targets: dict[str, dict[int, list[str]]] = field(default_factory=dict)
    up_names: set[str] = field(default_factory=set)
    shards: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # data set -> (index, bytes)
    recency: dict[tuple[str, int, str], float] = field(default_factory=dict)  # copy -> came or last read

    def __post_init__(self) -> None:
        self.up_names = {n for n, _ in self.up}
        by_ds: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for (ds, i), size in sorted(self.sizes.items()):
            by_ds[ds].append((i, size))
        self.shards = dict(by_ds)

    def healthy(self, ds: str, index: int) -> list[str]:
        up = self.up_names
        return [n for n, st in self.reps.get((ds, index), []) if st == ReplicaState.HEALTHY and n in up]

    def have(self, ds: str, index: int) -> list[str]:
        """Healthy copies, copies being made and copies expected: where the shard is or soon will be."""
        pending = sorted(dst for (d, i, dst) in self.inflight if d == ds and i == index)
        return list(dict.fromkeys(self.healthy(ds, index) + pending + self.arriving.get((ds, index), [])))

    def target(self, ds: str) -> dict[int, list[str]]:
        """The data set's target layout, worked out once per cycle from the copies it has."""
        if ds not in self.targets:
            shards = self.shards.get(ds, [])
            nodes = [(n, r) for n, r in self.up if n not in self.drained]
            held = {i: self.have(ds, i) for i, _ in shards}
            self.targets[ds] = lay_out(shards, nodes, self.required.get(ds, 0), span=self.span.get(ds, 1),
                                       node_bytes=self.node_bytes, room=self.room, held=held)
        return self.targets[ds]


def schedule_replication(s: Session, now: float, concurrency: int, disk_floor_bytes: int = 0,
                         cache_bytes: int = 0) -> int:
    """Plan this cycle's copies between nodes: missing copies first, then re-balancing (see the module).

    Called by the cycle once a cycle, in its transaction; adds PENDING transfers (at most ``concurrency``
    minus those already in flight) and DELETE orders for surplus copies, and returns how many copies it
    planned.  Idempotent within a cycle's state: a copy planned is in flight and is not planned again.
    A copy expected on a node (state STAGING, for ``STAGING_GRACE_S``) counts as one on its way, and so
    does a shard a job not yet over stages onto the node of one of its ranks.
    A drained node, or one whose reported free disk is under ``disk_floor_bytes``, takes no copy; the
    room of the others is their free disk less transfers in flight and checkpoints
    (``scheduler.store.room_reader.node_room``).
    """
    inflight_n = s.scalar(select(func.count()).select_from(Transfer).where(
        Transfer.job_id.is_(None), Transfer.state.in_(IN_FLIGHT))) or 0
    rows = s.execute(select(Node.name, Node.rack, Node.free_bytes, Node.drained_at)
                     .where(Node.state == NodeState.UP).order_by(Node.name)).all()
    if not rows:
        return 0
    c = _read(s, now, rows, disk_floor_bytes, cached=cache_bytes > 0)
    _follow_jobs(s, now, c)
    budget = max(0, concurrency - inflight_n)
    made = _missing_copies(s, now, c, budget)
    made += _rebalance(s, now, c, budget - made, cache_bytes, disk_floor_bytes)
    return made


def _read(s: Session, now: float, rows: Sequence[Row[str, str, int, float | None]], disk_floor_bytes: int,
          cached: bool = True) -> _Copies:
    """What the phase decides on; ``cached`` False (no node cache): without each copy's recency, which
    only the cache's choice of what to keep reads."""
    up = [(name, rack) for name, rack, _, _ in rows]
    up_names = {n for n, _ in up}
    inflight = {(ds, i, dst) for ds, i, dst in s.execute(select(Transfer.dataset, Transfer.shard, Transfer.dst).where(
        Transfer.job_id.is_(None), Transfer.state.in_(IN_FLIGHT)))}
    # Plain column reads (no ORM objects): this runs every cycle over every replica in the cluster.
    node_bytes: dict[str, int] = defaultdict(int)
    sizes = {(ds, i): size for ds, i, size in s.execute(select(Shard.dataset, Shard.index, Shard.bytes))}
    reps: dict[tuple[str, int], list[tuple[str, str]]] = defaultdict(list)
    # Bytes of each data set per node (healthy copies and copies on their way): a lost node's shards
    # are re-made together (place_replicas' group rule), not scattered shard by shard.
    ds_bytes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    arriving: dict[tuple[str, int], list[str]] = defaultdict(list)  # expected copies, within the grace
    recency: dict[tuple[str, int, str], float] = {}  # when a copy came or was last read where it lies
    read_col = Replica.last_read_at if cached else null()
    for ds, i, node, state, updated, read_at in s.execute(
            select(Replica.dataset, Replica.shard, Replica.node, Replica.state, Replica.updated_at, read_col)):
        reps[(ds, i)].append((node, state))
        if cached:
            recency[(ds, i, node)] = max(updated or 0.0, read_at or 0.0)
        if state == ReplicaState.STAGING and node in up_names and updated is not None and now - updated < STAGING_GRACE_S:
            arriving[(ds, i)].append(node)
        if state == ReplicaState.HEALTHY and node in up_names:
            node_bytes[node] += sizes.get((ds, i), 0)
            ds_bytes[ds][node] += sizes.get((ds, i), 0)
    for ds, i, dst in inflight:
        ds_bytes[ds][dst] += sizes.get((ds, i), 0)
        node_bytes[dst] += sizes.get((ds, i), 0)
    required: dict[str, int] = {}
    span: dict[str, int] = {}
    for name, r, sp in s.execute(select(Dataset.name, Dataset.replicas_required, Dataset.span)):
        required[name], span[name] = r, sp
    # Copies a job not yet over reads (on its node) or stages from: never dropped under it.  A rank that
    # stages a shard onto its node leaves a copy there (the agent keeps what it staged and reports it):
    # that copy is on its way as much as a planned one, and planning another over the same link to the
    # same node would send the bytes twice.
    in_use: set[tuple[str, int, str]] = set()
    for ds, i, node, src in s.execute(
            select(ShardAssignment.dataset, ShardAssignment.shard, ShardAssignment.node, ShardAssignment.source)
            .join(Job, (Job.id == ShardAssignment.job_id) & (Job.attempt == ShardAssignment.attempt))
            .where(Job.state.in_(ACTIVE))):
        in_use.update({(ds, i, node), (ds, i, src)})
        if src != node and node in up_names and node not in arriving[(ds, i)]:
            arriving[(ds, i)].append(node)
    # a drained node, or one under the disk floor, is a source of copies, never a destination
    drained = {name for name, _, free, at in rows if at is not None or under_floor(free, disk_floor_bytes)}
    return _Copies(up=up, drained=drained,
                   room=node_room(s, now, ((name, free) for name, _, free, _ in rows)), sizes=sizes, reps=reps,
                   arriving=arriving, inflight=inflight, node_bytes=node_bytes, ds_bytes=ds_bytes, required=required,
                   span=span, in_use=in_use, recency=recency)


def _follow_jobs(s: Session, now: float, c: _Copies) -> None:
    """A data set whose latest jobs span another number of nodes than its span takes theirs (an event)."""
    for d in s.scalars(select(Dataset).order_by(Dataset.name)):
        if d.job_spans:
            c.seen.add(d.name)
        seen = observed_span(d.job_spans or [])
        if seen is not None and seen != d.span:
            record(s, now, "server", "data.span", f"{d.name}: span {d.span} -> {seen}, the span most of its latest "
                                                  f"{len(d.job_spans)} jobs had; re-balancing toward it")
            d.span = c.span[d.name] = seen


def _copy(s: Session, now: float, c: _Copies, ds: str, index: int, dst: str, why: str) -> None:
    """Plan one copy of shard ``index`` of ``ds`` to ``dst`` from its nearest healthy copy."""
    size = c.sizes[(ds, index)]
    racks = dict(c.up)
    src = min(c.healthy(ds, index), key=lambda n: (racks.get(n) != racks.get(dst), n))
    s.add(Transfer(job_id=None, dataset=ds, shard=index, src=src, dst=dst, bytes=size,
                   state=TransferState.PENDING, created_at=now))
    c.inflight.add((ds, index, dst))
    c.node_bytes[dst] += size
    c.ds_bytes[ds][dst] += size
    if dst in c.room:
        c.room[dst] -= size
    record(s, now, "server", why, f"{ds}/{index}: {src} -> {dst}", node=dst)


def _missing_copies(s: Session, now: float, c: _Copies, budget: int) -> int:
    """Step 1: shards with fewer healthy copies than R get copies on their target's nodes."""
    made = 0
    for (ds, index), size in sorted(c.sizes.items()):
        want = c.required.get(ds, 0)
        healthy = c.healthy(ds, index)
        if not healthy or len(healthy) >= want:
            continue
        have = c.have(ds, index)
        if len(have) >= want:
            continue
        # Nodes holding a corrupt or missing copy come first: repair in place.
        repair = [node for node, state in c.reps.get((ds, index), [])
                  if state in (ReplicaState.CORRUPT, ReplicaState.MISSING) and node in c.up_names and node not in have]
        targets = [n for n in c.target(ds).get(index, []) if n not in have]
        if len(have) + len(targets) < want:  # the target cannot give them all (too few nodes): any node will do
            group = {n: b - (size if n in have else 0) for n, b in c.ds_bytes[ds].items()}
            plan = place_replicas([(index, size)], c.up, want, exclude=c.drained, existing={index: have},
                                  node_bytes=c.node_bytes, group_bytes=group, room=c.room)
            targets += [n for n in plan.get(index, []) if n not in have and n not in targets]
        for dst in sorted(targets, key=lambda n: (n not in repair, n))[: want - len(have)]:
            if made >= budget:
                return made
            _copy(s, now, c, ds, index, dst, "replica.copy")
            made += 1
    return made


def _rebalance(s: Session, now: float, c: _Copies, budget: int, cache_bytes: int = 0, floor: int = 0) -> int:
    """Step 2: move each data set's layout toward its target, copies first, surplus dropped after (or kept
    in its node's cache: ``_keep_cached``)."""
    made = 0
    surplus: list[tuple[str, int, str]] = []
    for ds in sorted(c.seen):
        want = c.required.get(ds, 0)
        shards = [i for i, _ in c.shards.get(ds, [])]
        if any(n in c.drained for i in shards for n, _ in c.reps.get((ds, i), [])):
            continue
        target = c.target(ds)
        for index in shards:
            if not c.healthy(ds, index):
                continue
            for dst in (n for n in target.get(index, []) if n not in c.have(ds, index)):
                if made >= budget:
                    break
                _copy(s, now, c, ds, index, dst, "replica.rebalance")
                made += 1
        for index in shards:
            healthy = c.healthy(ds, index)
            goal = target.get(index, [])
            if not goal or not all(n in healthy for n in goal):
                continue
            for node in sorted(n for n in healthy if n not in goal):
                if len(healthy) - 1 < want or (ds, index, node) in c.in_use:
                    continue
                surplus.append((ds, index, node))
                healthy.remove(node)
    kept = _keep_cached(c, surplus, cache_bytes, floor)
    for ds, index, node in surplus:
        if (ds, index, node) not in kept:
            _drop(s, now, ds, index, node)
    return made


def _keep_cached(c: _Copies, surplus: Sequence[tuple[str, int, str]], cache_bytes: int,
                 floor: int) -> set[tuple[str, int, str]]:
    """The node cache: of the copies the layouts no longer need (a copy a rank staged where it ran, the
    old place of one moved), each node keeps the most recently read (or made) up to ``cache_bytes``,
    and never so many that its room (free disk less what is on its way and the checkpoint reserve)
    stays under twice the disk floor: the cache gives its bytes back before the node would stop taking
    work.  The rest are dropped, least recently read first.  What a job reads there next is then read
    where it lies (the simulator's ``cache_gb``).  (A node under the floor or drained keeps what it
    holds: its data sets are not re-balanced at all.)"""
    if cache_bytes <= 0:
        return set()
    by_node: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    for copy in surplus:
        by_node[copy[2]].append(copy)
    kept: set[tuple[str, int, str]] = set()
    for node, copies in by_node.items():
        budget = cache_bytes
        if node in c.room:  # it reports its free disk: what keeping them all would leave it, at most
            held = sum(c.sizes.get(k[:2], 0) for k in copies)
            budget = min(budget, held - max(0, 2 * floor - c.room[node]))
        for copy in sorted(copies, key=lambda k: (-c.recency.get(k, 0.0), k)):
            size = c.sizes.get(copy[:2], 0)
            if size > budget:
                break
            kept.add(copy)
            budget -= size
    return kept


def _drop(s: Session, now: float, ds: str, index: int, node: str) -> None:
    """Drop a surplus copy: forget it and order its node to delete it (its next heartbeat)."""
    r = s.get(Replica, (ds, index, node))
    if r is not None:
        s.delete(r)
    s.add(Transfer(job_id=None, dataset=ds, shard=index, src=node, dst=node, bytes=0, state=TransferState.DELETE,
                   created_at=now))
    record(s, now, "server", "replica.drop", f"{ds}/{index} on {node}: the layout has it elsewhere", node=node)
