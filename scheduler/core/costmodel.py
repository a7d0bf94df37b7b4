"""The transfer cost model: how long staging bytes from one node to another is estimated to take.

Contract: pure functions of their arguments (no I/O, no clock).  Bandwidth depends only on distance:

- same node: free (infinite bandwidth, cost 0);
- same rack: ``cfg.same_rack_bps``;
- different racks, or a node whose rack is unknown: ``cfg.cross_rack_bps``.

Costs are integer milliseconds, rounded up, so that min-cost flow (integer costs) and equality checks in
tests are exact.  Stage 1 sums per-shard costs, each rounded up on its own; recomputing a candidate's
cost with :func:`reads_cost_ms` gives the very same integer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Protocol

from scheduler.core.placement import ShardRead


class _Bandwidths(Protocol):
    same_rack_bps: float
    cross_rack_bps: float


def bandwidth_bps(src_node: str, dst_node: str, racks: Mapping[str, str], cfg: _Bandwidths) -> float:
    """Bytes per second between two nodes; ``math.inf`` on the same node.

    A node missing from ``racks`` is treated as being in a rack of its own (cross-rack bandwidth).
    """
    if src_node == dst_node:
        return math.inf
    src_rack = racks.get(src_node)
    if src_rack is not None and src_rack == racks.get(dst_node):
        return cfg.same_rack_bps
    return cfg.cross_rack_bps


def cost_ms_at(nbytes: int, bps: float) -> int:
    """``ceil(nbytes / bps)`` in milliseconds; 0 for no bytes or infinite bandwidth.

    Integer-valued bandwidths (the usual case) are divided exactly in integers, so no float noise
    turns 320 ms into 321 ms.
    """
    if nbytes <= 0 or bps == math.inf:
        return 0
    if bps <= 0:
        raise ValueError(f"bandwidth must be positive, got {bps}")
    if float(bps).is_integer():
        return -(-nbytes * 1000 // int(bps))
    return math.ceil(nbytes * 1000 / bps)


def transfer_cost_ms(nbytes: int, src: str, dst: str, racks: Mapping[str, str], cfg: _Bandwidths) -> int:
    """Estimated milliseconds to stage ``nbytes`` from node ``src`` to node ``dst`` (0 when equal)."""
    return cost_ms_at(nbytes, bandwidth_bps(src, dst, racks, cfg))


def reads_cost_ms(reads: Iterable[ShardRead], racks: Mapping[str, str], cfg: _Bandwidths) -> int:
    """The cost of a candidate's reads: the sum of each non-local read's own (rounded-up) cost."""
    return sum(transfer_cost_ms(r.bytes, r.source, r.node, racks, cfg) for r in reads)
