"""The agent's job retention (agents/retention.py): which finished jobs' directories go, and when."""

from __future__ import annotations

from pathlib import Path

from agents.retention import JobRetention, expired, job_dir_ids
from scheduler.protocol.messages import Ended, Heartbeat, HeartbeatReply

DAY = 86400.0


def make_job_dir(data: Path, job_id: int) -> Path:
    d = data / ".gsched" / "jobs" / str(job_id)
    (d / "attempt-0").mkdir(parents=True)
    (d / "attempt-0" / "rank-0.log").write_text("epoch 1\n")
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / "epoch-0001.pt").write_bytes(b"x" * 10)
    return d


def test_a_directory_goes_once_its_job_ended_the_retention_ago_and_no_rank_of_it_runs_here() -> None:
    ended = [Ended(job_id=1, ago_s=8 * DAY), Ended(job_id=2, ago_s=6 * DAY), Ended(job_id=3, ago_s=7 * DAY),
             Ended(job_id=4, ago_s=9 * DAY)]
    # 7 days: job 1 (8 days) and job 3 (exactly 7) go; job 2 (6 days) stays; job 4 is old enough, but a rank
    # of it still runs here (not stopped yet): its directory stays until it has gone
    assert expired(ended, 7 * DAY, live={4}) == [1, 3]


def test_the_agent_lists_its_job_directories_when_a_sweep_is_due_and_removes_what_the_server_says(tmp_path: Path) -> None:
    for job_id in (3, 12, 40):
        make_job_dir(tmp_path, job_id)
    (tmp_path / ".gsched" / "jobs" / "pids").write_text("")  # not a job directory
    (tmp_path / ".gsched" / "jobs" / "77").symlink_to(tmp_path / ".gsched" / "jobs" / "3")  # nor a symlink
    assert job_dir_ids(tmp_path) == [3, 12, 40]
    r = JobRetention(tmp_path, retention_s=2 * DAY)
    start = r._last
    assert r.due(start + 1) is None  # the first sweep comes a minute after start
    dirs = r.due(start + 60)
    assert dirs == [3, 12, 40]
    Heartbeat.model_validate({"node": "n1", "address": "127.0.0.1:1", "incarnation": "i", "job_dirs": dirs})
    assert r.due(start + 61) is None  # and then once a minute
    reply = HeartbeatReply.model_validate({"ended": [{"job_id": 3, "ago_s": 3 * DAY}, {"job_id": 12, "ago_s": DAY}]})
    assert r.apply(reply.ended, live=set()) == [3]
    assert job_dir_ids(tmp_path) == [12, 40]
    assert (tmp_path / ".gsched" / "jobs" / "77").is_symlink()  # a symlink is never followed nor removed
    assert r.apply(reply.ended, live=set()) == []  # idempotent


def test_without_a_retention_nothing_is_listed_or_removed(tmp_path: Path) -> None:
    make_job_dir(tmp_path, 5)
    r = JobRetention(tmp_path, retention_s=None)
    assert r.due(r._last + 10 * DAY) is None
    assert r.apply([Ended(job_id=5, ago_s=10 * DAY)], live=set()) == []
    assert job_dir_ids(tmp_path) == [5]


def test_a_reply_without_ended_is_not_an_answer() -> None:
    assert HeartbeatReply().wire().get("ended", "absent") == "absent"
    assert HeartbeatReply(ended=[]).wire()["ended"] == []
