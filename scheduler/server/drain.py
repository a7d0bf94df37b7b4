"""Draining a node (``gsched node drain``, as Slurm's ``scontrol update state=drain``): no new ranks
are bound there and no new shard copies go there; ranks already there run to their end.  ``resume``
undoes it.  Admins only (the route says so).  Both are idempotent: draining a drained node keeps its
first time, with the new reason."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from scheduler.core.errors import NotFound
from scheduler.server.auth import Identity
from scheduler.store.effects import record
from scheduler.store.models import Node


def _node(s: Session, name: str) -> Node:
    node = s.get(Node, name)
    if node is None:
        raise NotFound(f"no node {name!r} (gsched nodes lists them)")
    return node


def _out(node: Node) -> dict[str, Any]:
    return {"name": node.name, "state": node.state, "drained": node.drained_at is not None,
            "drained_at": node.drained_at, "drain_reason": node.drain_reason}


def drain_node(s: Session, now: float, who: Identity, name: str, reason: str) -> dict[str, Any]:
    node = _node(s, name)
    if node.drained_at is None:
        node.drained_at = now
    node.drain_reason = reason or f"drained by {who.name}"
    record(s, now, who.actor, "node.drain", node.drain_reason, node=name)
    return _out(node)


def resume_node(s: Session, now: float, who: Identity, name: str) -> dict[str, Any]:
    node = _node(s, name)
    if node.drained_at is not None:
        node.drained_at = None
        node.drain_reason = ""
        record(s, now, who.actor, "node.resume", "", node=name)
    return _out(node)
