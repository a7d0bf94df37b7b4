"""The server runs its cycles in a child process (scheduler/server/cycleproc.py): one that dies is replaced
at the next cycle, and none outlives the server."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from scheduler.cli.localcluster import LocalCluster

pytestmark = pytest.mark.integration


def _cycle_pids(log: Path) -> list[int]:
    return [int(p) for p in re.findall(r"cycle process started \(pid (\d+)\)", log.read_text())]


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _samples(cluster: LocalCluster) -> int:
    return len(cluster.admin().get("/v1/cluster/history"))


def test_cycles_run_in_a_child_process_that_is_replaced_when_it_dies(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, [], cycle_s=0.3)
    try:
        cluster.start_server()
        server = cluster.procs["server"].pid
        log = tmp_path / "server.log"
        cluster.wait_for(lambda: _cycle_pids(log), 30, "the cycle process to start")
        first = _cycle_pids(log)[0]
        assert first != server and _ppid(first) == server
        cluster.wait_for(lambda: _samples(cluster) >= 2, 30, "cycles to write cluster samples")

        os.kill(first, signal.SIGKILL)
        cluster.wait_for(lambda: len(_cycle_pids(log)) >= 2, 30, "a new cycle process")
        second = _cycle_pids(log)[1]
        assert second != first and _ppid(second) == server
        assert "the cycle process died" in log.read_text()
        before = _samples(cluster)
        cluster.wait_for(lambda: _samples(cluster) >= before + 2, 30, "cycles from the new process")
        assert cluster.health()["leader"] is True
    finally:
        cluster.close()
    deadline = time.monotonic() + 15
    while Path(f"/proc/{second}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{second}").exists(), "the cycle process outlived the server"
