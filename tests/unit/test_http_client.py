"""The HTTP clients (scheduler/protocol/servers.py, client.py, http1.py, http.py): failover over a
server list, as the CLI and the agent each want it, and single requests to a data server.  Stand-in servers on loopback answer with
a fixed status and body and count what they were asked."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents.agent import Agent, ServerUnavailable
from scheduler.protocol.client import Client
from scheduler.protocol.http import send
from scheduler.protocol.servererror import ServerError
from scheduler.protocol.servers import Servers


class StandIn:
    def __init__(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.asked: list[tuple[str, str, bytes]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                stand_in.asked.append((self.command, self.path, data))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _answer  # noqa: N815

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def servers() -> Iterator[Any]:
    made: list[StandIn] = []

    def make(status: int, doc: Any = None, text: str | None = None) -> StandIn:
        body = text.encode() if text is not None else json.dumps(doc).encode()
        srv = StandIn(status, body, "text/plain" if text is not None else "application/json")
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.httpd.shutdown()
        srv.httpd.server_close()


def test_the_cli_fails_over_past_a_dead_server_and_a_5xx_and_stays_on_the_one_that_answered(servers, refused_url) -> None:  # type: ignore[no-untyped-def]
    down = refused_url()
    failing = servers(503, {"detail": "a standby"})
    good = servers(200, {"ok": True})
    c = Client(f"{down},{failing.url},{good.url}", token="gsu_x")
    assert c.get("/v1/health") == {"ok": True}
    assert c.get("/v1/health") == {"ok": True}
    assert len(failing.asked) == 1 and len(good.asked) == 2  # the second request went straight to it


def test_a_4xx_is_the_answer_with_the_servers_detail_and_no_failover(servers) -> None:  # type: ignore[no-untyped-def]
    refusing = servers(409, {"detail": "job 4 is already over", "field": None})
    good = servers(200, {"ok": True})
    with pytest.raises(ServerError) as e:
        Client(f"{refusing.url},{good.url}", token="gsu_x").post("/v1/jobs/4/cancel")
    assert (e.value.status, e.value.message) == (409, "job 4 is already over")
    assert good.asked == []


def test_a_5xx_from_the_last_server_is_the_answer(servers) -> None:  # type: ignore[no-untyped-def]
    broken = servers(500, text="Internal Server Error")
    with pytest.raises(ServerError) as e:
        Client(broken.url, token="gsu_x").get("/v1/jobs")
    assert (e.value.status, e.value.message) == (500, "Internal Server Error")


def test_when_no_server_answers_the_cli_names_each_one_and_what_to_do(refused_url) -> None:  # type: ignore[no-untyped-def]
    first, second = refused_url(), refused_url()
    with pytest.raises(ServerError) as e:
        Client(f"{first}, {second}", token="gsu_x", timeout_s=2).get("/v1/jobs")
    assert e.value.status == 0
    assert e.value.message.startswith(f"cannot reach the gsched server ({first}: ")
    assert f"; {second}: " in e.value.message and "Set GSCHED_SERVER or --server" in e.value.message


def test_the_caller_decides_which_failures_fail_over(servers) -> None:  # type: ignore[no-untyped-def]
    invalid = servers(422, {"detail": "ranks.0.state: bad"})
    good = servers(200, {"ok": True})
    s = Servers([invalid.url, good.url])
    assert s.send("POST", "/x", b"{}", {}, 5, fail_over=lambda e, last: True) == b'{"ok": true}'
    with pytest.raises(ServerError) as e:
        Servers([invalid.url, good.url]).send("POST", "/x", b"{}", {}, 5, fail_over=lambda e, last: False)
    assert e.value.status == 422
    with pytest.raises(ServerError) as e:
        Servers([invalid.url]).send("POST", "/x", b"{}", {}, 5, fail_over=lambda e, last: True)
    assert (e.value.status, e.value.message) == (0, f"{invalid.url}: HTTP 422 ranks.0.state: bad")


def test_the_agent_fails_over_on_any_answer_but_a_refused_token(servers, tmp_path: Path, refused_url) -> None:  # type: ignore[no-untyped-def]
    invalid = servers(422, {"detail": "bad heartbeat"})
    good = servers(200, {"assignments": []})
    agent = Agent([invalid.url, good.url], "n1", "r1", "1", tmp_path / "a", token="gsa_x")
    assert agent._post("/v1/agent/heartbeat", {"node": "n1"}) == {"assignments": []}
    assert [(m, p, json.loads(b)) for m, p, b in good.asked] == [("POST", "/v1/agent/heartbeat", {"node": "n1"})]

    with pytest.raises(ServerUnavailable, match="HTTP 422 bad heartbeat"):
        Agent([invalid.url, refused_url()], "n2", "r1", "1", tmp_path / "b", token="gsa_x")._post("/x", {})
    refusing = servers(401, {"detail": "invalid token"})
    with pytest.raises(SystemExit, match=r"refused this agent's token \(401\): invalid token"):
        Agent([refusing.url, good.url], "n3", "r1", "1", tmp_path / "c", token="gsa_x")._post("/x", {})


def test_one_request_to_a_data_server_streams_a_file_and_says_what_a_refusal_said(servers, tmp_path: Path, refused_url) -> None:  # type: ignore[no-untyped-def]
    taker = servers(201, text="stored\n")
    body = tmp_path / "shard"
    body.write_bytes(b"x" * 5000)
    with open(body, "rb") as f:
        assert send(taker.url + "/shards/tiny/0", "PUT", f, {"Content-Length": "5000"}) == b"stored\n"
    assert taker.asked == [("PUT", "/shards/tiny/0", b"x" * 5000)]
    refusing = servers(403, text="a valid agent ticket is required\n")
    with pytest.raises(ServerError) as e:
        send(refusing.url + "/nudge", "POST", b"", direct=True)
    assert (e.value.status, e.value.message) == (403, "a valid agent ticket is required")
    with pytest.raises(OSError):
        send(refused_url() + "/health", timeout_s=2)


class Canned:
    """A loopback server that answers every connection with ``answer``'s bytes, sent in pieces of
    ``piece`` bytes, then closes; it keeps what each request was."""

    def __init__(self, answer: bytes, piece: int = 7) -> None:
        import socket

        self.srv = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.srv.getsockname()[1]}"
        self.requests: list[bytes] = []

        def serve() -> None:
            while True:
                try:
                    conn, _ = self.srv.accept()
                except OSError:
                    return
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(4096)
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    while len(body) < length:
                        body += conn.recv(4096)
                    self.requests.append(head + b"\r\n\r\n" + body)
                    for i in range(0, len(answer), piece):
                        conn.sendall(answer[i:i + piece])

        threading.Thread(target=serve, daemon=True).start()


@pytest.mark.parametrize("answer", [
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 11\r\n\r\n{"ok": 1}\r\n',
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"ok\r\n7;x=y\r\n\": 1}\r\n\r\n0\r\n\r\n",
    b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"ok": 1}\r\n',
], ids=["content-length", "chunked", "until-close"])
def test_the_clis_transport_reads_each_way_an_answer_can_end(answer: bytes) -> None:
    srv = Canned(answer)
    assert Client(srv.url, token="gsu_x").post("/v1/jobs", {"spec": {}}) == {"ok": 1}
    head, _, body = srv.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/jobs HTTP/1.1" and body == b'{"spec": {}}'
    assert {"Authorization: Bearer gsu_x", "Content-Length: 12", "Connection: close",
            f"Host: {srv.url.removeprefix('http://')}"} <= set(lines)


def test_an_answer_that_is_not_http_is_no_answer_and_fails_over(servers) -> None:  # type: ignore[no-untyped-def]
    garbage = Canned(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    good = servers(200, {"ok": True})
    assert Client(f"{garbage.url},{good.url}", token="gsu_x").get("/v1/health") == {"ok": True}
    cut = Canned(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")
    with pytest.raises(ServerError) as e:
        Client(cut.url, token="gsu_x").get("/v1/health")
    assert e.value.status == 0 and "ended after 1 of 100 bytes" in e.value.message


def test_with_a_proxy_variable_set_requests_go_through_urllib(servers, monkeypatch: pytest.MonkeyPatch, refused_url) -> None:  # type: ignore[no-untyped-def]
    good = servers(200, {"ok": True})
    monkeypatch.setenv("HTTP_PROXY", refused_url())  # a proxy that is down ...
    monkeypatch.setenv("no_proxy", "127.0.0.1")  # ... and not used for loopback: urllib reads both
    assert Client(good.url, token="gsu_x").get("/v1/health") == {"ok": True}
    monkeypatch.delenv("no_proxy")
    with pytest.raises(ServerError) as e:
        Client(good.url, token="gsu_x", timeout_s=2).get("/v1/health")
    assert e.value.status == 0 and good.asked == [("GET", "/v1/health", b"")]


def test_every_page_follows_next_and_keeps_the_callers_after() -> None:
    """Pages of two jobs each: ``every_page`` asks with ``after`` = the last ``next`` (the caller's own
    ``after`` only for the first), until ``next`` is null."""
    from urllib.parse import parse_qs, urlsplit

    asked: list[dict[str, list[str]]] = []

    class Pages(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            q = parse_qs(urlsplit(self.path).query)
            asked.append(q)
            after = int(q.get("after", ["0"])[0])
            ids = [i for i in range(after + 1, 8)][:2]
            body = json.dumps({"time": 1.0, "jobs": [{"id": i} for i in ids],
                               "next": ids[-1] if ids and ids[-1] < 7 else None}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        doc = Client(f"http://127.0.0.1:{httpd.server_address[1]}", token="gsu_x").every_page(
            "/v1/history", user="bob", after=2)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert [j["id"] for j in doc["jobs"]] == [3, 4, 5, 6, 7] and doc["next"] is None
    assert [q["after"] for q in asked] == [["2"], ["4"], ["6"]] and all(q["user"] == ["bob"] for q in asked)
