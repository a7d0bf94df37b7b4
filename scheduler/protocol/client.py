"""``Client``: the CLI's JSON client over ``Servers`` (scheduler/protocol/servers.py).

The server from ``--server`` or ``GSCHED_SERVER`` (comma-separated: fails over to a standby on no
answer or a 5xx), the identity from ``GSCHED_TOKEN``, else ``$GSCHED_HOME/admin.token``, the CA from
``--ca`` or ``GSCHED_CA`` (scheduler/cli/connect.py adds the user's config file).  For start-up, this
and what it imports load neither http.client, urllib.request, ssl (unless a server is HTTPS),
pydantic nor scheduler.protocol.messages.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlencode

from scheduler.protocol.servererror import ServerError
from scheduler.protocol.servers import Servers, fail_over_when_unanswered

DEFAULT_SERVER = "http://127.0.0.1:8470"
# The CLI's bound on connecting to a server (then each read may take the whole timeout): a server whose
# host is down or cut off is said to be unreachable after this, not after the read timeout.
CONNECT_TIMEOUT_S = 2.0

TYPE_CHECKING = False  # typing itself costs the CLI 2 ms of start-up
if TYPE_CHECKING:
    from typing import Any


def default_token() -> str | None:
    token = os.environ.get("GSCHED_TOKEN")
    if token:
        return token.strip()
    path = Path(os.environ.get("GSCHED_HOME", "~/.gsched")).expanduser() / "admin.token"
    try:
        return path.read_text().strip()
    except OSError:
        return None


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
            path += "?" + urlencode({k: v for k, v in query.items() if v is not None})
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

    def every_page(self, path: str, **query: Any) -> dict[str, Any]:
        """``GET path`` page after page (``after`` = the last page's ``next``) until none is left: one
        document, the last page's with every page's ``jobs`` (``/v1/jobs``, ``/v1/history``)."""
        doc = self.get(path, **query)
        jobs = list(doc["jobs"])
        while doc.get("next") is not None:
            doc = {**doc, **self.get(path, **{**query, "after": doc["next"]})}
            jobs += doc["jobs"]
        return {**doc, "jobs": jobs, "next": None}
