"""A throw-away PostgreSQL 15 cluster of our own: for the database tests and the benchmarks.

``ThrowawayPostgres(port)`` runs ``initdb`` in a temp dir and starts a server on ``127.0.0.1:port``
(the caller picks the port: ``scheduler.cli.localcluster.free_port`` where it may import the CLI);
``new_database()`` gives the URL of a fresh, empty database; ``stop()`` stops the server and removes
the directory.  ``unavailable()`` says why one cannot be started here (no binaries, or root with no
``postgres`` user), or None.

initdb refuses to run as root, so as root the server runs as the ``postgres`` user (``runuser``).

``durable=False`` (the tests) turns fsync, synchronous commit and full-page writes off: quick, and a
crash loses the lot, which a test does not mind.  ``durable=True`` (the benchmarks) keeps
PostgreSQL's defaults, as production runs it: a commit returns once its WAL is on disk.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PG_BIN = Path(os.environ.get("GSCHED_PG_BIN", "/usr/lib/postgresql/15/bin"))


def unavailable() -> str | None:
    """Why a ``ThrowawayPostgres`` cannot be started on this machine, or None when it can."""
    if not (PG_BIN / "initdb").exists():
        return f"PostgreSQL binaries not found in {PG_BIN} (set GSCHED_PG_BIN)"
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run initdb as"
    return None


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temp dir, on a loopback port; removed on ``stop()``."""

    def __init__(self, port: int, *, durable: bool = False, max_connections: int = 200) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gsched-pg-"))
        self.port = port
        self.durable = durable
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            import pwd

            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.data = self.root / "data"
        self._n = 0
        try:
            self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "gsched", "-E", "UTF8",
                      *([] if durable else ["--no-sync"]))
            opts = f"-p {port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections={max_connections}"
            if not durable:
                opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "pg.log"), "-w",
                      "-t", "60", "-o", opts, "start")
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix, *args], check=True, capture_output=True, text=True)

    def pid(self) -> int | None:
        """The postmaster's process id (its backends are its children), or None when it is not running."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://gsched@127.0.0.1:{self.port}/{dbname}"

    def new_database(self) -> str:
        """A fresh, empty database on this cluster; its SQLAlchemy URL."""
        import psycopg

        self._n += 1
        name = f"gsched_t{os.getpid()}_{self._n}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=gsched dbname=postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
