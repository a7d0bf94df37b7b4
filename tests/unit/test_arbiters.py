"""Stage 2: the arbiters, driven through decide() on small clusters.

Shards are 1 GB: 320 ms from another node of the rack, 800 ms from another rack (see builders).
"""

from dataclasses import replace

import pytest

from policies.registry import ARBITERS, get_arbiter
from scheduler.core.decide import decide
from scheduler.core.placement import Candidate, Decision
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.reasons import Reason
from scheduler.core.snapshot import Snapshot
from tests.builders import cluster, job

NO_WAIT = PolicyConfig(locality_wait_s=0)
# The reservation mechanics at once: a blocked job reserves however short its wait (the default
# waits reserve_min_wait_s, 8 days, and bounds starvation with max_wait_s; tested at the end).
# The reservation's tests keep one user's jobs in age order (shortest_first off) and their ties in age
# order too (tie_shortest_first off): the rule under test is the reservation, and their hand-worked
# orders are by age.
AGE_ORDER = PolicyConfig(shortest_first=False, tie_shortest_first=False)
RESERVE_AT_ONCE = replace(AGE_ORDER, reserve_min_wait_s=0, max_wait_s=0)


def decided(snap: Snapshot, cfg: PolicyConfig) -> tuple[dict[int, list[Candidate]], Decision]:
    """``decide()`` with the arbiter ``cfg`` names, looked up in the registry as the cycle does."""
    return decide(snap, cfg, get_arbiter(cfg.arbiter))


def texts(reasons: dict[int, Reason]) -> dict[int, str]:
    """The reasons' sentences, as ``Job.reason`` stores them."""
    return {job_id: r.text() for job_id, r in reasons.items()}


def bound_nodes(decision) -> dict[int, dict[str, int]]:
    return {j: c.devices_by_node() for j, c in decision.bindings.items()}


def test_job_whose_shards_sit_on_a_goes_to_a_when_a_is_free() -> None:
    snap = (
        cluster()
        .node("a", rack="r1").holds("digits", shards=[0, 1])
        .node("b", rack="r1")
        .pending(job(1, ranks=2, dataset="digits"))
        .build()
    )  # fmt: skip
    _, d = decided(snap, PolicyConfig())
    assert bound_nodes(d) == {1: {"a": 2}}
    assert d.bindings[1].transfer_cost_ms == 0


def test_cheaper_of_two_placements_wins() -> None:
    snap = (
        cluster()
        .node("a", rack="r1", free=0).holds("d", shards=[0])
        .node("b", rack="r1", devices=1)
        .node("c", rack="r2", devices=2)
        .pending(job(1, dataset="d"))
        .build()
    )  # fmt: skip
    _, d = decided(snap, NO_WAIT)
    # a is busy; b stages from a in the rack (320 ms), c across racks (800 ms): b wins
    # (although c has more free devices)
    assert bound_nodes(d) == {1: {"b": 1}}
    assert d.bindings[1].transfer_cost_ms == 320


def test_lower_usage_user_goes_first() -> None:
    snap = (
        cluster()
        .node("a", devices=1)
        .usage(alice=100.0, bob=0.0)
        .pending(job(1, user="alice", submit_s=0), job(2, user="bob", submit_s=5))
        .at(5)
        .build()
    )
    _, d = decided(snap, RESERVE_AT_ONCE)
    # alice: U_norm 1, S_norm 0.5 -> 2^-2 = 0.25; bob: no usage -> 1.0
    assert d.order == [2, 1]
    assert d.factors == {1: 0.25, 2: 1.0}
    assert bound_nodes(d) == {2: {"a": 1}}
    # alice's job is next: reserved from when bob's ends by its time limit (5 + 3600)
    assert texts(d.reasons) == {1: "devices busy: needs 1, 0 free; devices reserved for it from t=3605s"}


def locality_snapshot(now_s: float, waiting_since_s: float | None = 100, pending_since_s: float = 100):
    # The data sits on a, which is busy; b (same rack) is free.  Waiting since t=100, wait 30 s.
    return (
        cluster()
        .node("a", rack="r1", free=0).holds("d", shards=[0])
        .node("b", rack="r1")
        .running(9, "carol", {"a": 4}, end_by_s=10_000)
        .pending(job(1, dataset="d", submit_s=pending_since_s, waiting_since_s=waiting_since_s))
        .at(now_s)
        .build()
    )  # fmt: skip


def test_locality_wait_holds_the_job_until_one_second_before_the_deadline() -> None:
    _, d = decided(locality_snapshot(129), PolicyConfig(locality_wait_s=30, locality_threshold_ms=0))
    assert d.bindings == {}
    assert texts(d.reasons) == {1: "waiting for locality until t=130s"}
    assert d.waiting == {1: 100}  # the wait's start, unchanged


def test_locality_wait_expires_exactly_when_configured() -> None:
    _, d = decided(locality_snapshot(130), PolicyConfig(locality_wait_s=30, locality_threshold_ms=0))
    # at waiting_since + wait = 130 it takes the costlier placement: b, staging from a (320 ms)
    assert bound_nodes(d) == {1: {"b": 1}}
    assert d.bindings[1].transfer_cost_ms == 320
    assert d.waiting == {}


def test_the_locality_wait_starts_when_the_job_could_first_run_elsewhere_not_at_submit() -> None:
    # Pending since t=100 (a backlog kept it queued), never waited: at t=5000 the free device on b is
    # the first it could take, so it waits from now (5000 -> 5030), not from t=100 (long over).
    cfg = PolicyConfig(locality_wait_s=30, locality_threshold_ms=0)
    _, d = decided(locality_snapshot(5000, waiting_since_s=None), cfg)
    assert d.bindings == {}
    assert d.waiting == {1: 5000}
    assert texts(d.reasons) == {1: "waiting for locality until t=5030s"}
    # The caller keeps that start: later cycles wait until 5030 and then take b.
    _, d = decided(locality_snapshot(5029, waiting_since_s=5000), cfg)
    assert texts(d.reasons) == {1: "waiting for locality until t=5030s"} and d.waiting == {1: 5000}
    _, d = decided(locality_snapshot(5030, waiting_since_s=5000), cfg)
    assert bound_nodes(d) == {1: {"b": 1}}


def contended(snap: Snapshot) -> Snapshot:
    """``snap`` with bob's gang of two 4-device ranks pending behind it: 8 devices, 4 free, so it finds
    none this cycle (the cycle is contended)."""
    return replace(snap, pending=(*snap.pending, job(2, user="bob", ranks=2, devices_per_rank=4, submit_s=200)))


def test_with_preemption_on_a_job_waits_preempt_locality_wait_s_for_its_data() -> None:
    # The locality snapshot (waiting since t=100 for a, where the data is; b free), with a job behind it
    # that finds no devices: with preempt on the wait is preempt_locality_wait_s (1800 s by default),
    # not locality_wait_s (10 s).  (bob's gang is wide, and bob holds nothing: it takes the reservation
    # at once, preempt_wide_window_s; that does not change job 1's wait.)
    on = PolicyConfig(preempt=True)
    assert (on.locality_wait, PolicyConfig().locality_wait) == (1800.0, 10.0)
    _, d = decided(contended(locality_snapshot(1899)), on)
    assert texts(d.reasons) == {1: "waiting for locality until t=1900s",
                                2: "devices busy: needs 8, 4 free; wider than its user's fair part, within "
                                   "preempt_wide_window_s, reserved at once: devices reserved for it from t=10000s"}
    _, d = decided(contended(locality_snapshot(1899)), replace(on, preempt_wide_window_s=0))
    assert texts(d.reasons) == {1: "waiting for locality until t=1900s", 2: "devices busy: needs 8, 4 free"}
    assert d.bindings == {}
    _, d = decided(contended(locality_snapshot(1900)), on)
    assert bound_nodes(d) == {1: {"b": 1}}
    _, d = decided(contended(locality_snapshot(110)), PolicyConfig())  # preemption off: 10 s
    assert bound_nodes(d) == {1: {"b": 1}}
    # locality_wait_s 0 means never wait, with preemption on too
    _, d = decided(contended(locality_snapshot(101)), PolicyConfig(preempt=True, locality_wait_s=0))
    assert bound_nodes(d) == {1: {"b": 1}}
    _, d = decided(contended(locality_snapshot(101)), PolicyConfig(preempt=True, preempt_locality_wait_s=0))
    assert bound_nodes(d) == {1: {"b": 1}}


def test_past_locality_wait_s_the_longer_wait_holds_only_while_the_cycle_is_contended() -> None:
    # Nobody else pending: b would idle.  Within locality_wait_s (10 s from t=100) the job waits, as
    # without preemption; from t=110 an uncontended cycle ends the longer wait and it takes b, staging
    # from a (320 ms), instead of idling b until t=1900.
    on = PolicyConfig(preempt=True)
    _, d = decided(locality_snapshot(109), on)
    assert texts(d.reasons) == {1: "waiting for locality until t=1900s"} and d.waiting == {1: 100}
    _, d = decided(locality_snapshot(110), on)
    assert bound_nodes(d) == {1: {"b": 1}} and d.bindings[1].transfer_cost_ms == 320
    assert d.waiting == {} and d.reasons == {} and d.candidate_reasons == {}
    # the same moment with bob's gang finding no devices behind it: the job keeps waiting
    _, d = decided(contended(locality_snapshot(110)), on)
    assert d.bindings == {} and d.waiting == {1: 100}


def test_a_job_in_its_longer_wait_takes_only_what_nobody_took_in_the_cycle() -> None:
    # As above at t=110, b with one device, and bob's one-device job (no data) behind job 1 in fair-share
    # order (bob has used much, alice nothing): job 1 passes b over, bob takes it; every job that could
    # fit got devices (uncontended), but none is left for job 1: it waits on.
    snap = (cluster()
            .node("a", rack="r1", free=0).holds("d", shards=[0])
            .node("b", rack="r1", devices=1)
            .running(9, "carol", {"a": 4}, end_by_s=10_000)
            .usage(alice=0.0, bob=100.0)
            .pending(job(1, dataset="d", submit_s=100, waiting_since_s=100), job(3, user="bob", submit_s=200))
            .at(110)
            .build())  # fmt: skip
    _, d = decided(snap, PolicyConfig(preempt=True))
    assert d.order == [1, 3] and bound_nodes(d) == {3: {"b": 1}}
    assert texts(d.reasons) == {1: "waiting for locality until t=1900s"} and d.waiting == {1: 100}


def test_a_job_others_were_preempted_for_goes_first_and_does_not_wait_for_locality() -> None:
    # As the locality test at t=110 (waiting until 130), but jobs were preempted for job 1: it takes b
    # at once, staging from a (320 ms), ahead of bob's job 2 whose user has used nothing (factor 1
    # against alice's 2^-2 = 0.25 would put job 2 first).
    base = locality_snapshot(110)
    snap = (cluster()
            .node("a", rack="r1", free=0).holds("d", shards=[0])
            .node("b", rack="r1", devices=1)
            .running(9, "carol", {"a": 4}, end_by_s=10_000)
            .usage(alice=100.0, bob=0.0)
            .pending(replace(base.pending[0], preempting=True), job(2, user="bob", submit_s=100))
            .at(110)
            .build())  # fmt: skip
    _, d = decided(snap, PolicyConfig(locality_wait_s=30, locality_threshold_ms=0))
    assert d.order == [1, 2]
    assert bound_nodes(d) == {1: {"b": 1}} and d.bindings[1].transfer_cost_ms == 320
    assert d.waiting == {}
    # Without the mark, bob's job goes first and takes b; job 1 would have waited for locality.
    _, d = decided(replace(snap, pending=(base.pending[0], snap.pending[1])),
                   PolicyConfig(locality_wait_s=30, locality_threshold_ms=0))
    assert d.order == [2, 1] and bound_nodes(d) == {2: {"b": 1}}


def test_no_wait_when_the_cost_is_under_the_threshold() -> None:
    _, d = decided(locality_snapshot(100), PolicyConfig(locality_wait_s=30, locality_threshold_ms=320))
    assert bound_nodes(d) == {1: {"b": 1}}


def test_no_wait_when_the_data_holders_could_never_do_better() -> None:
    # the only copy is on a node without devices big enough: waiting would gain nothing
    snap = (
        cluster()
        .node("a", rack="r1", devices=1, free=0).holds("d", shards=[0])
        .node("b", rack="r1")
        .pending(job(1, dataset="d", devices_per_rank=2, submit_s=100))
        .at(100)
        .build()
    )  # fmt: skip
    _, d = decided(snap, PolicyConfig(locality_wait_s=30))
    assert bound_nodes(d) == {1: {"b": 2}}


def test_locality_wait_for_a_copy_striped_over_two_nodes_and_none_for_a_gang_wider_than_its_holders() -> None:
    # d's two shards sit one on a (busy) and one on b: no node holds the whole copy, so stage 1 is
    # asked whether a and b, if idle, would give a local placement: 2 ranks, one on each, each reading
    # its own shard (0 ms).  Now only b and c are free: every placement stages a shard, so it waits.
    def snap(ranks: int):
        return (
            cluster()
            .node("a", rack="r1", free=0).holds("d", shards=[0])
            .node("b", rack="r1").holds("d", shards=[1])
            .node("c", rack="r1", devices=8)
            .running(9, "carol", {"a": 4}, end_by_s=10_000)
            .pending(job(1, ranks=ranks, dataset="d", submit_s=100))
            .at(100)
            .build()
        )  # fmt: skip

    cfg = PolicyConfig(locality_wait_s=30, locality_threshold_ms=0)
    _, d = decided(snap(2), cfg)
    assert d.bindings == {} and texts(d.reasons) == {1: "waiting for locality until t=130s"}
    # 9 ranks: the holders have 4 + 4 = 8 devices, so no placement on them exists to wait for; it
    # binds at once over b and c (4 + 8 free devices), staging
    _, d = decided(snap(9), cfg)
    assert sum(bound_nodes(d)[1].values()) == 9 and d.waiting == {}


def big_gang_snapshot(now_s: float, n1_free: int):
    # n1 and n2 have 4 devices each; job 9 holds all of n1 until t=1000.
    # Job 1 (8 devices, oldest, so highest priority) cannot start before 1000.
    # Job 2 (4 devices, runs one hour) would take n2 and delay job 1 to t=3602.
    # Job 3 (4 devices, 500 s limit) ends at 502 < 1000: it may backfill.
    b = (
        cluster()
        .node("n1", free=n1_free)
        .node("n2")
        .pending(
            job(1, ranks=8, submit_s=0),
            job(2, ranks=4, submit_s=1),
            job(3, ranks=4, submit_s=2, time_limit_s=500),
        )
        .at(now_s)
    )
    if n1_free == 0:
        b.running(9, "carol", {"n1": 4}, end_by_s=1000)
    return b.build()


def test_reserved_big_gang_starts_before_later_small_jobs_that_would_delay_it() -> None:
    _, d = decided(big_gang_snapshot(2, n1_free=0), RESERVE_AT_ONCE)
    assert d.order == [1, 2, 3]
    assert d.reservation == (1, {"n1": 4, "n2": 4}, 1000.0)
    assert d.reasons[1].text() == "devices busy: needs 8, 4 free; devices reserved for it from t=1000s"
    assert d.reasons[2].text() == "reserved for job 1 until t=1000s"
    assert bound_nodes(d) == {3: {"n2": 4}}  # backfilled: ends at 2 + 500 = 502 <= 1000
    # At t=1000 job 9 and job 3 are gone: the big gang starts first, job 2 still waits.
    _, d = decided(big_gang_snapshot(1000, n1_free=4), RESERVE_AT_ONCE)
    assert bound_nodes(d) == {1: {"n1": 4, "n2": 4}}
    # job 2 is now the first that does not fit: it gets the reservation, from 1000 + 3600
    assert d.reasons[2].text() == "devices busy: needs 4, 0 free; devices reserved for it from t=4600s"


def test_backfill_that_leaves_the_reserved_devices_alone() -> None:
    snap = (
        cluster()
        .node("n1", free=0)
        .node("n2")
        .node("n3", devices=2)
        .running(9, "carol", {"n1": 4}, end_by_s=1000)
        .pending(job(1, ranks=8, submit_s=0), job(2, ranks=2, submit_s=1))
        .at(2)
        .build()
    )
    _, d = decided(snap, RESERVE_AT_ONCE)
    # job 1 needs 8 of n1+n2 (fewest nodes; n3 is too small to matter): reserved n1, n2 from t=1000.
    # job 2 runs an hour but fits on n3, outside the reservation.
    assert d.reservation == (1, {"n1": 4, "n2": 4}, 1000.0)
    assert bound_nodes(d) == {2: {"n3": 2}}


def test_never_a_partial_gang() -> None:
    snap = cluster().node("a", free=2).node("b", free=0).pending(job(1, ranks=3)).build()
    for name in ARBITERS:
        _, d = decided(snap, PolicyConfig(arbiter=name))
        assert d.bindings == {}, name
        assert d.reasons[1].text() == "devices busy: needs 3, 2 free", name


def test_a_job_bigger_than_the_cluster_says_so() -> None:
    snap = cluster().node("a").pending(job(1, ranks=5)).build()
    for name in ARBITERS:
        _, d = decided(snap, PolicyConfig(arbiter=name))
        assert d.reasons[1].text() == "more devices than the cluster has up: needs 5, the up nodes have 4", name


def test_jobs_whose_candidates_collide_are_placed_elsewhere() -> None:
    # both jobs' stage-1 candidates prefer a; the second is re-proposed over what is left
    snap = (
        cluster()
        .node("a", devices=2).holds("d", shards=[0])
        .node("b", devices=2)
        .pending(job(1, ranks=2, dataset="d"), job(2, ranks=2, dataset="d", submit_s=1))
        .at(1)
        .build()
    )  # fmt: skip
    _, d = decided(snap, NO_WAIT)
    assert bound_nodes(d) == {1: {"a": 2}, 2: {"b": 2}}


def test_fifo_stops_at_a_head_that_does_not_fit() -> None:
    snap = (
        cluster().node("a", free=2).pending(job(1, ranks=4, submit_s=0), job(2, ranks=1, submit_s=1)).build()
    )
    _, d = decided(snap, PolicyConfig(arbiter="fifo"))
    assert d.bindings == {}
    assert texts(d.reasons) == {1: "devices busy: needs 4, 2 free", 2: "behind job 1 in the FIFO queue"}


def test_fairshare_baseline_ignores_data() -> None:
    snap = (
        cluster()
        .node("a", rack="r1", free=2).holds("d", shards=[0, 1])
        .node("b", rack="r2")
        .pending(job(1, ranks=2, dataset="d"))
        .build()
    )  # fmt: skip
    _, d = decided(snap, PolicyConfig(arbiter="fairshare"))
    # b has the most free devices: both ranks there, both shards across racks (2 x 800 ms)
    assert bound_nodes(d) == {1: {"b": 2}}
    assert d.bindings[1].transfer_cost_ms == 1600
    _, d = decided(snap, NO_WAIT)  # the default keeps them with the data
    assert bound_nodes(d) == {1: {"a": 2}}


def test_flow_prefers_cheap_placements_and_higher_priority_under_contention() -> None:
    snap = (
        cluster()
        .node("a", rack="r1", devices=1).holds("d", shards=[0])
        .node("c", rack="r2", devices=1)
        .usage(alice=50.0, bob=0.0)
        .pending(job(1, user="alice", dataset="d"), job(2, user="bob", dataset="d", submit_s=1))
        .build()
    )  # fmt: skip
    _, d = decided(snap, PolicyConfig(arbiter="flow"))
    # both want a (0 ms vs 800 ms on c).  Priorities: bob 1000 (factor 1.0), alice 250 (0.25), so
    # staging weighs 2x for bob and 1.25x for alice: bob on c costs 1600, alice on c 1000 -> bob gets a
    assert bound_nodes(d) == {2: {"a": 1}, 1: {"c": 1}}


def test_registry_lists_valid_names_on_a_typo() -> None:
    assert set(ARBITERS) >= {"twostage", "flow", "fifo", "fairshare"}
    assert get_arbiter("twostage") is ARBITERS["twostage"]
    with pytest.raises(ValueError, match="choose one of backfill, fairshare, fifo, flow, twostage"):
        get_arbiter("twostgae")


def test_decide_reports_phase_durations() -> None:
    _, d = decided(cluster().node("a").pending(job(1)).build(), PolicyConfig())
    assert set(d.durations_s) == {"index", "stage1", "stage2"}
    assert all(v >= 0 for v in d.durations_s.values())


def tie_snapshot(second_submit_s: float, second_user: str = "alice"):
    # one free device, on a, which holds d; e lives on b (busy).  Job 1 (e) is older than job 2 (d).
    return (
        cluster()
        .node("a", rack="r1", devices=1).holds("d", shards=[0])
        .node("b", rack="r1", devices=1, free=0).holds("e", shards=[0])
        .usage(alice=10.0, bob=10.0, carol=30.0)
        .pending(job(1, dataset="e", submit_s=0), job(2, user=second_user, dataset="d", submit_s=second_submit_s))
        .at(second_submit_s + 100)
        .build()
    )  # fmt: skip


def test_ties_in_priority_go_to_the_job_that_reads_locally() -> None:
    _, d = decided(tie_snapshot(300), PolicyConfig(locality_wait_s=0, tie_window_s=600))
    # job 2 became pending 300 s after job 1 (within the 600 s window) and reads d on a locally;
    # job 1 would stage e from b: job 2 goes first and job 1 waits for a device
    assert d.order == [2, 1]
    assert bound_nodes(d) == {2: {"a": 1}} and d.bindings[2].transfer_cost_ms == 0
    assert d.reasons[1].text().startswith("devices busy")
    assert d.priorities[1] > d.priorities[2]  # priorities themselves are untouched


def test_ties_go_to_another_user_only_within_the_fair_share_band() -> None:
    _, d = decided(tie_snapshot(300, "bob"), PolicyConfig(locality_wait_s=0, tie_window_s=600, tie_fairshare=0))
    assert d.order == [2, 1]  # alice and bob have used the same: a tie even with no band
    # carol has used more: usage 10/50 = 0.2 for alice, 30/50 = 0.6 for carol, shares 1/3 each, so
    # factors 2 ** (-0.2 * 3) = 0.660 and 2 ** (-0.6 * 3) = 0.287: 0.373 apart, 373 priority points
    # at fairshare_weight 1000 (the age terms, 400 s and 100 s pending, differ by 0.05)
    for band, order in ((0.0, [1, 2]), (0.3, [1, 2]), (0.4, [2, 1])):  # the tie alone: no stage_penalty
        _, d = decided(tie_snapshot(300, "carol"), PolicyConfig(locality_wait_s=0, tie_window_s=600,
                                                                tie_fairshare=band, stage_penalty=0))
        assert round(d.factors[1], 3) == 0.660 and round(d.factors[2], 3) == 0.287
        # a band of 0.3 (300.1 points with the window's 0.1) is less than 373: carol never passes;
        # 0.4 (400.1 points) ties them, and carol's local job goes first
        assert d.order == order, band
        assert bound_nodes(d) == ({1: {"a": 1}} if order == [1, 2] else {2: {"a": 1}})


def test_no_tie_beyond_the_window_or_with_the_window_off() -> None:
    for snap, cfg in (
        (tie_snapshot(700), PolicyConfig(locality_wait_s=0, tie_window_s=600, tie_fairshare=0, stage_penalty=0)),
        (tie_snapshot(300), PolicyConfig(locality_wait_s=0, tie_window_s=0, tie_fairshare=0, stage_penalty=0)),
    ):
        _, d = decided(snap, cfg)
        # strict priority order: job 1 takes a and stages e from b (320 ms)
        assert d.order == [1, 2]
        assert bound_nodes(d) == {1: {"a": 1}} and d.bindings[1].transfer_cost_ms == 320


def test_a_job_that_must_stage_is_ordered_stage_penalty_of_the_factor_lower() -> None:
    # tie_snapshot: alice's job 1 (factor 0.660) can only stage e from b (320 ms); carol's job 2
    # (factor 0.287) reads d on a locally.  Priorities: 1000 x (0.65975 - 0.28717) = 372.6 points of
    # factor and 100 x (400 - 100) / 604800 = 0.05 of age apart, 372.6 in all; the tie is 200.1
    # (tie_fairshare 0.2 and the window's 0.1).
    def run(penalty: float, band: float = 0.2):  # type: ignore[no-untyped-def]
        return decided(tie_snapshot(300, "carol"), PolicyConfig(locality_wait_s=0, tie_window_s=600,
                                                                tie_fairshare=band, stage_penalty=penalty))[1]

    for penalty in (0.0, 0.1):  # 372.6 - 0 / - 100 = 372.6 / 272.6 > 200.1: alice's job first, staging
        d = run(penalty)
        assert d.order == [1, 2] and bound_nodes(d) == {1: {"a": 1}} and d.bindings[1].transfer_cost_ms == 320
    d = run(0.2)  # 372.6 - 200 = 172.6 <= 200.1: a tie, and carol's local job goes first
    assert d.order == [2, 1] and bound_nodes(d) == {2: {"a": 1}} and d.bindings[2].transfer_cost_ms == 0
    assert d.reasons[1].text().startswith("devices busy")
    assert d.priorities[1] - d.priorities[2] == pytest.approx(372.6, abs=0.1)  # priorities untouched
    d = run(0.4, band=0.0)  # 372.6 - 400 < 0: carol's job ahead by the penalty alone, with no band
    assert d.order == [2, 1] and bound_nodes(d) == {2: {"a": 1}}
    # the other way round nothing moves: the job that reads locally is not penalised
    d = decided(tie_snapshot(300, "carol"), PolicyConfig(locality_wait_s=0, stage_penalty=1.0,
                                                         locality_threshold_ms=400))[1]
    assert d.order == [1, 2]  # with a threshold of 400 ms job 1's 320 ms counts as local: no penalty
    # the starvation bound comes after the penalty: job 1, pending 400 s >= max_wait_s, goes first
    d = decided(tie_snapshot(300, "carol"), PolicyConfig(locality_wait_s=0, stage_penalty=1.0, max_wait_s=350))[1]
    assert d.order == [1, 2] and bound_nodes(d) == {1: {"a": 1}}


def test_a_tied_gang_that_fits_nowhere_keeps_its_place_and_its_reservation() -> None:
    snap = (
        cluster()
        .node("a", devices=2, free=1).holds("d", shards=[0])
        .running(9, "carol", {"a": 1}, end_by_s=500)
        .pending(job(1, ranks=2, submit_s=0), job(2, dataset="d", submit_s=60))
        .at(100)
        .build()
    )  # fmt: skip
    _, d = decided(snap, PolicyConfig(locality_wait_s=0, tie_window_s=600, reserve_min_wait_s=0))
    # job 2 is local on a and tied with job 1, but job 1 (no candidate now) is not passed: it
    # reserves a from t=500, and job 2 (one hour) may not take the reserved device
    assert d.order == [1, 2]
    assert d.reservation == (1, {"a": 2}, 500.0)
    assert d.bindings == {} and d.reasons[2].text() == "reserved for job 1 until t=500s"


def test_a_job_that_stages_anyway_leaves_the_only_local_room_of_another_data_set() -> None:
    snap = (
        cluster()
        .node("h", rack="r1", free=0).holds("d", shards=[0])
        .node("x", rack="r1", devices=1).holds("e", shards=[0])
        .node("y", rack="r2", devices=1)
        .pending(job(1, dataset="d", submit_s=0), job(2, user="bob", dataset="e", submit_s=1))
        .usage(alice=0.0, bob=50.0)
        .at(1)
        .build()
    )  # fmt: skip
    _, d = decided(snap, NO_WAIT)
    # job 1 (higher priority) must stage d anyway: it takes y (800 ms) rather than x (320 ms), so
    # job 2 still reads e locally on x
    assert bound_nodes(d) == {1: {"y": 1}, 2: {"x": 1}}
    assert (d.bindings[1].transfer_cost_ms, d.bindings[2].transfer_cost_ms) == (800, 0)


def test_backfill_baseline_reserves_for_the_top_job_and_backfills_data_blind() -> None:
    # big_gang_snapshot at t=2: job 1 (8 devices) fits nowhere and gets the reservation n1+n2 from
    # t=1000 (job 9 ends then); job 2 (an hour, 4 devices) would take n2 past 1000: held back; job 3
    # (500 s) ends at 502 <= 1000: backfilled on n2, as twostage does.
    _, d = decided(big_gang_snapshot(2, n1_free=0), PolicyConfig(arbiter="backfill"))
    assert d.order == [1, 2, 3]
    assert d.reservation == (1, {"n1": 4, "n2": 4}, 1000.0)
    assert texts(d.reasons) == {1: "devices busy: needs 8, 4 free; devices reserved for it from t=1000s",
                                2: "reserved for job 1 until t=1000s"}
    assert bound_nodes(d) == {3: {"n2": 4}}
    # Data-blind: a holds the data with 2 free, b has 4 free across racks; packing takes b (most free),
    # both shards staged across racks (2 x 800 ms), where twostage reads locally on a.
    snap = (
        cluster()
        .node("a", rack="r1", free=2).holds("d", shards=[0, 1])
        .node("b", rack="r2")
        .pending(job(1, ranks=2, dataset="d"))
        .build()
    )  # fmt: skip
    _, d = decided(snap, PolicyConfig(arbiter="backfill"))
    assert bound_nodes(d) == {1: {"b": 2}} and d.bindings[1].transfer_cost_ms == 1600


def test_reservation_waits_until_the_job_has_been_pending_reserve_min_wait_s() -> None:
    # big_gang_snapshot: job 1 (8 devices) fits nowhere until job 9 ends at t=1000.
    cfg = replace(AGE_ORDER, reserve_min_wait_s=600)
    # t=2: job 1 has waited 2 s < 600: no reservation, so job 2 (an hour) takes n2 and job 3 waits.
    _, d = decided(big_gang_snapshot(2, n1_free=0), cfg)
    assert d.reservation is None
    assert bound_nodes(d) == {2: {"n2": 4}}
    assert texts(d.reasons) == {1: "devices busy: needs 8, 4 free", 3: "devices busy: needs 4, 0 free"}
    # t=600: job 1 has waited 600 s: it takes the reservation (n1+n2 from 1000) as before; job 3
    # (500 s, ends 1100 > 1000) no longer backfills, job 2 (an hour) neither.
    _, d = decided(big_gang_snapshot(600, n1_free=0), cfg)
    assert d.reservation == (1, {"n1": 4, "n2": 4}, 1000.0)
    assert d.bindings == {}


def starving_gang_snapshot(now_s: float, later_s: float = 0.0):
    # Nodes a, b of 4 devices.  Seven 1-device jobs of user carol run, ending at 3700, 3800, ... 4300
    # (a: 4 of them, b: 3, so b has 1 free).  Job 1: user wide's gang of 8 (the whole cluster),
    # pending since t=0; wide's usage is large, so fair share puts it last.  Jobs 2 and 3: x and y,
    # 1 device for 600 s, pending since 3500 (the stream of small jobs of other users).  ``later_s``
    # moves everything but the gang's submission that much later (the gang has then waited longer).
    b = cluster().node("a", free=0).node("b", free=1).usage(wide=1e6, x=0.0, y=0.0, carol=0.0)
    for i in range(7):
        b.running(10 + i, "carol", {"a" if i < 4 else "b": 1}, end_by_s=later_s + 3700 + 100 * i)
    b.pending(job(1, user="wide", ranks=8, submit_s=0),
              job(2, user="x", submit_s=later_s + 3500, time_limit_s=600),
              job(3, user="y", submit_s=later_s + 3500, time_limit_s=600))
    return b.at(now_s).build()


def test_a_cluster_wide_gang_behind_small_jobs_of_others_is_first_once_it_waited_max_wait_s() -> None:
    cfg = PolicyConfig(max_wait_s=3600, reserve_min_wait_s=3600)
    # t=3599: fair share first (x, y, then wide); x takes b's free device; y is the first job that fits
    # nowhere but has waited only 99 s < 3600: nobody reserves, and the gang would wait for ever
    # behind such a stream.
    _, d = decided(starving_gang_snapshot(3599), cfg)
    assert d.order == [2, 3, 1]
    assert bound_nodes(d) == {2: {"b": 1}}
    assert d.reservation is None
    # t=3600: the gang has waited max_wait_s: it goes first and takes the reservation, a and b from
    # 4300 (the last of carol's jobs ends then).  x (600 s: ends 4200 <= 4300) still backfills on b's
    # free device; y finds nothing free.
    _, d = decided(starving_gang_snapshot(3600), cfg)
    assert d.order == [1, 2, 3]
    assert d.reservation == (1, {"a": 4, "b": 4}, 4300.0)
    assert bound_nodes(d) == {2: {"b": 1}}
    assert texts(d.reasons) == {1: "devices busy: needs 8, 1 free; devices reserved for it from t=4300s",
                                3: "devices busy: needs 1, 0 free"}
    # With the bound off and reservations at once (the old default), the reservation goes to the
    # first small job that fits nowhere, never to the gang.
    _, d = decided(starving_gang_snapshot(3600), RESERVE_AT_ONCE)
    assert d.order == [2, 3, 1] and d.reservation is not None and d.reservation[0] == 3


def test_with_preemption_a_wide_job_that_fits_its_users_part_over_the_window_reserves_at_once() -> None:
    # starving_gang_snapshot at t=3599 with preemption on (reserve_min_wait_s and max_wait_s at their
    # 8 days).  Fair parts of the 8 devices among the users asking: x 1 and y 1 (what they ask), then
    # wide (asks 8) and carol (holds 7) 3 each.  The gang (8 devices, an hour) is wide (8 > 3); it has
    # waited 3599 s >= preempt_after_s (300); wide holds nothing; 8 x 3600 = 28,800 device-seconds <=
    # 3 x preempt_wide_window_s (2 days: 518,400).  So, behind x and y in fair-share order, it takes the
    # reservation at once: a and b from 4300 (carol's last job ends then).  x (ends 4199) still runs.
    on = PolicyConfig(preempt=True)
    _, d = decided(starving_gang_snapshot(3599), on)
    assert d.order == [2, 3, 1]
    assert d.reservation == (1, {"a": 4, "b": 4}, 4300.0)
    assert bound_nodes(d) == {2: {"b": 1}}
    assert texts(d.reasons)[1] == ("devices busy: needs 8, 0 free; wider than its user's fair part, within "
                                   "preempt_wide_window_s, reserved at once: devices reserved for it from t=4300s")
    # Not with the window off, nor without preemption (the gang then waits its 8 days: see the tests
    # above and below), nor for a gang too long for the window (8 x 18 h 1 s > 3 x 2 days)...
    for cfg in (replace(on, preempt_wide_window_s=0), PolicyConfig()):
        assert decided(starving_gang_snapshot(3599), cfg)[1].reservation is None
    long = starving_gang_snapshot(3599)
    long = replace(long, pending=tuple(replace(j, time_limit_s=18 * 3600 + 1) if j.id == 1 else j
                                       for j in long.pending))
    assert decided(long, on)[1].reservation is None
    # ... nor while wide holds devices (one of carol's jobs is wide's: it holds 1)
    held = starving_gang_snapshot(3599)
    held = replace(held, running=tuple(replace(r, user="wide") if r.id == 10 else r for r in held.running))
    assert decided(held, on)[1].reservation is None
    # ... nor before it has waited preempt_after_s (here 3600 s)
    assert decided(starving_gang_snapshot(3599), replace(on, preempt_after_s=3600))[1].reservation is None


def test_by_default_the_starvation_bound_and_the_reservation_wait_eight_days() -> None:
    # The same gang behind the same stream, 8 days (691200 s) later: with the defaults it has the
    # bound and the reservation only once it has waited 8 days.
    day8 = 8 * 86400.0
    cfg = PolicyConfig()
    assert (cfg.max_wait_s, cfg.reserve_min_wait_s) == (day8, day8)
    # t = 8 days - 3601 s + 3600 (the stream is at t = later + 3500): the gang has waited 691199 s
    # (7.99999 days, past the old 4-day default): fair share orders x, y, the gang; x takes b's free
    # device, nobody reserves.
    later = day8 - 3601.0
    _, d = decided(starving_gang_snapshot(later + 3600, later), cfg)
    assert d.order == [2, 3, 1]
    assert bound_nodes(d) == {2: {"b": 1}}
    assert d.reservation is None
    # One second later it has waited 691200 s: first in the order, and it takes the reservation of
    # a and b from the end of carol's last job (later + 4300 = 691899 s).
    _, d = decided(starving_gang_snapshot(later + 3601, later), cfg)
    assert d.order == [1, 2, 3]
    assert d.reservation == (1, {"a": 4, "b": 4}, later + 4300)
    assert bound_nodes(d) == {2: {"b": 1}}


# ---------------------------------------------------------------- each user's own jobs shortest first

AGE = 100 / 604800  # priority points per second of age at the default weights (age_weight / age_max_s)


def test_each_users_jobs_take_that_users_places_shortest_first() -> None:
    # alice and bob both have factor 1.0 (no usage), so the order is by age at t=10000:
    #   a1 alice 4 ranks x 1 day (345600 device-s), pending since 0     prio 1000 + 10000 * AGE
    #   b1 bob   1 rank  x 600 s                    pending since 2000  prio 1000 +  8000 * AGE
    #   a2 alice 1 rank  x 1 hour (3600)            pending since 5000  prio 1000 +  5000 * AGE
    #   a3 alice 2 ranks x 600 s (1200)             pending since 9000  prio 1000 +  1000 * AGE
    # alice holds places 1, 3 and 4; filled smallest first: a3 (1200), a2 (3600), a1 (345600).  Bob
    # keeps place 2, and each job takes the priority of its place.
    from scheduler.core.fairshare import queue_order
    snap = (cluster().node("n1", free=0)
            .pending(job(1, ranks=4, submit_s=0, time_limit_s=86400),
                     job(2, user="bob", submit_s=2000, time_limit_s=600),
                     job(3, submit_s=5000, time_limit_s=3600),
                     job(4, ranks=2, submit_s=9000, time_limit_s=600))
            .at(10000).build())
    cfg = PolicyConfig()
    by_age, prios, _ = queue_order(snap, cfg)
    assert [j.id for j in by_age] == [1, 2, 3, 4]
    shortest, given, _ = queue_order(snap, cfg, shortest=True)
    assert [j.id for j in shortest] == [4, 2, 3, 1]
    assert given == pytest.approx({4: 1000 + 10000 * AGE, 2: 1000 + 8000 * AGE, 3: 1000 + 5000 * AGE,
                                   1: 1000 + 1000 * AGE})
    assert prios == pytest.approx({1: 1000 + 10000 * AGE, 2: 1000 + 8000 * AGE, 3: 1000 + 5000 * AGE,
                                   4: 1000 + 1000 * AGE})
    # twostage orders so by default (no device is free: nothing binds, the order is all there is)
    _, d = decided(snap, replace(cfg, tie_window_s=0, tie_fairshare=0))
    assert d.order == [4, 2, 3, 1]
    assert d.priorities == pytest.approx(given)
    _, d = decided(snap, replace(cfg, tie_window_s=0, tie_fairshare=0, shortest_first=False))
    assert d.order == [1, 2, 3, 4]


def test_shortest_first_binds_a_users_short_job_before_their_long_one_and_keeps_the_starvation_bound() -> None:
    # One node with 2 free devices; alice's 2-rank week-long job has waited since t=0, her 2-rank
    # 10-minute job since t=100.  At t=200 twostage gives the node to the short one (same user: nobody
    # else loses a place); by age, or with the fairshare baseline, the long one takes it.
    def snap(now: float) -> Snapshot:
        return (cluster().node("n1", devices=2)
                .pending(job(1, ranks=2, submit_s=0, time_limit_s=7 * 86400),
                         job(2, ranks=2, submit_s=100, time_limit_s=600))
                .at(now).build())
    cfg = PolicyConfig(locality_wait_s=0)
    _, d = decided(snap(200), cfg)
    assert bound_nodes(d) == {2: {"n1": 2}}
    _, d = decided(snap(200), replace(cfg, shortest_first=False, tie_shortest_first=False))
    assert bound_nodes(d) == {1: {"n1": 2}}
    _, d = decided(snap(200), replace(cfg, arbiter="fairshare"))
    assert bound_nodes(d) == {1: {"n1": 2}}
    # Once the long job has waited max_wait_s it goes first whatever its size.
    _, d = decided(snap(200), replace(cfg, max_wait_s=200))
    assert d.order[0] == 1 and bound_nodes(d) == {1: {"n1": 2}}


def test_tied_jobs_that_read_locally_go_smallest_first_then_the_others_cheapest_first() -> None:
    # One free device on a (holds d) and one on c (holds nothing); e lives on b (busy).  alice and bob
    # have used the same (factor 0.660), carol more (0.287: 373 priority points below, beyond the
    # default band of 200.1).  Pending, by age:
    #   1 alice d 4 h       since 0    local on a
    #   3 alice e 5 min     since 200  must stage e from b
    #   2 bob   d 10 min    since 300  local on a
    #   4 carol d 1 min     since 400  local on a, but not tied
    # Alice's own jobs go smallest first (3 takes her first place, 1 her second); 3, 1 and 2 tie.
    # Among them the jobs that read locally go first, smallest first: 2 (600 device-s) before 1
    # (14,400); then 3, which stages, however small; carol stays behind.
    snap = (
        cluster()
        .node("a", rack="r1", devices=1).holds("d", shards=[0])
        .node("b", rack="r1", devices=1, free=0).holds("e", shards=[0])
        .node("c", rack="r1", devices=1)
        .usage(alice=10.0, bob=10.0, carol=30.0)
        .pending(job(1, dataset="d", submit_s=0, time_limit_s=4 * 3600),
                 job(3, dataset="e", submit_s=200, time_limit_s=300),
                 job(2, user="bob", dataset="d", submit_s=300, time_limit_s=600),
                 job(4, user="carol", dataset="d", submit_s=400, time_limit_s=60))
        .at(500)
        .build()
    )  # fmt: skip
    _, d = decided(snap, replace(NO_WAIT, stage_penalty=0))  # the tie alone
    assert round(d.factors[1], 3) == round(d.factors[2], 3) == 0.660 and round(d.factors[4], 3) == 0.287
    assert d.order == [2, 1, 3, 4]
    # bob's short job reads d on a; alice's long one takes c and stages d; no device is left for 3 or 4
    assert bound_nodes(d) == {2: {"a": 1}, 1: {"c": 1}}
    assert d.bindings[2].transfer_cost_ms == 0 and d.bindings[1].transfer_cost_ms > 0
    assert d.reasons[3].text().startswith("devices busy") and d.reasons[4].text().startswith("devices busy")
    # with the default stage_penalty (0.3) job 3, which must stage, is ordered 300 points lower: 73
    # above carol's job 4, within the tie, so carol's local job goes before it (no device for either)
    _, d = decided(snap, NO_WAIT)
    assert d.order == [2, 1, 4, 3] and bound_nodes(d) == {2: {"a": 1}, 1: {"c": 1}}
    # tie_shortest_first off: every tied job by transfer cost, equal costs by priority (1 before 2)
    _, d = decided(snap, replace(NO_WAIT, tie_shortest_first=False, stage_penalty=0))
    assert d.order == [1, 2, 3, 4]
    assert bound_nodes(d) == {1: {"a": 1}, 2: {"c": 1}}
