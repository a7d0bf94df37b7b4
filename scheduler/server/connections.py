"""Bounds on the API server's connections: uvicorn's httptools protocol with a header timeout and caps.

uvicorn closes a kept-alive connection that stays idle after a response, but keeps a connection that
never completes its request headers for as long as the client likes, and ``limit_concurrency`` answers
503 yet still accepts every connection.  A thousand silent clients would hold a thousand sockets, and
one host could take every slot from the agents' heartbeats.  ``limited_protocol`` makes a protocol
class (uvicorn's ``http=``) that

* closes a connection whose request headers are not complete ``header_timeout_s`` after it opened,
  or after the first byte of its next request on a kept-alive connection (data trickled in does not
  extend it);
* closes at once a new connection beyond ``max_connections`` open in all, or beyond
  ``max_per_client`` open from the same client address.

A request whose headers arrived is not timed here (its handler reads the body as it comes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("gsched.server")

WARN_EVERY_S = 60.0  # a flood is logged once a minute, not once a connection


def limited_protocol(header_timeout_s: float, max_connections: int, max_per_client: int) -> type[HttpToolsProtocol]:
    """A protocol class for one server: its count of connections per client address is its own."""
    per_client: dict[str, int] = {}
    warned = [0.0]

    def refuse(why: str) -> None:
        now = time.monotonic()
        if now - warned[0] >= WARN_EVERY_S:
            warned[0] = now
            log.warning("closing new connections: %s (logged once a minute)", why)

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _counted_as: str | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            host = self.client[0] if self.client else ""
            self._counted_as = host
            per_client[host] = per_client.get(host, 0) + 1
            if len(self.connections) > max_connections:
                refuse(f"{max_connections} connections are open (max_connections)")
                transport.close()
            elif per_client[host] > max_per_client:
                refuse(f"{max_per_client} connections are open from {host} (max_connections_per_client)")
                transport.close()
            else:
                self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # a new request begins: its headers have header_timeout_s to arrive
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            host, self._counted_as = self._counted_as, None
            if host is not None:
                left = per_client.get(host, 1) - 1
                if left > 0:
                    per_client[host] = left
                else:
                    per_client.pop(host, None)
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return LimitedHttpToolsProtocol
