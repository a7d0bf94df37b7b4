"""The agent's shard and checkpoint endpoints refuse every way out of the data dir.

A real ``DataServer`` on loopback; requests are sent raw (``http.client``) so that ``..``, encoded
dots and slashes reach the server unnormalized.  Each attempt carries a ticket that would be valid
for the name it asks for, so a refusal is the path check's doing, not the ticket's; the ticket cases
come after.  Nothing outside the data dir may be read or changed.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agents.dataserver import TICKET_SKEW_S, TICKET_TTL_S, DataServer
from agents.shardfile import MAGIC
from scheduler.protocol.tickets import ticket

KEY = "k" * 64
SECRET = b"GSHARD1\nTOP SECRET outside the data dir"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DataServer, Path, Path]]:
    tmp_path = tmp_path_factory.mktemp("dataserver")
    data, outside = tmp_path / "data", tmp_path / "outside"
    for d in (data / "tiny", data / ".gsched", outside / "jobs" / "1" / "checkpoints"):
        d.mkdir(parents=True)
    (data / "tiny" / "00000.shard").write_bytes(MAGIC + b"ok")
    (data / ".gsched" / "agent.token").write_text("gsa_secret")
    (outside / "00000.shard").write_bytes(SECRET)
    (outside / "jobs" / "1" / "checkpoints" / "epoch-0001.pt").write_bytes(SECRET)
    (data / "evil").symlink_to(outside, target_is_directory=True)  # a data set dir pointing outside
    (data / "tiny" / "00001.shard").symlink_to(outside / "00000.shard")  # a shard file pointing outside
    (data / "tiny" / "00002.shard").symlink_to(data / ".gsched" / "agent.token")  # ... or at the token
    (data / ".gsched" / "jobs").symlink_to(outside / "jobs", target_is_directory=True)
    srv = DataServer("127.0.0.1", 0, data, "n1", lambda: KEY, lambda *a: None)
    srv.start()
    yield srv, data, outside
    srv.stop()


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def send(srv: DataServer, method: str, path: str, headers: dict[str, str] | None = None,
         body: bytes = b"") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in {**(headers or {}), "Content-Length": str(len(body))}.items():
            conn.putheader(k, v)
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def get_ticket(*parts: object, age_s: int = 0) -> dict[str, str]:
    ts = int(time.time()) - age_s
    return {"X-Gsched-Ticket": ticket(KEY, *parts, ts), "X-Gsched-Time": str(ts)}


# (path, ticket parts for a GET of what the path names)
TRAVERSALS = [
    ("/shards/../outside/00000", ("get", "..", 0)),
    ("/shards/%2e%2e/0", ("get", "..", 0)),
    ("/shards/..%2f..%2foutside/0", ("get", "../../outside", 0)),
    ("/shards/%2e%2e%2foutside/0", ("get", "../outside", 0)),
    ("/shards/%2Foutside/0", ("get", "/outside", 0)),
    ("//shards/tiny/../../../outside/00000.shard", ("get", "tiny", 0)),
    ("/shards/tiny%00/0", ("get", "tiny\x00", 0)),
    ("/shards/tiny%0a/0", ("get", "tiny\n", 0)),
    ("/shards/tiny/-1", ("get", "tiny", -1)),
    ("/shards/tiny/%D9%A0", ("get", "tiny", 0)),  # an Arabic-Indic zero is not an index
    ("/shards/evil/0", ("get", "evil", 0)),  # symlinked data set dir
    ("/shards/tiny/1", ("get", "tiny", 1)),  # symlinked shard file -> outside
    ("/shards/tiny/2", ("get", "tiny", 2)),  # symlinked shard file -> the agent's token
    ("/checkpoints/1/..%2f..%2f..%2f..%2f.gsched%2fagent.token", ("ckpt", 1, "../../../../.gsched/agent.token")),
    ("/checkpoints/1/epoch-0001.pt%0a", ("ckpt", 1, "epoch-0001.pt\n")),
    ("/checkpoints/1/epoch-0001.pt", ("ckpt", 1, "epoch-0001.pt")),  # .gsched/jobs is a symlink outside
    ("/checkpoints/..%2f1/epoch-0001.pt", ("ckpt", "../1", "epoch-0001.pt")),
    ("/checkpoints/%2fetc/passwd", ("ckpt", "/etc", "passwd")),
]


@pytest.mark.parametrize("path,parts", TRAVERSALS, ids=[p for p, _ in TRAVERSALS])
def test_get_outside_the_data_dir_is_refused(server: tuple[DataServer, Path, Path], path: str,
                                             parts: tuple[object, ...]) -> None:
    srv, data, outside = server
    status, body = send(srv, "GET", path, get_ticket(*parts))
    assert 400 <= status < 500, (path, status, body)
    assert b"SECRET" not in body and b"gsa_secret" not in body


@pytest.mark.parametrize("path,parts", TRAVERSALS, ids=[p for p, _ in TRAVERSALS])
def test_put_outside_the_data_dir_is_refused(server: tuple[DataServer, Path, Path], path: str,
                                             parts: tuple[object, ...]) -> None:
    srv, data, outside = server
    before, token = snapshot(outside), (data / ".gsched" / "agent.token").read_bytes()
    payload = MAGIC + b"overwritten"
    sha = hashlib.sha256(payload).hexdigest()
    kind, name, index = parts
    headers = (get_ticket(*parts) | {"X-Gsched-Sha256": sha} if kind == "ckpt"
               else {"X-Gsched-Ticket": ticket(KEY, "put", "n1", name, index, sha)})
    status, body = send(srv, "PUT", f"{path}?sha256={sha}", headers, payload)
    assert 400 <= status < 500, (path, status, body)
    assert snapshot(outside) == before
    assert (data / ".gsched" / "agent.token").read_bytes() == token


def test_the_real_shard_is_served_with_a_good_ticket(server: tuple[DataServer, Path, Path]) -> None:
    srv, _, _ = server
    assert send(srv, "GET", "/shards/tiny/0", get_ticket("get", "tiny", 0)) == (200, MAGIC + b"ok")
    # A little clock skew either way is fine: a ticket a few seconds old, or from a clock a bit ahead.
    for age in (TICKET_TTL_S - 5, 0, -(TICKET_SKEW_S - 5)):
        assert send(srv, "GET", "/shards/tiny/0", get_ticket("get", "tiny", 0, age_s=age))[0] == 200, age


# Each case makes its headers when the test runs, not when the module is collected: a ticket stamped
# "two minutes ahead" at collection was, ten minutes into the suite, an expired one, refused for the
# wrong reason (and, run two to seven minutes after collection, accepted).
@pytest.mark.parametrize("what,headers", [
    ("no ticket", lambda: {}),
    ("garbage ticket", lambda: {"X-Gsched-Ticket": "0" * 64, "X-Gsched-Time": str(int(time.time()))}),
    ("expired ticket", lambda: get_ticket("get", "tiny", 0, age_s=3600)),
    ("ticket from the future", lambda: get_ticket("get", "tiny", 0, age_s=-3600)),
    # Stamped minutes ahead: accepted as skew, it would last TTL + minutes (it used to last ten).
    ("ticket stamped two minutes ahead", lambda: get_ticket("get", "tiny", 0, age_s=-120)),
    ("ticket just past its life", lambda: get_ticket("get", "tiny", 0, age_s=TICKET_TTL_S + 5)),
    ("ticket for another shard", lambda: get_ticket("get", "tiny", 1)),
    ("ticket made with another key", lambda: {"X-Gsched-Ticket": ticket("other", "get", "tiny", 0, int(time.time())),
                                              "X-Gsched-Time": str(int(time.time()))}),
    ("time not a number", lambda: {"X-Gsched-Ticket": "x", "X-Gsched-Time": "soon"}),
])
def test_bad_tickets_are_refused(server: tuple[DataServer, Path, Path], what: str,
                                 headers: Callable[[], dict[str, str]]) -> None:
    srv, _, _ = server
    status, body = send(srv, "GET", "/shards/tiny/0", headers())
    assert status == 403, (what, status, body)


def test_upload_tickets_are_for_one_node_and_one_checksum(server: tuple[DataServer, Path, Path]) -> None:
    srv, data, _ = server
    payload = MAGIC + b"new"
    sha = hashlib.sha256(payload).hexdigest()
    for parts in (("put", "n2", "tiny", 5, sha),  # a ticket the server issued for another node
                  ("put", "n1", "tiny", 5, "0" * 64),  # for other bytes
                  ("put", "n1", "tiny", 6, sha)):  # for another shard
        status, _ = send(srv, "PUT", f"/shards/tiny/5?sha256={sha}", {"X-Gsched-Ticket": ticket(KEY, *parts)}, payload)
        assert status == 403, parts
    assert not (data / "tiny" / "00005.shard").exists()
    # The body must also hash to what the ticket names.
    good = {"X-Gsched-Ticket": ticket(KEY, "put", "n1", "tiny", 5, sha)}
    assert send(srv, "PUT", f"/shards/tiny/5?sha256={sha}", good, MAGIC + b"bad")[0] == 422
    assert send(srv, "PUT", f"/shards/tiny/5?sha256={sha}", good, payload)[0] == 201
    assert (data / "tiny" / "00005.shard").read_bytes() == payload
    assert not [p for p in os.listdir(data / "tiny") if ".part" in p]


def test_a_nudge_needs_the_servers_ticket_for_this_node(tmp_path: Path) -> None:
    nudged: list[bool] = []
    srv = DataServer("127.0.0.1", 0, tmp_path, "n1", lambda: KEY, lambda *a: None, on_nudge=lambda: nudged.append(True))
    srv.start()
    try:
        assert send(srv, "POST", "/nudge")[0] == 403  # no ticket
        assert send(srv, "POST", "/nudge", get_ticket("nudge", "n2"))[0] == 403  # another node's
        assert send(srv, "POST", "/nudge", get_ticket("nudge", "n1", age_s=3600))[0] == 403  # stale
        assert send(srv, "POST", "/nudge", {"X-Gsched-Ticket": ticket("not the key", "nudge", "n1", int(time.time())),
                                            "X-Gsched-Time": str(int(time.time()))})[0] == 403  # forged
        assert nudged == []
        assert send(srv, "POST", "/nudge", get_ticket("nudge", "n1"))[0] == 200
        assert nudged == [True]
        assert send(srv, "POST", "/shards/tiny/0", get_ticket("nudge", "n1"))[0] == 404
    finally:
        srv.stop()


def test_a_fetch_ticket_reads_one_checkpoint_and_writes_nothing(tmp_path: Path) -> None:
    """``gsched fetch``'s ticket (``("fetch", job, file, ts)``, from the server to the job's owner or
    an admin) reads that file; it never uploads one, nor reads another job's or another file."""
    ckpts = tmp_path / ".gsched" / "jobs" / "7" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "epoch-0002.pt").write_bytes(b"weights")
    (ckpts / "epoch-0001.pt").write_bytes(b"older")
    srv = DataServer("127.0.0.1", 0, tmp_path, "n1", lambda: KEY, lambda *a: None)
    srv.start()
    try:
        good = get_ticket("fetch", 7, "epoch-0002.pt")
        assert send(srv, "GET", "/checkpoints/7/epoch-0002.pt", good) == (200, b"weights")
        assert send(srv, "GET", "/checkpoints/7/epoch-0001.pt", good)[0] == 403  # another file
        assert send(srv, "GET", "/checkpoints/8/epoch-0002.pt", good)[0] == 403  # another job
        assert send(srv, "GET", "/checkpoints/7/epoch-0002.pt", get_ticket("fetch", 7, "epoch-0002.pt",
                                                                           age_s=3600))[0] == 403  # stale
        sha = hashlib.sha256(b"evil").hexdigest()
        status, _ = send(srv, "PUT", "/checkpoints/7/epoch-0002.pt", good | {"X-Gsched-Sha256": sha}, b"evil")
        assert status == 403
        assert (ckpts / "epoch-0002.pt").read_bytes() == b"weights"
    finally:
        srv.stop()


def test_a_peer_that_hangs_up_is_a_log_line_and_other_errors_keep_their_traceback(
        server: tuple[DataServer, Path, Path], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    srv = server[0].httpd
    caplog.set_level("INFO", logger="gsched")
    try:
        raise BrokenPipeError(32, "Broken pipe")  # what writing a reply to a peer that left raises
    except BrokenPipeError:
        srv.handle_error(None, ("127.0.0.9", 1234))
    assert "Traceback" not in capsys.readouterr().err
    assert any("peer 127.0.0.9 hung up" in r.getMessage() for r in caplog.records)
    try:
        raise ValueError("a real bug")
    except ValueError:
        srv.handle_error(None, ("127.0.0.9", 1234))
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: a real bug" in err
