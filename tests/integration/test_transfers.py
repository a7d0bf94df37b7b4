"""Big files between agents: a copy cut halfway resumes where it stopped (HTTP Range) and its sha256 is
right; the throttle bounds copies in flight and bandwidth.

A real data server on loopback serves a real shard file; the cut is made by a real TCP relay between the
fetcher and the server that closes the first connection after half the response.  The bandwidth bound is
checked with a fake clock (no timing assertions)."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from pathlib import Path

import pytest

from agents.dataserver import DataServer
from agents.shardfile import MAGIC, shard_path
from agents.staging import StagingError, fetch
from agents.throttle import Throttle

pytestmark = pytest.mark.integration
KEY = "k" * 64
SIZE = 6 << 20  # six 1 MiB chunks


class CuttingRelay:
    """Forwards connections to ``upstream``; the first one's response is cut after ``cut_at`` bytes
    (counted from the start of the response, headers included).  Records every request's head."""

    def __init__(self, upstream: tuple[str, int], cut_at: int, cuts: int = 1) -> None:
        self.upstream = upstream
        self.cut_at = cut_at
        self.cuts_left = cuts
        self.requests: list[str] = []
        self.responses: list[bytes] = []  # the start of each response (its status line and headers)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            cut = self.cut_at if self.cuts_left > 0 else None
            self.cuts_left -= 1
            threading.Thread(target=self._one, args=(client, cut), daemon=True).start()

    def _one(self, client: socket.socket, cut: int | None) -> None:
        up = socket.create_connection(self.upstream)
        head = b""
        while b"\r\n\r\n" not in head:
            block = client.recv(65536)
            if not block:
                break
            head += block
        self.requests.append(head.decode("latin-1"))
        up.sendall(head)
        sent = 0
        first = True
        try:
            while block := up.recv(65536):
                if first:
                    self.responses.append(block[:512])
                    first = False
                if cut is not None and sent + len(block) >= cut:
                    client.sendall(block[: cut - sent])
                    break
                client.sendall(block)
                sent += len(block)
        finally:
            client.shutdown(socket.SHUT_RDWR)
            client.close()
            up.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    path = shard_path(src, "big", 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(MAGIC + os.urandom(SIZE - len(MAGIC)))
    srv = DataServer("127.0.0.1", 0, src, "n1", lambda: KEY, lambda *a: None)
    srv.start()
    srv.sha = hashlib.sha256(path.read_bytes()).hexdigest()  # type: ignore[attr-defined]
    yield srv
    srv.stop()


def test_a_copy_cut_halfway_resumes_where_it_stopped_and_its_sha256_is_right(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    relay = CuttingRelay(("127.0.0.1", server.port), cut_at=SIZE // 2)
    dest = shard_path(tmp_path / "dst", "big", 0)
    seen: list[int] = []
    n = fetch(f"127.0.0.1:{relay.port}", "shards/big/0", ("get", "big", 0), dest, server.sha, KEY,
              lambda done, total, rate: seen.append(done))
    relay.close()
    assert n == SIZE and hashlib.sha256(dest.read_bytes()).hexdigest() == server.sha
    assert not dest.with_name(dest.name + ".partial").exists()
    # two connections: the whole file, then the rest from where the first stopped
    assert len(relay.requests) == 2 and "Range" not in relay.requests[0]
    (asked,) = [line for line in relay.requests[1].split("\r\n") if line.lower().startswith("range:")]
    start = int(asked.split("=")[1].rstrip("-"))
    assert 0 < start < SIZE // 2  # what had arrived before the cut (the headers took some of the half)
    # the server answered the resume with the rest only: 206, from that byte to the end
    again = relay.responses[1].decode("latin-1")
    assert again.startswith("HTTP/1.1 206")
    assert f"Content-Range: bytes {start}-{SIZE - 1}/{SIZE}" in again and f"Content-Length: {SIZE - start}" in again
    assert seen[-1] == SIZE


def test_a_fetch_that_keeps_breaking_keeps_its_partial_and_the_next_one_resumes_it(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # every try of one fetch is cut after an eighth of the file: five tries bring five eighths at most
    relay = CuttingRelay(("127.0.0.1", server.port), cut_at=SIZE // 8, cuts=5)
    dest = shard_path(tmp_path / "dst", "big", 0)
    with pytest.raises(StagingError, match="fetching shards/big/0 from"):
        fetch(f"127.0.0.1:{relay.port}", "shards/big/0", ("get", "big", 0), dest, server.sha, KEY)
    partial = dest.with_name(dest.name + ".partial")
    kept = partial.stat().st_size
    assert len(relay.requests) == 5 and all("Range: bytes=" in r for r in relay.requests[1:])
    assert 0 < kept < SIZE and not dest.exists()  # the copy does not count, its bytes are kept
    # the next fetch (straight to the server, as from another replica) asks only for the rest.  The cut
    # tries' server threads may still be writing into their closed sockets: the count is read once they stop
    assert server.wait_idle(30), "a cut response's server thread never stopped writing"
    before = server.bytes_served
    assert fetch(f"127.0.0.1:{server.port}", "shards/big/0", ("get", "big", 0), dest, server.sha, KEY) == SIZE
    assert server.wait_idle(30) and server.bytes_served - before == SIZE - kept
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == server.sha
    relay.close()


def test_a_partial_with_wrong_bytes_is_thrown_away_and_nothing_counts(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dest = shard_path(tmp_path / "dst", "big", 0)
    dest.parent.mkdir(parents=True)
    dest.with_name(dest.name + ".partial").write_bytes(b"not the start of this file")
    with pytest.raises(StagingError, match="sha256 mismatch"):
        fetch(f"127.0.0.1:{server.port}", "shards/big/0", ("get", "big", 0), dest, server.sha, KEY)
    assert not dest.exists() and not dest.with_name(dest.name + ".partial").exists()
    # and the next fetch starts clean and is right
    assert fetch(f"127.0.0.1:{server.port}", "shards/big/0", ("get", "big", 0), dest, server.sha, KEY) == SIZE


def test_the_bandwidth_bound_makes_copies_wait_for_their_share() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    t = Throttle(max_transfers=2, max_transfer_mbps=8.0, clock=lambda: now[0], sleep=sleep)  # 1 MB/s
    t.take(1_000_000)  # the first second's worth passes at once
    assert slept == []
    t.take(500_000)  # half a second more
    t.take(500_000)  # and another half, queued behind it
    assert slept == [0.5, 0.5] and now[0] == 1.0
    now[0] += 10.0  # idle: the bucket refills to one second's worth, no more
    t.take(1_500_000)
    assert slept[-1] == 0.5


def test_copies_in_flight_are_bounded() -> None:
    t = Throttle(max_transfers=2)
    entered = threading.Barrier(2)
    release = threading.Event()
    third_in = threading.Event()

    def copy(mark: threading.Event | None) -> None:
        with t.transfer():
            if mark is None:
                entered.wait()
                release.wait()
            else:
                mark.set()

    a, b = (threading.Thread(target=copy, args=(None,)) for _ in range(2))
    a.start()
    b.start()
    c = threading.Thread(target=copy, args=(third_in,))
    while t.in_flight < 2:
        pass
    c.start()
    assert not third_in.wait(0.2) and t.in_flight == 2  # the third waits for a slot
    release.set()
    c.join()
    a.join()
    b.join()
    assert third_in.is_set() and t.most_in_flight == 2 and t.in_flight == 0
    with pytest.raises(ValueError, match="--max-transfers must be at least 1"):
        Throttle(max_transfers=0)
