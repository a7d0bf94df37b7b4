"""Data sets on the server side: register a manifest, plan replica placement, change R.

The server never touches shard bytes.  ``register_dataset`` stores the manifest, places R copies of
each shard on up nodes (``scheduler.core.replicas.lay_out``: shaped for the nodes its jobs span, one copy
whole on one node and the others striped, rack-aware, balanced by bytes) and answers with one upload per copy: the agent's address and a
ticket (HMAC from the peer key) that lets the uploader PUT exactly that shard with exactly that
checksum on exactly that node.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from scheduler.core.errors import Conflict, Forbidden, NotFound, Unprocessable
from scheduler.core.jobspec import stored
from scheduler.core.lifecycle import FINAL, NodeState, ReplicaState, TransferState
from scheduler.core.replicas import default_span, lay_out, reported_room
from scheduler.protocol.messages import DATASET
from scheduler.protocol.tickets import ticket
from scheduler.server.api_models import AbandonIn, DatasetIn
from scheduler.server.auth import Identity
from scheduler.server.service import peer_key, record, require_person
from scheduler.store.models import Dataset, Device, Job, Node, Replica, Shard, Transfer


def valid_dataset_name(name: str) -> bool:
    return bool(re.fullmatch(DATASET, name)) and ".." not in name


def _most_devices(s: Session, up_nodes: list[Node]) -> int:
    """The most healthy devices any of these nodes has (1 when none reported any)."""
    names = [n.name for n in up_nodes]
    counts = s.execute(select(Device.node, func.count()).where(Device.node.in_(names), Device.healthy.is_(True))
                       .group_by(Device.node)).all() if names else []
    return max((int(c) for _, c in counts), default=1)


def _node_bytes(s: Session) -> dict[str, int]:
    sizes = {(sh.dataset, sh.index): sh.bytes for sh in s.scalars(select(Shard))}
    out: dict[str, int] = defaultdict(int)
    for r in s.scalars(select(Replica).where(Replica.state.in_((ReplicaState.HEALTHY, ReplicaState.STAGING)))):
        out[r.node] += sizes.get((r.dataset, r.shard), 0)
    return out


def _up_nodes(s: Session, name: str, wanted: list[str]) -> list[Node]:
    """The up nodes; refuses (naming it) a node in ``wanted`` that is unknown or not up."""
    up_nodes = list(s.scalars(select(Node).where(Node.state == NodeState.UP).order_by(Node.name)))
    names = {n.name for n in up_nodes}
    for node in wanted:
        if node not in names:
            known = s.get(Node, node) is not None
            raise Conflict(f"data set {name!r}: node {node!r} is {'not up' if known else 'not known'}"
                           f"{'' if known else ' (gsched nodes lists them)'}", "nodes")
    return up_nodes


def scan_tickets(s: Session, now: float, who: Identity, name: str, nodes: list[str]) -> dict[str, Any]:
    """``gsched data add``, step 1: may ``name`` be registered from files on ``nodes``?  Refuses a name
    already taken and a node unknown or not up; answers, per node, its agent's address and a ticket
    (good for the data server's ticket time) to ask it to hash the files: ``POST /scan/<name>``."""
    require_person(who)
    if not valid_dataset_name(name):
        raise Unprocessable(f"invalid data set name {name!r}: use lowercase letters, digits, '_', '.', '-'", "name")
    if s.get(Dataset, name) is not None:
        raise Conflict(f"data set {name!r} already exists: pick another name (nothing was changed)", "name")
    up = {n.name: n for n in _up_nodes(s, name, nodes)}
    key = peer_key(s)
    ts = int(time.time())  # the agents check a ticket's age against their own clocks
    return {"name": name, "scans": [{"node": n, "address": up[n].address, "time": ts,
                                     "ticket": ticket(key, "scan", n, name, ts)} for n in dict.fromkeys(nodes)]}


def register_dataset(s: Session, now: float, who: Identity, body: DatasetIn) -> dict[str, Any]:
    """Store a data set's manifest and say where its bytes go.

    Built on the client (``gsched data make``): R copies are placed by ``lay_out`` and the answer has one
    upload per copy.  Registered in place (``gsched data add``, ``body.in_place`` names the file of every
    shard on the nodes holding it): those nodes hold the first copies, the answer has one link per file
    (a ticket for its agent to make it the shard), and the cycle's replication phase copies the rest
    from peer to peer.  Refuses a name already taken, shard indexes other than 0..N-1, a node not up and
    a shard with no file; nothing is stored then."""
    require_person(who)
    if s.get(Dataset, body.name) is not None:
        raise Conflict(f"data set {body.name!r} already exists")
    indexes = [sh.index for sh in body.shards]
    if sorted(indexes) != list(range(len(indexes))):
        raise Unprocessable("shards: indexes must be 0..N-1, each once", "shards")
    if not body.in_place and not body.image_shape:
        raise Unprocessable("image_shape: give [height, width, channels]", "image_shape")
    up_nodes = _up_nodes(s, body.name, sorted({f.node for f in body.in_place}))
    up = [(n.name, n.rack) for n in up_nodes]
    if not up:
        raise Conflict("no node is up: start agents first (gsched agent ...)")
    if body.in_place:
        return _register_in_place(s, now, who, body, len(up), _most_devices(s, up_nodes))
    up_nodes = [n for n in up_nodes if n.drained_at is None]  # a drained node takes no new copies
    up = [(n.name, n.rack) for n in up_nodes]
    if not up:
        raise Conflict("every node that is up is drained (gsched node resume NODE)")
    span = body.span if body.span is not None else default_span(body.replicas, len(up), len(body.shards),
                                                                 _most_devices(s, up_nodes))
    s.add(Dataset(name=body.name, source=body.source, classes=body.classes, image_shape=body.image_shape,
                  replicas_required=body.replicas, span=span, owner=who.name, created_at=now))
    for sh in body.shards:
        s.add(Shard(dataset=body.name, index=sh.index, bytes=sh.bytes, sha256=sh.sha256, samples=sh.samples))
    plan = lay_out([(sh.index, sh.bytes) for sh in body.shards], up, body.replicas, span=span,
                   node_bytes=_node_bytes(s), room=reported_room((n.name, n.free_bytes) for n in up_nodes))
    key = peer_key(s)
    addresses = dict(s.execute(select(Node.name, Node.address)).all())
    shas = {sh.index: sh.sha256 for sh in body.shards}
    uploads = []
    for index, nodes in sorted(plan.items()):
        for node in nodes:
            s.add(Replica(dataset=body.name, shard=index, node=node, state=ReplicaState.STAGING, updated_at=now))
            uploads.append({"shard": index, "node": node, "address": addresses[node],
                            "ticket": ticket(key, "put", node, body.name, index, shas[index])})
    record(s, now, who.actor, "data.make", f"{body.name}: {len(body.shards)} shards x {body.replicas} replicas")
    warning = ""
    if len(up) < body.replicas:
        warning = f"only {len(up)} nodes are up: each shard gets {len(up)} of {body.replicas} copies for now"
    return {"name": body.name, "uploads": uploads, "warning": warning}


def _register_in_place(s: Session, now: float, who: Identity, body: DatasetIn, n_up: int,
                       most_devices: int) -> dict[str, Any]:
    files: dict[int, dict[str, str]] = defaultdict(dict)  # shard -> node -> path
    for f in body.in_place:
        if f.shard >= len(body.shards):
            raise Unprocessable(f"in_place: shard {f.shard} is not one of the {len(body.shards)} shards", "in_place")
        files[f.shard][f.node] = f.path
    missing = [sh.index for sh in body.shards if sh.index not in files]
    if missing:
        raise Unprocessable(f"in_place: shard {missing[0]} has no file on any node", "in_place")
    span = body.span if body.span is not None else default_span(body.replicas, n_up, len(body.shards), most_devices)
    s.add(Dataset(name=body.name, source=body.source, classes=body.classes, image_shape=body.image_shape,
                  replicas_required=body.replicas, span=span, owner=who.name, created_at=now))
    key = peer_key(s)
    addresses = dict(s.execute(select(Node.name, Node.address)).all())
    links = []
    for sh in body.shards:
        s.add(Shard(dataset=body.name, index=sh.index, bytes=sh.bytes, sha256=sh.sha256, samples=sh.samples))
        for node, path in sorted(files[sh.index].items()):
            s.add(Replica(dataset=body.name, shard=sh.index, node=node, state=ReplicaState.STAGING, updated_at=now))
            links.append({"shard": sh.index, "node": node, "address": addresses[node], "path": path,
                          "sha256": sh.sha256, "ticket": ticket(key, "link", node, body.name, sh.index, sh.sha256)})
    nodes = sorted({f.node for f in body.in_place})
    record(s, now, who.actor, "data.add", f"{body.name}: {len(body.shards)} shards in place on {', '.join(nodes)}, "
                                          f"{body.replicas} replicas")
    return {"name": body.name, "links": links, "uploads": [], "warning": ""}


def abandon_registration(s: Session, now: float, who: Identity, name: str, body: AbandonIn) -> dict[str, Any]:
    """``gsched data add`` whose link step failed (a file changed since it was hashed, say): forget the
    data set it registered, so the name is free again and no shard waits for a copy that never comes.

    The data set's owner or an admin.  Only while none of its copies is healthy: it is refused (409,
    naming a healthy copy) once one is, and while a job not yet over names the data set; nothing is
    changed then.  Otherwise its manifest and expected copies are deleted, and each copy in
    ``body.linked`` gets a delete order (its agent removes the link, never the file it links to).  Touches
    nothing else stored.  Idempotent in effect: a second call finds no data set (404)."""
    require_person(who)
    d = s.get(Dataset, name)
    if d is None:
        raise NotFound(f"no data set {name!r}")
    require_dataset_owner(d, who)
    copies = list(s.scalars(select(Replica).where(Replica.dataset == name).order_by(Replica.shard, Replica.node)))
    healthy = next((r for r in copies if r.state == ReplicaState.HEALTHY), None)
    if healthy is not None:
        raise Conflict(f"data set {name!r} is not rolled back: shard {healthy.shard} has a healthy copy on node "
                       f"{healthy.node} (gsched data ls {name}); nothing was changed", "name")
    for job in s.scalars(select(Job).where(Job.state.not_in(FINAL))):
        if stored(job.spec).dataset == name:
            raise Conflict(f"data set {name!r} is not rolled back: job {job.id} reads it (gsched cancel {job.id} "
                           f"first); nothing was changed", "name")
    for r in copies:
        s.delete(r)
    for sh in s.scalars(select(Shard).where(Shard.dataset == name)):
        s.delete(sh)
    s.execute(delete(Transfer).where(Transfer.dataset == name, Transfer.job_id.is_(None),
                                     Transfer.state.in_((TransferState.PENDING, TransferState.RUNNING))))
    s.flush()
    s.delete(d)
    for ref in sorted({(c.shard, c.node) for c in body.linked}):
        s.add(Transfer(job_id=None, dataset=name, shard=ref[0], src=ref[1], dst=ref[1], bytes=0,
                       state=TransferState.DELETE, created_at=now))
    why = f": {body.reason}" if body.reason else ""
    record(s, now, who.actor, "data.abandon", f"{name}: registration rolled back{why}")
    return {"name": name, "rolled_back": True, "unlinked": len({(c.shard, c.node) for c in body.linked})}


def require_dataset_owner(d: Dataset, who: Identity) -> None:
    require_person(who)
    if not (who.is_admin or d.owner == who.name):
        raise Forbidden(f"data set {d.name!r} belongs to {d.owner}; only its owner or an admin may change it")


def set_replicas(s: Session, now: float, who: Identity, name: str, replicas: int) -> dict[str, Any]:
    """Change R (the data set's owner or an admin).  Raising it schedules copies (the cycle's replication
    phase); lowering it drops extras."""
    require_person(who)
    d = s.get(Dataset, name)
    if d is None:
        raise NotFound(f"no data set {name!r}")
    require_dataset_owner(d, who)
    old = d.replicas_required
    d.replicas_required = replicas
    dropped = []
    if replicas < old:
        for sh in s.scalars(select(Shard).where(Shard.dataset == name)):
            rows = sorted((r for r in s.scalars(select(Replica).where(Replica.dataset == name, Replica.shard == sh.index))
                           if r.state == ReplicaState.HEALTHY), key=lambda r: r.node)
            for r in rows[replicas:]:
                dropped.append({"shard": sh.index, "node": r.node})
                s.delete(r)
                s.add(Transfer(job_id=None, dataset=name, shard=sh.index, src=r.node, dst=r.node, bytes=0,
                               state=TransferState.DELETE, created_at=now))
    record(s, now, who.actor, "data.place", f"{name}: replicas {old} -> {replicas}")
    return {"name": name, "replicas": replicas, "previous": old, "dropped": dropped}
