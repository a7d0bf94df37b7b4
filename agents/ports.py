"""Rendezvous ports: which port a job's rank 0 hosts its TCPStore on, handed out by this node's agent.

Rank 0 of a job binds ``MASTER_PORT`` when its process group starts, a second or two after the agent
started the process.  A port picked by binding port 0 and letting it go can be taken by anything on the
node meanwhile (another rank's gloo connection draws from the same ephemeral range), so the agent hands
out ports from a configured range instead (``gsched agent --rendezvous-ports 29500-29999`` by default,
outside Linux's ephemeral range 32768-60999, so outgoing connections never draw them), and:

* never hands out a port one of its own jobs still holds (it is taken until that rank 0 ended);
* checks that the port can be bound and listened on, the way the TCPStore binds it (the wildcard
  address, ``SO_REUSEADDR``, IPv4 and IPv6), right before it hands it out;
* goes round the range rather than back to its start, so a port freed a moment ago is the last to be
  reused.

What can still happen, a process outside gsched binding the port in the second between the check and
the rank's bind, is a rendezvous failure that the server treats as the node's fault, not the job's
(``agents/rankfail.py``): the job is requeued, not failed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Hashable

DEFAULT_RANGE = "29500-29999"


class PortRangeError(ValueError):
    pass


def parse_range(text: str) -> tuple[int, int]:
    """``"29500-29999"`` (or one port, ``"29500"``) as (first, last); raises ``PortRangeError``."""
    parts = text.strip().split("-")
    try:
        if len(parts) == 1:
            lo = hi = int(parts[0])
        elif len(parts) == 2:
            lo, hi = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise PortRangeError(f"--rendezvous-ports {text!r}: give FIRST-LAST, e.g. {DEFAULT_RANGE}") from None
    if not (1024 <= lo <= hi <= 65535):
        raise PortRangeError(f"--rendezvous-ports {text!r}: ports must be 1024..65535 and FIRST <= LAST")
    return lo, hi


def bindable(port: int) -> bool:
    """Whether a TCPStore could listen on ``port`` now: on the IPv4 wildcard, and on the IPv6 one where
    the host has IPv6.  ``SO_REUSEADDR`` as the store sets it, so a port left in TIME_WAIT by an earlier
    job counts as free (the store can bind it) and only a socket that is bound or listening does not."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, host in families:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host: nothing can hold the port there either
        with contextlib.closing(s):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((host, port))
                s.listen(1)
            except OSError:
                return False
    return True


class RendezvousPorts:
    """The agent's range of rendezvous ports and which of its jobs hold which (thread-safe)."""

    def __init__(self, first: int, last: int, start: int | None = None) -> None:
        self.first, self.last = first, last
        self.size = last - first + 1
        self._next = (start if start is not None else 0) % self.size
        self._held: dict[int, Hashable] = {}
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def take(self, owner: Hashable) -> int | None:
        """A free port for ``owner`` (held until ``release``), or None when every port of the range is
        held by this agent's jobs or cannot be bound."""
        with self._lock:
            for step in range(self.size):
                port = self.first + (self._next + step) % self.size
                if port in self._held or not bindable(port):
                    continue
                self._held[port] = owner
                self._next = (port - self.first + 1) % self.size
                return port
        return None

    def release(self, port: int | None) -> None:
        if port is not None:
            with self._lock:
                self._held.pop(port, None)

    def held(self) -> dict[int, Hashable]:
        with self._lock:
            return dict(self._held)
