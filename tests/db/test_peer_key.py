"""The peer key (tickets between nodes) is made once and then kept per database: a heartbeat's reply
carries it without a query; a key made in a transaction that rolls back is never kept."""

from __future__ import annotations

from sqlalchemy import event

from scheduler.server import service as svc
from scheduler.store.db import Database
from scheduler.store.models import Setting


def _statements(db: Database) -> list[str]:
    seen: list[str] = []
    event.listen(db.engine, "before_cursor_execute",
                 lambda conn, cur, stmt, params, ctx, many: seen.append(stmt))
    return seen


def test_the_key_is_read_once_then_kept(db: Database) -> None:
    with db.session() as s:
        made = svc.peer_key(s)
        assert svc.peer_key(s) == made  # made in this transaction: not kept yet
    seen = _statements(db)
    with db.session() as s:
        assert svc.peer_key(s) == made
    reads = [x for x in seen if "settings" in x]
    with db.session() as s:
        assert svc.peer_key(s) == made
    assert len(reads) == 1 and [x for x in seen if "settings" in x] == reads


def test_a_key_made_in_a_rolled_back_transaction_is_not_kept(db: Database) -> None:
    class Boom(Exception):
        pass

    try:
        with db.session() as s:
            lost = svc.peer_key(s)
            raise Boom
    except Boom:
        pass
    with db.session() as s:
        kept = svc.peer_key(s)
    assert kept != lost
    with db.session() as s:
        assert s.get(Setting, "peer_key").value == kept  # type: ignore[union-attr]
