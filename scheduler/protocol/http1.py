"""One HTTP/1.1 request over one socket, for the JSON API: what ``Servers`` (scheduler/protocol/servers.py)
sends when no proxy is configured, so the CLI's requests and the agents' heartbeats.

``request(url, ...)`` connects (TCP, then TLS for ``https``, both bounded by ``connect_timeout_s``),
sends the request with ``Connection: close`` and reads the whole answer, each read bounded by
``timeout_s``.  Returns the body of a 2xx answer; any other status raises ``ServerError(status, what
the server said)``; no answer (refused, timed out, reset, TLS) raises the ``OSError`` (an untrusted
certificate: ``ssl.SSLCertVerificationError``).  Redirects are not followed (the API sends none).

Why not http.client (or urllib over it), which this replaced on the CLI's path: start-up.  ``gsched
queue`` is one request, and its whole run should take at most about twice a bare ``python -c pass``
(22 ms on the 2-core build machine).  Least of 9 fresh interpreters there: ``import http.client`` 17 ms
(it parses headers with the email package), ``urllib.request`` 24 ms, ``httptools`` (uvicorn's C
parser) 5 ms, ``h11`` 28 ms, ``httpx`` and ``requests`` over 100 ms; ``socket`` 3 ms (plain HTTP goes
over ``_socket``, see ``_open``).  What this must
read is little: a status line, header lines, and a body delimited by ``Content-Length``, by chunked
transfer coding, or by the end of the connection; anything else is refused as a malformed answer
(``OSError``).  Streaming transfers (shards, checkpoints, uploads) and proxies stay with urllib
(scheduler/protocol/http.py).
"""

from __future__ import annotations

import _socket
from urllib.parse import urlsplit

from scheduler.protocol.servererror import ServerError, said

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; a server sending more is not ours


class BadAnswer(OSError):
    """The bytes that came back are not an HTTP/1.x answer this reader can take."""


def connect(url: str, timeout_s: float, connect_timeout_s: float | None,
            context: ssl.SSLContext | None = None) -> tuple[_socket.socket, str, str]:
    """A socket connected to ``url``'s server (TLS for ``https``: ``context``, else the system's
    defaults), the ``Host`` header's value and the path of ``url`` (with its query)."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{url}: not an http:// or https:// URL")
    tls = u.scheme == "https"
    port = u.port or (443 if tls else 80)
    quick = timeout_s if connect_timeout_s is None else min(timeout_s, connect_timeout_s)
    # An ASCII host name goes to getaddrinfo as bytes: as a str, Python encodes it with the idna codec,
    # whose import (stringprep, unicodedata) costs the CLI 2 ms; a non-ASCII one still takes that path.
    host: str | bytes = u.hostname.encode("ascii") if u.hostname.isascii() else u.hostname
    sock = _open(host, port, quick, tls)
    try:
        if tls:
            import ssl

            ctx = context or ssl.create_default_context()
            sock = ctx.wrap_socket(sock, server_hostname=u.hostname)  # type: ignore[arg-type]  # the handshake, within ``quick``
        sock.settimeout(timeout_s)
    except BaseException:
        sock.close()
        raise
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return sock, u.netloc.rpartition("@")[2], path


def _open(host: str | bytes, port: int, timeout_s: float, tls: bool) -> _socket.socket:
    """A TCP connection to the first address of ``host`` that takes one (the error of the last that
    did not), as ``socket.create_connection``.  Plain HTTP uses ``_socket``, the C module the socket
    module wraps: ``import socket`` builds four IntEnums from the platform's constants (3 ms of every
    command's start).  TLS wraps a ``socket.socket``, and ssl imports socket anyway."""
    if tls:
        import socket

        return socket.create_connection((host, port), timeout=timeout_s)  # type: ignore[arg-type]  # bytes: see connect
    error: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout_s)
            sock.connect(address)
            return sock
        except OSError as e:
            error = e
            sock.close()
    raise error or OSError(f"{host!r}: no address to connect to")


def request(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None,
            timeout_s: float = 60.0, context: ssl.SSLContext | None = None,
            connect_timeout_s: float | None = None) -> bytes:
    """The body of the answer to one request (see the module docstring for errors)."""
    sock, host, path = connect(url, timeout_s, connect_timeout_s, context)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        status, raw = read_answer(sock, method)
    finally:
        sock.close()
    if 200 <= status < 300:
        return raw
    raise ServerError(status, said(raw))


def read_answer(sock: _socket.socket, method: str = "GET") -> tuple[int, bytes]:
    """(status, body) of the answer on ``sock``, read to its end."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD_BYTES:
            raise BadAnswer("the server's answer has no end of headers")
        got = sock.recv(65536)
        if not got:
            raise BadAnswer("the server closed the connection before answering" if not buf
                            else "the server's answer ended within its headers")
        buf += got
    head, _, rest = buf.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, _, code = status_line.partition(" ")
    if not version.startswith("HTTP/1.") or not code[:3].isdigit():
        raise BadAnswer(f"not an HTTP/1.x answer: {status_line[:80]!r}")
    status = int(code[:3])
    fields: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise BadAnswer(f"a malformed header line: {line[:80]!r}")
        fields[name.strip().lower()] = value.strip()
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return status, b""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return status, _dechunk(sock, rest)
    if "content-length" in fields:
        try:
            length = int(fields["content-length"])
        except ValueError:
            raise BadAnswer(f"a malformed Content-Length: {fields['content-length'][:40]!r}") from None
        parts, have = [rest], len(rest)
        while have < length:
            got = sock.recv(min(1 << 20, length - have))
            if not got:
                raise BadAnswer(f"the server's answer ended after {have} of {length} bytes")
            parts.append(got)
            have += len(got)
        return status, b"".join(parts)[:length]
    parts = [rest]  # delimited by the end of the connection
    while got := sock.recv(1 << 20):
        parts.append(got)
    return status, b"".join(parts)


def _dechunk(sock: _socket.socket, buf: bytes) -> bytes:
    """The body of a chunked answer, ``buf`` being what was read past the headers."""
    out: list[bytes] = []

    def fill(n: int) -> None:  # at least n bytes in buf
        nonlocal buf
        while len(buf) < n:
            got = sock.recv(65536)
            if not got:
                raise BadAnswer("the server's chunked answer ended early")
            buf += got

    while True:
        while b"\r\n" not in buf:
            fill(len(buf) + 1)
        size_line, _, buf = buf.partition(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadAnswer(f"a malformed chunk size: {size_line[:40]!r}") from None
        if size == 0:
            return b"".join(out)  # trailers, if any, are not read: the connection closes
        fill(size + 2)
        out.append(buf[:size])
        buf = buf[size + 2:]
