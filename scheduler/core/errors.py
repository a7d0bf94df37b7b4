"""What a request can get wrong: the one error vocabulary of the core, the store and the server.

A ``RequestError`` carries what its caller is told: ``status`` (the HTTP 4xx it becomes), ``message`` (the
words, shown as they are) and ``field`` (the name of the input that is wrong, or None).  The API answers
each one as ``{"detail": message, "field": field}`` with its status; the store's group commit
(``scheduler.store.batching``) hands it to the one caller whose call raised it.  Each subclass fixes the
status.  The CLI's client has its own exception for what it hears back (``scheduler.protocol.servererror``).
"""

from __future__ import annotations


class RequestError(Exception):
    status = 400

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class BadRequest(RequestError):
    status = 400


class Unauthorized(RequestError):
    status = 401


class Forbidden(RequestError):
    status = 403


class NotFound(RequestError):
    status = 404


class Conflict(RequestError):
    status = 409


class Unprocessable(RequestError):
    status = 422
