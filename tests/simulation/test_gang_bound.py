"""Gang-bound windows (``scheduler.sim.simulator.gang_bound``): when a user's max-min part of a window
is narrower than a job they hold or wait for, and their narrower jobs cannot fill it, the window's
Jain is held below 1 by the gang's width, whatever the policy; the simulator reports the share of used
device time in such windows and Jain over the others."""

from __future__ import annotations

from pathlib import Path

import pytest

import scheduler.sim.simulator as simmod
from scheduler.sim.simulator import ClusterSpec, DataSpec, gang_bound, simulate
from tests.simulation.test_simulator import write_trace

H = 3600.0


def test_a_user_whose_part_is_narrower_than_their_only_job_makes_the_window_gang_bound() -> None:
    # 16 devices used for the hour, two users asking for 16 each: each is entitled to 8 device-hours.
    demand, fair = {"a": 16 * H, "b": 16 * H}, {"a": 8 * H, "b": 8 * H}
    assert gang_bound(demand, fair, {"a": {16: 1}, "b": {1: 16}}, H)  # a's one job is 16 wide > 8
    # b's jobs are all 1 wide: b can be given exactly 8; a 16-wide job of b's with 16 narrow ones is not
    # binding either (the narrow ones fill b's part)
    assert not gang_bound(demand, fair, {"a": {4: 2, 1: 8}, "b": {1: 16}}, H)
    assert not gang_bound(demand, fair, {"a": {4: 4}, "b": {16: 1, 1: 8}}, H)
    # 16 wide with only 4 + 2 + 1 = 7 narrow devices beside it: 7 < 8, still bound
    assert gang_bound(demand, fair, {"a": {16: 1, 4: 1, 2: 1, 1: 1}, "b": {1: 16}}, H)


def test_a_user_asking_no_more_than_their_part_never_binds() -> None:
    # a asks for 4 device-hours (one 4-wide job for the hour) and gets them all: no gang can bind a.
    # b asks for 16 with a 12-wide job; b's part is 16 - 4 = 12: the job fits the part exactly.
    demand, fair = {"a": 4 * H, "b": 16 * H}, {"a": 4 * H, "b": 12 * H}
    assert not gang_bound(demand, fair, {"a": {4: 1}, "b": {12: 1, 4: 1}}, H)
    # the same with b's job 13 wide (and nothing narrow enough to fill 12): bound
    assert gang_bound(demand, fair, {"a": {4: 1}, "b": {13: 1, 4: 1}}, H)


def test_the_simulator_reports_the_gang_bound_share_and_jain_outside_it(tmp_path: Path) -> None:
    # One node of 4 devices (it holds the one shard: every read local), fifo.  u1's 4-wide job W
    # arrives at 0 and runs 0 -> 3 h; u2's four 1-wide jobs arrive at 1 s and run 3 h -> 6 h.
    # Hours 0-2: 4 devices used, both ask for 4 (u2 for 4 x 3599 s in hour 0): parts 2 and 2; u1 gets
    #   4 (x = 2), u2 0 (x = 0): Jain (2 + 0)^2 / (2 (4 + 0)) = 0.5; u1 is over its part of 2 with a
    #   4-wide job and nothing narrow: gang-bound.
    # Hours 3-5: only u2 asks, for 4, and gets 4: Jain 1, not bound.
    # Jain = (3 x 0.5 + 3 x 1) / 6 = 0.75 (each hour weighs 4 device-hours); bound share 3/6; Jain
    # elsewhere 1.
    trace = write_trace(tmp_path / "gang.csv", [("W", 0, "u1", 4, 3 * H)]
                        + [(f"n{i}", 1, "u2", 1, 3 * H) for i in range(4)])
    r = simulate(simmod.load_trace(trace), "fifo", ClusterSpec(nodes=1, devices_per_node=4, racks=1),
                 DataSpec(datasets=1, shards=1, shard_mb=1, replicas=1), seed=0, cycle_s=10)
    assert r.schedule["W"] == (0, 3 * H) and all(r.schedule[f"n{i}"] == (3 * H, 6 * H) for i in range(4))
    assert r.jain == pytest.approx(0.75, abs=1e-6)
    assert r.gang_bound_share == pytest.approx(0.5, abs=1e-6)
    assert r.jain_unbound == pytest.approx(1.0, abs=1e-6)
    assert {"gang_bound_share", "jain_unbound"} <= set(r.as_json())
