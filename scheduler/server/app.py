"""The HTTP API (FastAPI): ``create_app`` assembles the route modules of ``scheduler.server.routes`` (one per
resource; routes only parse and delegate to ``service``, ``heartbeat``, ``datastore`` and ``views``) behind
two plain ASGI middlewares, ``Gate`` and ``BodyLimit``.

Every request is handled in this order, so that a caller learns nothing about a route's input before
it is known to be allowed to send it:

1. authenticate: ``Gate``, a plain ASGI middleware in front of FastAPI, reads the bearer token and
   answers 401 when it is missing or unknown, on every path but the public ones (health, metrics,
   the OpenAPI schema and its pages), unknown paths and wrong methods included;
2. authorize: the same middleware checks the route's ``Access`` (who may call it, stated where the
   route is declared) and, for the routes that act on one job or data set, that the caller owns it
   (403);
3. validate: only then does FastAPI read the path, the query and the body (422 naming the field).

A heartbeat names its node in its body: its route reads the JSON, refuses another node's agent (403),
then validates.  Who may call what:

* no token: ``/v1/health`` and ``/metrics`` only (and ``/openapi.json``, ``/docs``, ``/redoc``);
* agent tokens (``gsa_``, bound to a node): ``/v1/whoami`` and the node's own heartbeat, nothing else;
* user tokens: reads (queue, jobs, nodes, data sets, share, events), submit, their own jobs' logs and
  cancel, making data sets and changing the replicas of their own;
* admin tokens: everything users may do, on every job and data set, plus users and agent tokens.

The gate keeps who a token is for ``AUTH_CACHE_S`` (an agent's for ``AGENT_AUTH_CACHE_S``, longer than
a heartbeat period, so a heartbeat costs no lookup of its own); every write, heartbeats included, still
checks the token again in its own transaction, and removing a user forgets its token here
at once.  Every error a caller can cause is a 4xx JSON body ``{"detail": message, "field": name-or-null}``
(``ErrorOut``, documented on every operation).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match

from scheduler.core.errors import Forbidden, RequestError, Unauthorized
from scheduler.server import service as svc
from scheduler.server.api_models import ErrorOut
from scheduler.server.auth import Identity, hash_token
from scheduler.server.context import ServerContext
from scheduler.server.quiet import Settled
from scheduler.server.routes import accounts, agents, cluster, datasets, jobs, users
from scheduler.server.routes.base import ANY_TOKEN, MISSING_TOKEN, PUBLIC, Access
from scheduler.store.batching import WriteBatcher

MAX_BODY_BYTES = 64 << 20  # a full inventory of 200k replicas is ~30 MB
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in ((400, "Malformed request"), (401, "Missing or invalid token"), (403, "Not allowed for this token"),
                       (404, "No such object"), (409, "Conflicts with the current state"),
                       (413, "Request body too large"), (422, "Invalid field (named in `field`)"))
}
AUTH_CACHE_S = 5.0  # how long the gate trusts what it last read about a token
# ... about an agent's token: longer than a heartbeat period, or every heartbeat looked its token up
# again.  An agent may only heartbeat (and ask whoami), and the heartbeat checks its token again in
# its own transaction, so a removed agent token is refused at its next heartbeat all the same.
AGENT_AUTH_CACHE_S = 300.0
RESOURCES = (cluster, users, accounts, agents, datasets, jobs)  # the route modules, in the order their routes are added


class Identities:
    """Who a token is: looked up with ``lookup`` in a worker thread, and positive answers kept for
    ``ttl`` seconds (``agent_ttl`` for an agent's; unknown tokens are looked up each time).  ``forget`` drops a user's entries, and
    a lookup that was under way when it was called is not kept."""

    def __init__(self, lookup: Callable[[str], Identity | None], ttl: float = AUTH_CACHE_S,
                 clock: Callable[[], float] = time.monotonic, agent_ttl: float = AGENT_AUTH_CACHE_S) -> None:
        self.lookup = lookup
        self.ttl = ttl
        self.agent_ttl = agent_ttl
        self.clock = clock
        self._known: dict[str, tuple[Identity, float]] = {}
        self._lock = threading.Lock()
        self._generation = 0

    async def __call__(self, token: str) -> Identity | None:
        key = hash_token(token)
        hit = self._known.get(key)
        now = self.clock()
        if hit is not None and hit[1] > now:
            return hit[0]
        generation = self._generation
        me = await run_in_threadpool(self.lookup, token)
        with self._lock:
            if me is None:
                self._known.pop(key, None)
            elif generation == self._generation:
                if len(self._known) > 10000:  # only valid tokens get here: this only sheds expired ones
                    self._known = {k: v for k, v in self._known.items() if v[1] > now}
                self._known[key] = (me, now + (self.agent_ttl if me.is_agent else self.ttl))
        return me

    def forget(self, name: str) -> None:
        """``name`` was removed: its token is looked up again (and refused) from now on."""
        with self._lock:
            self._generation += 1
            self._known = {k: v for k, v in self._known.items() if v[0].is_agent or v[0].name != name}


def _bearer(headers: Any) -> str:
    for name, value in headers:
        if name == b"authorization":
            auth = value.decode("latin-1")
            return auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    return ""


class Gate:
    """Authenticate, then authorize, every request before FastAPI reads its path, query or body.

    Finds the route the request is for (as Starlette's router will), answers 401 without a valid
    token unless the route is public, 403 when the route's ``Access`` refuses the identity, and
    otherwise passes the request on with the identity in ``scope["state"]["identity"]``.  Unknown
    paths and wrong methods need a valid token too (then FastAPI answers 404 or 405).  A plain ASGI
    middleware, like ``BodyLimit``."""

    def __init__(self, app: Any, routes: list[Any], rules: dict[tuple[str, str], Access],
                 identities: Identities, db: Any) -> None:
        self.app = app
        self.routes = routes
        self.rules = rules
        self.identities = identities
        self.db = db
        self._static: dict[tuple[str, str, str], Access] = {}

    def resolve(self, scope: Any) -> tuple[Access, dict[str, Any]]:
        """The first route that takes this method and path, as Starlette's router picks it; no such
        route (404, or 405 where the path exists with other methods): any valid token.  Routes
        without path parameters are remembered by method and path (a heartbeat matches no regex)."""
        key = (scope["method"], scope.get("root_path", ""), scope["path"])
        known = self._static.get(key)
        if known is not None:
            return known, {}
        for route in self.routes:
            match, child = route.matches(scope)
            if match == Match.FULL:
                access = self.rules.get((scope["method"], route.path), ANY_TOKEN)
                if "{" not in route.path:
                    self._static[key] = access
                return access, child.get("path_params", {})
        return ANY_TOKEN, {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        access, params = self.resolve(scope)
        if access.audience != "public":
            try:
                me = await self.admit(scope, access, params)
            except RequestError as e:
                response = JSONResponse({"detail": e.message, "field": None}, status_code=e.status)
                await response(scope, receive, send)
                return
            scope.setdefault("state", {})["identity"] = me
        await self.app(scope, receive, send)

    async def admit(self, scope: Any, access: Access, params: dict[str, Any]) -> Identity:
        token = _bearer(scope.get("headers", ()))
        if not token:
            raise Unauthorized(MISSING_TOKEN)
        me = await self.identities(token)
        if me is None:
            raise Unauthorized("invalid token")
        if access.audience == "agent":
            if not me.is_agent:
                raise Forbidden("only a node's agent token may send its heartbeat")
        elif access.audience in ("person", "admin"):
            svc.require_person(me)
            if access.audience == "admin":
                svc.require_admin(me)
            if access.owner is not None and not me.is_admin:
                await run_in_threadpool(self.check_owner, access.owner, me, params)
        return me

    def check_owner(self, owner: Callable[[Any, Identity, dict[str, Any]], None], me: Identity,
                    params: dict[str, Any]) -> None:
        with self.db.read() as s:
            owner(s, me, params)


class BodyLimit:
    """Refuse a declared body over ``limit`` bytes (413) before anything reads it.

    A plain ASGI middleware: Starlette's ``@app.middleware("http")`` wraps every request in an extra
    task and response stream, which cost a fifth of the server's time under 200 heartbeats a second."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for name, value in scope.get("headers", ()):
                if name == b"content-length" and (not value.isdigit() or int(value) > self.limit):
                    response = JSONResponse({"detail": f"request body larger than {self.limit} bytes", "field": None},
                                            status_code=413)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


HOT_ROUTES = (("POST", "/v1/agent/heartbeat"), ("POST", "/v1/jobs"))  # hundreds a second each


def _hot_routes_first(routes: list[Any]) -> None:
    """Put the routes of ``HOT_ROUTES`` first, the others in their order: the router tries its routes
    one by one, and a submit, the 32nd, paid for 31 path matches (a tenth of its time on the event
    loop).  Only the request each names matches it in full, so no other route's requests change hands."""
    def rank(route: Any) -> int:
        for i, (method, path) in enumerate(HOT_ROUTES):
            if getattr(route, "path", None) == path and method in (getattr(route, "methods", None) or ()):
                return i
        return len(HOT_ROUTES)

    routes.sort(key=rank)


def create_app(ctx: ServerContext) -> FastAPI:
    """The API of the running server ``ctx`` (its ``db``, ``settings``, ``clock``, ``poke()``), kept in
    ``app.state.ctx`` for the routes.  Every route is declared in a module of ``RESOURCES`` with its
    ``Access``; one without fails here, at start-up."""
    # FastAPI's own OpenTelemetry hooks asked, on every request, whether a tracer, meter or logger
    # provider had been set up (a few per cent of a submit's time on the event loop); the server has
    # its own /metrics and logs, and sets none up.
    app = FastAPI(title="gsched", version="0.1.0", responses=ERRORS,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    db = ctx.db
    app.state.ctx = ctx

    # Heartbeats and submits are the routes hit hundreds of times a second: each is queued to one
    # thread that commits them in batches (scheduler/store/batching.py), and the route awaits its answer on
    # the event loop instead of holding one of the forty request threads.
    ctx.heartbeats = WriteBatcher(db, ctx.clock.now, "heartbeat")
    ctx.submits = WriteBatcher(db, ctx.clock.now, "submit", linger_s=0.001)
    ctx.settled = Settled()

    def lookup(token: str) -> Identity | None:
        with db.read() as s:
            return svc.authenticate(s, token)

    ctx.identities = identities = Identities(lookup)
    rules: dict[tuple[str, str], Access] = {
        (method, path): PUBLIC for path in (app.openapi_url, app.docs_url, app.redoc_url,
                                            app.swagger_ui_oauth2_redirect_url) if path
        for method in ("GET", "HEAD")}
    parsed_bodies: list[type[BaseModel]] = []  # bodies routes read themselves, documented all the same
    for resource in RESOURCES:
        for r in resource.routes.declared:
            rules[(r.method, r.path)] = r.access
            app.add_api_route(r.path, r.endpoint, methods=[r.method], **r.options)
        parsed_bodies += resource.routes.parsed_bodies
    _hot_routes_first(app.router.routes)

    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(Gate, routes=app.router.routes, rules=rules, identities=identities, db=db)  # outermost

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, e: RequestError) -> JSONResponse:
        return JSONResponse({"detail": e.message, "field": e.field}, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        parts, fields = [], []
        for err in e.errors():
            loc = list(err.get("loc", ()))
            if err.get("type") == "json_invalid":  # its loc is ("body", character): name the body, say where
                fields.append("body")
                parts.append(f"body: not valid JSON ({err.get('msg')} at character {loc[-1] if len(loc) > 1 else 0})")
                continue
            if loc and loc[0] in ("body", "query", "path", "header"):
                loc = loc[1:]
            name = ".".join(str(p) for p in loc) or "body"
            fields.append(name)
            parts.append(f"{name}: {err.get('msg')}")
        return JSONResponse({"detail": "; ".join(parts), "field": fields[0] if fields else None}, status_code=422)

    unruled = [f"{m} {r.path}" for r in app.routes if isinstance(r, APIRoute) for m in r.methods or ()
               if (m, r.path) not in rules]
    assert not unruled, f"routes without an Access (declare them with Routes.route()): {unruled}"

    schema_of_routes = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's schema, plus the models of the bodies that routes read themselves."""
        if app.openapi_schema is None:
            components = schema_of_routes().setdefault("components", {}).setdefault("schemas", {})
            for model in parsed_bodies:
                doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(doc.pop("$defs", {}))
                components[model.__name__] = doc
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
