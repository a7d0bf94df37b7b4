"""Where a node mirrors its checkpoints: the ``peers`` of a heartbeat reply to a node running ranks
(``scheduler.server.heartbeat`` and ``scheduler.server.quiet`` both answer with them)."""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.core.diskfloor import under_floor
from scheduler.core.lifecycle import NodeState
from scheduler.protocol.messages import Peer
from scheduler.store.models import Node

MIRROR_PEERS = 3


def mirror_peers(s: Session, node_name: str, disk_floor_bytes: int = 0) -> list[Peer]:
    """Up to ``MIRROR_PEERS`` up nodes, other racks first (a checkpoint should survive its rack), then
    in an order stable per node but different for each, so mirrors spread over the cluster instead of
    all landing on one node.  A node whose free disk is under ``disk_floor_bytes`` is no peer (it takes
    no new bytes)."""
    rack = s.scalar(select(Node.rack).where(Node.name == node_name))
    rows = [(n, a, r) for n, a, r, free in s.execute(
        select(Node.name, Node.address, Node.rack, Node.free_bytes).where(Node.state == NodeState.UP, Node.name != node_name))
        if not under_floor(free, disk_floor_bytes)]

    def key(row: Any) -> tuple[bool, bytes]:
        return (row[2] == rack, hashlib.sha1(f"{node_name}/{row[0]}".encode()).digest())

    return [Peer(name=n, address=a) for n, a, _ in sorted(rows, key=key)[:MIRROR_PEERS]]
