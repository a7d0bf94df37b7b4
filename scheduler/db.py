"""Engine, sessions and migrations.

``open_database(url)`` returns a ``Database`` whose ``session()`` is a context manager giving one
transaction.  SQLite gets WAL, a busy timeout and foreign keys; writes are serialised with a process
lock because SQLite allows one writer.  PostgreSQL uses the engine's pool as it is.

``read()`` gives a session for reading only: it takes no write lock (under WAL, SQLite readers never
wait for the writer), so authentication, the GET routes and the cycle's snapshot do not queue behind
heartbeats and bindings.  It is always rolled back, and a flush in it is an error, so a write slipped
into a read path fails loudly instead of vanishing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class Database:
    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict = {}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
            kwargs["pool_size"] = 10
        self.engine: Engine = create_engine(url, **kwargs)
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)
        self._reader = sessionmaker(self.engine, expire_on_commit=False, autoflush=False)
        event.listen(self._reader, "before_flush", _refuse_flush)
        self._write_lock = threading.RLock() if self.is_sqlite else None

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on normal exit, rolled back on exception."""
        lock = self._write_lock
        if lock is not None:
            lock.acquire()
        try:
            with self._factory() as s, s.begin():
                yield s
        finally:
            if lock is not None:
                lock.release()

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session: no write lock, rolled back at the end; flushing raises."""
        with self._reader() as s:
            try:
                yield s
            finally:
                s.rollback()

    def upgrade(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` with Alembic (idempotent)."""
        from alembic import command

        with self.engine.begin() as conn:
            cfg = alembic_config(self.url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)

    def current_revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def dispose(self) -> None:
        self.engine.dispose()


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _refuse_flush(session: Session, _context, _instances) -> None:  # type: ignore[no-untyped-def]
    if session.new or session.dirty or session.deleted:
        raise RuntimeError("a write in a read-only session (Database.read)")


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()
