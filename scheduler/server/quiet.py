"""The heartbeat of a node that has nothing to say and nothing to do, answered with one UPDATE instead
of the whole of ``scheduler.server.heartbeat``.

Most heartbeats of a big cluster are of this kind: an idle node says it is alive, with the same
devices, rack, address and incarnation as last time, and the server has nothing for it.  The whole
path reads the node, its devices, its ranks, its transfers and the token through the ORM (about a
millisecond of the server's CPU in a batch on SQLite, more on PostgreSQL); at 5,000 agents every 5 s
that is 1,000 heartbeats a second, more than one process has beside the HTTP work.

A heartbeat takes this path only when all of these hold; otherwise the whole path runs (it is the rule):

* it reports nothing but the node's identity, devices and free disk (``QUIET``: no ranks, logs,
  metrics, transfers, full inventory or job-directory list);
* its rack, address, incarnation and devices are exactly what the last heartbeat of this node that
  went the whole way wrote in this server process, and committed (``Settled``; devices are only ever
  written by a heartbeat);
* in the database, checked by the UPDATE itself in the batch's transaction: the token is this node's
  agent token, the node is UP with that incarnation, no rank on it is unfinished (nothing to start or
  kill), no copy or delete order to it is open, and its free disk is on the same side of the floor as
  the report's (crossing the floor is an event).

The UPDATE writes ``last_seen`` and ``free_bytes``; if it matched no row nothing was written and the
whole path runs.  The answer is what the whole path gives such a node: no assignments, kills, copies
or deletes, the peer key, no peers (a node with no live rank mirrors no checkpoint).
``tests/db/test_quiet_heartbeat.py`` holds the two answers and the two sets of writes equal.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from scheduler.core.diskfloor import under_floor
from scheduler.core.lifecycle import RANK_FINAL, NodeState, TransferState
from scheduler.protocol.messages import Heartbeat, HeartbeatReply
from scheduler.server.auth import hash_token
from scheduler.server.service import peer_key

# Every field of a heartbeat is one of these two: what a quiet heartbeat may carry, and what it must
# leave empty (a test holds this to Heartbeat's fields, so a new field is classified on purpose).
IDENTITY = frozenset({"node", "rack", "address", "incarnation", "devices", "free_bytes"})
QUIET: dict[str, Any] = {"replicas": None, "ranks": [], "logs": [], "metrics": [], "transfers": [], "job_dirs": None}
OPEN_ORDERS = (TransferState.PENDING, TransferState.RUNNING, TransferState.DELETE)  # what _reply sends


def _words(states: Any) -> str:
    return ", ".join(f"'{s.value}'" for s in sorted(states))


_TOUCH = f"""
UPDATE nodes SET last_seen = :now, free_bytes = :free
WHERE name = :node AND state = '{NodeState.UP.value}' AND incarnation = :incarnation
  AND EXISTS (SELECT 1 FROM agent_tokens WHERE token_hash = :token_hash AND node = :node)
  AND NOT EXISTS (SELECT 1 FROM ranks WHERE node = :node AND state NOT IN ({_words(RANK_FINAL)}))
  AND NOT EXISTS (SELECT 1 FROM transfers WHERE dst = :node AND state IN ({_words(OPEN_ORDERS)}))"""
_UNDER = "(free_bytes > 0 AND free_bytes < :floor)"  # diskfloor.under_floor, for the stored figure
# by (floor set, the report under it): the statement, with its condition on the stored free disk
_STATEMENTS = {(False, False): text(_TOUCH), (True, True): text(f"{_TOUCH} AND {_UNDER}"),
               (True, False): text(f"{_TOUCH} AND NOT {_UNDER}")}


def signature(hb: Heartbeat) -> tuple[Any, ...]:
    """What a heartbeat says of the node that the whole path writes and this one does not."""
    return (hb.rack, hb.address, hb.incarnation,
            tuple((d.index, d.kind, d.model, d.memory_bytes, d.healthy, d.uuid, d.health) for d in hb.devices))


def is_quiet(hb: Heartbeat) -> bool:
    return all(getattr(hb, name) == empty for name, empty in QUIET.items())


class Settled:
    """Per node, the ``signature`` of the last heartbeat the whole path wrote, once committed."""

    def __init__(self) -> None:
        self._by_node: dict[str, tuple[Any, ...]] = {}
        self._lock = threading.Lock()

    def after_commit(self, s: Session, hb: Heartbeat) -> None:
        """Remember ``hb`` once the transaction of ``s`` commits (``WriteBatcher`` runs the hooks)."""
        sig = signature(hb)
        s.info.setdefault("after_commit", []).append(lambda: self._put(hb.node, sig))

    def _put(self, node: str, sig: tuple[Any, ...]) -> None:
        with self._lock:
            self._by_node[node] = sig

    def get(self, node: str) -> tuple[Any, ...] | None:
        return self._by_node.get(node)


def quiet_heartbeat(s: Session, now: float, token: str, hb: Heartbeat, settled: Settled,
                    disk_floor_bytes: int = 0) -> dict[str, Any] | None:
    """The reply to ``hb`` (``HeartbeatReply.wire``) when it is quiet and its node has nothing to do,
    with ``last_seen`` and ``free_bytes`` written; None, with nothing written, when the whole path
    must run."""
    if not is_quiet(hb) or settled.get(hb.node) != signature(hb):
        return None
    floor = disk_floor_bytes > 0
    statement = _STATEMENTS[(floor, floor and under_floor(hb.free_bytes, disk_floor_bytes))]
    done = s.execute(statement, {"now": now, "free": hb.free_bytes, "node": hb.node, "incarnation": hb.incarnation,
                                 "token_hash": hash_token(token), "floor": disk_floor_bytes})
    if done.rowcount != 1:  # type: ignore[attr-defined]
        return None
    return _reply(peer_key(s))


_replies: dict[str, dict[str, Any]] = {}


def _reply(key: str) -> dict[str, Any]:
    """The whole path's reply to a node with nothing to do; a fresh dict each time (the route adds to it)."""
    if key not in _replies:
        _replies[key] = HeartbeatReply(peer_key=key).wire()
    return {name: (list(value) if isinstance(value, list) else value) for name, value in _replies[key].items()}
