"""Silent and slow clients cannot hold the server's connections (scheduler/server/connections.py), on loopback.

The floods come from other loopback addresses (127.0.0.2 and up: any 127.x address is the machine
itself on Linux), the agents and users from 127.0.0.1, so the per-address bound is what lets them
through.  Only generous deadlines: nothing here says how fast the server must be.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.cli.localcluster import LocalCluster
from tests.security.conftest import World

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0


def open_idle(port: int, source: str, n: int) -> list[socket.socket]:
    """``n`` connections from ``source`` that send nothing."""
    out = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        out.append(s)
    return out


def closed_by_server(s: socket.socket) -> bool:
    """True once the server closed ``s`` (end of stream or reset), without waiting."""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(1024) == b""
    except OSError:
        return True


def wait_closed(socks: list[socket.socket], how_many: int | None = None) -> int:
    """Wait (at most ``DEADLINE_S``) until ``how_many`` (default: all) of ``socks`` were closed; how many were."""
    want = len(socks) if how_many is None else how_many
    gone: set[int] = set()
    stop = time.monotonic() + DEADLINE_S
    while len(gone) < want and time.monotonic() < stop:
        for i, s in enumerate(socks):
            if i not in gone and closed_by_server(s):
                gone.add(i)
        time.sleep(0.1)
    return len(gone)


def cluster(root: Path, **env: str) -> Iterator[World]:
    c = LocalCluster(root, [], extra_env={f"GSCHED_{k.upper()}": v for k, v in env.items()})
    c.start_server()
    try:
        w = World(c, c.url, {"admin": c.admin_token()})
        w.tokens["agent"] = w.ok("POST", "/v1/agent-tokens", "admin", {"node": "n1"})["token"]
        yield w
    finally:
        c.close()


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Headers get 2 s; 64 connections per address."""
    yield from cluster(tmp_path_factory.mktemp("quick"), header_timeout_s="2", max_connections_per_client="64")


@pytest.fixture(scope="module")
def patient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Headers get 10 minutes (nothing here is closed by the timeout); 30 per address, 100 in all."""
    yield from cluster(tmp_path_factory.mktemp("patient"), header_timeout_s="600", max_connections="100",
                       max_connections_per_client="30")


def port_of(w: World) -> int:
    return int(w.url.rsplit(":", 1)[1])


def accepts_exactly(port: int, source: str, n: int) -> bool:
    """True once ``n`` idle connections from ``source`` stay open and the next one is closed (tried
    again until ``DEADLINE_S``: connections closed just before may not have been counted out yet)."""
    stop = time.monotonic() + DEADLINE_S
    while time.monotonic() < stop:
        socks = open_idle(port, source, n + 1)
        try:
            if wait_closed(socks[-1:]) == 1 and not any(closed_by_server(s) for s in socks[:-1]):
                return True
        finally:
            for s in socks:
                s.close()
        time.sleep(0.5)
    return False


def test_idle_connections_are_closed_and_others_are_served_meanwhile(quick: World) -> None:
    socks = open_idle(port_of(quick), "127.0.0.2", 300)
    try:
        assert quick.ok("GET", "/v1/health", "admin")["ok"] is True
        assert quick.ok("POST", "/v1/agent/heartbeat", "agent", quick.heartbeat("n1"))["heartbeat_s"] > 0
        assert wait_closed(socks) == len(socks)
    finally:
        for s in socks:
            s.close()
    assert quick.ok("GET", "/v1/whoami", "agent") == {"kind": "agent", "name": "n1"}


def test_a_client_that_trickles_its_headers_is_closed(quick: World) -> None:
    s = socket.socket()
    s.bind(("127.0.0.3", 0))
    s.connect(("127.0.0.1", port_of(quick)))
    try:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
        stop = time.monotonic() + DEADLINE_S
        while time.monotonic() < stop and not closed_by_server(s):
            try:
                s.sendall(b"X-Slow: 1\r\n")  # a header line every half second, never the blank line
            except OSError:
                break
            time.sleep(0.5)
        assert time.monotonic() < stop, "still open"
    finally:
        s.close()


def test_connections_beyond_the_bound_per_address_are_closed_at_once(patient: World) -> None:
    port = port_of(patient)
    kept = open_idle(port, "127.0.0.2", 30)
    extra = open_idle(port, "127.0.0.2", 10)
    try:
        assert wait_closed(extra) == 10  # long before their 600 s
        assert not any(closed_by_server(s) for s in kept)  # accepted before the extra ones were refused
        assert patient.ok("GET", "/v1/health", "admin")["ok"] is True  # from 127.0.0.1, meanwhile
        assert patient.ok("POST", "/v1/agent/heartbeat", "agent", patient.heartbeat("n1"))["heartbeat_s"] > 0
    finally:
        for s in kept + extra:
            s.close()
    assert accepts_exactly(port, "127.0.0.2", 30)  # the closed ones gave their places back


def test_connections_beyond_the_bound_in_all_are_closed_at_once(patient: World) -> None:
    port = port_of(patient)
    socks: list[socket.socket] = []
    try:
        for source in ("127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"):
            socks += open_idle(port, source, 30)  # each within its address' bound, 120 in all
        assert wait_closed(socks, 20) >= 20  # at most 100 stay open, long before their 600 s
    finally:
        for s in socks:
            s.close()


def test_the_timeout_and_bounds_are_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from scheduler.server.config import ConfigError, Settings, load_settings

    assert (Settings().header_timeout_s, Settings().max_connections, Settings().max_connections_per_client) == \
        (10.0, 2048, 256)
    monkeypatch.setenv("GSCHED_MAX_CONNECTIONS_PER_CLIENT", "7")
    (tmp_path / "gsched.toml").write_text("header_timeout_s = 3.5\nmax_connections = 99\n")
    got = load_settings(tmp_path / "gsched.toml")
    assert (got.header_timeout_s, got.max_connections, got.max_connections_per_client) == (3.5, 99, 7)
    for bad in ({"header_timeout_s": 0}, {"max_connections": 0}, {"max_connections_per_client": -1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            load_settings(tmp_path / "gsched.toml", **bad)
