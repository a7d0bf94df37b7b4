"""The node's fence (agents/fence.py) with real processes: a stand-in agent that claims the lease,
starts one rank process group and arms the watchdog; the test freezes, kills or replaces it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.fence import (
    FENCE_FRACTION,
    Fence,
    Group,
    kill_group,
    not_ours,
    read_groups,
    read_lease,
    read_pids,
    record,
)

TTL_S = 2.0  # the watchdog fences after FENCE_FRACTION of it: 1.2 s (room for a loaded machine)

AGENT = """
import subprocess, sys, time
from pathlib import Path
from agents.fence import Fence, record
d = Path(sys.argv[1])
fence = Fence(d)
fence.claim()
rank = subprocess.Popen(["sleep", "120"], start_new_session=True)
(d / "pids").write_text(record(rank.pid).line())
fence.arm(float(sys.argv[2]))
print(rank.pid, fence.watchdog.pid, flush=True)
rank.wait()
print("rank", rank.returncode, fence.fenced(rank.pid, rank.returncode), flush=True)
time.sleep(4 * 0.25)
print("watchdog", fence.watchdog.pid, fence.watchdog.poll() is None, flush=True)
fence.close()
"""


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _wait(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    p = subprocess.Popen([sys.executable, "-c", AGENT, str(tmp_path), str(TTL_S)], stdout=subprocess.PIPE, text=True,
                         env=env)
    assert p.stdout is not None
    rank, watchdog = map(int, p.stdout.readline().split())
    yield p, rank, watchdog, tmp_path
    for pid in (p.pid, rank, watchdog):
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


def test_a_live_agent_keeps_its_rank_and_a_frozen_one_loses_it_before_the_ttl(agent) -> None:  # type: ignore[no-untyped-def]
    p, rank, watchdog, d = agent
    time.sleep(2 * FENCE_FRACTION * TTL_S)  # ticking: nothing happens
    assert _alive(rank) and _alive(watchdog)
    os.kill(p.pid, signal.SIGSTOP)  # frozen: no ticks, its rank thread frozen too
    _wait(lambda: not _alive(rank), 5, "the fence to stop the rank")
    assert read_pids(d / "fenced") == {rank}
    _wait(lambda: not _alive(watchdog), 5, "the watchdog to exit once it has fenced")
    os.kill(p.pid, signal.SIGCONT)  # the agent comes back: it learns its rank was fenced, and fences again
    assert p.stdout.readline().split() == ["rank", str(-signal.SIGKILL), "True"]
    words = p.stdout.readline().split()
    assert words[0] == "watchdog" and int(words[1]) != watchdog and words[2] == "True"
    assert p.wait(10) == 0
    assert not (d / "lease").exists()  # closed cleanly: the lease is gone


def test_a_killed_agents_rank_is_stopped(agent) -> None:  # type: ignore[no-untyped-def]
    p, rank, watchdog, d = agent
    os.kill(p.pid, signal.SIGKILL)  # the agent alone dies; its rank (its own session) would run on
    _wait(lambda: not _alive(rank), 5, "the fence to stop the rank")
    assert read_pids(d / "fenced") == {rank}


def test_a_new_agent_on_the_node_retires_the_old_watchdog_and_it_kills_nothing(agent) -> None:  # type: ignore[no-untyped-def]
    p, rank, watchdog, d = agent
    os.kill(p.pid, signal.SIGSTOP)
    new = Fence(d)  # this process claims the node, as a restarted agent does first
    new.claim()
    try:
        assert read_lease(d / "lease")[0] == os.getpid()  # type: ignore[index]
        _wait(lambda: not _alive(watchdog), 5, "the old watchdog to exit")
        assert _alive(rank)  # stopping the predecessor's ranks is the new agent's job (kill_leftovers)
        assert not (d / "fenced").exists()
    finally:
        new.close()


def test_an_agent_that_stops_cleanly_takes_its_watchdog_and_lease_with_it(agent) -> None:  # type: ignore[no-untyped-def]
    p, rank, watchdog, d = agent
    os.kill(rank, signal.SIGTERM)  # the rank ends on its own
    assert p.stdout.readline().split() == ["rank", str(-signal.SIGTERM), "False"]  # not the fence's doing
    p.stdout.readline()
    assert p.wait(10) == 0
    assert not _alive(watchdog) and not (d / "lease").exists() and not (d / "fenced").exists()


def _session(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, start_new_session=True, env=env)


def test_a_recorded_group_is_killed_only_while_it_is_still_the_ranks(tmp_path: Path) -> None:
    """Each group is recorded with its leader's start time and the boot.  Killed: the rank itself, and
    the members left of a group whose leader exited (the id cannot be given out while they live).  Left
    alone: a group recorded in another boot, one whose id now names a process started at another time
    (the pid reused), and an older agent's bare id whose process is not a rank's."""
    rank = _session(["sleep", "60"])
    orphans = _session(["sh", "-c", "sleep 60 & echo $! > " + str(tmp_path / "member")])
    stranger = _session(["sleep", "60"])
    legacy_rank = _session(["sleep", "60"], env={**os.environ, "GSCHED_JOB_ID": "7"})
    try:
        mine = record(rank.pid)
        assert mine.start is not None and mine.boot
        group = record(orphans.pid)
        orphans.wait(10)  # the leader is gone; its background member lives on in its group
        _wait(lambda: (tmp_path / "member").exists() and (tmp_path / "member").read_text().strip().isdigit(), 5,
              "the member's pid")
        member = int((tmp_path / "member").read_text())
        assert os.getpgid(member) == orphans.pid

        taken = Group(stranger.pid, (record(stranger.pid).start or 0) - 1, mine.boot)  # as if the id came back
        elsewhere = Group(stranger.pid, record(stranger.pid).start, "another-boot")
        bare = Group(stranger.pid)
        assert not_ours(taken) == "its id was taken by another process"
        assert not_ours(elsewhere) == "recorded before the machine restarted"
        assert not_ours(bare) == "its process is not a rank's"
        assert not any(kill_group(g) for g in (taken, elsewhere, bare))
        assert _alive(stranger.pid)

        assert not_ours(mine) is None and kill_group(mine)
        assert rank.wait(5) == -signal.SIGKILL
        assert not_ours(group) is None and kill_group(group)
        _wait(lambda: not _alive(member), 5, "the orphaned member to be stopped")
        assert not_ours(Group(legacy_rank.pid)) is None and kill_group(Group(legacy_rank.pid))
        assert legacy_rank.wait(5) == -signal.SIGKILL

        pids = tmp_path / "pids"  # what the agent writes, read back the same; an older agent's bare ids too
        pids.write_text(mine.line() + "\n" + "123\n" + "junk\n")
        assert read_groups(pids) == {rank.pid: mine, 123: Group(123)}
        assert read_pids(pids) == {rank.pid, 123}
    finally:
        for p in (rank, orphans, stranger, legacy_rank):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
