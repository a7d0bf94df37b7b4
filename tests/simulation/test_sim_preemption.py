"""The simulator with ``[policy] preempt``: the plan of policies/preemption.py acted on, checkpoints
every ``epoch_s`` of running, the work since the last one lost.

The world: 2 nodes x 2 devices, no data.  alice submits four 1-device jobs of 20,000 s at t = 0 and
fills the cluster; bob submits one of 100 s at t = 1000.  At t >= 1300 bob has waited preempt_after_s
(300): alice's usage is about 4 x 1300 device-s, bob's 0, one share each, so alice's factor is
2^(-1 / 0.5) = 0.25 (over her share) and bob's 1 (under his).  All of alice's jobs started at 0 and
lose the same work since their checkpoint at 1200 (epoch 600 s): the tie goes to the lowest id, a0.
"""

from __future__ import annotations

from scheduler.core.policy_config import PolicyConfig
from scheduler.sim.simulator import ClusterSpec, DataSpec, TraceJob, simulate

TRACE = [TraceJob(f"a{i}", 0.0, "alice", 1, 20_000.0) for i in range(4)] + [TraceJob("b", 1000.0, "bob", 1, 100.0)]
CLUSTER = ClusterSpec(nodes=2, devices_per_node=2, racks=1)


def run(preempt: bool):  # type: ignore[no-untyped-def]
    return simulate(TRACE, "twostage", CLUSTER, DataSpec(none=True), cycle_s=10.0,
                    cfg=PolicyConfig(preempt=preempt), epoch_s=600.0)


def test_without_preemption_bob_waits_for_alices_jobs_to_end() -> None:
    r = run(False)
    assert r.schedule["b"][0] >= 20_000.0
    assert (r.preemptions, r.preempted_device_s) == (0, 0.0)


def test_with_preemption_bob_runs_after_preempt_after_s_and_alices_victim_resumes_and_completes() -> None:
    r = run(True)
    start_b = r.schedule["b"][0]
    # bob waited preempt_after_s (300) plus at most one 60 s look and one 10 s tick
    assert 1000.0 + 300.0 <= start_b <= 1000.0 + 300.0 + 60.0 + 10.0
    assert r.preemptions == 1
    # a0 lost the work since its checkpoint at 1200 s: less than one epoch, never more
    assert 0.0 < r.preempted_device_s == start_b - 1200.0 < 600.0
    # everyone completes; a0 resumed after bob's job ended and ran the rest: 20,000 - 1200 s
    assert r.jobs == 5 and r.unfinished == 0
    a0_start, a0_end = r.schedule["a0"]  # (its last start, its end)
    assert a0_start >= r.schedule["b"][1]
    assert a0_end - a0_start == 20_000.0 - 1200.0
    for k in ("a1", "a2", "a3"):
        assert r.schedule[k] == (0.0, 20_000.0)
