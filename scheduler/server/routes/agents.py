"""What agents call, and their tokens: a node's heartbeat (its agent's token only) and making an
agent token (admins).

A heartbeat names its node in its body: the route reads the JSON, refuses another node's agent (403)
before looking at the rest, then validates.  Heartbeats are queued to the group commit
(``ctx.heartbeats``, ``scheduler.store.batching``) and awaited on the event loop.  A heartbeat with
nothing new, from an idle node or one whose ranks still run, is answered by ``scheduler.server.quiet``
(one conditional UPDATE); the others by ``scheduler.server.heartbeat``."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from scheduler.core.errors import Forbidden
from scheduler.core.lifecycle import RANK_FINAL
from scheduler.protocol.messages import Heartbeat
from scheduler.server import service as svc
from scheduler.server.api_models import AgentTokenIn
from scheduler.server.heartbeat import process_heartbeat
from scheduler.server.quiet import quiet_heartbeat
from scheduler.server.routes.base import (
    ADMIN,
    AGENT,
    Routes,
    again,
    bearer,
    context,
    known,
    read_json,
    validated,
    who,
)

routes = Routes()


@routes.route("POST", "/v1/agent/heartbeat", AGENT, openapi_extra=routes.body_doc(Heartbeat))
async def heartbeat(request: Request) -> JSONResponse:
    ctx = context(request)
    me, token = who(request), bearer(request)
    data = await read_json(request)
    node = data.get("node") if isinstance(data, dict) else None
    if isinstance(node, str) and node != me.name:  # before the rest of the body is looked at
        raise Forbidden(f"this token may not report for node {node[:100]!r}")
    body = validated(Heartbeat, data)

    def call(s: Any, now: float) -> dict[str, Any]:
        floor = ctx.settings.disk_floor_bytes
        quick = quiet_heartbeat(s, now, token, body, ctx.settled, floor)
        if quick is not None:
            return quick
        return process_heartbeat(s, now, known(s, token), body, ctx.settings.heartbeat_ttl_s,
                                 single_team=ctx.settings.run_as_agent_user, disk_floor_bytes=floor,
                                 settled=ctx.settled)

    reply = await asyncio.wrap_future(ctx.heartbeats.submit(call))
    if any(r.state in RANK_FINAL for r in body.ranks):
        ctx.poke()  # devices were freed: schedule soon
    reply["heartbeat_s"] = ctx.settings.heartbeat_s
    reply["ttl_s"] = ctx.settings.heartbeat_ttl_s  # the agent's fence stops its ranks before this runs out
    return JSONResponse(reply)


@routes.route("POST", "/v1/agent-tokens", ADMIN, status_code=201)
def agent_token(body: AgentTokenIn, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        token = svc.create_agent_token(s, ctx.clock.now(), again(s, request), body.node)
    return {"node": body.node, "token": token}
