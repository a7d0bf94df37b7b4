"""Where the copies of a data set's shards go: whole copies kept together, rack-aware, balanced by bytes.

Used by ``gsched data`` (first placement), by re-replication after a node is lost, and by the
simulator.  Pure: the same arguments always give the same placement.

Why together: a training rank reads its slice of the data set, and most jobs have one rank, which
reads it all.  Spread shard by shard over the least-loaded nodes (as HDFS spreads blocks), a data
set of 16 shards with 3 copies lands on up to 48 nodes and no node can serve a one-rank job
locally until staging has filled caches.  Kept together, R nodes each hold the whole set from the
start.  In the trace replays (benchmarks/RESULTS.md) this took the local-read fraction from 0.927
to 0.945 (Philly) and 0.925 to 0.950 (ITP), and bytes moved from 3.01 to 2.25 TB and 3.08 to 2.07 TB.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence


def place_replicas(
    shards: Sequence[tuple[int, int]],
    nodes: Sequence[tuple[str, str]],
    replicas: int,
    existing: Mapping[int, Sequence[str]] | None = None,
    node_bytes: Mapping[str, int] | None = None,
    group_bytes: Mapping[str, int] | None = None,
    room: Mapping[str, int] | None = None,
) -> dict[int, list[str]]:
    """Nodes for each shard's copies: shard index -> node names (existing copies first).

    ``shards``: (index, bytes) of one data set (the *group*); ``nodes``: (name, rack) of the nodes that
    may take copies; ``existing``: shard index -> nodes that already hold a healthy copy (kept as they
    are; only the missing copies are added); ``node_bytes``: bytes each node already stores (when
    omitted, counted from ``existing``; so pass it only if it includes those copies);
    ``group_bytes``: bytes of this data set each node holds outside ``shards`` (re-replication passes
    the other shards' copies; when omitted, counted from ``existing``); ``room``: bytes each node may
    still take (free disk); a node missing from it is not limited.

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
            if n not in taken and rack[n] not in banned and (not need_room or fits(n, nbytes)):
                chosen = n
                break
        for item in skipped:
            heapq.heappush(heap, item)
        return chosen

    out: dict[int, list[str]] = {}
    for idx, nbytes in sorted(shards, key=lambda s: (-s[1], s[0])):
        copies = list(dict.fromkeys(existing.get(idx, ())))
        want = min(replicas, len(copies) + sum(1 for n in rack if n not in copies))
        while len(copies) < want:
            racks_used = {rack.get(n) for n in copies}
            last = len(copies) == want - 1
            need_other_rack = last and n_racks >= 2 and want >= 2 and len(racks_used) == 1
            banned = racks_used if need_other_rack else set()
            mates = sorted((n for n in together if n not in copies and rack[n] not in banned and fits(n, nbytes)),
                           key=lambda n: (-together[n], load[n], n))
            chosen = mates[0] if mates else least_loaded(copies, banned, nbytes, True)
            if chosen is None:
                chosen = least_loaded(copies, banned, nbytes, False)  # nobody has room: best effort
            if chosen is None and need_other_rack:  # no node in another rack can take it: best effort
                chosen = least_loaded(copies, set(), nbytes, False)
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


def reported_room(free_bytes: Iterable[tuple[str, int | None]]) -> dict[str, int]:
    """``place_replicas``' ``room`` from (node, free bytes its agent reported); 0 or None means not
    reported yet, and such a node is left out (not limited)."""
    return {name: free for name, free in free_bytes if free and free > 0}
