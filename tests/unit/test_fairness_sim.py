"""Fair share over a simulated day, driving decide() with a fake clock.

A 16-device cluster (4 nodes x 4) is kept full by two users who always have work queued: jobs of
2 devices that run 30 minutes (their time limit).  Every minute the loop completes the jobs that
ended, builds a snapshot, calls decide(), starts what it bound, then advances the clock, charging
each user the device-seconds of their running jobs into a usage that decays with the configured
half-life.  Over a day the device time each user got must follow their shares within 10%.
"""

import pytest

from policies.registry import get_arbiter
from scheduler.core.decide import decide
from scheduler.core.fairshare import decay_all
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import JobView, NodeView, RunningView, Snapshot

DAY_S = 24 * 3600
STEP_S = 60
JOB_S = 1800
DEVICES_PER_JOB = 2


def run_day(shares: dict[str, float], arbiter: str = "twostage") -> dict[str, float]:
    cfg = PolicyConfig(arbiter=arbiter, locality_wait_s=0)
    node_names = [f"n{i}" for i in range(4)]
    used = dict.fromkeys(node_names, 0)
    usage = dict.fromkeys(shares, 0.0)
    device_s = dict.fromkeys(shares, 0.0)
    pending: list[JobView] = []
    running: dict[int, tuple[JobView, dict[str, int], float]] = {}
    next_id = 1
    now = 0.0
    while now < DAY_S:
        for jid in [j for j, (_, _, end) in running.items() if end <= now]:
            _, dbn, _ = running.pop(jid)
            for n, d in dbn.items():
                used[n] -= d
        for user in sorted(shares):  # each user keeps 8 jobs queued
            while sum(j.user == user for j in pending) < 8:
                pending.append(JobView(next_id, user, DEVICES_PER_JOB, 1, None, now, now, JOB_S))
                next_id += 1
        snap = Snapshot(
            now_s=now,
            nodes={n: NodeView(n, "r1", 4, 4 - used[n]) for n in node_names},
            shards={},
            replicas={},
            pending=tuple(pending),
            running=tuple(
                RunningView(j, job.user, tuple(dbn.items()), end) for j, (job, dbn, end) in running.items()
            ),
            usage=dict(usage),
            shares=shares,
        )
        _, decision = decide(snap, cfg, get_arbiter(cfg.arbiter))
        for jid, cand in decision.bindings.items():
            job = next(j for j in pending if j.id == jid)
            pending.remove(job)
            dbn = cand.devices_by_node()
            for n, d in dbn.items():
                used[n] += d
            running[jid] = (job, dbn, now + JOB_S)
        usage = decay_all(usage, STEP_S, cfg.usage_half_life_s)
        for job, dbn, _ in running.values():
            charge = sum(dbn.values()) * STEP_S
            usage[job.user] += charge
            device_s[job.user] += charge
        assert sum(used.values()) == 16  # the cluster stays full
        now += STEP_S
    return device_s


@pytest.mark.parametrize("arbiter", ["twostage", "fairshare"])
def test_equal_shares_get_equal_device_time(arbiter: str) -> None:
    got = run_day({"alice": 1, "bob": 1}, arbiter)
    alice = got["alice"] / (got["alice"] + got["bob"])
    assert alice == pytest.approx(0.5, rel=0.10)


def test_shares_two_to_one_get_device_time_two_to_one() -> None:
    got = run_day({"alice": 2, "bob": 1})
    assert got["alice"] / got["bob"] == pytest.approx(2.0, rel=0.10)
