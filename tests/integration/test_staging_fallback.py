"""Staging falls back to another replica, fails with a reason naming the shard when none is good, and
fetches a shard once when two ranks of one node need it at the same time.

Real ``DataServer``s on loopback serve the copies; the rank runner's staging step runs as the agent
runs it (``RankRunner.run``), with a stand-in for the agent object that only records what staging
tells it.  No rank process is started: every case here ends before launch or fails.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.dataserver import DataServer
from agents.launcher import RankRunner
from agents.shardfile import MAGIC
from agents.staging import ShardFlights
from agents.throttle import Throttle
from scheduler.protocol.messages import Assignment
from tests.conftest import refused_port

KEY = "k" * 64
GOOD = MAGIC + b"the real shard bytes" * 100
BAD = MAGIC + b"the real shard bytez" * 100  # one byte flipped per repeat: same size, other sha256
SHA = hashlib.sha256(GOOD).hexdigest()


class StandInAgent:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.peer_key = KEY
        self.noted: list[tuple[str, int, str]] = []
        self.reports = 0
        self.flights = ShardFlights()  # the agent's own
        self.throttle = Throttle()  # the agent's own, with its defaults
        self.peer_tls = None  # the agent's TLS context for HTTPS peers: these peers are plain HTTP

    def report_soon(self) -> None:
        self.reports += 1

    def local_sha(self, dataset: str, shard: int, path: Path) -> str | None:
        return next((sha for d, i, sha in self.noted if (d, i) == (dataset, shard)), None)

    def note_shard(self, dataset: str, shard: int, path: Path, sha256: str) -> None:
        self.noted.append((dataset, shard, sha256))

    def show_progress(self, *args: Any) -> None:
        pass


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Two peers: ``bad`` holds a corrupt copy of tiny/0, ``good`` the real one; ``dead`` is a closed port."""
    servers = []
    addresses: dict[str, Any] = {"servers": {}}
    for name, content in (("bad", BAD), ("good", GOOD)):
        d = tmp_path / name
        (d / "tiny").mkdir(parents=True)
        (d / "tiny" / "00000.shard").write_bytes(content)
        srv = DataServer("127.0.0.1", 0, d, name, lambda: KEY, lambda *a: None)
        srv.start()
        servers.append(srv)
        addresses[name] = f"127.0.0.1:{srv.port}"
        addresses["servers"][name] = srv
    with refused_port() as dead:  # held bound, never listened on, for the test's length
        addresses["dead"] = f"127.0.0.1:{dead}"
        yield addresses
    for srv in servers:
        srv.stop()


def runner(tmp_path: Path, source: str, alternates: list[str], agent: StandInAgent | None = None,
           job_id: int = 7) -> tuple[RankRunner, StandInAgent]:
    agent = agent or StandInAgent(tmp_path / "node")
    assignment = Assignment.model_validate({
        "job_id": job_id, "attempt": 1, "rank": 0, "local_rank": 0, "world_size": 1, "local_world_size": 1,
        "devices": [0], "shards": [{"dataset": "tiny", "index": 0, "sha256": SHA, "bytes": len(GOOD), "source": "x",
                                    "source_address": source, "alternates": alternates}]})
    return RankRunner(agent, assignment), agent


def test_a_corrupt_source_is_rejected_and_the_shard_comes_from_another_replica(peers, tmp_path, caplog):  # type: ignore[no-untyped-def]
    r, agent = runner(tmp_path, peers["bad"], [peers["dead"], peers["good"]])
    with caplog.at_level(logging.WARNING):
        paths = r._stage()
    assert Path(paths[0]).read_bytes() == GOOD  # verified before it counted
    assert agent.noted == [("tiny", 0, SHA)]
    assert r.staged == len(GOOD) and r.staging_total == len(GOOD)
    warnings = [m for m in caplog.messages if "trying another replica" in m]
    assert len(warnings) == 2 and "sha256 mismatch" in warnings[0] and peers["dead"] in warnings[1]
    assert not list(Path(paths[0]).parent.glob("*.fetch*"))  # no partial files left behind


def test_when_every_replica_fails_the_rank_exits_with_a_reason_naming_the_shard(peers, tmp_path):  # type: ignore[no-untyped-def]
    r, agent = runner(tmp_path, peers["dead"], [peers["bad"]])
    r.run()  # as the agent's thread would: staging fails, nothing is launched
    assert r.state == "EXITED" and r.exit_code == 3 and r.proc is None
    assert r.error.startswith("staging failed: shard tiny/0: every replica failed; last: ")
    assert "sha256 mismatch" in r.error
    assert agent.noted == []
    assert not (tmp_path / "node" / "tiny" / "00000.shard").exists()


def test_two_ranks_of_one_node_needing_the_same_shard_fetch_it_once(peers, tmp_path):  # type: ignore[no-untyped-def]
    """Two jobs of one data set placed on one node in the same cycle: the second rank waits for the
    first one's transfer and reads the shard from disk (the simulator counts its bytes once, too)."""
    first, agent = runner(tmp_path, peers["good"], [], job_id=7)
    second, _ = runner(tmp_path, peers["good"], [], agent=agent, job_id=8)
    served = peers["servers"]["good"]
    # Both ranks find the shard missing, then queue behind a transfer already in flight: the test
    # holds the shard's turn until both have reached it, so both run the in-flight path.
    results: dict[int, list[str]] = {}
    with agent.flights.hold("tiny", 0):
        threads = [threading.Thread(target=lambda r=r: results.setdefault(r.key[0], r._stage())) for r in (first, second)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while agent.flights.waiting("tiny", 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert agent.flights.waiting("tiny", 0) == 3  # the test and both ranks
    for t in threads:
        t.join(timeout=30)
    assert served.wait_idle(30) and served.bytes_served == len(GOOD)  # one transfer for both ranks
    assert sorted((first.staged, second.staged)) == [0, len(GOOD)]
    assert sorted((first.staging_total, second.staging_total)) == [0, len(GOOD)]
    assert results[7] == results[8] and Path(results[7][0]).read_bytes() == GOOD
    assert agent.noted == [("tiny", 0, SHA)]
    assert agent.flights.busy() == 0
    assert not list(Path(results[7][0]).parent.glob("*.fetch*"))
