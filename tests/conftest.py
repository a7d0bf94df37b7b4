"""Fixtures shared by the suites: a real local cluster (server + agents on loopback)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.cli.localcluster import LocalCluster, NodeSpec

# Small, learnable and quick on 2 cores: 4 classes of 8x8 RGB images.
TINY_SOURCE = "synthetic:classes=4,samples=480,size=8,seed=5"


def job_toml(name: str = "t", *, ranks: int = 2, gpus: int = 1, dataset: str = "tiny", epochs: int = 2,
             batch: int = 16, lr: float = 0.05, extra: str = "", limits: str = 'time = "10m"') -> str:
    return (f'name = "{name}"\n[resources]\nranks = {ranks}\ngpus_per_rank = {gpus}\n[data]\ndataset = "{dataset}"\n'
            f"[train]\nepochs = {epochs}\nbatch_size = {batch}\nlr = {lr}\n{extra}\n[limits]\n{limits}\n")


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator:
    made: list[LocalCluster] = []

    def factory(nodes: list[NodeSpec], **kw) -> LocalCluster:  # type: ignore[no-untyped-def]
        c = LocalCluster(tmp_path / f"cluster{len(made)}", nodes, **kw)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.close()


def rank_processes(job_id: int, root: Path) -> list[int]:
    """PIDs of live rank processes of ``job_id`` of the cluster under ``root`` (its GSCHED_SHARD_LIST
    lies there) on this machine, read from /proc: another cluster's job of the same id (another test,
    another run of the suite beside this one) is not this one."""
    under = b"GSCHED_SHARD_LIST=" + str(Path(root).resolve()).encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            if b"agents.workloads.resnet_ddp" not in cmd:
                continue
            env = (d / "environ").read_bytes().split(b"\0")
            status = (d / "status").read_text()
        except OSError:
            continue
        if "State:\tZ" in status:
            continue
        if f"GSCHED_JOB_ID={job_id}".encode() in env and any(v.startswith(under) for v in env):
            pids.append(int(d.name))
    return pids




# ---------------------------------------------------------------- databases: SQLite and PostgreSQL

PG_BIN = Path(os.environ.get("GSCHED_PG_BIN", "/usr/lib/postgresql/15/bin"))


class ThrowawayPostgres:
    """A PostgreSQL 15 cluster of our own in a temp dir, on a loopback port; removed on stop().

    initdb refuses to run as root, so as root the server runs as the ``postgres`` user.
    """

    def __init__(self) -> None:
        import pwd
        import shutil
        import subprocess
        import tempfile

        from scheduler.cli.localcluster import free_port

        self.root = Path(tempfile.mkdtemp(prefix="gsched-pg-"))
        self.port = free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self._run = lambda *a: subprocess.run([*self.prefix, *a], check=True, capture_output=True, text=True)
        data = self.root / "data"
        self._run(str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "gsched", "--no-sync", "-E", "UTF8")
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(self.root / "pg.log"), "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                  f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200", "start")
        self.data = data
        self._shutil = shutil
        self._n = 0

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://gsched@127.0.0.1:{self.port}/{dbname}"

    def new_database(self) -> str:
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
            self._shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[ThrowawayPostgres]:
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL binaries not found in {PG_BIN} (set GSCHED_PG_BIN)")
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run initdb as")
    pg = ThrowawayPostgres()
    yield pg
    pg.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
    """A fresh, empty database of each backend: the same tests run on both."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gsched.db'}"
    pg: ThrowawayPostgres = request.getfixturevalue("postgres")
    return pg.new_database()
