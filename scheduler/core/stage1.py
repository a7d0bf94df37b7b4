"""Stage 1, local: propose up to k whole-gang candidate placements for one pending job.

Contract
--------
:func:`propose` is a pure function of (job, snapshot, config[, index, free]): it reads nothing else,
mutates nothing, and keeps no state between calls, so the jobs of one cycle may be evaluated in any
order or in parallel (threads or processes).  :class:`Stage1Index` holds what every job of one
snapshot needs (per data set: which live node holds which shard; nodes ordered by free devices); build
it once per snapshot with :func:`build_index` and pass it to every call.  With the index the work per
job is about O(replicas of its shards + k * ranks), not O(nodes).

A candidate (see :class:`scheduler.core.placement.Candidate`) places every rank of the gang at once,
each rank on ``devices_per_rank`` free devices of one node (ranks may spread across nodes), and
assigns every shard of the job's data set to exactly one rank:

- each rank gets ``floor(n/R)`` or ``ceil(n/R)`` of the ``n`` shards (within one shard of even);
- under that constraint local reads are maximized (greedy, most constrained shard first, then
  augmenting paths that move local shards between nodes holding them);
- every other shard goes to the rank whose node is closest to one of its replicas, and is staged from
  the cheapest replica by the cost model (ties by node name);
- ``transfer_cost_ms`` is the SUM of the per-shard costs (each rounded up on its own), i.e. it assumes
  the shards are staged one after another over one link, which is what
  :func:`scheduler.core.costmodel.reads_cost_ms` recomputes.

Placements tried ("variants"): data holders first (ranks where the data is; among holders of as
many bytes, the least contended first), fewest nodes (largest free first; holders win ties), spread
(one rank per node), the job's ``prefer_nodes`` first, the data-holders placement again avoiding the
first one's nodes (a disjoint fallback for the arbiter), and calm (the least contended nodes: where a
job that must stage anyway takes the least local room from others; a gang whole on one node if one
has room).  Duplicates are dropped; the rest are sorted by :func:`candidate_order` and the first
``cfg.candidates_per_job`` returned.

Contention (:func:`node_contention`, once per snapshot in the index): a node holding every shard of a
data set can run any one-rank job of it locally; if ``F_d`` devices are free on the nodes holding
``d`` whole, one of them is ``1/F_d`` of ``d``'s free local room.  A node's contention sums that over
the data sets it holds whole.  Candidate order: local enough (cost within
``cfg.locality_threshold_ms``) first, by (cost, nodes, contention); then the rest by (contention,
cost, nodes); ties by node names.  Replays of real traces showed jobs missing locality mostly because
every holder of their data was busy while devices were free elsewhere; taking the least contended
devices keeps local room where it is scarce (``benchmarks/RESULTS.md``, quality).

:func:`infeasible_reason` says whether a job can never run on this cluster (whatever is busy).
:func:`missing_data_reason` says whether its data cannot be read now (a shard with no live copy).
Both answer with a :class:`~scheduler.core.reasons.Reason` (its kind and words), or None.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.core.costmodel import cost_ms_at
from scheduler.core.placement import Candidate, ShardRead
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.reasons import Reason, ReasonKind
from scheduler.core.snapshot import JobView, ShardView, Snapshot


@dataclass(frozen=True)
class DatasetIndex:
    """One data set's shards and where their live copies are (built once per snapshot)."""

    name: str
    shards: tuple[ShardView, ...]
    sources: tuple[tuple[str, ...], ...]  # per shard position: live nodes with a copy, by name
    holders: tuple[str, ...]  # live nodes holding any shard, by (-local bytes, name)
    local_bytes: Mapping[str, int]
    local_shards: Mapping[str, int]  # node -> number of shards it holds
    missing: tuple[int, ...]  # shard indices without a live copy


@dataclass(frozen=True)
class Stage1Index:
    """Per-snapshot lookups shared read-only by every :func:`propose` call of one cycle."""

    racks: Mapping[str, str]
    devices: Mapping[str, int]
    free: Mapping[str, int]
    free_desc: tuple[str, ...]  # nodes with free devices, by (-free, name)
    free_desc_by_rack: Mapping[str, tuple[str, ...]]
    datasets: Mapping[str, DatasetIndex]
    device_hist: tuple[tuple[int, int], ...]  # (devices on a node, how many nodes)
    total_devices: int
    max_node_devices: int
    # node -> contention of one of its free devices (see node_contention); empty: all 0
    contention: Mapping[str, float] = field(default_factory=dict)
    calm: tuple[str, ...] = ()  # nodes with free devices, by (contention, -free, name)
    calm_pos: Mapping[str, int] = field(default_factory=dict)  # node -> its position in ``calm``


def _by_rack(names: Iterable[str], racks: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(racks[n], []).append(n)
    return {r: tuple(ns) for r, ns in out.items()}


def node_contention(snap: Snapshot, free: Mapping[str, int]) -> dict[str, float]:
    """How much local room for other data sets a free device of each node stands for.

    A node holding every shard of a data set ``d`` can run any one-rank job of ``d`` with local
    reads.  If ``F_d`` devices are free on such nodes, one of them is ``1/F_d`` of ``d``'s free local
    room; a node's contention is the sum of ``1/F_d`` over the data sets it holds whole (0 for a
    node that holds no data set whole, or has nothing free).  Placements that take low-contention
    devices leave the scarce local room to the jobs that need it.  O(replicas).
    """
    nodes = snap.nodes
    out = dict.fromkeys((n for n in nodes if free.get(n, 0) > 0), 0.0)
    for name, shards in snap.shards.items():
        if not shards:
            continue
        count: dict[str, int] = {}
        for s in shards:
            for n in snap.replicas.get((name, s.index), ()):
                if n in nodes:
                    count[n] = count.get(n, 0) + 1
        whole = [n for n, c in count.items() if c >= len(shards)]
        room = sum(free.get(n, 0) for n in whole)
        for n in whole:
            if n in out:
                out[n] += 1.0 / room
    return out


def index_dataset(snap: Snapshot, name: str, contention: Mapping[str, float] | None = None) -> DatasetIndex:
    """Where the live copies of data set ``name`` are (an empty index for an unknown data set).

    Holders are ordered by local bytes (most first), then by ``contention`` (least first), then name.
    """
    shards = tuple(snap.shards.get(name, ()))
    nodes = snap.nodes
    sources: list[tuple[str, ...]] = []
    local_bytes: dict[str, int] = {}
    local_shards: dict[str, int] = {}
    missing: list[int] = []
    for s in shards:
        src = tuple(sorted({n for n in snap.replicas.get((name, s.index), ()) if n in nodes}))
        sources.append(src)
        if not src:
            missing.append(s.index)
        for n in src:
            local_bytes[n] = local_bytes.get(n, 0) + s.bytes
            local_shards[n] = local_shards.get(n, 0) + 1
    con = contention or {}
    holders = tuple(sorted(local_bytes, key=lambda n: (-local_bytes[n], con.get(n, 0.0), n)))
    return DatasetIndex(name, shards, tuple(sources), holders, local_bytes, local_shards, tuple(missing))


def build_index(snap: Snapshot, datasets: Iterable[str] | None = None) -> Stage1Index:
    """Build the per-snapshot index (O(nodes log nodes + replicas)).

    ``datasets`` limits the data sets indexed (default: those of the pending jobs); :func:`propose`
    indexes any other data set on the fly.
    """
    nodes = snap.nodes
    racks = {n: v.rack for n, v in nodes.items()}
    devices = {n: v.devices for n, v in nodes.items()}
    free = {n: max(0, min(v.free, v.devices)) for n, v in nodes.items()}
    free_desc = tuple(sorted((n for n in nodes if free[n] > 0), key=lambda n: (-free[n], n)))
    if datasets is None:
        datasets = {j.dataset for j in snap.pending if j.dataset is not None}
    hist = Counter(devices.values())
    contention = node_contention(snap, free)
    calm = tuple(sorted(contention, key=lambda n: (contention[n], -free[n], n)))
    return Stage1Index(
        racks=racks,
        devices=devices,
        free=free,
        free_desc=free_desc,
        free_desc_by_rack=_by_rack(free_desc, racks),
        datasets={d: index_dataset(snap, d, contention) for d in sorted(datasets)},
        device_hist=tuple(sorted(hist.items())),
        total_devices=sum(devices.values()),
        max_node_devices=max(devices.values(), default=0),
        contention=contention,
        calm=calm,
        calm_pos={n: i for i, n in enumerate(calm)},
    )


def infeasible_reason(job: JobView, index: Stage1Index) -> Reason | None:
    """Why the job can never run on this cluster even when every device is idle (a ``too_large``
    reason; ``other`` for a gang of no devices); None if it can."""
    if job.ranks <= 0 or job.devices_per_rank <= 0:
        return Reason(ReasonKind.OTHER, "a job needs at least one rank of at least one device")
    if job.devices > index.total_devices:
        return Reason(
            ReasonKind.TOO_LARGE,
            # Only up nodes are in the snapshot (submit already checked every known node), so a job
            # can read this while nodes are down: say so rather than "more than exist".
            f"more devices than the cluster has up: needs {job.devices}, the up nodes have {index.total_devices}",
        )
    if job.devices_per_rank > index.max_node_devices:
        return Reason(
            ReasonKind.TOO_LARGE,
            f"each rank needs {job.devices_per_rank} devices on one node; "
            f"the largest node has {index.max_node_devices}",
        )
    fit = sum(count * (d // job.devices_per_rank) for d, count in index.device_hist)
    if fit < job.ranks:
        return Reason(
            ReasonKind.TOO_LARGE,
            f"{job.ranks} ranks of {job.devices_per_rank} devices do not fit on the cluster's nodes "
            f"(at most {fit} such ranks)",
        )
    return None


def dataset_of(job: JobView, snap: Snapshot, index: Stage1Index) -> DatasetIndex | None:
    """The job's data set index (None for a job without data); indexed on the fly if not in ``index``."""
    if job.dataset is None:
        return None
    ds = index.datasets.get(job.dataset)
    return ds if ds is not None else index_dataset(snap, job.dataset, index.contention)


def missing_data_reason(job: JobView, snap: Snapshot, index: Stage1Index) -> Reason | None:
    """Why the job's data cannot be read now (a ``data_missing`` reason: a shard without any live
    copy); None if it can."""
    ds = dataset_of(job, snap, index)
    if ds is None or not ds.missing:
        return None
    return Reason(
        ReasonKind.DATA_MISSING,
        f"data set {ds.name!r}: {len(ds.missing)} shard(s) have no copy on a live node "
        f"(first: shard {ds.missing[0]})",
    )


# --- placement variants: each returns node -> ranks, or None when the gang does not fit -----------


class FreeDevices(Mapping[str, int]):
    """Free devices per node, kept in fill order (most free first, then name) under updates.

    For callers that re-run :func:`propose` over changing free devices (the arbiters): build one,
    :meth:`set` it as devices are given away, and pass it as ``free``; it is then not re-sorted on
    every call.  :func:`propose` only reads it.  Nodes not in ``racks`` and nodes with nothing free
    are left out.
    """

    def __init__(self, free: Mapping[str, int], racks: Mapping[str, str]):
        self._racks = racks
        self._free: dict[str, int] = {}
        self._buckets: dict[int, list[str]] = {}
        self._rack_buckets: dict[str, dict[int, list[str]]] = {}
        for n in sorted(free):
            f = free[n]
            if f > 0 and n in racks:
                self._free[n] = f
                self._buckets.setdefault(f, []).append(n)
                self._rack_buckets.setdefault(racks[n], {}).setdefault(f, []).append(n)

    def __getitem__(self, node: str) -> int:
        return self._free[node]

    def get(self, node: str, default: int = 0) -> int:  # type: ignore[override]
        return self._free.get(node, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._free)

    def __len__(self) -> int:
        return len(self._free)

    @property
    def counts(self) -> Mapping[str, int]:
        """The same free devices as a plain dict, kept current by :meth:`set`: a caller that reads
        many nodes (an arbiter's fit checks) looks them up without a Python call each.  Read-only."""
        return self._free

    def set(self, node: str, free: int) -> None:
        """Node ``node`` now has ``free`` free devices (0 removes it)."""
        old = self._free.get(node, 0)
        if old == free:
            return
        rack = self._racks[node]
        if old > 0:
            for b in (self._buckets, self._rack_buckets[rack]):
                names = b[old]
                names.pop(bisect.bisect_left(names, node))
                if not names:
                    del b[old]
            del self._free[node]
        if free > 0:
            self._free[node] = free
            bisect.insort(self._buckets.setdefault(free, []), node)
            bisect.insort(self._rack_buckets.setdefault(rack, {}).setdefault(free, []), node)

    def desc(self, min_free: int, rack: str | None = None) -> Iterator[str]:
        """Nodes (of ``rack``, or all) with at least ``min_free`` free, most free first, then name."""
        buckets = self._buckets if rack is None else self._rack_buckets.get(rack, {})
        for f in sorted(buckets, reverse=True):
            if f < min_free:
                return
            yield from buckets[f]


class _Fit:
    """The free devices one propose call sees (the snapshot's, or an override) and the fill order."""

    def __init__(self, job: JobView, index: Stage1Index, free: Mapping[str, int] | None):
        self.dpr = job.devices_per_rank
        self.ranks = job.ranks
        self.index = index
        self.view: FreeDevices | None = None
        if free is None:
            self.free: Mapping[str, int] = index.free
        else:
            self.view = free if isinstance(free, FreeDevices) else FreeDevices(free, index.racks)
            self.free = self.view

    def cap(self, node: str) -> int:
        return self.free.get(node, 0) // self.dpr

    def fill_nodes(self, racks: Sequence[str] = ()) -> Iterable[str]:
        """Nodes with room for one rank: those in ``racks`` first, then all, most free first."""
        seen_racks = set()
        for r in racks:
            if r in seen_racks:
                continue
            seen_racks.add(r)
            yield from self._desc(r)
        for n in self._desc(None):
            if self.index.racks.get(n) not in seen_racks:
                yield n

    def _desc(self, rack: str | None) -> Iterable[str]:
        if self.view is not None:
            yield from self.view.desc(self.dpr, rack)
            return
        names = self.index.free_desc if rack is None else self.index.free_desc_by_rack.get(rack, ())
        for n in names:
            if self.free.get(n, 0) < self.dpr:
                return  # sorted descending: no later node has room either
            yield n


def _fill(fit: _Fit, counts: dict[str, int], remaining: int, exclude: set[str], per_node: int | None) -> int:
    """Add ranks on nodes not yet used (same racks as the used ones first); return ranks left."""
    racks = [fit.index.racks[n] for n in counts]
    for n in fit.fill_nodes(racks):
        if remaining == 0:
            break
        if n in counts or n in exclude:
            continue
        take = min(fit.cap(n), remaining, per_node or remaining)
        counts[n] = take
        remaining -= take
    return remaining


def _topup(fit: _Fit, counts: dict[str, int], remaining: int) -> int:
    """Use the spare room of nodes already chosen, in the order they were chosen."""
    for n in counts:
        if remaining == 0:
            break
        more = min(fit.cap(n) - counts[n], remaining)
        if more > 0:
            counts[n] += more
            remaining -= more
    return remaining


def _holders_first(
    fit: _Fit, ds: DatasetIndex | None, exclude: set[str], first: Sequence[str] = ()
) -> dict[str, int] | None:
    counts: dict[str, int] = {}
    remaining = fit.ranks
    for n in first:
        if remaining and n not in exclude and n not in counts and fit.cap(n) > 0:
            counts[n] = min(fit.cap(n), remaining)
            remaining -= counts[n]
    if ds is not None and ds.shards:
        per_rank = -(-len(ds.shards) // fit.ranks)
        for n in ds.holders:
            if remaining == 0:
                break
            if n in exclude or n in counts:
                continue
            c = fit.cap(n)
            if c > 0:
                want = -(-ds.local_shards[n] // per_rank)
                counts[n] = min(c, want, remaining)
                remaining -= counts[n]
    remaining = _topup(fit, counts, remaining)
    remaining = _fill(fit, counts, remaining, exclude, None)
    return counts if remaining == 0 else None


def _fewest_nodes(fit: _Fit, ds: DatasetIndex | None) -> dict[str, int] | None:
    pool: dict[str, int] = {}
    for n in ds.holders if ds is not None else ():
        if fit.cap(n) > 0:
            pool[n] = fit.cap(n)
    for i, n in enumerate(fit.fill_nodes()):
        if i >= fit.ranks:
            break
        pool[n] = fit.cap(n)
    local = ds.local_bytes if ds is not None else {}
    counts: dict[str, int] = {}
    remaining = fit.ranks
    for n in sorted(pool, key=lambda n: (-pool[n], -local.get(n, 0), n)):
        if remaining == 0:
            break
        counts[n] = min(pool[n], remaining)
        remaining -= counts[n]
    return counts if remaining == 0 else None


def _spread(fit: _Fit, ds: DatasetIndex | None) -> dict[str, int] | None:
    counts: dict[str, int] = {}
    remaining = fit.ranks
    for n in ds.holders if ds is not None else ():
        if remaining == 0:
            break
        if fit.cap(n) > 0:
            counts[n] = 1
            remaining -= 1
    remaining = _fill(fit, counts, remaining, set(), 1)
    remaining = _topup(fit, counts, remaining)
    return counts if remaining == 0 else None


def _calm(fit: _Fit) -> dict[str, int] | None:
    """Ranks on the least contended nodes (most free first among equals): where a job that has to
    stage its data anyway takes the least local room from others.  A gang goes whole to the least
    contended node with room for all its ranks if there is one.

    Only nodes of the snapshot's :attr:`Stage1Index.calm` are used, in that order.  When the arbiter
    has given most devices away, the few nodes still free are put in that order rather than walking
    every node of the snapshot (the 50,000-job cycle called this 1,900 times over 5,000 nodes)."""
    index, ranks = fit.index, fit.ranks
    order: Iterable[str] = index.calm
    if fit.view is not None and 4 * len(fit.view) < len(index.calm):
        pos = index.calm_pos
        order = sorted((n for n in fit.view.desc(fit.dpr) if n in pos), key=pos.__getitem__)
    if ranks > 1:
        for n in order:
            if fit.cap(n) >= ranks:
                return {n: ranks}
    counts: dict[str, int] = {}
    remaining = ranks
    for n in order:
        if remaining == 0:
            break
        c = fit.cap(n)
        if c > 0:
            counts[n] = min(c, remaining)
            remaining -= counts[n]
    return counts if remaining == 0 else None


# --- evaluating a placement: shard assignment, sources, costs --------------------------------------


def _assign_local(
    counts: Mapping[str, int], ds: DatasetIndex, ranks: int
) -> tuple[list[str | None], Callable[[str], bool], Callable[[str], None]]:
    """Assign shards to nodes holding them: local reads maximized within each node's quota.

    A node with ``r`` ranks takes between ``r*floor(n/R)`` and ``r*ceil(n/R)`` shards, and no more
    than ``n mod R`` ranks in all take the ceiling.  Returns the node of each shard position (None
    when not read locally) and the ``room``/``take`` functions that keep enforcing the quotas.
    """
    n = len(ds.shards)
    base, pool = divmod(n, ranks)
    lower = {h: r * base for h, r in counts.items()}
    upper = {h: r * (base + 1) for h, r in counts.items()}
    cnt = dict.fromkeys(counts, 0)
    owner: list[str | None] = [None] * n
    members: dict[str, set[int]] = {h: set() for h in counts}
    state = {"pool": pool}

    def room(h: str) -> bool:
        return cnt[h] < lower[h] or (cnt[h] < upper[h] and state["pool"] > 0)

    def take(h: str) -> None:
        if cnt[h] >= lower[h]:
            state["pool"] -= 1
        cnt[h] += 1

    opts = [tuple(h for h in src if h in counts) for src in ds.sources]
    local_order = sorted(
        (p for p in range(n) if opts[p]), key=lambda p: (len(opts[p]), -ds.shards[p].bytes, p)
    )
    leftover: list[int] = []
    for p in local_order:
        best = None
        for h in opts[p]:
            if room(h):
                key = (cnt[h] - lower[h], h)
                if best is None or key < best[0]:
                    best = (key, h)
        if best is None:
            leftover.append(p)
            continue
        h = best[1]
        owner[p] = h
        members[h].add(p)
        take(h)

    # Augmenting paths: move a local shard to another node holding it to make room for this one.
    for p in leftover:
        prev: dict[str, tuple[int, str | None]] = {}
        queue: deque[str] = deque()
        for h in opts[p]:
            prev[h] = (p, None)
            queue.append(h)
        while queue:
            h = queue.popleft()
            if room(h):
                take(h)
                node: str | None = h
                while node is not None:
                    shard, frm = prev[node]
                    owner[shard] = node
                    members[node].add(shard)
                    if frm is not None:
                        members[frm].discard(shard)
                    node = frm
                break
            for t in sorted(members[h]):
                for g in opts[t]:
                    if g not in prev:
                        prev[g] = (t, h)
                        queue.append(g)

    return owner, room, take


def _evaluate(
    job: JobView, counts: Mapping[str, int], ds: DatasetIndex | None, index: Stage1Index, cfg: PolicyConfig
) -> Candidate:
    nodes = sorted(counts)
    rank_nodes = tuple(h for h in nodes for _ in range(counts[h]))
    if ds is None or not ds.shards:
        return Candidate(job.id, rank_nodes, job.devices_per_rank, (), 0, 0)
    owner, room, take = _assign_local(counts, ds, job.ranks)
    # Remote shards, largest first: to a node with room in a rack holding a copy, else any node.
    racks = index.racks
    rack_nodes: dict[str, list[str]] = {}
    for h in nodes:
        rack_nodes.setdefault(racks[h], []).append(h)
    ptr: dict[str, int] = dict.fromkeys(rack_nodes, 0)
    all_ptr = [0]

    def first_with_room(lst: list[str], i: int) -> int:
        while i < len(lst) and not room(lst[i]):
            i += 1
        return i

    remote = sorted(
        (p for p in range(len(ds.shards)) if owner[p] is None), key=lambda p: (-ds.shards[p].bytes, p)
    )
    for p in remote:
        best: str | None = None
        for r in {racks[s] for s in ds.sources[p]}:  # order is irrelevant: the least name wins
            lst = rack_nodes.get(r)
            if lst is None:
                continue
            ptr[r] = first_with_room(lst, ptr[r])
            if ptr[r] < len(lst) and (best is None or lst[ptr[r]] < best):
                best = lst[ptr[r]]
        if best is None:
            all_ptr[0] = first_with_room(nodes, all_ptr[0])
            best = nodes[all_ptr[0]]
        owner[p] = best
        take(best)

    by_node: dict[str, list[int]] = {h: [] for h in nodes}
    for p, holder in enumerate(owner):
        assert holder is not None  # every shard has a node by now
        by_node[holder].append(p)
    n = len(ds.shards)
    base = n // job.ranks
    reads: list[ShardRead] = []
    total_bytes = 0
    total_ms = 0
    rank = 0
    for h in nodes:
        ps = by_node[h]
        extra = len(ps) - counts[h] * base
        i = 0
        for k in range(counts[h]):
            take_n = base + (1 if k < extra else 0)
            for p in ps[i : i + take_n]:
                s = ds.shards[p]
                src, ms = _source(h, ds.sources[p], s.bytes, racks, cfg)
                if src != h:
                    total_bytes += s.bytes
                    total_ms += ms
                reads.append(ShardRead(s.index, rank + k, h, src, s.bytes))
            i += take_n
        rank += counts[h]
    return Candidate(job.id, rank_nodes, job.devices_per_rank, tuple(reads), total_bytes, total_ms)


def _source(
    node: str, sources: Sequence[str], nbytes: int, racks: Mapping[str, str], cfg: PolicyConfig
) -> tuple[str, int]:
    """The cheapest replica of a shard for ``node`` and its cost (ties by node name).

    Bandwidth depends only on same rack or not (:mod:`scheduler.core.costmodel`), so the candidates are the
    first same-rack source and the first other source by name (``sources`` is sorted by name).
    """
    if node in sources:
        return node, 0
    rack = racks.get(node)
    same = other = None
    for s in sources:
        if rack is not None and racks.get(s) == rack:
            same = same or s
        else:
            other = other or s
        if same and other:
            break
    if same is None:
        return other, cost_ms_at(nbytes, cfg.cross_rack_bps)  # type: ignore[return-value]
    via_rack = (cost_ms_at(nbytes, cfg.same_rack_bps), same)
    if other is None:
        return via_rack[1], via_rack[0]
    cost, best = min(via_rack, (cost_ms_at(nbytes, cfg.cross_rack_bps), other))
    return best, cost


def candidate_key(c: Candidate) -> tuple[int, int, tuple[str, ...]]:
    """The plain order: cheapest first, then fewest nodes, then node names."""
    return (c.transfer_cost_ms, len(c.nodes), c.nodes)


def contention_of(c: Candidate, index: Stage1Index) -> float:
    """The contention of the devices a candidate takes (devices x node contention, summed)."""
    con = index.contention
    return c.devices_per_rank * sum(con.get(n, 0.0) for n in c.rank_nodes)


def candidate_order(
    index: Stage1Index, cfg: PolicyConfig
) -> Callable[[Candidate], tuple[int, int, float, float, float, tuple[str, ...]]]:
    """Stage 1's order (and the arbiters' choice among fitting candidates), best first:

    candidates within ``cfg.locality_threshold_ms`` ("local enough") before the others; among local
    ones the cheapest, then fewest nodes, then the least contended (:func:`contention_of`); among the
    others, those staging a smaller share of the job's bytes first (in eighths), then the least
    contended, then the cheapest, then fewest nodes: placements that stage about as much pay about
    the same wherever they go, so they should take the devices least useful for other data sets'
    local reads, but a gang that can read half its data locally must not be sent where it reads
    none.  Last, node names.  With no data set held whole anywhere every contention is 0 and this is
    the plain order of :func:`candidate_key` within each class.
    """
    limit = cfg.locality_threshold_ms

    def key(c: Candidate) -> tuple[int, int, float, float, float, tuple[str, ...]]:
        con = contention_of(c, index)
        if c.transfer_cost_ms <= limit:
            return (0, 0, c.transfer_cost_ms, len(c.nodes), con, c.nodes)
        staged_eighths = round(8 * (1.0 - c.local_fraction))
        return (1, staged_eighths, con, c.transfer_cost_ms, len(c.nodes), c.nodes)

    return key


def propose_packed(
    job: JobView,
    snap: Snapshot,
    cfg: PolicyConfig,
    index: Stage1Index | None = None,
    free: Mapping[str, int] | None = None,
) -> Candidate | None:
    """One data-blind placement: fewest nodes, most free first, ties by name (None if no fit).

    For baselines that ignore data (``policies.fairshare``); its reads and costs are still computed
    (local reads happen only by chance).  Pure.
    """
    if index is None:
        index = build_index(snap, [job.dataset] if job.dataset else [])
    if infeasible_reason(job, index) is not None:
        return None
    ds = dataset_of(job, snap, index)
    if ds is not None and ds.missing:
        return None
    counts = _fewest_nodes(_Fit(job, index, free), None)
    return None if counts is None else _evaluate(job, counts, ds, index, cfg)


def propose(
    job: JobView,
    snap: Snapshot,
    cfg: PolicyConfig,
    index: Stage1Index | None = None,
    free: Mapping[str, int] | None = None,
    quick: bool = False,
) -> list[Candidate]:
    """Up to ``cfg.candidates_per_job`` whole-gang candidates for ``job``, best first.

    ``index`` must be built from ``snap`` (built here when omitted: fine for tests, slow at scale).
    ``free`` overrides the free devices per node (the arbiters use it to re-propose over what is left
    in this cycle, or over all devices to ask "where could it run with zero cost?"); nodes missing from
    it have none.  Returns [] when the job cannot be placed over those free devices, can never run
    (:func:`infeasible_reason`), or its data cannot be read (:func:`missing_data_reason`).
    ``quick`` tries only the data-holders-first placement (fewest nodes if that fails): for the
    arbiters' re-proposals within a cycle, where speed matters more than variety.  Pure and idempotent.
    """
    if index is None:
        index = build_index(snap, [job.dataset] if job.dataset else [])
    if infeasible_reason(job, index) is not None:
        return []
    ds = dataset_of(job, snap, index)
    if ds is not None and ds.missing:
        return []
    fit = _Fit(job, index, free)
    layouts: list[dict[str, int] | None] = [_holders_first(fit, ds, set())]
    if not quick or layouts[0] is None:
        layouts.append(_fewest_nodes(fit, ds))
    if not quick:
        layouts.append(_spread(fit, ds))
    if job.prefer_nodes:
        layouts.append(_holders_first(fit, ds, set(), job.prefer_nodes))
    if layouts[0] is not None and not quick:
        layouts.append(_holders_first(fit, ds, set(layouts[0])))
    seen: set[tuple[tuple[str, int], ...]] = set()
    out: list[Candidate] = []

    def add(counts: dict[str, int] | None) -> None:
        if counts is None:
            return
        key = tuple(sorted(counts.items()))
        if key not in seen:
            seen.add(key)
            out.append(_evaluate(job, counts, ds, index, cfg))

    for counts in layouts:
        add(counts)
    if ds is not None and ds.shards and not quick:
        add(_calm(fit))
    out.sort(key=candidate_order(index, cfg))
    return out[: max(0, cfg.candidates_per_job)]
