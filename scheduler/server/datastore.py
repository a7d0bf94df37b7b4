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

from scheduler.core.diskfloor import under_floor
from scheduler.core.errors import Conflict, Forbidden, NotFound, Unprocessable
from scheduler.core.jobspec import stored
from scheduler.core.lifecycle import FINAL, NodeState, ReplicaState, TransferState
from scheduler.core.replicas import default_span, lay_out
from scheduler.protocol.messages import DATASET
from scheduler.protocol.tickets import ticket
from scheduler.server.api_models import AbandonIn, DatasetIn
from scheduler.server.auth import Identity
from scheduler.server.service import peer_key, record, require_person
from scheduler.store.models import Dataset, Device, Job, Node, Replica, Shard, Transfer
from scheduler.store.room_reader import node_room


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


def register_dataset(s: Session, now: float, who: Identity, body: DatasetIn, disk_floor_bytes: int = 0) -> dict[str, Any]:
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
    # a registration of this name rolled back just now may have left delete orders no agent has taken
    # yet: they were for the old files and must not remove the new ones
    s.execute(delete(Transfer).where(Transfer.dataset == body.name, Transfer.state == TransferState.DELETE))
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
    # a drained node takes no new copies, nor does one whose disk is under the floor
    up_nodes = [n for n in up_nodes if n.drained_at is None and not under_floor(n.free_bytes, disk_floor_bytes)]
    up = [(n.name, n.rack) for n in up_nodes]
    if not up:
        raise Conflict("every node that is up is drained or under the disk floor (gsched nodes says which; "
                       "gsched node resume NODE, or free disk on a node)")
    span = body.span if body.span is not None else default_span(body.replicas, len(up), len(body.shards),
                                                                 _most_devices(s, up_nodes))
    s.add(Dataset(name=body.name, source=body.source, classes=body.classes, image_shape=body.image_shape,
                  replicas_required=body.replicas, span=span, owner=who.name, created_at=now))
    for sh in body.shards:
        s.add(Shard(dataset=body.name, index=sh.index, bytes=sh.bytes, sha256=sh.sha256, samples=sh.samples))
    plan = lay_out([(sh.index, sh.bytes) for sh in body.shards], up, body.replicas, span=span,
                   node_bytes=_node_bytes(s), room=node_room(s, now, ((n.name, n.free_bytes) for n in up_nodes)))
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
    """``gsched data add`` whose link step failed for some files (one changed since it was hashed, say).

    The data set's owner or an admin.  When a shard whose link failed has no copy at all (none healthy,
    none in ``body.linked``), the data set could never be read: the registration is rolled back, so the
    name is free again; its manifest and expected copies are deleted and every copy of it that exists
    or may (links made, copies made or under way) gets a delete order (an agent removes the shard file,
    which for a link never touches the file it links to).  Otherwise it is kept, ``rolled_back`` false:
    the cycle makes the missing copies from the others.  Refused (409, nothing changed) while a job not
    yet over names the data set.  Touches nothing else stored; a second call finds no data set (404)."""
    require_person(who)
    d = s.get(Dataset, name)
    if d is None:
        raise NotFound(f"no data set {name!r}")
    require_dataset_owner(d, who)
    copies = list(s.scalars(select(Replica).where(Replica.dataset == name).order_by(Replica.shard, Replica.node)))
    held = {(r.shard, r.node) for r in copies if r.state == ReplicaState.HEALTHY} | {(c.shard, c.node) for c in body.linked}
    lost = sorted({f.shard for f in body.failed} - {shard for shard, _ in held})
    if not lost:
        record(s, now, who.actor, "data.add", f"{name}: kept although links failed ({body.reason}); every shard has "
                                              f"a copy, the cycle makes the missing ones")
        return {"name": name, "rolled_back": False,
                "why": "every shard whose link failed has a copy on another node: the cycle makes the missing copies"}
    for job in s.scalars(select(Job).where(Job.state.not_in(FINAL))):
        if stored(job.spec).dataset == name:
            raise Conflict(f"data set {name!r} is not rolled back: job {job.id} reads it (gsched cancel {job.id} "
                           f"first); nothing was changed", "name")
    inflight = [(t.shard, t.dst) for t in s.scalars(select(Transfer).where(
        Transfer.dataset == name, Transfer.job_id.is_(None), Transfer.state.in_((TransferState.PENDING,
                                                                                 TransferState.RUNNING))))]
    drop = sorted({(r.shard, r.node) for r in copies} | held | set(inflight))
    for r in copies:
        s.delete(r)
    for sh in s.scalars(select(Shard).where(Shard.dataset == name)):
        s.delete(sh)
    s.execute(delete(Transfer).where(Transfer.dataset == name, Transfer.job_id.is_(None),
                                     Transfer.state.in_((TransferState.PENDING, TransferState.RUNNING))))
    s.flush()
    s.delete(d)
    for shard, node in drop:
        s.add(Transfer(job_id=None, dataset=name, shard=shard, src=node, dst=node, bytes=0,
                       state=TransferState.DELETE, created_at=now))
    record(s, now, who.actor, "data.abandon", f"{name}: registration rolled back, shard {lost[0]} has no copy"
                                              f"{': ' + body.reason if body.reason else ''}")
    return {"name": name, "rolled_back": True, "why": f"shard {lost[0]} has no copy", "dropped": len(drop)}


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
