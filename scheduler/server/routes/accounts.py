"""The fair-share account tree: accounts (admins add and move them), a user's account (admins move
users), and the tree with its shares, usage and factors (``gsched share``, anyone)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from scheduler.server import accounts as acc
from scheduler.server.api_models import AccountAdd, AccountIn, ParentIn
from scheduler.server.routes.base import ADMIN, PERSON, Name, Routes, again, context

routes = Routes()


@routes.route("POST", "/v1/accounts", ADMIN, status_code=201)
def add_account(body: AccountAdd, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        acc.add_account(s, ctx.clock.now(), again(s, request), body.name, body.parent, body.shares)
    return {"name": body.name, "parent": body.parent or "root", "shares": body.shares}


@routes.route("GET", "/v1/accounts", PERSON)
def accounts(request: Request) -> list[dict[str, Any]]:
    with context(request).db.read() as s:
        return acc.list_accounts(s)


@routes.route("PUT", "/v1/accounts/{name}/parent", ADMIN)
def move_account(name: Name, body: ParentIn, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        acc.set_account_parent(s, ctx.clock.now(), again(s, request), name, body.parent)
    return {"name": name, "parent": body.parent or "root"}


@routes.route("PUT", "/v1/users/{name}/account", ADMIN)
def move_user(name: Name, body: AccountIn, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        acc.set_user_account(s, ctx.clock.now(), again(s, request), name, body.account)
    return {"name": name, "account": body.account or "root"}


@routes.route("GET", "/v1/share/tree", PERSON)
def share_tree(request: Request) -> list[dict[str, Any]]:
    ctx = context(request)
    with ctx.db.read() as s:
        return acc.share_tree_rows(s, ctx.clock.now(), ctx.settings.policy, devices=True,
                                   disk_floor_bytes=ctx.settings.disk_floor_bytes)
