"""Why a rank ended badly: the job's own fault, or the node's (an infrastructure failure).

A rank that exits non-zero fails its job (or uses one of its ``retry_on_failure``).  A few failures
are not the job's doing and say nothing about its code: its rank 0 could not listen on the rendezvous
port, its peers never joined the store within the init timeout, or it could not reach rank 0's store.
The agent reports those with ``failure = "rendezvous"``, and the server puts the job back in the
queue (as after a node loss; ``max_restarts`` bounds how often) instead of failing it.

They are told apart by the last error that torch.distributed printed, the same text for the built-in
workload and for a user's command that calls ``init_process_group`` (env:// or its own TCPStore):

* ``DistNetworkError: The server socket has failed to listen on any local network address ...
  EADDRINUSE``: the port was taken between the agent's check and the store's bind;
* ``DistStoreError: Timed out after N seconds waiting for clients. k/n clients joined.``: rank 0's
  store never saw every peer;
* ``DistNetworkError: The client socket has timed out after Nms while trying to connect to (host,
  port)``: a peer never reached rank 0's store.
"""

from __future__ import annotations

import re

RENDEZVOUS = "rendezvous"
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(Error|Exception)\b")  # a traceback's last line: "pkg.SomeError: ..."

_SIGNS = [
    re.compile(r"DistNetworkError: The server socket has failed to listen.*"),
    re.compile(r"DistNetworkError: .*(EADDRINUSE|address already in use).*"),
    re.compile(r"DistStoreError: Timed out after .* waiting for clients.*"),
    re.compile(r"DistNetworkError: The client socket has timed out after .* trying to connect to .*"),
]


def rendezvous_failure(log_tail: str) -> str | None:
    """The line of ``log_tail`` (the end of a rank's output) that shows a rendezvous failure, if the
    last error in it is one; None otherwise."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    # Only the last exception counts: a job that printed such a line once and failed later for its
    # own reasons is the job's failure.
    errors = [line for line in lines if _EXCEPTION.match(line)]
    if not errors:
        return None
    last = errors[-1]
    for sign in _SIGNS:
        m = sign.search(last)
        if m:
            return m.group(0)[:500]
    return None
