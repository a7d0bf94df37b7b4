"""PostgreSQL's pool pings a connection only when it sat idle (``scheduler/store/db.py`` ``PING_IDLE_S``):
one used a moment ago costs no round trip, and one whose server side went away while idle is replaced."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text

from scheduler.store import db as dbmod
from scheduler.store.db import Database
from scheduler.store.throwaway_postgres import ThrowawayPostgres


@pytest.fixture
def pg_db(postgres: ThrowawayPostgres):  # type: ignore[no-untyped-def]
    d = Database(postgres.new_database())
    pings: list[int] = []
    real = d.engine.dialect.do_ping

    def counted(conn):  # type: ignore[no-untyped-def]
        pings.append(1)
        return real(conn)

    d.engine.dialect.do_ping = counted  # type: ignore[method-assign]
    yield d, pings, postgres
    d.dispose()


def _pid(d: Database) -> int:
    with d.session() as s:
        return int(s.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_connection_used_a_moment_ago_is_not_pinged(pg_db, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    d, pings, _ = pg_db
    monkeypatch.setattr(dbmod, "PING_IDLE_S", 60.0)
    first = _pid(d)
    assert [_pid(d) for _ in range(5)] == [first] * 5
    assert pings == []


def test_an_idle_connection_whose_backend_went_away_is_replaced(pg_db, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    d, pings, pg = pg_db
    first = _pid(d)
    with psycopg.connect(f"host=127.0.0.1 port={pg.port} user=gsched dbname=postgres", autocommit=True) as c:
        assert c.execute("SELECT pg_terminate_backend(%s)", (first,)).fetchone() == (True,)
    monkeypatch.setattr(dbmod, "PING_IDLE_S", 0.0)  # any wait counts as idle
    second = _pid(d)  # the ping fails, the pool opens a new connection: no error reaches the caller
    assert second != first and pings

