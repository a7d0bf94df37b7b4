"""gsched's one HTTP client: to the server's API (the CLI, the agents) and to agents' data servers.

* ``Servers``: a list of servers, primary first then standbys, tried in order from the one that last
  answered.  Every failure is turned into a ``ServerError`` first; a ``fail_over(error, last)`` policy
  of the caller says whether to try the next server or raise it.  When none is left, it raises
  ``ServerError(0, "URL: what went wrong; URL: ...")``.  With a CA file it verifies HTTPS servers
  against it; a certificate that does not verify is ``CERT_ERROR`` with a message naming ``--ca``.
* ``Client``: the CLI's JSON client over ``Servers``: the server from ``--server`` or
  ``GSCHED_SERVER`` (comma-separated: fails over to a standby on no answer or a 5xx), the identity
  from ``GSCHED_TOKEN``, else ``$GSCHED_HOME/admin.token``, the CA from ``--ca`` or ``GSCHED_CA``.
* ``open_url`` and ``send``: one request to one URL (shards, checkpoints, uploads, nudges to a data
  server), the body streamed from a file when it is one, the answer streamed by ``open_url``.

Errors: an HTTP error status is a ``ServerError`` (``.status``, ``.message``: what the server said);
a request that got no answer (refused, timed out, TLS) raises ``OSError`` from the single-URL calls,
and is a failover line (``ServerError(0, ...)``) in ``Servers``.  ``ServerError`` is not an OSError.

Why the standard library (urllib, over http.client) rather than httpx: start-up.  ``gsched queue`` is
one request, so importing the client is a large part of its time; measured with ``python -X importtime``
(the least of 9 runs on the 2-core build machine, where a bare ``python -c pass`` takes 71 ms):
``import scheduler.protocol.http`` 35 ms, ``import httpx`` 106 ms, ``import requests`` 121 ms.  For the same reason this module imports neither pydantic nor
scheduler.protocol.messages.  urllib honours the ``*_proxy`` environment variables; ``direct=True``
ignores them (the server's nudges, sent with http.client before this module took them over).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from http.client import HTTPResponse

DEFAULT_SERVER = "http://127.0.0.1:8470"
# The CLI's bound on connecting to a server (then each read may take the whole timeout): a server whose
# host is down or cut off is said to be unreachable after this, not after the read timeout.
CONNECT_TIMEOUT_S = 2.0
CERT_ERROR = 495  # the status of a ServerError for an HTTPS server whose certificate is not trusted (as nginx)


class ServerError(Exception):
    """A request that did not succeed: ``status`` is the HTTP status, 0 when no server answered (the
    message then says what each one did), ``CERT_ERROR`` for an untrusted certificate; ``message`` is
    what the server said (its JSON ``detail``, else its text) or what went wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


Body = bytes | IO[bytes] | None
FailOver = Callable[[ServerError, bool], bool]  # (the error, whether it came from the last server) -> try the next?


def default_token() -> str | None:
    token = os.environ.get("GSCHED_TOKEN")
    if token:
        return token.strip()
    path = Path(os.environ.get("GSCHED_HOME", "~/.gsched")).expanduser() / "admin.token"
    try:
        return path.read_text().strip()
    except OSError:
        return None


def ssl_context(ca: str | None) -> ssl.SSLContext | None:
    """A context that verifies HTTPS servers against the CA file ``ca``; None: the system's defaults."""
    return ssl.create_default_context(cafile=ca) if ca else None


def _said(raw: bytes) -> str:
    """What an error answer says: the ``detail`` of a JSON body, else its text."""
    text = raw.decode(errors="replace")
    try:
        doc = json.loads(raw)
    except ValueError:
        return text.strip()
    return str(doc.get("detail", text)) if isinstance(doc, dict) else text.strip()


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
        raise ServerError(e.code, _said(raw)) from None
    with resp:
        yield resp


def send(url: str, method: str = "GET", body: Body = None, headers: dict[str, str] | None = None,
         timeout_s: float = 60.0, context: ssl.SSLContext | None = None, direct: bool = False,
         connect_timeout_s: float | None = None) -> bytes:
    """One request to one URL; returns the answer's body (errors as ``open_url``)."""
    with open_url(url, method, body, headers, timeout_s, context, direct, connect_timeout_s) as resp:
        return bytes(resp.read())


def _not_trusted(url: str, reason: ssl.SSLCertVerificationError) -> ServerError:
    return ServerError(CERT_ERROR, f"{url}: the server's TLS certificate is not trusted ({reason.verify_message}): "
                       "pass --ca FILE or set GSCHED_CA to the CA that signed it")


class Servers:
    """The gsched servers a caller may talk to (``servers``: a list, or one comma-separated string),
    tried in order starting from the one that answered last, so a failed-over caller stays on the
    standby that took over.  Safe for one thread at a time."""

    def __init__(self, servers: str | Sequence[str], ca: str | None = None) -> None:
        listed = servers.split(",") if isinstance(servers, str) else servers
        self.urls = [s.strip().rstrip("/") for s in listed if s.strip()]
        self.context = ssl_context(ca)
        self._index = 0

    def send(self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout_s: float,
             fail_over: FailOver, connect_timeout_s: float | None = None) -> bytes:
        """The body of the first good answer.  Each failure becomes a ``ServerError`` (an HTTP status with
        what the server said; ``CERT_ERROR``; or 0 with why there was no answer) and ``fail_over(error,
        last)`` decides: True tries the next server, False raises that error.  When every server was
        failed over, raises ``ServerError(0, "URL: ...; URL: ...")``, one part per server."""
        errors = []
        for i in range(len(self.urls)):
            idx = (self._index + i) % len(self.urls)
            url = self.urls[idx]
            try:
                raw = send(url + path, method, body, headers, timeout_s, self.context,
                           connect_timeout_s=connect_timeout_s)
            except ServerError as e:
                error, line = e, f"{url}: HTTP {e.status} {e.message[:500]}".rstrip()
            except OSError as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, ssl.SSLCertVerificationError):
                    error = _not_trusted(url, reason)
                    line = error.message
                else:
                    error, line = ServerError(0, f"{url}: {reason}"), f"{url}: {reason}"
            else:
                self._index = idx
                return raw
            if not fail_over(error, i + 1 == len(self.urls)):
                raise error from None
            errors.append(line)
        raise ServerError(0, "; ".join(errors))


def fail_over_when_unanswered(error: ServerError, last: bool) -> bool:
    """The CLI's policy: try the next server when this one gave no answer, or a 5xx with another to
    try; a 4xx is the answer, and an untrusted certificate (``CERT_ERROR``, a 4xx) is said at once."""
    return error.status == 0 or (error.status >= 500 and not last)


class Client:
    """The CLI's JSON client (see the module docstring for where server, token and CA come from)."""

    def __init__(self, server: str | None = None, token: str | None = None, ca: str | None = None,
                 timeout_s: float = 30, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.servers = Servers(server or os.environ.get("GSCHED_SERVER") or DEFAULT_SERVER,
                               ca or os.environ.get("GSCHED_CA"))
        self.token = token or default_token()
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer (None for an empty one).  Raises ``ServerError``: the server's status
        and ``detail`` for an error answer; status 0 when no server answered."""
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            raw = self.servers.send(method, path, data, headers, self.timeout_s, fail_over_when_unanswered,
                                    self.connect_timeout_s)
        except ServerError as e:
            if e.status != 0:
                raise
            raise ServerError(0, f"cannot reach the gsched server ({e.message}); is `gsched server` running? "
                              "Set GSCHED_SERVER or --server") from None
        return json.loads(raw) if raw else None

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query or None)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body if body is not None else {})
