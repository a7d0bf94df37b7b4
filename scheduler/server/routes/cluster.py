"""The cluster as a whole: health, nodes, fair share, the event log, the cluster history and the
Prometheus metrics.  Health is public (probes carry no token); metrics are public too unless the
config sets ``metrics_token``, which the scraper then sends as its bearer token; the rest is for
users and admins."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import PlainTextResponse

from scheduler.core.errors import Unauthorized
from scheduler.server import service as svc
from scheduler.server.api_models import MAX_ID, NodeDrain
from scheduler.server.drain import drain_node, resume_node
from scheduler.server.metrics import history_rows, render
from scheduler.server.routes.base import ADMIN, PERSON, PUBLIC, Name, Routes, again, context, who
from scheduler.server.views import events_view, share_rows

routes = Routes()


@routes.route("GET", "/v1/health", PUBLIC)
def health(request: Request) -> dict[str, Any]:
    ctx = context(request)
    return {"ok": True, "leader": ctx.is_leader(), "time": ctx.clock.now()}


@routes.route("GET", "/v1/nodes", PERSON)
def nodes(request: Request) -> list[dict[str, Any]]:
    with context(request).db.read() as s:
        return svc.node_rows(s, context(request).settings.disk_floor_bytes)


@routes.route("POST", "/v1/nodes/{name}/drain", ADMIN)
def drain(name: Name, body: NodeDrain, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        return drain_node(s, ctx.clock.now(), again(s, request), name, body.reason)


@routes.route("POST", "/v1/nodes/{name}/resume", ADMIN)
def resume(name: Name, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        out = resume_node(s, ctx.clock.now(), again(s, request), name)
    ctx.poke()
    return out


@routes.route("GET", "/v1/share", PERSON)
def share(request: Request) -> list[dict[str, Any]]:
    ctx = context(request)
    with ctx.db.read() as s:
        return share_rows(s, ctx.clock.now(), ctx.settings.policy)


@routes.route("GET", "/v1/events", PERSON)
def events(request: Request, job: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
           limit: Annotated[int, Query(ge=1, le=MAX_ID)] = 100) -> list[dict[str, Any]]:
    me = who(request)
    with context(request).db.read() as s:
        return events_view(s, me, job, max(1, min(limit, 1000)))


@routes.route("GET", "/v1/cluster/history", PERSON)
def cluster_history(request: Request, since: float | None = None,
                    limit: Annotated[int, Query(ge=1, le=MAX_ID)] = 5000) -> list[dict[str, Any]]:
    with context(request).db.read() as s:
        return history_rows(s, since, max(1, min(limit, 50000)))


@routes.route("GET", "/metrics", PUBLIC)
def metrics(request: Request) -> PlainTextResponse:
    """Prometheus text.  With ``metrics_token`` set, a request without that bearer token is 401 and
    is told nothing else (user and node names are in the metrics); user and agent tokens are not it."""
    ctx = context(request)
    want = ctx.settings.metrics_token
    if want:
        auth = request.headers.get("authorization", "")
        got = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not got:
            raise Unauthorized("missing token: this server's /metrics needs its metrics_token")
        if not hmac.compare_digest(got.encode(), want.encode()):
            raise Unauthorized("invalid token")
    with ctx.db.read() as s:
        return PlainTextResponse(render(s, ctx), media_type="text/plain; version=0.0.4")
