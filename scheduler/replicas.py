"""Where the copies of a data set's shards go: HDFS-like, rack-aware, balanced by bytes.

Used by ``gsched data`` (first placement), by re-replication after a node is lost, and by the
simulator.  Pure: the same arguments always give the same placement.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence


def place_replicas(
    shards: Sequence[tuple[int, int]],
    nodes: Sequence[tuple[str, str]],
    replicas: int,
    existing: Mapping[int, Sequence[str]] | None = None,
    node_bytes: Mapping[str, int] | None = None,
) -> dict[int, list[str]]:
    """Nodes for each shard's copies: shard index -> node names (existing copies first).

    ``shards``: (index, bytes); ``nodes``: (name, rack) of the nodes that may take copies;
    ``existing``: shard index -> nodes that already hold a healthy copy (kept as they are; only the
    missing copies are added); ``node_bytes``: bytes each node already stores.  When ``node_bytes`` is
    omitted, the load is counted from ``existing`` (so pass it only if it includes those copies).

    Rules, in order: ``replicas`` copies on distinct nodes (fewer if there are fewer nodes); with at
    least two racks the copies of a shard are never all in one rack; each new copy goes to the
    least-loaded allowed node by bytes (ties by name).  Shards are placed largest first (then by
    index), which keeps bytes balanced across nodes.
    """
    existing = existing or {}
    rack = dict(nodes)
    sizes = dict(shards)
    load: dict[str, int] = dict.fromkeys(rack, 0)
    if node_bytes is not None:
        for n, b in node_bytes.items():
            if n in load:
                load[n] = b
    else:
        for idx, holders in existing.items():
            for n in holders:
                if n in load:
                    load[n] += sizes.get(idx, 0)
    n_racks = len(set(rack.values()))
    heap = [(b, n) for n, b in load.items()]
    heapq.heapify(heap)

    out: dict[int, list[str]] = {}
    for idx, nbytes in sorted(shards, key=lambda s: (-s[1], s[0])):
        copies = list(dict.fromkeys(existing.get(idx, ())))
        want = min(replicas, len(copies) + sum(1 for n in rack if n not in copies))
        while len(copies) < want:
            racks_used = {rack.get(n) for n in copies}
            last = len(copies) == want - 1
            need_other_rack = last and n_racks >= 2 and want >= 2 and len(racks_used) == 1
            skipped = []
            chosen = None
            while heap:
                b, n = heapq.heappop(heap)
                if b != load[n]:
                    continue  # stale entry
                if n in copies or (need_other_rack and rack[n] in racks_used):
                    skipped.append((b, n))
                    continue
                chosen = n
                break
            for item in skipped:
                heapq.heappush(heap, item)
            if chosen is None:
                if need_other_rack:  # no node in another rack is free to take it: best effort
                    need_other_rack = False
                    chosen = min((n for n in rack if n not in copies), key=lambda n: (load[n], n))
                else:
                    break
            copies.append(chosen)
            load[chosen] += nbytes
            heapq.heappush(heap, (load[chosen], chosen))
        out[idx] = copies
    return out
