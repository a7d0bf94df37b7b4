"""Who the caller is, and users with their shares (admins only).  A removed user's token is refused
at once: its entry in the gate's token cache is dropped (``Identities.forget``)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from scheduler.server import accounts as acc
from scheduler.server import service as svc
from scheduler.server.api_models import SharesIn, UnixUserIn, UserAdd
from scheduler.server.routes.base import ADMIN, ANY_TOKEN, Name, Routes, again, context, who

routes = Routes()


@routes.route("GET", "/v1/whoami", ANY_TOKEN)
def whoami(request: Request) -> dict[str, Any]:
    me = who(request)
    return {"kind": me.kind, "name": me.name}


@routes.route("POST", "/v1/users", ADMIN, status_code=201)
def add_user(body: UserAdd, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        me = again(s, request)
        token = svc.add_user(s, ctx.clock.now(), me, body.name, body.shares, body.role, body.unix_user)
        if body.account is not None:
            acc.set_user_account(s, ctx.clock.now(), me, body.name, body.account)
    return {"name": body.name, "token": token}


@routes.route("GET", "/v1/users", ADMIN)
def users(request: Request) -> list[dict[str, Any]]:
    me = who(request)
    with context(request).db.read() as s:
        return svc.list_users(s, me)


@routes.route("DELETE", "/v1/users/{name}", ADMIN)
def remove_user(name: Name, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        svc.remove_user(s, ctx.clock.now(), again(s, request), name)
    ctx.identities.forget(name)
    return {"removed": name}


@routes.route("PUT", "/v1/users/{name}/shares", ADMIN)
def shares(name: Name, body: SharesIn, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        svc.set_shares(s, ctx.clock.now(), again(s, request), name, body.shares)
    return {"name": name, "shares": body.shares}


@routes.route("PUT", "/v1/users/{name}/unix-user", ADMIN)
def unix_user(name: Name, body: UnixUserIn, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        svc.set_unix_user(s, ctx.clock.now(), again(s, request), name, body.unix_user)
    return {"name": name, "unix_user": body.unix_user}
