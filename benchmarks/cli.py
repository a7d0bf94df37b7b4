"""Section ``cli``: how long ``gsched queue -o json``, ``gsched queue`` and ``gsched submit`` take, as
whole processes, against a bare interpreter's start-up (``python -c pass``) timed in the same run.

The server is a real ``gsched server`` on loopback with no agents: 4 fake nodes of 8 devices
(registered by heartbeats from agent tokens, as in section ``control``), one data set and 30 pending
jobs of 3 users, so the queue view draws every panel.  Each command is the ``gsched`` console
script next to the interpreter (else the same two lines with ``-c``: ``python -m`` would add runpy's
start-up), with this tree first on ``PYTHONPATH``, as user ``bench`` (``GSCHED_TOKEN``),
``COLUMNS=150``, its output thrown away.  The commands and the baseline run in turn (A B A B ...),
after one warm-up each, so the machine's drift weighs on both; each figure is the median wall time,
and the ratio the median of the pair-by-pair ratios.  The byte-code cache is used as a user's installed copy uses it: ``PYTHONDONTWRITEBYTECODE``
is dropped from the commands' environment and ``PYTHONPYCACHEPREFIX`` points at a folder of this run.
Target: each command within 2x the interpreter's start-up.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import Figure, Report
from scheduler.cli.localcluster import LocalCluster

TARGET = 2.0
NODES, DEVICES, JOBS = 4, 8, 30
JOB_TOML = """\
name = "bench-submit"
[resources]
ranks = 1
gpus_per_rank = 1
[data]
dataset = "benchdata"
[train]
epochs = 1
[limits]
time = "10m"
"""
# What the console script runs, where there is none.
GSCHED = "import sys; from scheduler.cli.main import main; sys.argv[0] = 'gsched'; sys.exit(main())"


def gsched_argv() -> list[str]:
    script = Path(sys.executable).with_name("gsched")
    return [sys.executable, str(script)] if script.is_file() else [sys.executable, "-c", GSCHED]


def _heartbeat(node: str) -> dict[str, Any]:
    return {"node": node, "rack": f"rack{int(node[1:]) % 2}", "address": "127.0.0.1:9", "incarnation": "bench",
            "devices": [{"index": i} for i in range(DEVICES)], "free_bytes": 10**12, "replicas": []}


@contextmanager
def serving(root: Path) -> Iterator[tuple[LocalCluster, dict[str, str]]]:
    """A server with fake nodes, a data set and pending jobs; yields it and the environment the timed
    commands run in (``bench``'s token, ``job.toml`` written under ``root``)."""
    cluster = LocalCluster(root / "cluster", [], cycle_s=2.0, ttl_s=3600.0)
    try:
        cluster.start_server()
        admin = cluster.admin()
        tokens = {u: cluster.add_user(u) for u in ("bench", "alice", "bob")}
        for i in range(NODES):
            name = f"n{i}"
            tok = admin.post("/v1/agent-tokens", {"node": name})["token"]
            cluster.client(tok).post("/v1/agent/heartbeat", _heartbeat(name))
        admin.post("/v1/datasets", {"name": "benchdata", "classes": 4, "image_shape": [3, 8, 8], "replicas": 1,
                                    "shards": [{"index": 0, "bytes": 1000, "sha256": "0" * 64, "samples": 10}]})
        users = list(tokens)
        for k in range(JOBS):  # their data has no live copy: they stay pending, each with a reason
            spec = {"name": f"job-{k}", "resources": {"ranks": 1 + k % 2, "gpus_per_rank": 1},
                    "data": {"dataset": "benchdata"}, "train": {"epochs": 1}, "limits": {"time": 600}}
            cluster.client(tokens[users[k % 3]]).post("/v1/jobs", {"spec": spec})
        (root / "job.toml").write_text(JOB_TOML)
        env = {**cluster.env, "GSCHED_TOKEN": tokens["bench"], "COLUMNS": "150", "LINES": "50",
               "PYTHONPYCACHEPREFIX": str(root / "pycache")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        yield cluster, env
    finally:
        cluster.close()


def _time(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{argv} exited {out.returncode}: {out.stderr.decode(errors='replace')[-400:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def paired(a: list[str], b: list[str], env: dict[str, str], cwd: Path, runs: int) -> dict[str, tuple[float, float, float]]:
    """For ``wall`` and ``cpu``: (median of A, median of B, median of the A/B ratios), A and B run in
    turn after a warm-up each."""
    _time(a, env, cwd)
    _time(b, env, cwd)
    ta, tb = [], []
    for _ in range(runs):
        ta.append(_time(a, env, cwd))
        tb.append(_time(b, env, cwd))
    out = {}
    for k, what in enumerate(("wall", "cpu")):
        xs, ys = [t[k] for t in ta], [t[k] for t in tb]
        out[what] = (statistics.median(xs), statistics.median(ys),
                     statistics.median(x / y for x, y in zip(xs, ys, strict=True) if y > 0))
    return out


def run(report: Report) -> None:
    runs = 5 if report.quick else 21
    py = sys.executable
    base = [py, "-c", "pass"]
    with tempfile.TemporaryDirectory(prefix="gsched-bench-cli-") as tmp, serving(Path(tmp)) as (_, env):
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                             *filter(None, [env.get("PYTHONPATH")])])
        report.note("cli", f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the start (other "
                           "work on a shared machine lengthens the wall times; CPU times move less)")
        for words in (["queue", "-o", "json"], ["queue"], ["submit", "job.toml"]):
            got = paired([*gsched_argv(), *words], base, env, Path(tmp), runs)
            (a, b, ratio), (ca, cb, cratio) = got["wall"], got["cpu"]
            report.add(Figure("cli", f"gsched {' '.join(words)} ({JOBS} jobs, {NODES} nodes; median of {runs})",
                              f"{a * 1000:.0f} ms wall, {ca * 1000:.0f} ms CPU",
                              f"vs python -c pass {b * 1000:.0f} ms wall, {cb * 1000:.0f} ms CPU: ratio {ratio:.2f} "
                              f"(CPU {cratio:.2f})", f"wall <= {TARGET:g}x", ratio <= TARGET))
