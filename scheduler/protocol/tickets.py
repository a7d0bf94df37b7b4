"""Tickets: how an agent (or the CLI, or the server) proves to another agent's data server that it may.

A ticket is an HMAC-SHA256, keyed with the cluster's peer key, over the parts of what is asked for
joined with ``\\x1f`` (``("get", dataset, index, ts)``, ``("ckpt", job, file, ts)``, ``("nudge", node, ts)``,
``("put", node, dataset, index, sha256)``; agents/dataserver.py lists which route takes which).  The
server hands the peer key to authenticated agents only, in the heartbeat reply, so only the server and
the agents can make tickets.  A ticket with a time in it (``ticket_headers``) is sent as
``X-Gsched-Ticket`` with that time in ``X-Gsched-Time``; the data server decides how old it may be.

Part of the protocol between the server and the agents: standard library only, and nothing else of
``scheduler`` (agents import only ``scheduler.protocol``).
"""

from __future__ import annotations

import hashlib
import hmac
import time


def ticket(peer_key: str, *parts: object) -> str:
    """An HMAC over ``parts``: what one agent shows another (or the CLI shows an agent) to be let in."""
    msg = "\x1f".join(str(p) for p in parts).encode()
    return hmac.new(peer_key.encode(), msg, hashlib.sha256).hexdigest()


def ticket_headers(peer_key: str, *parts: object) -> dict[str, str]:
    """The headers a data server checks (``X-Gsched-Ticket`` over ``parts`` and now, ``X-Gsched-Time``)."""
    ts = int(time.time())
    return {"X-Gsched-Ticket": ticket(peer_key, *parts, ts), "X-Gsched-Time": str(ts)}


def check_ticket(peer_key: str, given: str, *parts: object) -> bool:
    """Whether ``given`` is the ticket over ``parts`` (compared in constant time); an empty one never is."""
    return bool(given) and hmac.compare_digest(ticket(peer_key, *parts), given)
