"""The HTTP API (FastAPI).  Routes only parse, authenticate and delegate to ``service``/``heartbeat``.

Every error a caller can cause is a 4xx JSON body ``{"detail": message, "field": name-or-null}``
(``ErrorOut``, documented on every operation).  Who may call what:

* no token: ``/v1/health`` and ``/metrics`` only;
* agent tokens (``gsa_``, bound to a node): ``/v1/whoami`` and the node's own heartbeat, nothing else;
* user tokens: reads (queue, jobs, nodes, data sets, share, events), submit, their own jobs' logs and
  cancel, making data sets and changing the replicas of their own;
* admin tokens: everything users may do, on every job and data set, plus users and agent tokens.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from scheduler import service as svc
from scheduler.api_models import (
    MAX_ID,
    AgentTokenIn,
    DatasetIn,
    ErrorOut,
    Heartbeat,
    JobSubmit,
    PlaceIn,
    SharesIn,
    UserAdd,
)
from scheduler.auth import Identity
from scheduler.errors import ApiError, Unauthorized

MAX_BODY_BYTES = 64 << 20  # a full inventory of 200k replicas is ~30 MB
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in ((400, "Malformed request"), (401, "Missing or invalid token"), (403, "Not allowed for this token"),
                       (404, "No such object"), (409, "Conflicts with the current state"),
                       (413, "Request body too large"), (422, "Invalid field (named in `field`)"))
}
JobId = Annotated[int, Path(ge=1, le=MAX_ID)]
Name = Annotated[str, Path(min_length=1, max_length=64)]


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
    from scheduler.batching import WriteBatcher

    # Heartbeats and submits are the routes hit hundreds of times a second: each is queued to one
    # thread that commits them in batches (scheduler/batching.py), and the route awaits its answer on
    # the event loop instead of holding one of the forty request threads.
    ctx.heartbeats = WriteBatcher(db, ctx.clock.now, "heartbeat")
    ctx.submits = WriteBatcher(db, ctx.clock.now, "submit")

    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

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
            raise Unauthorized("missing token: set GSCHED_TOKEN or pass --token")
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
        token = bearer(request)
        with db.read() as s:
            return known(s, token)

    def person(request: Request) -> Identity:
        """A user or admin; agent tokens are refused (403) everywhere but their heartbeat."""
        me = who(request)
        svc.require_person(me)
        return me

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "leader": ctx.is_leader(), "time": ctx.clock.now()}

    @app.get("/v1/whoami")
    def whoami(request: Request) -> dict[str, Any]:
        me = who(request)
        return {"kind": me.kind, "name": me.name}

    # ---------------------------------------------------------- users and tokens
    @app.post("/v1/users", status_code=201)
    def add_user(body: UserAdd, request: Request) -> dict[str, Any]:
        me = person(request)
        with db.session() as s:
            token = svc.add_user(s, ctx.clock.now(), me, body.name, body.shares, body.role)
        return {"name": body.name, "token": token}

    @app.get("/v1/users")
    def users(request: Request) -> list[dict[str, Any]]:
        me = person(request)
        with db.read() as s:
            return svc.list_users(s, me)

    @app.delete("/v1/users/{name}")
    def remove_user(name: Name, request: Request) -> dict[str, Any]:
        me = person(request)
        with db.session() as s:
            svc.remove_user(s, ctx.clock.now(), me, name)
        return {"removed": name}

    @app.put("/v1/users/{name}/shares")
    def shares(name: Name, body: SharesIn, request: Request) -> dict[str, Any]:
        me = person(request)
        with db.session() as s:
            svc.set_shares(s, ctx.clock.now(), me, name, body.shares)
        return {"name": name, "shares": body.shares}

    @app.post("/v1/agent-tokens", status_code=201)
    def agent_token(body: AgentTokenIn, request: Request) -> dict[str, Any]:
        me = person(request)
        with db.session() as s:
            token = svc.create_agent_token(s, ctx.clock.now(), me, body.node)
        return {"node": body.node, "token": token}

    @app.get("/v1/share")
    def share(request: Request) -> list[dict[str, Any]]:
        person(request)
        from scheduler.views import share_rows

        with db.read() as s:
            return share_rows(s, ctx.clock.now(), ctx.settings.policy)

    # ---------------------------------------------------------- agents
    @app.post("/v1/agent/heartbeat")
    async def heartbeat(body: Heartbeat, request: Request) -> JSONResponse:
        token = bearer(request)
        from scheduler.heartbeat import process_heartbeat

        def call(s: Any, now: float) -> dict[str, Any]:
            return process_heartbeat(s, now, known(s, token), body, ctx.settings.heartbeat_ttl_s)

        reply = await asyncio.wrap_future(ctx.heartbeats.submit(call))
        if any(r.state in ("EXITED", "KILLED") for r in body.ranks):
            ctx.poke()  # devices were freed: schedule soon
        reply["heartbeat_s"] = ctx.settings.heartbeat_s
        return JSONResponse(reply)

    @app.get("/v1/nodes")
    def nodes(request: Request) -> list[dict[str, Any]]:
        person(request)
        with db.read() as s:
            return svc.node_rows(s)

    # ---------------------------------------------------------- data sets
    @app.post("/v1/datasets", status_code=201)
    def make_dataset(body: DatasetIn, request: Request) -> dict[str, Any]:
        me = person(request)
        from scheduler.datastore import register_dataset

        with db.session() as s:
            return register_dataset(s, ctx.clock.now(), me, body)

    @app.post("/v1/datasets/{name}/place")
    def place(name: Name, body: PlaceIn, request: Request) -> dict[str, Any]:
        me = person(request)
        from scheduler.datastore import set_replicas

        with db.session() as s:
            out = set_replicas(s, ctx.clock.now(), me, name, body.replicas)
        ctx.poke()
        return out

    @app.get("/v1/transfers")
    def transfers(request: Request) -> list[dict[str, Any]]:
        person(request)
        with db.read() as s:
            return svc.transfer_rows(s)

    @app.get("/v1/datasets")
    def datasets(request: Request) -> list[dict[str, Any]]:
        person(request)
        with db.read() as s:
            return svc.dataset_rows(s)

    # ---------------------------------------------------------- jobs
    @app.post("/v1/jobs", status_code=201,
              responses={200: {"description": "Already submitted with this client_request_id: that job"}})
    async def submit(body: JobSubmit, request: Request) -> JSONResponse:
        token = bearer(request)

        def call(s: Any, now: float) -> tuple[int, bool]:
            return svc.submit_job(s, now, known(s, token), body.spec, body.client_request_id)

        job_id, created = await asyncio.wrap_future(ctx.submits.submit(call))
        if created:
            ctx.poke()
        return JSONResponse({"id": job_id, "created": created}, status_code=201 if created else 200)

    @app.get("/v1/jobs")
    def queue(request: Request, all: bool = False) -> dict[str, Any]:
        person(request)
        from scheduler.views import queue_view

        with db.read() as s:
            return queue_view(s, ctx.clock.now(), ctx.settings.policy, include_done=all)

    @app.get("/v1/jobs/{job_id}")
    def show(job_id: JobId, request: Request) -> dict[str, Any]:
        me = person(request)
        with db.read() as s:
            job = svc.get_job(s, job_id)
            return svc.job_detail(s, job, with_logs=me.is_admin or job.user == me.name)

    @app.get("/v1/jobs/{job_id}/explain")
    def explain(job_id: JobId, request: Request) -> dict[str, Any]:
        person(request)
        from scheduler.views import explain_view

        with db.read() as s:
            return explain_view(s, svc.get_job(s, job_id))

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: JobId, request: Request) -> dict[str, Any]:
        me = person(request)
        with db.session() as s:
            state = svc.cancel_job(s, ctx.clock.now(), me, job_id)
        ctx.poke()
        return {"id": job_id, "state": state}

    @app.get("/v1/jobs/{job_id}/logs")
    def logs(job_id: JobId, request: Request, rank: Annotated[int | None, Query(ge=0, le=4096)] = None,
             after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0) -> dict[str, Any]:
        me = person(request)
        with db.read() as s:
            job = svc.get_job(s, job_id)
            svc.require_owner(job, me)
            return svc.job_logs(s, job, rank, after)

    @app.get("/v1/events")
    def events(request: Request, job: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
               limit: Annotated[int, Query(ge=1, le=MAX_ID)] = 100) -> list[dict[str, Any]]:
        me = person(request)
        from scheduler.views import events_view

        with db.read() as s:
            return events_view(s, me, job, max(1, min(limit, 1000)))

    @app.get("/v1/cluster/history")
    def cluster_history(request: Request, since: float | None = None,
                        limit: Annotated[int, Query(ge=1, le=MAX_ID)] = 5000) -> list[dict[str, Any]]:
        person(request)
        from scheduler.metrics import history_rows

        with db.read() as s:
            return history_rows(s, since, max(1, min(limit, 50000)))

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        from scheduler.metrics import render

        with db.read() as s:
            return PlainTextResponse(render(s, ctx), media_type="text/plain; version=0.0.4")

    return app
