"""Single requests to one URL over urllib: ``open_url`` and ``send`` (shards, checkpoints, uploads, nudges
to a data server), the body streamed from a file when it is one, the answer streamed by ``open_url``;
and the requests of ``Servers`` (scheduler/protocol/servers.py) when a proxy variable is set.

Errors: an HTTP error status is a ``ServerError`` (``.status``, ``.message``: what the server said,
scheduler/protocol/servererror.py); a request that got no answer (refused, timed out, TLS) raises
``OSError``.  ``ServerError`` is not an OSError.

urllib honours the ``*_proxy`` environment variables; ``direct=True`` ignores them (the server's nudges,
sent with http.client before this module took them over).  The JSON API's requests, the CLI's above
all, go over scheduler/protocol/http1.py instead: importing this module costs about 24 ms (urllib.request,
http.client and the email package), as much as a bare interpreter's start.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from scheduler.protocol.servererror import CERT_ERROR, ServerError, said

__all__ = ["CERT_ERROR", "Body", "ServerError", "open_url", "send", "ssl_context"]

if TYPE_CHECKING:
    from http.client import HTTPResponse

Body = bytes | IO[bytes] | None


def ssl_context(ca: str | None) -> ssl.SSLContext | None:
    """A context that verifies HTTPS servers against the CA file ``ca``; None: the system's defaults."""
    return ssl.create_default_context(cafile=ca) if ca else None


class _QuickConnect:
    """Mixed into http.client's connections: the TCP connect (and TLS handshake) waits at most
    ``connect_timeout_s``, then every read ``timeout`` as before.  A host that is down or cut off sends
    nothing back, so without it a caller learns so only after the whole read timeout (30 s for the CLI)."""

    timeout: Any
    sock: socket.socket | None
    connect_timeout_s: float | None = None

    def connect(self) -> None:
        full = self.timeout
        quick = self.connect_timeout_s
        if quick is not None and isinstance(full, int | float):
            self.timeout = min(full, quick)
        try:
            super().connect()  # type: ignore[misc]
        finally:
            self.timeout = full
        if self.sock is not None and isinstance(full, int | float):
            self.sock.settimeout(full)


class _QuickHTTP(_QuickConnect, http.client.HTTPConnection):
    pass


class _QuickHTTPS(_QuickConnect, http.client.HTTPSConnection):
    pass


class _QuickHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, connect_timeout_s: float) -> None:
        super().__init__()
        self.connect_timeout_s = connect_timeout_s

    def http_open(self, req: urllib.request.Request) -> Any:
        def conn(host: str, **kw: Any) -> _QuickHTTP:
            c = _QuickHTTP(host, **kw)
            c.connect_timeout_s = self.connect_timeout_s
            return c

        return self.do_open(conn, req)


class _QuickHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, connect_timeout_s: float, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self.connect_timeout_s = connect_timeout_s
        self.tls_context = context

    def https_open(self, req: urllib.request.Request) -> Any:
        def conn(host: str, **kw: Any) -> _QuickHTTPS:
            c = _QuickHTTPS(host, **kw)
            c.connect_timeout_s = self.connect_timeout_s
            return c

        return self.do_open(conn, req, context=self.tls_context)


@contextmanager
def open_url(url: str, method: str = "GET", body: Body = None, headers: dict[str, str] | None = None,
             timeout_s: float = 60.0, context: ssl.SSLContext | None = None,
             direct: bool = False, connect_timeout_s: float | None = None) -> Iterator[HTTPResponse]:
    """The answer to one request, open for reading (``.read(n)``, ``.headers``), closed on leaving.

    A file ``body`` is streamed (give its ``Content-Length`` in ``headers``).  ``timeout_s`` bounds the
    connect and every read; ``connect_timeout_s``, when given, the connect alone.  Raises
    ``ServerError(status, what the server said)`` for an HTTP error status and ``OSError`` when there
    was no answer.  ``direct``: ignore proxy settings."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        if direct or connect_timeout_s is not None:
            handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})] if direct else []
            if connect_timeout_s is not None:
                handlers += [_QuickHTTPHandler(connect_timeout_s), _QuickHTTPSHandler(connect_timeout_s, context)]
            elif context is not None:
                handlers.append(urllib.request.HTTPSHandler(context=context))
            resp = urllib.request.build_opener(*handlers).open(req, timeout=timeout_s)
        else:
            resp = urllib.request.urlopen(req, timeout=timeout_s, context=context)
    except urllib.error.HTTPError as e:
        try:
            raw = e.read()
        except OSError:
            raw = b""
        finally:
            e.close()
        raise ServerError(e.code, said(raw)) from None
    with resp:
        yield resp


def send(url: str, method: str = "GET", body: Body = None, headers: dict[str, str] | None = None,
         timeout_s: float = 60.0, context: ssl.SSLContext | None = None, direct: bool = False,
         connect_timeout_s: float | None = None) -> bytes:
    """One request to one URL; returns the answer's body (errors as ``open_url``)."""
    with open_url(url, method, body, headers, timeout_s, context, direct, connect_timeout_s) as resp:
        return bytes(resp.read())
