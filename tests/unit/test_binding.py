"""Binding a candidate device by device (scheduler/core/binding.py), the bookkeeping the server's
binder and the simulator share."""

from __future__ import annotations

from scheduler.core.binding import BindPlan, RankSlot, plan_binding
from scheduler.core.fairshare import accrue
from scheduler.core.placement import Candidate, ShardRead

# Three ranks of two devices: two on n1 (which holds shard 0), one on n2, which stages shard 1 from n1.
READS = (ShardRead(0, 0, "n1", "n1", 100), ShardRead(1, 2, "n2", "n1", 200))
GANG = Candidate(7, ("n1", "n1", "n2"), 2, READS, 200, 64)


def test_each_rank_gets_the_lowest_free_devices_of_its_node_in_rank_order() -> None:
    plan = plan_binding(GANG, {"n1": [0, 1, 2, 3, 4, 5], "n2": [0, 1]}, {"n1": {1}}, {"n1", "n2"})
    assert plan == BindPlan((RankSlot(0, "n1", 0, (0, 2)), RankSlot(1, "n1", 1, (3, 4)), RankSlot(2, "n2", 0, (0, 1))),
                            staging=(READS[1],))
    assert plan.devices_by_node() == {"n1": [0, 2, 3, 4], "n2": [0, 1]}


def test_a_node_down_or_short_of_free_devices_is_refused_saying_which() -> None:
    healthy = {"n1": [0, 1, 2, 3], "n2": [0, 1]}
    assert plan_binding(GANG, healthy, {}, {"n1"}) == "node n2 is not up any more"
    taken = plan_binding(GANG, healthy, {"n1": {0}}, {"n1", "n2"})
    assert taken == "devices on n1 became taken since the snapshot (3 free, 4 needed)"
    sick = plan_binding(GANG, {"n1": [0, 1, 2], "n2": [0, 1]}, {}, {"n1", "n2"})
    assert sick == "devices on n1 became unhealthy since the snapshot (3 free, 4 needed)"


def test_usage_accrues_decayed_plus_the_device_seconds_held() -> None:
    # 1000 device-seconds, one half-life later, with 4 devices held for that hour: 500 + 4 * 3600.
    assert accrue(1000.0, 4, 3600.0, 3600.0) == 500.0 + 14400.0
    assert accrue(1000.0, 4, 0.0, 3600.0) == 1000.0
