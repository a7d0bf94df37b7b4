"""Tell agents that ranks were bound on their node, so they heartbeat now instead of at their next tick.

Without it, a job bound just after a node's heartbeat waited up to ``heartbeat_s`` (2 s by default)
before its node heard of it.  The cycle process calls ``nudge_nodes`` after binding: one small
``POST /nudge`` to each such node's data server, with an HMAC ticket made from the cluster's peer key,
sent from short-lived threads so a slow or dead node never delays the cycle.  A node whose agent serves
HTTPS (an ``https://`` address) is nudged over HTTPS, verified with ``peer_tls`` (the config's ``peer_ca``).  It carries nothing: the
assignments still come with the heartbeat reply, so a lost nudge only costs the old latency.
"""

from __future__ import annotations

import logging
import ssl
import threading

from sqlalchemy import select

from scheduler.protocol.http import send
from scheduler.protocol.peers import peer_host, peer_url
from scheduler.protocol.servererror import ServerError
from scheduler.protocol.tickets import ticket_headers
from scheduler.server.service import get_setting
from scheduler.store.db import Database
from scheduler.store.models import Node

log = logging.getLogger("gsched.nudge")
TIMEOUT_S = 1.0


def nudge_nodes(db: Database, nodes: list[str], peer_tls: ssl.SSLContext | None = None) -> list[threading.Thread]:
    """Start one nudge per node (returns the threads; callers need not wait for them)."""
    if not nodes:
        return []
    with db.read() as s:
        key = get_setting(s, "peer_key")
        addresses = dict(s.execute(select(Node.name, Node.address).where(Node.name.in_(sorted(set(nodes))))).all())
    if not key:
        return []
    threads = []
    for node, address in sorted(addresses.items()):
        t = threading.Thread(target=_nudge, args=(node, address, key, peer_tls), name=f"nudge-{node}", daemon=True)
        t.start()
        threads.append(t)
    return threads


def _nudge(node: str, address: str, key: str, peer_tls: ssl.SSLContext | None) -> None:
    """One ``POST /nudge`` to ``address`` (host:port or https://host:port), straight to it (no proxy),
    within ``TIMEOUT_S``; a failure is logged at debug level and otherwise ignored."""
    port = address.rpartition(":")[2]
    if not peer_host(address) or not port.isdigit():
        return
    try:
        send(peer_url(address, "nudge"), "POST", b"", ticket_headers(key, "nudge", node), timeout_s=TIMEOUT_S,
             context=peer_tls, direct=True)
    except (ServerError, OSError, ValueError) as e:  # ValueError: an address urllib cannot parse
        log.debug("nudge to %s (%s) failed: %s", node, address, e)
