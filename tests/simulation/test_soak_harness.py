"""``python -m benchmarks.soak``: its device check, and a quarter-minute run end to end (no figures asserted
beyond "nothing lost, duplicated or double-held")."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from benchmarks.soak import REPORT_KEYS, ProcessWatch, double_held, main


def test_double_held_finds_overlapping_holds_of_one_device_by_different_attempts() -> None:
    rows = [
        # (job, attempt, rank, node, devices, bound_at, ended_at)
        (1, 1, 0, "n1", "[0, 1]", 10.0, 20.0),
        (2, 1, 0, "n1", "[0]", 20.0, 30.0),  # bound as job 1 ended: touching, not overlapping
        (1, 2, 0, "n1", "[1]", 15.0, None),  # job 1's next attempt on device 1 while attempt 1 holds it
        (3, 1, 0, "n2", [0], 5.0, None),  # still held at the end (100.0)...
        (4, 1, 1, "n2", [0], 99.0, 99.5),  # ...so this one overlaps it
        (5, 1, 0, "n3", [0], 1.0, 2.0),
        (5, 1, 1, "n3", [1], 1.0, 2.0),  # one attempt's ranks on their own devices
    ]
    assert double_held(rows, end=100.0) == [
        ("n1", 1, (1, 1, 0), (1, 2, 0)),
        ("n2", 0, (3, 1, 0), (4, 1, 1)),
    ]


def test_the_process_watch_sees_two_attempts_of_one_job_alive_at_once(tmp_path: Path) -> None:
    def rank(job: int, attempt: int, node: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "GSCHED_JOB_ID": str(job), "GSCHED_ATTEMPT": str(attempt),
               "GSCHED_SHARD_LIST": f"{tmp_path.resolve()}/nodes/{node}/.gsched/run/rank-0.shards"}
        return subprocess.Popen(["sleep", "30"], env=env)

    procs = [rank(7, 1, "n1"), rank(7, 2, "n2"), rank(8, 1, "n1")]
    try:
        watch = ProcessWatch(tmp_path)
        watch.paused = "n1"
        watch.sample()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert watch.live_jobs == {7, 8} and watch.ranks_on == {"n1": 2, "n2": 1}
    assert list(watch.seen) == [7]
    assert watch.seen[7]["attempts"] == {1: ["n1"], 2: ["n2"]} and watch.seen[7]["paused"] == "n1"
    watch.sample()  # both gone now: nothing new
    assert list(watch.seen) == [7]


@pytest.mark.integration
def test_a_quarter_minute_of_soak_reports_every_figure_and_finds_nothing_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    # No pause: with a 4 s TTL the node's fence (agents/fence.py) stops a paused agent's ranks at 2.4 s and
    # the job may run elsewhere from 4 s on, a margin a loaded CI machine's scheduling could eat; the
    # 30-minute soak (make soak) pauses one, and tests/unit/test_fence.py and the frozen-agent test of
    # tests/integration/test_reliability.py check the fence with room to spare.
    code = main(["--minutes", "0.25", "--seed", "1", "--resnet", "0", "--ttl-s", "4", "--drain-s", "120", "--no-pause"])
    printed = capsys.readouterr().out
    report = printed.split("[soak] report\n", 1)[1]
    for key in REPORT_KEYS:
        assert f"  {key}: " in report, (key, printed)
    assert "[soak] OK: lost 0, duplicated 0, double-held 0, unknown jobs 0" in printed, printed
    assert code == 0
    figures = dict(line.strip().split(": ", 1) for line in report.splitlines() if line.startswith("  ") and ": " in line
                   and not line.strip().startswith(("FAILED", "LOST", "DUPLICATED", "DOUBLE-HELD", "tracebacks in")))
    assert int(figures["submitted"]) > 0 and int(figures["jobs_seen_live"]) > 0  # it did watch real ranks
    assert (figures["server_kills"], figures["pauses"]) == ("1", "0")
    assert int(figures["agent_crashes"]) >= 1 and int(figures["node_kills"]) >= 1
