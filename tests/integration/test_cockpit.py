"""The cockpit against a real cluster: ``gsched queue --watch`` in a pseudo-terminal, show, plot, /metrics.

One scenario (module fixture ``watched``), run once: two nodes of one device each hold every shard of
``tiny``.  Node n2's agent is frozen (SIGSTOP), so it misses heartbeats and is declared down; a 2-rank
job submitted then stays PENDING (the cluster has one live device), deterministically and without a
second training job to occupy devices.  ``gsched queue --watch`` runs in a real pty (pexpect); the
agent is thawed (SIGCONT), n2 comes back, the job is placed, runs one epoch and completes, and the
watch is read all along.  The tests then look at what the watch showed and at the job's other views.
"""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli.localcluster import LocalCluster, NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pexpect = pytest.importorskip("pexpect")
pytestmark = pytest.mark.integration

# Control sequences a terminal interprets (colours, cursor moves, alternate screen) and OSC titles.
CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]|\x1b[=>78]")


class Screen:
    """What the watch has drawn so far, as plain text (control sequences removed)."""

    def __init__(self, child: Any) -> None:
        self.child = child
        self.text = ""

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                chunk = self.child.read_nonblocking(65536, timeout=0.2)
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                return
            self.text += CONTROL.sub("", chunk).replace("\r", "")

    def last_frame(self, lines: int = 30) -> str:
        return "\n".join([line.rstrip() for line in self.text.splitlines() if line.strip()][-lines:])

    def wait_for(self, pattern: str, timeout: float, what: str, diagnose: Any = None) -> re.Match[str]:
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        start = len(self.text)
        while time.monotonic() < deadline:
            m = rx.search(self.text, max(0, start - 400))
            if m:
                return m
            self.pump(0.5)
        detail = diagnose() if diagnose else ""
        raise AssertionError(f"the watch never showed {what} in {timeout:.0f}s; last lines drawn:\n"
                             f"{self.last_frame()}\n{detail}")


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("cockpit")
    c = LocalCluster(root, [NodeSpec("n1", "r1", gpus=1), NodeSpec("n2", "r1", gpus=1)], ttl_s=3.0)
    agent_pid = None
    child = None
    try:
        c.start()
        c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "4", "--replicas", "2")
        alice = c.add_user("alice")
        agent_pid = c.procs["agent-n2"].pid
        os.killpg(agent_pid, signal.SIGSTOP)
        c.wait_for(lambda: {n["name"]: n["state"] for n in c.admin().get("/v1/nodes")}["n2"] == "down", 30,
                   "n2 to be declared down")
        spec = root / "probe.toml"
        spec.write_text(job_toml("probe", ranks=2, epochs=1))
        job_id = int(c.cli("submit", str(spec), token=alice).stdout.split()[-1])

        env = {**c.env, "GSCHED_TOKEN": alice, "TERM": "xterm-256color", "COLUMNS": "150", "LINES": "50"}
        env.pop("NO_COLOR", None)
        child = pexpect.spawn(sys.executable, ["-m", "scheduler.cli", "queue", "--watch", "--interval", "0.5"],
                              env=env, cwd=str(root), dimensions=(50, 150), encoding="utf-8",
                              codec_errors="replace")
        screen = Screen(child)
        row = rf"^\s*{job_id}\s+alice\s+probe\s+"
        seen = {"PENDING": screen.wait_for(row + r"PENDING\s.*more devices than the cluster has.*", 60,
                                           "the job PENDING with its reason").group(0)}
        os.killpg(agent_pid, signal.SIGCONT)
        agent_pid = None
        def diagnose() -> str:
            doc = c.job(job_id)
            return json.dumps({k: doc[k] for k in ("state", "reason", "ranks", "events")}, indent=1) + c.tail_logs()

        seen["RUNNING"] = screen.wait_for(row + r"RUNNING\b.*", 180, "the job RUNNING", diagnose).group(0)
        seen["COMPLETED"] = screen.wait_for(row + r"COMPLETED\b.*", 300, "the job COMPLETED", diagnose).group(0)
        order = [screen.text.find(m) for m in seen.values()]
        child.sendintr()
        child.expect(pexpect.EOF, timeout=20)
        child.close()
        yield {"cluster": c, "job": job_id, "alice": alice, "seen": seen, "order": order, "screen": screen.text,
               "status": child.exitstatus, "root": root}
    finally:
        if agent_pid is not None:
            os.killpg(agent_pid, signal.SIGCONT)
        if child is not None and child.isalive():
            child.terminate(force=True)
        c.close()


def test_watch_shows_the_job_pending_then_running_then_completed(watched: dict[str, Any]) -> None:
    seen = watched["seen"]
    assert list(seen) == ["PENDING", "RUNNING", "COMPLETED"]
    assert watched["order"] == sorted(watched["order"]), "states appeared out of order"
    # While pending, the row says why in plain words; once running it names both nodes.
    assert "needs 2, the up nodes have 1" in seen["PENDING"]
    assert re.search(r"RUNNING\s+2x1\s+n1,n2\s+100%", seen["RUNNING"]), seen["RUNNING"]
    # The panels were drawn too, and Ctrl-C ended the watch cleanly.
    assert "fair share" in watched["screen"] and "nodes (" in watched["screen"]
    assert watched["status"] == 0


def test_queue_json_carries_the_same_figures(watched: dict[str, Any]) -> None:
    c = watched["cluster"]
    out = json.loads(c.cli("queue", "--json", "--all", "--mine", token=watched["alice"]).stdout)
    (job,) = [j for j in out["jobs"] if j["id"] == watched["job"]]
    assert job["state"] == "COMPLETED" and job["nodes"] == ["n1", "n2"]
    assert {"elapsed_s", "eta_s", "reason_text", "epochs_progress"} <= set(job)
    assert {u["user"] for u in out["users"]} >= {"alice"} and len(out["nodes"]) == 2


def test_show_reads_as_a_report(watched: dict[str, Any]) -> None:
    out = watched["cluster"].cli("show", str(watched["job"]), token=watched["alice"]).stdout
    for section in ("COMPLETED", "placement", "100% of bytes read locally", "shard map", "epochs", "checkpoints",
                    "events", "job.submit"):
        assert section in out, f"{section!r} missing from gsched show:\n{out}"


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", head[16:24])


def test_plot_writes_pngs_of_the_job_and_of_the_cluster(watched: dict[str, Any], tmp_path: Path) -> None:
    c = watched["cluster"]
    job_png, cluster_png = tmp_path / "job.png", tmp_path / "cluster.png"
    assert c.cli("plot", str(watched["job"]), "-o", str(job_png), token=watched["alice"]).stdout.strip() == str(job_png)
    c.cli("plot", "--cluster", "--last", "1h", "-o", str(cluster_png), token=watched["alice"])
    for png in (job_png, cluster_png):
        assert png_size(png) == (1000, 600)
        assert 10_000 < png.stat().st_size < 1_000_000
    history = c.client(watched["alice"]).get("/v1/cluster/history", limit=5)
    assert len(history) == 5 and [h["time"] for h in history] == sorted(h["time"] for h in history)
    assert {"devices_total", "devices_busy", "pending", "running", "durations"} <= set(history[0])


def test_metrics_parse_and_have_the_expected_series(watched: dict[str, Any]) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    c = watched["cluster"]
    with urllib.request.urlopen(c.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    names = {name for name, _ in samples}
    assert {"gsched_jobs", "gsched_jobs_pending_by_reason", "gsched_cycle_phase_seconds",
            "gsched_cycle_last_timestamp_seconds", "gsched_cycles_total", "gsched_decisions_total", "gsched_devices",
            "gsched_staged_bytes_total", "gsched_node_up", "gsched_node_heartbeat_age_seconds",
            "gsched_fairshare_factor", "gsched_fairshare_usage_device_seconds", "gsched_fairshare_shares"} <= names
    assert samples[("gsched_jobs", (("state", "COMPLETED"),))] >= 1
    assert samples[("gsched_jobs_pending_by_reason", (("reason", "devices_busy"),))] == 0  # present, nothing waits
    assert samples[("gsched_decisions_total", (("decision", "bind"),))] >= 1
    assert samples[("gsched_devices", (("use", "total"),))] == 2
    phases = {dict(labels)["phase"] for name, labels in samples if name == "gsched_cycle_phase_seconds"}
    assert {"expire", "snapshot", "decide"} <= phases
    assert samples[("gsched_node_up", (("node", "n2"),))] == 1
    assert 0 <= samples[("gsched_node_heartbeat_age_seconds", (("node", "n1"),))] < 10
    assert 0 < samples[("gsched_fairshare_factor", (("user", "alice"),))] <= 1
