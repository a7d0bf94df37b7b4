"""The HTTP API (FastAPI).  Routes only parse and delegate to ``service``/``heartbeat``.

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

The gate keeps who a token is for ``AUTH_CACHE_S`` (a heartbeat costs no lookup of its own); every
write still checks the token again in its own transaction, and removing a user forgets its token here
at once.  Every error a caller can cause is a 4xx JSON body ``{"detail": message, "field": name-or-null}``
(``ErrorOut``, documented on every operation).
"""

from __future__ import annotations

import asyncio
import email.message
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match

from scheduler.core.errors import ApiError, BadRequest, Forbidden, Unauthorized
from scheduler.protocol.messages import Heartbeat
from scheduler.server.api_models import (
    MAX_ID,
    AgentTokenIn,
    DatasetIn,
    ErrorOut,
    JobSubmit,
    PlaceIn,
    SharesIn,
    UserAdd,
)
from scheduler.server.auth import Identity, hash_token
from scheduler.server import service as svc

MAX_BODY_BYTES = 64 << 20  # a full inventory of 200k replicas is ~30 MB
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in ((400, "Malformed request"), (401, "Missing or invalid token"), (403, "Not allowed for this token"),
                       (404, "No such object"), (409, "Conflicts with the current state"),
                       (413, "Request body too large"), (422, "Invalid field (named in `field`)"))
}
JobId = Annotated[int, Path(ge=1, le=MAX_ID)]
Name = Annotated[str, Path(min_length=1, max_length=64)]
AUTH_CACHE_S = 5.0  # how long the gate trusts what it last read about a token
MISSING_TOKEN = "missing token: set GSCHED_TOKEN or pass --token"
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


_job_id: TypeAdapter[int] = TypeAdapter(Annotated[int, Field(ge=1, le=MAX_ID)])  # as FastAPI reads JobId


def _own_job(s: Any, me: Identity, params: dict[str, Any]) -> None:
    from scheduler.store.models import Job

    try:
        job_id = _job_id.validate_python(params.get("job_id"))
    except ValidationError:
        return
    job = s.get(Job, job_id)
    if job is not None:
        svc.require_owner(job, me)


def _own_dataset(s: Any, me: Identity, params: dict[str, Any]) -> None:
    from scheduler.server.datastore import require_dataset_owner
    from scheduler.store.models import Dataset

    d = s.get(Dataset, params.get("name"))
    if d is not None:
        require_dataset_owner(d, me)


PUBLIC, ANY_TOKEN, PERSON, ADMIN, AGENT = (Access(a) for a in ("public", "identity", "person", "admin", "agent"))
JOB_OWNER = Access("person", _own_job)
DATASET_OWNER = Access("person", _own_dataset)


class Identities:
    """Who a token is: looked up with ``lookup`` in a worker thread, and positive answers kept for
    ``ttl`` seconds (unknown tokens are looked up each time).  ``forget`` drops a user's entries, and
    a lookup that was under way when it was called is not kept."""

    def __init__(self, lookup: Callable[[str], Identity | None], ttl: float = AUTH_CACHE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lookup = lookup
        self.ttl = ttl
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
                self._known[key] = (me, now + self.ttl)
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
            except ApiError as e:
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


def create_app(ctx: Any) -> FastAPI:
    """``ctx`` is the running ``ServerContext``: ``db``, ``settings``, ``clock``, ``poke()``."""
    app = FastAPI(title="gsched", version="0.1.0", responses=ERRORS)
    db = ctx.db
    from scheduler.store.batching import WriteBatcher

    # Heartbeats and submits are the routes hit hundreds of times a second: each is queued to one
    # thread that commits them in batches (scheduler/store/batching.py), and the route awaits its answer on
    # the event loop instead of holding one of the forty request threads.
    ctx.heartbeats = WriteBatcher(db, ctx.clock.now, "heartbeat")
    ctx.submits = WriteBatcher(db, ctx.clock.now, "submit")

    def lookup(token: str) -> Identity | None:
        with db.read() as s:
            return svc.authenticate(s, token)

    identities = Identities(lookup)
    rules: dict[tuple[str, str], Access] = {
        (method, path): PUBLIC for path in (app.openapi_url, app.docs_url, app.redoc_url,
                                            app.swagger_ui_oauth2_redirect_url) if path
        for method in ("GET", "HEAD")}
    parsed_bodies: list[type[BaseModel]] = []  # bodies routes read themselves, documented all the same

    def route(method: str, path: str, access: Access, **kw: Any) -> Callable[[Callable[..., Any]], Any]:
        """``app.api_route`` for one method, with who may call it (``Access``, checked by ``Gate``)."""
        rules[(method, path)] = access
        return app.api_route(path, methods=[method], **kw)

    def body_doc(model: type[BaseModel]) -> dict[str, Any]:
        """``openapi_extra`` for a route that reads a ``model`` body itself (``read_json``, ``validated``)."""
        parsed_bodies.append(model)
        return {"requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}

    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(Gate, routes=app.router.routes, rules=rules, identities=identities, db=db)  # outermost

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        return JSONResponse({"detail": e.message, "field": e.field}, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        parts, fields = [], []
        for err in e.errors():
            loc = list(err.get("loc", ()))
            if loc and loc[0] in ("body", "query", "path", "header"):
                loc = loc[1:]
            name = ".".join(str(p) for p in loc) or "body"
            fields.append(name)
            parts.append(f"{name}: {err.get('msg')}")
        return JSONResponse({"detail": "; ".join(parts), "field": fields[0] if fields else None}, status_code=422)

    def bearer(request: Request) -> str:
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

    @route("GET", "/v1/health", PUBLIC)
    def health() -> dict[str, Any]:
        return {"ok": True, "leader": ctx.is_leader(), "time": ctx.clock.now()}

    @route("GET", "/v1/whoami", ANY_TOKEN)
    def whoami(request: Request) -> dict[str, Any]:
        me = who(request)
        return {"kind": me.kind, "name": me.name}

    # ---------------------------------------------------------- users and tokens
    @route("POST", "/v1/users", ADMIN, status_code=201)
    def add_user(body: UserAdd, request: Request) -> dict[str, Any]:
        with db.session() as s:
            token = svc.add_user(s, ctx.clock.now(), again(s, request), body.name, body.shares, body.role)
        return {"name": body.name, "token": token}

    @route("GET", "/v1/users", ADMIN)
    def users(request: Request) -> list[dict[str, Any]]:
        me = who(request)
        with db.read() as s:
            return svc.list_users(s, me)

    @route("DELETE", "/v1/users/{name}", ADMIN)
    def remove_user(name: Name, request: Request) -> dict[str, Any]:
        with db.session() as s:
            svc.remove_user(s, ctx.clock.now(), again(s, request), name)
        identities.forget(name)
        return {"removed": name}

    @route("PUT", "/v1/users/{name}/shares", ADMIN)
    def shares(name: Name, body: SharesIn, request: Request) -> dict[str, Any]:
        with db.session() as s:
            svc.set_shares(s, ctx.clock.now(), again(s, request), name, body.shares)
        return {"name": name, "shares": body.shares}

    @route("POST", "/v1/agent-tokens", ADMIN, status_code=201)
    def agent_token(body: AgentTokenIn, request: Request) -> dict[str, Any]:
        with db.session() as s:
            token = svc.create_agent_token(s, ctx.clock.now(), again(s, request), body.node)
        return {"node": body.node, "token": token}

    @route("GET", "/v1/share", PERSON)
    def share() -> list[dict[str, Any]]:
        from scheduler.server.views import share_rows

        with db.read() as s:
            return share_rows(s, ctx.clock.now(), ctx.settings.policy)

    # ---------------------------------------------------------- agents
    @route("POST", "/v1/agent/heartbeat", AGENT, openapi_extra=body_doc(Heartbeat))
    async def heartbeat(request: Request) -> JSONResponse:
        me, token = who(request), bearer(request)
        data = await read_json(request)
        node = data.get("node") if isinstance(data, dict) else None
        if isinstance(node, str) and node != me.name:  # before the rest of the body is looked at
            raise Forbidden(f"this token may not report for node {node[:100]!r}")
        body = validated(Heartbeat, data)
        from scheduler.server.heartbeat import process_heartbeat

        def call(s: Any, now: float) -> dict[str, Any]:
            return process_heartbeat(s, now, known(s, token), body, ctx.settings.heartbeat_ttl_s)

        reply = await asyncio.wrap_future(ctx.heartbeats.submit(call))
        if any(r.state in ("EXITED", "KILLED") for r in body.ranks):
            ctx.poke()  # devices were freed: schedule soon
        reply["heartbeat_s"] = ctx.settings.heartbeat_s
        return JSONResponse(reply)

    @route("GET", "/v1/nodes", PERSON)
    def nodes() -> list[dict[str, Any]]:
        with db.read() as s:
            return svc.node_rows(s)

    # ---------------------------------------------------------- data sets
    @route("POST", "/v1/datasets", PERSON, status_code=201)
    def make_dataset(body: DatasetIn, request: Request) -> dict[str, Any]:
        from scheduler.server.datastore import register_dataset

        with db.session() as s:
            return register_dataset(s, ctx.clock.now(), again(s, request), body)

    @route("POST", "/v1/datasets/{name}/place", DATASET_OWNER)
    def place(name: Name, body: PlaceIn, request: Request) -> dict[str, Any]:
        from scheduler.server.datastore import set_replicas

        with db.session() as s:
            out = set_replicas(s, ctx.clock.now(), again(s, request), name, body.replicas)
        ctx.poke()
        return out

    @route("GET", "/v1/transfers", PERSON)
    def transfers() -> list[dict[str, Any]]:
        with db.read() as s:
            return svc.transfer_rows(s)

    @route("GET", "/v1/datasets", PERSON)
    def datasets() -> list[dict[str, Any]]:
        with db.read() as s:
            return svc.dataset_rows(s)

    # ---------------------------------------------------------- jobs
    @route("POST", "/v1/jobs", PERSON, status_code=201,
           responses={200: {"description": "Already submitted with this client_request_id: that job"}})
    async def submit(body: JobSubmit, request: Request) -> JSONResponse:
        token = bearer(request)

        def call(s: Any, now: float) -> tuple[int, bool]:
            return svc.submit_job(s, now, known(s, token), body.spec, body.client_request_id)

        job_id, created = await asyncio.wrap_future(ctx.submits.submit(call))
        if created:
            ctx.poke()
        return JSONResponse({"id": job_id, "created": created}, status_code=201 if created else 200)

    @route("GET", "/v1/jobs", PERSON)
    def queue(all: bool = False) -> dict[str, Any]:
        from scheduler.server.views import queue_view

        with db.read() as s:
            return queue_view(s, ctx.clock.now(), ctx.settings.policy, include_done=all)

    @route("GET", "/v1/jobs/{job_id}", PERSON)
    def show(job_id: JobId, request: Request) -> dict[str, Any]:
        me = who(request)
        with db.read() as s:
            job = svc.get_job(s, job_id)
            return svc.job_detail(s, job, with_logs=me.is_admin or job.user == me.name)

    @route("GET", "/v1/jobs/{job_id}/explain", PERSON)
    def explain(job_id: JobId) -> dict[str, Any]:
        from scheduler.server.views import explain_view

        with db.read() as s:
            return explain_view(s, svc.get_job(s, job_id))

    @route("POST", "/v1/jobs/{job_id}/cancel", JOB_OWNER)
    def cancel(job_id: JobId, request: Request) -> dict[str, Any]:
        with db.session() as s:
            state = svc.cancel_job(s, ctx.clock.now(), again(s, request), job_id)
        ctx.poke()
        return {"id": job_id, "state": state}

    @route("GET", "/v1/jobs/{job_id}/logs", JOB_OWNER)
    def logs(job_id: JobId, request: Request, rank: Annotated[int | None, Query(ge=0, le=4096)] = None,
             after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0) -> dict[str, Any]:
        me = who(request)
        with db.read() as s:
            job = svc.get_job(s, job_id)
            svc.require_owner(job, me)
            return svc.job_logs(s, job, rank, after)

    @route("GET", "/v1/events", PERSON)
    def events(request: Request, job: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
               limit: Annotated[int, Query(ge=1, le=MAX_ID)] = 100) -> list[dict[str, Any]]:
        me = who(request)
        from scheduler.server.views import events_view

        with db.read() as s:
            return events_view(s, me, job, max(1, min(limit, 1000)))

    @route("GET", "/v1/cluster/history", PERSON)
    def cluster_history(since: float | None = None,
                        limit: Annotated[int, Query(ge=1, le=MAX_ID)] = 5000) -> list[dict[str, Any]]:
        from scheduler.server.metrics import history_rows

        with db.read() as s:
            return history_rows(s, since, max(1, min(limit, 50000)))

    @route("GET", "/metrics", PUBLIC)
    def metrics() -> PlainTextResponse:
        from scheduler.server.metrics import render

        with db.read() as s:
            return PlainTextResponse(render(s, ctx), media_type="text/plain; version=0.0.4")

    unruled = [f"{m} {r.path}" for r in app.routes if isinstance(r, APIRoute) for m in r.methods or ()
               if (m, r.path) not in rules]
    assert not unruled, f"routes without an Access (declare them with route()): {unruled}"

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
