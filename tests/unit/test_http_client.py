"""The one HTTP client (scheduler/protocol/http.py): failover over a server list, as the CLI and the
agent each want it, and single requests to a data server.  Stand-in servers on loopback answer with
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
from scheduler.cli.localcluster import free_port
from scheduler.protocol.http import Client, ServerError, Servers, send


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


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there, and nothing of ours will


def test_the_cli_fails_over_past_a_dead_server_and_a_5xx_and_stays_on_the_one_that_answered(servers) -> None:  # type: ignore[no-untyped-def]
    down = dead_url()
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


def test_when_no_server_answers_the_cli_names_each_one_and_what_to_do() -> None:
    first, second = dead_url(), dead_url()
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


def test_the_agent_fails_over_on_any_answer_but_a_refused_token(servers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    invalid = servers(422, {"detail": "bad heartbeat"})
    good = servers(200, {"assignments": []})
    agent = Agent([invalid.url, good.url], "n1", "r1", "1", tmp_path / "a", token="gsa_x")
    assert agent._post("/v1/agent/heartbeat", {"node": "n1"}) == {"assignments": []}
    assert [(m, p, json.loads(b)) for m, p, b in good.asked] == [("POST", "/v1/agent/heartbeat", {"node": "n1"})]

    with pytest.raises(ServerUnavailable, match="HTTP 422 bad heartbeat"):
        Agent([invalid.url, dead_url()], "n2", "r1", "1", tmp_path / "b", token="gsa_x")._post("/x", {})
    refusing = servers(401, {"detail": "invalid token"})
    with pytest.raises(SystemExit, match=r"refused this agent's token \(401\): invalid token"):
        Agent([refusing.url, good.url], "n3", "r1", "1", tmp_path / "c", token="gsa_x")._post("/x", {})


def test_one_request_to_a_data_server_streams_a_file_and_says_what_a_refusal_said(servers, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
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
        send(dead_url() + "/health", timeout_s=2)
