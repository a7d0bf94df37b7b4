"""A steady heartbeat writes what changed and nothing else: the node's last_seen.  A changed device
is still written."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, select

from scheduler.protocol.messages import Heartbeat
from scheduler.server.auth import Identity
from scheduler.server.heartbeat import process_heartbeat
from scheduler.store.db import Database
from scheduler.store.models import Device, Node


def _hb(**device: Any) -> Heartbeat:
    return Heartbeat.model_validate({
        "node": "n1", "rack": "r0", "address": "127.0.0.1:9", "incarnation": "a", "free_bytes": 10**12,
        "devices": [{"index": i, **(device if i == 3 else {})} for i in range(8)], "replicas": None})


def test_a_steady_heartbeat_updates_last_seen_only_and_a_changed_device_is_written(db: Database) -> None:
    with db.session() as s:
        process_heartbeat(s, 1000.0, Identity("agent", "n1"), _hb())
    writes: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda conn, cur, stmt, params, ctx, many: writes.append(stmt)
                 if stmt.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE")) else None)
    with db.session() as s:
        process_heartbeat(s, 1005.0, Identity("agent", "n1"), _hb())
    assert [w.split()[1] for w in writes] == ["nodes"]
    with db.read() as s:
        assert s.get(Node, "n1").last_seen == 1005.0  # type: ignore[union-attr]

    writes.clear()
    with db.session() as s:
        process_heartbeat(s, 1010.0, Identity("agent", "n1"), _hb(healthy=False, health="ECC errors"))
    assert sorted(w.split()[1] for w in writes) == ["devices", "nodes"]
    with db.read() as s:
        d = s.scalar(select(Device).where(Device.node == "n1", Device.index == 3))
        assert d is not None and not d.healthy and d.health == "ECC errors"
