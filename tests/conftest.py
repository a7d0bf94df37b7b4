"""Fixtures shared by the suites: a real local cluster (server + agents on loopback)."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.cli.localcluster import LocalCluster, NodeSpec, free_port
from scheduler.store.throwaway_postgres import ThrowawayPostgres, unavailable

# Small, learnable and quick on 2 cores: 4 classes of 8x8 RGB images.
TINY_SOURCE = "synthetic:classes=4,samples=480,size=8,seed=5"


def job_toml(name: str = "t", *, ranks: int = 2, gpus: int = 1, dataset: str = "tiny", epochs: int = 2,
             batch: int = 16, lr: float = 0.05, extra: str = "", limits: str = 'time = "10m"') -> str:
    return (f'name = "{name}"\n[resources]\nranks = {ranks}\ngpus_per_rank = {gpus}\n[data]\ndataset = "{dataset}"\n'
            f"[train]\nepochs = {epochs}\nbatch_size = {batch}\nlr = {lr}\n{extra}\n[limits]\n{limits}\n")


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections while the block lasts: bound here and never listened
    on.  A port merely checked free (``free_port``) can meanwhile be bound by a server of another test:
    the other xdist worker draws from the same range, and a client meant to be refused reaches it."""
    with socket.socket() as held:  # no SO_REUSEADDR: then no server can bind the port beside it either
        for _ in range(50):
            try:  # free_port() counts a port in TIME_WAIT as free (a server can bind it): the next one then
                held.bind(("127.0.0.1", free_port()))
                break
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
        else:
            raise RuntimeError("no port to hold refused in 50 tries")
        yield held.getsockname()[1]


@pytest.fixture
def refused_url() -> Iterator:
    """``refused_url()``: an ``http://127.0.0.1:PORT`` that refuses connections until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda: f"http://127.0.0.1:{stack.enter_context(refused_port())}"


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

@pytest.fixture(scope="session")
def postgres() -> Iterator[ThrowawayPostgres]:
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    pg = ThrowawayPostgres(free_port())
    yield pg
    pg.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
    """A fresh, empty database of each backend: the same tests run on both."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gsched.db'}"
    pg: ThrowawayPostgres = request.getfixturevalue("postgres")
    return pg.new_database()
