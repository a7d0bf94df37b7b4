"""Where the copies of a data set's shards go: whole copies kept together, rack-aware, balanced by bytes.

Used by ``gsched data`` (first placement), by the cycle's replication phase (copies after a node is
lost, and re-balancing toward the span a data set's jobs have: ``lay_out(..., held=)``,
``observed_span``), and by the simulator.  Pure: the same arguments always give the same placement.

Why together: a training rank reads its slice of the data set, and most jobs have one rank, which
reads it all.  Spread shard by shard over the least-loaded nodes (as HDFS spreads blocks), a data
set of 16 shards with 3 copies lands on up to 48 nodes and no node can serve a one-rank job
locally until staging has filled caches.  Kept together, R nodes each hold the whole set from the
start.  In the trace replays (benchmarks/RESULTS.md) this took the local-read fraction from 0.927
to 0.945 (Philly) and 0.925 to 0.950 (ITP), and bytes moved from 3.01 to 2.25 TB and 3.08 to 2.07 TB.

Why striped too (:func:`lay_out`): a gang spanning ``k`` nodes reads ``1/k`` of the data set on each
of them.  With every copy whole on one node, one copy (R = 1) leaves ``k - 1`` of the gang's nodes
staging everything they read.  So a data set has a *span*, how many nodes its jobs spread over: with
span 1 every copy is whole (the case above); with span ``w >= 2`` and R = 1 the copy is striped over
``w`` nodes, and with R >= 2 the first copy stays whole (one-rank jobs) and the others are striped
over ``w`` nodes each (gangs).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence


def place_replicas(
    shards: Sequence[tuple[int, int]],
    nodes: Sequence[tuple[str, str]],
    replicas: int,
    existing: Mapping[int, Sequence[str]] | None = None,
    node_bytes: Mapping[str, int] | None = None,
    group_bytes: Mapping[str, int] | None = None,
    room: Mapping[str, int] | None = None,
    exclude: Collection[str] = (),
) -> dict[int, list[str]]:
    """Nodes for each shard's copies: shard index -> node names (existing copies first).

    ``shards``: (index, bytes) of one data set (the *group*); ``nodes``: (name, rack) of the nodes that
    may take copies; ``existing``: shard index -> nodes that already hold a healthy copy (kept as they
    are; only the missing copies are added); ``node_bytes``: bytes each node already stores (when
    omitted, counted from ``existing``; so pass it only if it includes those copies);
    ``group_bytes``: bytes of this data set each node holds outside ``shards`` (re-replication passes
    the other shards' copies; when omitted, counted from ``existing``); ``room``: bytes each node may
    still take (free disk); a node missing from it is not limited; ``exclude``: nodes that take no new
copy (their existing copies still count, for the rack rule too).

    Rules, in order:

    1. ``replicas`` copies on distinct nodes (fewer if there are fewer nodes);
    2. with at least two racks the copies of a shard are never all in one rack;
    3. a copy goes where it fits: a node whose ``room`` is smaller than the shard is passed over
       (unless no allowed node has room: then the least-loaded allowed node, best effort);
    4. copies are kept together: a new copy goes to the allowed node already holding the most bytes
       of the group (its earlier shards in this call count), ties to the least loaded;
    5. otherwise to the least-loaded allowed node by bytes, ties by name.

    Shards are placed largest first (then by index).  So a new data set's R copies each land whole on
    one node, on the R least-loaded nodes (rack-aware); a copy that does not fit spills over to the
    next least-loaded node and continues there; a lost node's shards are re-made together on one node.
    """
    existing = existing or {}
    rack = dict(nodes)
    sizes = dict(shards)
    load: dict[str, int] = dict.fromkeys(rack, 0)
    counted: dict[str, int] = dict.fromkeys(rack, 0)  # group bytes per node, counted from existing
    for idx, holders in existing.items():
        for n in holders:
            if n in load:
                counted[n] += sizes.get(idx, 0)
    if node_bytes is not None:
        for n, b in node_bytes.items():
            if n in load:
                load[n] = b
    else:
        load.update(counted)
    together: dict[str, int] = {}
    for n, b in (group_bytes.items() if group_bytes is not None else counted.items()):
        if n in rack and b > 0:
            together[n] = b
    left: dict[str, int] = {n: b for n, b in (room or {}).items() if n in rack}
    n_racks = len(set(rack.values()))
    heap = [(b, n) for n, b in load.items()]
    heapq.heapify(heap)

    def fits(n: str, nbytes: int) -> bool:
        return left.get(n, nbytes) >= nbytes

    def least_loaded(taken: list[str], banned: set[str | None], nbytes: int, need_room: bool) -> str | None:
        """The least-loaded node not in ``taken``, not in a ``banned`` rack (with room if asked)."""
        skipped = []
        chosen = None
        while heap:
            b, n = heapq.heappop(heap)
            if b != load[n]:
                continue  # stale entry
            skipped.append((b, n))
            if n not in taken and n not in exclude and rack[n] not in banned and (not need_room or fits(n, nbytes)):
                chosen = n
                break
        for item in skipped:
            heapq.heappush(heap, item)
        return chosen

    def mate(taken: list[str], banned: set[str | None], nbytes: int) -> str | None:
        """The allowed node holding the most of the group (with room), ties to the least loaded, by name."""
        ok = [n for n in together if n not in taken and n not in exclude and rack[n] not in banned and fits(n, nbytes)]
        return min(ok, key=lambda n: (-together[n], load[n], n)) if ok else None

    out: dict[int, list[str]] = {}
    for idx, nbytes in sorted(shards, key=lambda s: (-s[1], s[0])):
        copies = list(dict.fromkeys(existing.get(idx, ())))
        want = min(replicas, len(copies) + sum(1 for n in rack if n not in copies and n not in exclude))
        while len(copies) < want:
            racks_used = {rack.get(n) for n in copies}
            last = len(copies) == want - 1
            need_other_rack = last and n_racks >= 2 and want >= 2 and len(racks_used) == 1
            banned = racks_used if need_other_rack else set()
            chosen = mate(copies, banned, nbytes) or least_loaded(copies, banned, nbytes, True)
            if chosen is None:
                chosen = least_loaded(copies, banned, nbytes, False)  # nobody has room: best effort
            if chosen is None and need_other_rack:  # no node in another rack can take it: best effort,
                chosen = mate(copies, set(), nbytes) or least_loaded(copies, set(), nbytes, False)  # still together
            if chosen is None:
                break
            copies.append(chosen)
            load[chosen] += nbytes
            together[chosen] = together.get(chosen, 0) + nbytes
            if chosen in left:
                left[chosen] -= nbytes
            heapq.heappush(heap, (load[chosen], chosen))
        out[idx] = copies
    return out


def default_span(replicas: int, nodes: int, shards: int, devices_per_node: int = 1) -> int:
    """The span a data set is laid out for before any of its jobs is seen.

    One copy on nodes of one device each (``devices_per_node``: the most any up node has): every gang
    of ``k`` ranks spans ``k`` nodes, so the copy is striped over every node (up to one a shard) and a
    gang over any of them reads locally.  Otherwise 1, every copy whole: on nodes of several devices
    most jobs fit on one node, and one-rank jobs are most jobs.  (Striping one copy over all 16 nodes
    of the trace replays' 8-device nodes took their local-read fraction from 0.34 to 0.14 (ITP) and
    0.38 to 0.17 (Philly): docs/concepts.md.)"""
    if replicas == 1 and devices_per_node <= 1:
        return max(1, min(nodes, shards))
    return 1


SPANS_KEPT = 16  # how many of a data set's latest jobs its observed span is taken from


def seen_spans(spans: Sequence[int], nodes: int, keep: int = SPANS_KEPT) -> list[int]:
    """``spans`` (a data set's latest jobs' node counts, oldest first) with one more job that spans
    ``nodes`` nodes, keeping the latest ``keep``.  Called by the binder for every job bound to read a
    data set."""
    return [*spans, max(1, nodes)][-keep:]


def observed_span(spans: Sequence[int]) -> int | None:
    """The span a data set's jobs actually have: the node count most of its latest jobs spanned (ties to
    the larger, where a gang reads locally and a one-node job reads its stripe); None before any job.

    With one copy this decides whole (1) or striped; with two or more, one copy stays whole whatever it
    says (``lay_out``), so a 1 here means no gang is common enough to stripe the others for."""
    if not spans:
        return None
    counts: dict[int, int] = defaultdict(int)
    for n in spans:
        counts[n] += 1
    return max(counts, key=lambda n: (counts[n], n))


def lay_out(
    shards: Sequence[tuple[int, int]],
    nodes: Sequence[tuple[str, str]],
    replicas: int,
    span: int = 1,
    node_bytes: Mapping[str, int] | None = None,
    room: Mapping[str, int] | None = None,
    held: Mapping[int, Collection[str]] | None = None,
) -> dict[int, list[str]]:
    """A data set's layout: shard index -> nodes, for ``replicas`` copies shaped for jobs of ``span`` nodes.

    Copy 0 is whole on one node when ``replicas >= 2`` or ``span <= 1``; every other copy (and copy 0
    when ``replicas == 1`` and ``span >= 2``) is *striped*: its shards are dealt round-robin by index
    into ``w = min(span, shards, nodes)`` stripes, each stripe kept together on its own node, no two
    stripes of one copy on one node.  Each stripe is placed by :func:`place_replicas` with the copies
    made so far as ``existing``, so every rule there holds per shard: copies on distinct nodes, never
    all in one rack, room respected, least loaded first (ties by name).  Where the nodes run out a
    stripe shares a node with another stripe of its copy (never with another copy of its shards).
    Pure.  With ``span <= 1`` and no ``held`` it gives exactly what ``place_replicas`` gives.

    ``held`` (shard index -> nodes holding a copy now, or getting one) turns it into the *target* of a
    re-balance: each whole copy or stripe goes to the allowed node already holding the most of its bytes
    (``place_replicas``' together rule, counted per stripe), so a layout that already has the shape is
    its own target and only the copies the shape lacks move; the bytes a node holds of this data set
    count as room it has.  ``node_bytes`` then includes those copies.
    """
    if not shards:
        return {}
    rack = dict(nodes)
    sizes = dict(shards)
    mine: dict[str, int] = defaultdict(int)  # bytes of this data set each allowed node holds
    for i, holders in (held or {}).items():
        for n in set(holders):
            if n in rack and i in sizes:
                mine[n] += sizes[i]
    room = {n: b + mine.get(n, 0) for n, b in room.items()} if room is not None and held else room
    if span <= 1 and not held:
        return place_replicas(shards, nodes, replicas, node_bytes=node_bytes, room=room)
    if span <= 1:
        return place_replicas(shards, nodes, replicas, node_bytes=node_bytes, group_bytes=dict(mine), room=room)
    load: dict[str, int] = {n: 0 for n, _ in nodes}
    for n, b in (node_bytes or {}).items():
        if n in load:
            load[n] = b
    left = {n: b for n, b in (room or {}).items() if n in load}
    ordered = sorted(shards, key=lambda s: s[0])
    out: dict[int, list[str]] = {i: [] for i, _ in ordered}
    width = max(1, min(span, len(ordered), len(nodes)))
    for copy in range(min(replicas, len(nodes))):
        striped = copy >= 1 or replicas == 1
        stripes = [ordered[k::width] for k in range(width)] if striped else [ordered]
        used: set[str] = set()  # nodes holding a stripe of this copy
        for stripe in stripes:
            avoid: set[str] = used
            if not any(n not in used and all(n not in out[i] for i, _ in stripe) for n, _ in nodes):
                avoid = set()  # more stripes than free nodes: share one of this copy's nodes
            holding: dict[str, int] = defaultdict(int)  # bytes of this stripe each node holds now
            for i, nbytes in stripe:
                for n in set((held or {}).get(i, ())):
                    if n in rack:
                        holding[n] += nbytes
            plan = place_replicas(stripe, nodes, copy + 1, existing={i: out[i] for i, _ in stripe},
                                  node_bytes=load, group_bytes=dict(holding), room=left, exclude=avoid)
            size = dict(stripe)
            for i, holders in plan.items():
                for n in holders[len(out[i]):]:
                    out[i].append(n)
                    used.add(n)
                    load[n] += size[i]
                    if n in left:
                        left[n] -= size[i]
    return out


def reported_room(free_bytes: Iterable[tuple[str, int | None]]) -> dict[str, int]:
    """``place_replicas``' ``room`` from (node, free bytes its agent reported); 0 or None means not
    reported yet, and such a node is left out (not limited)."""
    return {name: free for name, free in free_bytes if free and free > 0}
