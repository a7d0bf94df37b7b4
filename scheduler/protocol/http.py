"""A small HTTP client for the CLI (standard library only, so ``gsched queue`` starts fast).

The server comes from ``--server`` or ``GSCHED_SERVER`` (a comma-separated list is tried in order, so
the CLI fails over to a standby); the identity from ``GSCHED_TOKEN``, else ``$GSCHED_HOME/admin.token``.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_SERVER = "http://127.0.0.1:8470"
CERT_ERROR = 495  # the status of an ApiError for an HTTPS server whose certificate is not trusted (as nginx)


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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
    def __init__(self, server: str | None = None, token: str | None = None, ca: str | None = None,
                 timeout_s: float = 30) -> None:
        raw = server or os.environ.get("GSCHED_SERVER") or DEFAULT_SERVER
        self.servers = [s.strip().rstrip("/") for s in raw.split(",") if s.strip()]
        self.token = token or default_token()
        self.timeout_s = timeout_s
        ca = ca or os.environ.get("GSCHED_CA")
        self._ssl = ssl.create_default_context(cafile=ca) if ca else None
        self._index = 0

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        errors = []
        for i in range(len(self.servers)):
            idx = (self._index + i) % len(self.servers)
            req = urllib.request.Request(self.servers[idx] + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._ssl) as resp:
                    self._index = idx
                    raw = resp.read()
                    return json.loads(raw) if raw else None
            except urllib.error.HTTPError as e:
                raw = e.read()
                try:
                    detail = json.loads(raw).get("detail", raw.decode(errors="replace"))
                except ValueError:
                    detail = raw.decode(errors="replace")
                if e.code >= 500 and i + 1 < len(self.servers):
                    errors.append(f"{self.servers[idx]}: HTTP {e.code}")
                    continue
                raise ApiError(e.code, str(detail)) from None
            except (urllib.error.URLError, OSError) as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, ssl.SSLCertVerificationError):
                    raise ApiError(CERT_ERROR, f"{self.servers[idx]}: the server's TLS certificate is not trusted "
                                   f"({reason.verify_message}): pass --ca FILE or set GSCHED_CA to the CA "
                                   "that signed it") from None
                errors.append(f"{self.servers[idx]}: {reason}")
        raise ApiError(0, "cannot reach the gsched server (" + "; ".join(errors) + "); is `gsched server` running? "
                       "Set GSCHED_SERVER or --server")

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query or None)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body if body is not None else {})
