"""A real server with every kind of caller, and no agent processes (nothing trains, so it stays light).

Two nodes exist because their agent tokens heartbeat once; users ``alice`` (owns the data set ``tiny``
and the job ``job``) and ``bob`` (owns nothing).  The nodes go down after the TTL, which does not
matter here: submit counts the devices the nodes reported.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler.cli.localcluster import LocalCluster, NodeSpec

SHA0 = "0" * 64


@dataclass
class World:
    cluster: LocalCluster
    url: str
    tokens: dict[str, str]  # admin, owner (alice), other (bob), agent_here (n1), agent_other (n2)
    job: int = 0
    dataset: str = "tiny"
    made: dict[str, int] = field(default_factory=dict)

    def call(self, method: str, path: str, token: str | None = None, body: Any = None) -> tuple[int, Any]:
        """(status, decoded JSON or text) for one request; never raises for an HTTP status.

        ``body`` is sent as JSON, except ``bytes``, which are sent as they are (as ``application/json``)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def ok(self, method: str, path: str, who: str = "admin", body: Any = None) -> Any:
        status, out = self.call(method, path, self.tokens[who], body)
        assert 200 <= status < 300, (method, path, status, out)
        return out

    def heartbeat(self, node: str) -> dict[str, Any]:
        return {"node": node, "rack": "rack0", "address": "127.0.0.1:9", "incarnation": "sec",
                "devices": [{"index": 0, "kind": "cpu", "model": "test", "memory_bytes": 0}]}

    def scan_body(self, node: str) -> dict[str, Any]:
        """A body for ``POST /v1/datasets/NAME/scan``: the node heartbeats again first, so it is up
        whatever the module's other tests took (the server asks the node's agent for nothing here)."""
        self.ok("POST", "/v1/agent/heartbeat", "agent_here" if node == "n1" else "agent_other", self.heartbeat(node))
        return {"nodes": [node]}

    def new_job(self, name: str = "j", who: str = "owner") -> int:
        spec = {"name": name, "resources": {"ranks": 1, "gpus_per_rank": 1}, "data": {"dataset": self.dataset}}
        return int(self.ok("POST", "/v1/jobs", who, {"spec": spec})["id"])

    def new_user(self) -> str:
        n = self.made["user"] = self.made.get("user", 0) + 1
        name = f"temp{n}"
        self.ok("POST", "/v1/users", "admin", {"name": name})
        return name

    def jobs(self) -> list[dict[str, Any]]:
        return list(self.ok("GET", "/v1/jobs?all=true")["jobs"])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    c = LocalCluster(tmp_path_factory.mktemp("security"), [NodeSpec("n1"), NodeSpec("n2")])
    c.start_server()
    w = World(c, c.url.split(",")[0], {"admin": c.admin_token()})
    for node, who in (("n1", "agent_here"), ("n2", "agent_other")):
        w.tokens[who] = w.ok("POST", "/v1/agent-tokens", "admin", {"node": node})["token"]
        w.ok("POST", "/v1/agent/heartbeat", who, w.heartbeat(node))
    w.tokens["owner"] = c.add_user("alice")
    w.tokens["other"] = c.add_user("bob")
    w.ok("POST", "/v1/datasets", "owner", {"name": "tiny", "classes": 4, "image_shape": [3, 8, 8], "replicas": 1,
                                           "shards": [{"index": 0, "bytes": 100, "sha256": SHA0, "samples": 10}]})
    w.job = w.new_job("owned")
    yield w
    c.close()


