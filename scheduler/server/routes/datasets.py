"""Data sets: making one (or registering one from files the nodes have: scan tickets), changing how many replicas it keeps (its owner or an admin), listing them,
and the transfers under way."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from scheduler.server import service as svc
from scheduler.server.api_models import AbandonIn, DatasetIn, PlaceIn, ScanIn
from scheduler.server.auth import Identity
from scheduler.server.datastore import (
    abandon_registration,
    register_dataset,
    require_dataset_owner,
    scan_tickets,
    set_replicas,
)
from scheduler.server.routes.base import PERSON, Access, Name, Routes, again, context
from scheduler.store.models import Dataset

routes = Routes()


def _own_dataset(s: Any, me: Identity, params: dict[str, Any]) -> None:
    """``Access.owner`` for routes on one data set: the data set the path names is ``me``'s."""
    d = s.get(Dataset, params.get("name"))
    if d is not None:
        require_dataset_owner(d, me)


DATASET_OWNER = Access("person", _own_dataset)


@routes.route("POST", "/v1/datasets", PERSON, status_code=201)
def make_dataset(body: DatasetIn, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        return register_dataset(s, ctx.clock.now(), again(s, request), body, ctx.settings.disk_floor_bytes)


@routes.route("POST", "/v1/datasets/{name}/scan", PERSON)
def scan(name: Name, body: ScanIn, request: Request) -> dict[str, Any]:
    """``gsched data add``: tickets for the nodes' agents to hash the files (see datastore.scan_tickets)."""
    ctx = context(request)
    with ctx.db.session() as s:  # the first ticket ever made may create the peer key
        return scan_tickets(s, ctx.clock.now(), again(s, request), name, body.nodes)


@routes.route("POST", "/v1/datasets/{name}/place", DATASET_OWNER)
def place(name: Name, body: PlaceIn, request: Request) -> dict[str, Any]:
    ctx = context(request)
    with ctx.db.session() as s:
        out = set_replicas(s, ctx.clock.now(), again(s, request), name, body.replicas)
    ctx.poke()
    return out


@routes.route("POST", "/v1/datasets/{name}/abandon", DATASET_OWNER)
def abandon(name: Name, body: AbandonIn, request: Request) -> dict[str, Any]:
    """``gsched data add`` whose link failed: roll the registration back (see datastore.abandon_registration)."""
    ctx = context(request)
    with ctx.db.session() as s:
        return abandon_registration(s, ctx.clock.now(), again(s, request), name, body)


@routes.route("GET", "/v1/transfers", PERSON)
def transfers(request: Request) -> list[dict[str, Any]]:
    with context(request).db.read() as s:
        return svc.transfer_rows(s)


@routes.route("GET", "/v1/datasets", PERSON)
def datasets(request: Request) -> list[dict[str, Any]]:
    with context(request).db.read() as s:
        return svc.dataset_rows(s)
