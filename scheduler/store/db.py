"""Engine, sessions and migrations.

``open_database(url)`` returns a ``Database`` whose ``session()`` is a context manager giving one
transaction.  SQLite gets WAL, a busy timeout and foreign keys; writes are serialised with a process
lock because SQLite allows one writer, and between processes (the server and its cycle process) by a
``flock`` on ``<database>.writer`` (``_WriterLock``), with ``BEGIN IMMEDIATE`` behind it.  PostgreSQL
uses the engine's pool, which pings a connection only when it sat idle (``PING_IDLE_S``); a flush of
several new rows of one table takes their ids from its sequence first (``_number_new_rows``).

Under SQLite every session is one real transaction from its first statement (``BEGIN`` is emitted by
us, not by the sqlite3 module, which would start it only at the first write): a read session sees one
consistent state, and savepoints nest inside the transaction instead of committing it.

``read()`` gives a session for reading only: it takes no write lock (under WAL, SQLite readers never
wait for the writer), so authentication, the GET routes and the cycle's snapshot do not queue behind
heartbeats and bindings.  It is always rolled back, and a flush in it is an error, so a write slipped
into a read path fails loudly instead of vanishing.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from sqlalchemy import Integer, Table, create_engine, event, exc, func, insert, inspect, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from scheduler.store.models import Event

AT_COMMIT = "add_at_commit"  # Session.info: events (column dicts, or functions making one) a write session
# writes as it commits (effects.record_at_commit)
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


class Database:
    def __init__(self, url: str, autocheckpoint: bool = True) -> None:
        """``autocheckpoint=False`` (the server's HTTP process): this process's commits never copy the
        WAL back into the database file; another process calls ``checkpoint()`` (the cycle process,
        after each cycle).  A checkpoint with fsync inside a heartbeat batch's commit stalled every
        heartbeat behind it for about 100 ms."""
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict = {}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            # One connection per server thread (40 request threads, the cycle and the timer) kept
            # open: a new SQLite connection re-runs the pragmas and re-parses the schema on its first
            # statement, and the default pool (5 + 10 overflow, overflow closed on return) did that
            # for every tenth heartbeat under load.
            kwargs["pool_size"] = 64
            kwargs["max_overflow"] = 64
        else:
            # Every request thread (the Gate's token lookup, the GET routes) and both group-commit
            # threads check a connection out: 10 kept plus overflow closed on return opened a new
            # connection (a PostgreSQL backend) for some requests under load.  20 kept, 20 more at most.
            kwargs["pool_size"] = 20
            kwargs["max_overflow"] = 20
        self.engine: Engine = create_engine(url, **kwargs)
        if not self.is_sqlite:
            # In place of pool_pre_ping, which cost a round trip (SELECT 1) on every checkout: a
            # connection idle in the pool for more than PING_IDLE_S is pinged, and replaced when the
            # ping fails.  One checked in a moment ago is used as it is; should the server have gone in
            # that moment, its first statement fails and the pool drops every older connection.
            event.listen(self.engine.pool, "checkin", _note_checkin)
            event.listen(self.engine.pool, "checkout", _ping_if_idle(self.engine))
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
            if not autocheckpoint:
                event.listen(self.engine, "connect", _no_autocheckpoint)
            event.listen(self.engine, "begin", _sqlite_begin)
        # Write sessions take SQLite's write lock when they begin (BEGIN IMMEDIATE): the cycle runs in
        # its own process, and a deferred transaction that read first could not later write after
        # the other process committed (SQLITE_BUSY at once, no waiting).
        writer = self.engine.execution_options(sqlite_begin="BEGIN IMMEDIATE") if self.is_sqlite else self.engine
        self._factory = sessionmaker(writer, expire_on_commit=False)
        self._reader = sessionmaker(self.engine, expire_on_commit=False, autoflush=False)
        event.listen(self._reader, "before_flush", _refuse_flush)
        event.listen(self._factory, "before_commit", _add_at_commit)
        if not self.is_sqlite:
            event.listen(self._factory, "before_flush", _number_new_rows)
        self._write_lock = _WriterLock(self.engine.url.database) if self.is_sqlite else None

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

    def checkpoint(self) -> None:
        """Copy the SQLite WAL back into the database file without blocking readers or writers."""
        if self.is_sqlite:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

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


class _WriterLock:
    """SQLite's one writer, between the threads of this process (an RLock) and between processes
    (``flock`` on ``<database>.writer``, taken by the outermost holder).  SQLite's own busy handler
    polls with sleeps of up to 100 ms, so a heartbeat waiting behind the cycle process's write
    slept long after the lock was free; a blocked ``flock`` wakes as soon as it is released."""

    def __init__(self, database: str | None) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._path = f"{database}.writer" if database and database != ":memory:" else None
        self._fd: int | None = None

    def acquire(self) -> None:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1 and self._path is not None:
            try:
                if self._fd is None:
                    self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except BaseException:
                self._depth -= 1
                self._lock.release()
                raise

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._lock.release()


PING_IDLE_S = 1.0


def _note_checkin(_dbapi_conn, record) -> None:  # type: ignore[no-untyped-def]
    record.info["checked_in"] = time.monotonic()


def _ping_if_idle(engine: Engine):  # type: ignore[no-untyped-def]
    def checkout(dbapi_conn, record, _proxy) -> None:  # type: ignore[no-untyped-def]
        since = record.info.get("checked_in")
        if since is None or time.monotonic() - since <= PING_IDLE_S:
            return  # new, or used a moment ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as e:  # noqa: BLE001 - any failure: the pool retries with a new connection
            raise exc.DisconnectionError(f"connection idle {time.monotonic() - since:.0f} s failed its ping: {e}") from e

    return checkout


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _add_at_commit(session: Session) -> None:
    """Write the events ``record_at_commit`` kept, in one INSERT (no ORM objects: nothing reads them
    back).  One that is a function makes its row from what the flush gives (a new job's id): the
    session is flushed first."""
    rows = session.info.pop(AT_COMMIT, None)
    if rows:
        if any(callable(r) for r in rows):
            session.flush()
        session.execute(insert(cast(Table, Event.__table__)), [r() if callable(r) else r for r in rows])


PREALLOCATE_AT = 2  # new rows of one table in one flush from which their ids are taken beforehand


def _number_new_rows(session: Session, _context, _instances) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL: give the new rows of a table their ids from its sequence before the flush, in one
    ``SELECT nextval(...)`` for all of them, where the flush holds ``PREALLOCATE_AT`` or more of them.

    Left to the ORM, rows whose ids the database makes are written by one ``INSERT ... VALUES (...),
    (...) RETURNING id`` with every row's parameters in it: a statement psycopg parses again each time
    (it keeps the parsed form only of statements with at most 50 parameters), which was a third of a
    group-committed batch of submits.  With their ids known the rows go as one short statement run
    for each row (psycopg's ``executemany``, pipelined: one round trip), parsed once per connection.
    The ids are the ones the column's default would have taken, in the order the rows were added.
    """
    by_table: dict[Table, list[object]] = {}
    for obj in session.new:
        mapper = getattr(obj, "__mapper__", None)
        if mapper is None or len(mapper.primary_key) != 1:
            continue
        pk = mapper.primary_key[0]
        if pk.autoincrement is not True and not (pk.autoincrement == "auto" and isinstance(pk.type, Integer)):
            continue
        if getattr(obj, pk.key) is None:
            by_table.setdefault(cast(Table, pk.table), []).append(obj)
    for table, objs in by_table.items():
        if len(objs) < PREALLOCATE_AT:
            continue
        pk = table.primary_key.columns.values()[0]
        ids = session.execute(
            select(func.nextval(func.pg_get_serial_sequence(table.name, pk.name)))
            .select_from(func.generate_series(1, len(objs)))).scalars().all()
        for obj, new_id in zip(sorted(objs, key=_added_order), ids, strict=True):
            setattr(obj, pk.key, new_id)


def _added_order(obj: object) -> int:
    """The order objects were added to the session in (what the flush inserts them in)."""
    return cast(int, getattr(inspect(obj), "insert_order", 0))


def _refuse_flush(session: Session, _context, _instances) -> None:  # type: ignore[no-untyped-def]
    if session.new or session.dirty or session.deleted:
        raise RuntimeError("a write in a read-only session (Database.read)")


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    # The sqlite3 module's own transaction handling starts a transaction only before a write, so the
    # reads of a session ran outside it and a SAVEPOINT could commit early; it is switched off and
    # every session begins its transaction itself (_sqlite_begin), the way SQLAlchemy documents.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _no_autocheckpoint(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA wal_autocheckpoint=0")
    cur.close()


def _sqlite_begin(conn) -> None:  # type: ignore[no-untyped-def]
    conn.exec_driver_sql(conn.get_execution_options().get("sqlite_begin", "BEGIN"))
