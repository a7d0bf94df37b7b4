"""``ServerError``: what a request to a gsched server (or an agent's data server) did not get, and the
statuses it carries.  Standard library only, and little of it: the CLI imports this on every start,
``--help`` and usage errors included, before it knows whether it will send a request at all."""

from __future__ import annotations

CERT_ERROR = 495  # the status of a ServerError for an HTTPS server whose certificate is not trusted (as nginx)


class ServerError(Exception):
    """A request that did not succeed: ``status`` is the HTTP status, 0 when no server answered (the
    message then says what each one did), ``CERT_ERROR`` for an untrusted certificate; ``message`` is
    what the server said (its JSON ``detail``, else its text) or what went wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def said(raw: bytes) -> str:
    """What an error answer says: the ``detail`` of a JSON body, else its text."""
    import json

    text = raw.decode(errors="replace")
    try:
        doc = json.loads(raw)
    except ValueError:
        return text.strip()
    return str(doc.get("detail", text)) if isinstance(doc, dict) else text.strip()
