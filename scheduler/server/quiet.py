"""The heartbeat of a node with nothing new to say, answered with one UPDATE (and the ranks' changed log
tails) instead of the whole of ``scheduler.server.heartbeat``.

Most heartbeats of a big cluster are of this kind: an idle node says it is alive, or a busy one says
its ranks still run, with the same devices, rack, address and incarnation as last time.  The whole
path reads the node, its devices, its ranks and their jobs, its transfers and the token through the
ORM (about a millisecond of the server's CPU for an idle node in a batch on SQLite, 2.5 ms for a node
running eight ranks); at 5,000 agents every 5 s that is 1,000 heartbeats a second, more than one
process has beside the HTTP work.

A heartbeat takes this path only when all of these hold; otherwise the whole path runs (it is the rule):

* it reports nothing but the node's identity, devices, free disk and ranks (``QUIET``: no logs,
  metrics, transfers, full inventory or job-directory list);
* its rack, address, incarnation and devices are exactly what the last heartbeat of this node that
  went the whole way wrote in this server process, and committed (``Settled``; devices are only ever
  written by a heartbeat); its ranks, if any, report exactly what that heartbeat reported of them
  (``rank_key``: all but the log tail), every one RUNNING then;
* in the database, checked by the UPDATE itself in the batch's transaction: the token is this node's
  agent token, the node is UP with that incarnation, no copy or delete order to it is open, its free
  disk is on the same side of the floor as the report's (crossing the floor is an event), and either
  no rank on it is unfinished (an idle node: nothing to start or kill) or its unfinished ranks are
  exactly the reported ones, each RUNNING in its job's current attempt with the job active (nothing to
  start, kill or re-derive: the cycle settles every active job each cycle, as the whole path would).

The UPDATE writes ``last_seen`` and ``free_bytes``, and the ranks' log tails that changed are written as
the whole path writes them; if it matched no row nothing was written and the whole path runs.  The
answer is what the whole path gives such a node: no assignments (a RUNNING rank needs none), kills,
copies or deletes; the peer key; for a node running ranks the peers to mirror checkpoints to
(``mirrors.mirror_peers``, worked out again every ``PEERS_TTL_S``: the agent tries them in order, so one
that went down meanwhile costs a failed attempt, not a lost mirror).  ``tests/db/test_quiet_heartbeat.py`` holds the answers and the writes equal.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.orm import Session

from scheduler.core.diskfloor import under_floor
from scheduler.core.lifecycle import ACTIVE, RANK_FINAL, NodeState, RankState, TransferState
from scheduler.protocol.messages import Heartbeat, HeartbeatReply, Peer, RankIn
from scheduler.server.auth import hash_token
from scheduler.server.mirrors import mirror_peers
from scheduler.server.service import peer_key

# Every field of a heartbeat is one of these: what a quiet heartbeat may carry, what it must leave empty,
# and its ranks (a test holds this to Heartbeat's fields, so a new field is classified on purpose).
IDENTITY = frozenset({"node", "rack", "address", "incarnation", "devices", "free_bytes"})
QUIET: dict[str, Any] = {"replicas": None, "logs": [], "metrics": [], "transfers": [], "job_dirs": None}
RANKS = "ranks"
OPEN_ORDERS = (TransferState.PENDING, TransferState.RUNNING, TransferState.DELETE)  # what _reply sends


def _words(states: Any) -> str:
    return ", ".join(f"'{s.value}'" for s in sorted(states))


_NODE = f"""
UPDATE nodes SET last_seen = :now, free_bytes = :free
WHERE name = :node AND state = '{NodeState.UP.value}' AND incarnation = :incarnation
  AND EXISTS (SELECT 1 FROM agent_tokens WHERE token_hash = :token_hash AND node = :node)
  AND NOT EXISTS (SELECT 1 FROM transfers WHERE dst = :node AND state IN ({_words(OPEN_ORDERS)}))"""
# an idle node: no unfinished rank on it
_IDLE = f"""
  AND NOT EXISTS (SELECT 1 FROM ranks WHERE node = :node AND state NOT IN ({_words(RANK_FINAL)}))"""
# a node running ranks: its unfinished ranks are exactly the :n rows :ids, each RUNNING in its job's
# current attempt, the job active
_RUNNING = f"""
  AND (SELECT count(*) FROM ranks WHERE node = :node AND state NOT IN ({_words(RANK_FINAL)})) = :n
  AND (SELECT count(*) FROM ranks r JOIN jobs j ON j.id = r.job_id
       WHERE r.id IN :ids AND r.node = :node AND r.state = '{RankState.RUNNING.value}' AND r.attempt = j.attempt
         AND j.state IN ({_words(ACTIVE)})) = :n"""
_UNDER = "(free_bytes > 0 AND free_bytes < :floor)"  # diskfloor.under_floor, for the stored figure
_FLOOR = {(False, False): "", (True, True): f" AND {_UNDER}", (True, False): f" AND NOT {_UNDER}"}
# by (running ranks, floor set, the report under it): the statement
_STATEMENTS = {(False, *k): text(_NODE + _IDLE + cond) for k, cond in _FLOOR.items()} | {
    (True, *k): text(_NODE + _RUNNING + cond).bindparams(bindparam("ids", expanding=True)) for k, cond in _FLOOR.items()}
_LOG_TAIL = text("UPDATE ranks SET log_tail = :tail WHERE id = :id")
PEERS_TTL_S = 30.0  # how long a steady heartbeat's mirror peers are kept (Settled.peers)


def signature(hb: Heartbeat) -> tuple[Any, ...]:
    """What a heartbeat says of the node that the whole path writes and this one does not."""
    return (hb.rack, hb.address, hb.incarnation,
            tuple((d.index, d.kind, d.model, d.memory_bytes, d.healthy, d.uuid, d.health) for d in hb.devices))


def rank_key(r: RankIn) -> tuple[Any, ...]:
    """What a rank report says, but its log tail (rewritten whenever it changed)."""
    return (r.job_id, r.attempt, r.rank, r.state, r.exit_code, r.staged_bytes, r.staging_total, r.staging_rate_bps,
            r.staging_s, r.master_port, r.error, r.failure)


def is_quiet(hb: Heartbeat) -> bool:
    """Nothing but the identity, and ranks (their report is compared with ``Settled``'s)."""
    return all(getattr(hb, name) == empty for name, empty in QUIET.items())


@dataclass(frozen=True)
class Known:
    """What the server last wrote for a node: its ``signature``, and when every rank it reported was
    RUNNING, each rank's ``rank_key`` -> (its row's id, the log tail written)."""

    signature: tuple[Any, ...]
    running: dict[tuple[Any, ...], tuple[int, str]] | None


class Settled:
    """Per node, what the last heartbeat that went the whole way wrote (``Known``), once committed;
    a steady heartbeat's log tails are added as they are written."""

    def __init__(self) -> None:
        self._by_node: dict[str, Known] = {}
        self._peers: dict[str, tuple[float, list[Peer]]] = {}
        self._lock = threading.Lock()

    def peers(self, s: Session, node: str, now: float, disk_floor_bytes: int) -> list[Peer]:
        """``mirror_peers`` of ``node``, worked out again once ``PEERS_TTL_S`` old: it reads every up node
        (half a millisecond at 2,000 nodes, most of a steady heartbeat).  A peer that went down since is
        harmless: the agent tries the peers in order until one takes the checkpoint."""
        hit = self._peers.get(node)
        if hit is not None and 0 <= now - hit[0] < PEERS_TTL_S:
            return hit[1]
        peers = mirror_peers(s, node, disk_floor_bytes)
        self._peers[node] = (now, peers)
        return peers

    def after_commit(self, s: Session, hb: Heartbeat, running: dict[tuple[int, int, int], int] | None = None) -> None:
        """Remember ``hb`` once the transaction of ``s`` commits (``WriteBatcher`` runs the hooks).
        ``running``: (job, attempt, rank) -> row id of the node's ranks RUNNING after it; kept only
        when it holds every rank ``hb`` reported, each reported RUNNING."""
        steady = None
        if running is not None and all(r.state == RankState.RUNNING and (r.job_id, r.attempt, r.rank) in running
                                       for r in hb.ranks):
            steady = {rank_key(r): (running[(r.job_id, r.attempt, r.rank)], r.log_tail) for r in hb.ranks}
        known = Known(signature(hb), steady)
        s.info.setdefault("after_commit", []).append(lambda: self._put(hb.node, known))

    def _put(self, node: str, known: Known) -> None:
        with self._lock:
            self._by_node[node] = known

    def get(self, node: str) -> Known | None:
        return self._by_node.get(node)


def quiet_heartbeat(s: Session, now: float, token: str, hb: Heartbeat, settled: Settled,
                    disk_floor_bytes: int = 0) -> dict[str, Any] | None:
    """The reply to ``hb`` (``HeartbeatReply.wire``) when it is quiet and its node has nothing to do,
    with ``last_seen``, ``free_bytes`` and changed log tails written; None, with nothing written, when
    the whole path must run."""
    known = settled.get(hb.node)
    if known is None or not is_quiet(hb) or known.signature != signature(hb):
        return None
    ids: list[int] = []
    tails: list[dict[str, Any]] = []
    memo = known.running or {}
    if hb.ranks:
        if len(memo) != len(hb.ranks):
            return None
        for r in hb.ranks:
            seen = memo.get(rank_key(r))
            if seen is None:
                return None
            ids.append(seen[0])
            if r.log_tail and r.log_tail != seen[1]:
                tails.append({"id": seen[0], "tail": r.log_tail})
    floor = disk_floor_bytes > 0
    statement = _STATEMENTS[(bool(hb.ranks), floor, floor and under_floor(hb.free_bytes, disk_floor_bytes))]
    params: dict[str, Any] = {"now": now, "free": hb.free_bytes, "node": hb.node, "incarnation": hb.incarnation,
                              "token_hash": hash_token(token), "floor": disk_floor_bytes}
    if hb.ranks:
        params |= {"ids": ids, "n": len(ids)}
    done = s.execute(statement, params)
    if done.rowcount != 1:  # type: ignore[attr-defined]
        return None
    if not hb.ranks:
        return _reply(peer_key(s))
    if tails:  # written as the whole path writes them; remembered once committed
        s.execute(_LOG_TAIL, tails)
        running = dict(memo)
        for r in hb.ranks:
            if r.log_tail:
                key = rank_key(r)
                running[key] = (running[key][0], r.log_tail)
        again = Known(known.signature, running)
        s.info.setdefault("after_commit", []).append(lambda: settled._put(hb.node, again))
    # a node running ranks mirrors their checkpoints: the whole path's peers
    return HeartbeatReply(peer_key=peer_key(s), peers=settled.peers(s, hb.node, now, disk_floor_bytes)).wire()


_replies: dict[str, dict[str, Any]] = {}


def _reply(key: str) -> dict[str, Any]:
    """The whole path's reply to a node with nothing to do; a fresh dict each time (the route adds to it)."""
    if key not in _replies:
        _replies[key] = HeartbeatReply(peer_key=key).wire()
    return {name: (list(value) if isinstance(value, list) else value) for name, value in _replies[key].items()}
