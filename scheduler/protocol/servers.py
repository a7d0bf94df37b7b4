"""``Servers``: the gsched servers a caller may talk to, primary first then standbys, tried in order from
the one that last answered; the CLI's client (scheduler/protocol/client.py) and the agents send
through it.

Every failure is turned into a ``ServerError`` first; a ``fail_over(error, last)`` policy of the caller
says whether to try the next server or raise it.  When none is left, it raises ``ServerError(0, "URL:
what went wrong; URL: ...")``.  With a CA file it verifies HTTPS servers against it; a certificate that
does not verify is ``CERT_ERROR`` with a message naming ``--ca``.

Requests go over scheduler/protocol/http1.py (one socket, no http.client: start-up), unless a proxy
variable (``http_proxy``, ``https_proxy``, ``all_proxy``, any case) is set: then over urllib, which
honours them and ``no_proxy`` (scheduler/protocol/http.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from scheduler.protocol import http1
from scheduler.protocol.servererror import CERT_ERROR, ServerError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl

FailOver = Callable[[ServerError, bool], bool]  # (the error, whether it came from the last server) -> try the next?
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


def proxied() -> bool:
    """Whether the environment names a proxy (then urllib decides, per URL, whether to use it)."""
    return any(os.environ.get(v) or os.environ.get(v.upper()) for v in PROXY_VARIABLES)


def _not_trusted(url: str, reason: ssl.SSLCertVerificationError) -> ServerError:
    return ServerError(CERT_ERROR, f"{url}: the server's TLS certificate is not trusted ({reason.verify_message}): "
                       "pass --ca FILE or set GSCHED_CA to the CA that signed it")


def _no_answer(url: str, e: OSError) -> ServerError:
    """The failover line for a request to ``url`` that got no answer: urllib's ``URLError`` carries the
    cause in ``reason`` (an ``ssl.SSLError`` has a ``reason`` of its own, a string)."""
    reason = e if hasattr(e, "library") else getattr(e, "reason", e)
    ssl = sys.modules.get("ssl")  # loaded if TLS was tried at all
    if ssl is not None and isinstance(reason, ssl.SSLCertVerificationError):
        return _not_trusted(url, reason)
    return ServerError(0, f"{url}: {reason}")


class Servers:
    """The servers (``servers``: a list, or one comma-separated string), tried in order starting from
    the one that answered last, so a failed-over caller stays on the standby that took over.  Safe for
    one thread at a time."""

    def __init__(self, servers: str | Sequence[str], ca: str | None = None) -> None:
        listed = servers.split(",") if isinstance(servers, str) else servers
        self.urls = [s.strip().rstrip("/") for s in listed if s.strip()]
        self.ca = ca
        self._context: ssl.SSLContext | None = None
        self._index = 0

    def context(self) -> ssl.SSLContext:
        """The TLS context for HTTPS servers (``ca``'s, else the system's), made once, when first needed."""
        if self._context is None:
            import ssl

            self._context = ssl.create_default_context(cafile=self.ca)
        return self._context

    def _send_one(self, url: str, method: str, body: bytes | None, headers: dict[str, str], timeout_s: float,
                  connect_timeout_s: float | None) -> bytes:
        context = self.context() if url.startswith("https:") else None
        if proxied():
            from scheduler.protocol.http import send

            return send(url, method, body, headers, timeout_s, context, connect_timeout_s=connect_timeout_s)
        return http1.request(url, method, body, headers, timeout_s, context, connect_timeout_s)

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
                raw = self._send_one(url + path, method, body, headers, timeout_s, connect_timeout_s)
            except ServerError as e:
                error, line = e, f"{url}: HTTP {e.status} {e.message[:500]}".rstrip()
            except OSError as e:
                error = _no_answer(url, e)
                line = error.message
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
