"""What every route module shares: who may call a route, how a module declares its routes, and the
helpers a route uses to reach the server and the caller.

A module declares its routes on its own ``Routes`` (``routes.route(method, path, access)``, one method
each) and ``scheduler.server.app.create_app`` adds them to the app in one place, with each route's
``Access`` for the gate.  Routes take the request's ``ServerContext`` from ``context(request)`` and
import everything they use at the top of their module.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Path, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from scheduler.core.errors import BadRequest, Unauthorized
from scheduler.server import service as svc
from scheduler.server.api_models import MAX_ID
from scheduler.server.auth import Identity
from scheduler.server.context import ServerContext

MISSING_TOKEN = "missing token: set GSCHED_TOKEN or pass --token"
JobId = Annotated[int, Path(ge=1, le=MAX_ID)]
Name = Annotated[str, Path(min_length=1, max_length=64)]
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Access:
    """Who may call a route, checked by ``Gate`` before anything reads the request's path, query or body.

    ``audience``: ``public`` (no token), ``identity`` (any valid token), ``person`` (users and admins),
    ``admin``, ``agent``.  ``owner``, for a non-admin person: ``owner(session, identity, path_params)``
    raises ``Forbidden`` when the object the path names belongs to someone else (and returns when it
    does not exist or the path does not name one: the route then answers 404 or 422)."""

    audience: str
    owner: Callable[[Any, Identity, dict[str, Any]], None] | None = None


PUBLIC, ANY_TOKEN, PERSON, ADMIN, AGENT = (Access(a) for a in ("public", "identity", "person", "admin", "agent"))


@dataclass(frozen=True)
class Route:
    """One declared route: ``endpoint`` answers ``method`` on ``path`` for callers ``access`` admits;
    ``options`` go to FastAPI's ``add_api_route`` as they are (status code, extra responses, ...)."""

    method: str
    path: str
    access: Access
    endpoint: Callable[..., Any]
    options: dict[str, Any]


@dataclass
class Routes:
    """The routes of one resource, in the order declared, and the bodies they read themselves."""

    declared: list[Route] = field(default_factory=list)
    parsed_bodies: list[type[BaseModel]] = field(default_factory=list)

    def route(self, method: str, path: str, access: Access, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        """Declare the decorated function as the route for one method and path, with who may call it."""
        def declare(endpoint: Callable[..., Any]) -> Callable[..., Any]:
            self.declared.append(Route(method, path, access, endpoint, options))
            return endpoint
        return declare

    def body_doc(self, model: type[BaseModel]) -> dict[str, Any]:
        """``openapi_extra`` for a route that reads a ``model`` body itself (``read_json``, ``validated``);
        the app adds ``model``'s schema to the document."""
        self.parsed_bodies.append(model)
        return {"requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def context(request: Request) -> ServerContext:
    """The running server this request came to (``create_app`` keeps it in ``app.state.ctx``)."""
    ctx: ServerContext = request.app.state.ctx
    return ctx


def bearer(request: Request) -> str:
    """The request's bearer token; 401 when there is none."""
    auth = request.headers.get("authorization", "")
    token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    if not token:
        raise Unauthorized(MISSING_TOKEN)
    return token


def known(s: Any, token: str) -> Identity:
    """The token's identity, read once per transaction: a batch of one user's submits shares it."""
    seen = s.info.setdefault("identities", {})
    if token not in seen:
        seen[token] = svc.authenticate(s, token)
    if seen[token] is None:
        raise Unauthorized("invalid token")
    return seen[token]


def who(request: Request) -> Identity:
    """The caller, as the gate found it (authenticated and allowed on this route)."""
    me = request.scope.get("state", {}).get("identity")
    if me is None:
        raise Unauthorized(MISSING_TOKEN)
    return me


def again(s: Any, request: Request) -> Identity:
    """The caller read again inside a write's own transaction: the gate's answer may be seconds old."""
    return known(s, bearer(request))


async def read_json(request: Request) -> Any:
    """The request's body as FastAPI reads a declared one: JSON for a JSON content type, else the bytes
    (which then fail validation); 422 for an empty body or bad JSON, as FastAPI words them."""
    raw = await request.body()
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    message = email.message.Message()
    message["content-type"] = request.headers.get("content-type", "")
    subtype = message.get_content_subtype()
    if message.get_content_maintype() != "application" or not (subtype == "json" or subtype.endswith("+json")):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": e.msg}}]) from e
    except ValueError as e:  # not UTF-8
        raise BadRequest("There was an error parsing the body") from e


def validated(model: type[M], data: Any) -> M:
    """``data`` as ``model``, or the 422 FastAPI gives for a declared body of that model."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from e
