"""Preemption as a pure function of the snapshot (policies/preemption.py).

Unless a test says otherwise: two nodes of 4 devices, both full; alice (usage 1000, 1 share) holds
them, bob (usage 0, 1 share) waits.  Factors: alice U = 1, S = 0.5 -> F = 2^(-2) = 0.25 (over her
share); bob U = 0 -> F = 1 (under his).  Now = 10,000 s; bob's job has waited 400 s (> 300).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import preemption
from policies.preemption import _Free, plan_preemptions, preemption_plan, snapshot_parts, victim_reason
from scheduler.core.fairshare import competing_tree, snapshot_factors
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import JobView, NodeView, RunningView, Snapshot
from tests.builders import ClusterBuilder, cluster, job

NOW = 10_000.0
ON = PolicyConfig(preempt=True)  # preempt_after_s 300, min_runtime_s 600, 2 an hour


def full() -> ClusterBuilder:
    return cluster().node("n1", free=0).node("n2", free=0).usage(alice=1000, bob=0).at(NOW)


def bobs_job(devices: int = 4, ranks: int = 1, waited_s: float = 400, dataset: str | None = None) -> JobView:
    return job(10, user="bob", ranks=ranks, devices_per_rank=devices, pending_since_s=NOW - waited_s,
               submit_s=NOW - waited_s, dataset=dataset)


def test_off_by_default() -> None:
    snap = (full().running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .pending(bobs_job()).build())
    assert plan_preemptions(snap, PolicyConfig()) == []


def test_the_victim_is_the_one_that_loses_least_work_since_its_checkpoint() -> None:
    # job 1 checkpointed 100 s ago, job 2 1000 s ago: job 1 loses 100 s x 4 devices = 400 device-s
    snap = (full().running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 1000)
            .pending(bobs_job()).build())
    [p] = plan_preemptions(snap, ON)
    assert (p.job, p.victims, p.lost_work_s) == (10, (1,), 400.0)
    assert "job 1 (alice, loses 100 s)" in p.why and "under their share" in p.why
    assert victim_reason(10) == "preempted for job 10"


def test_not_before_preempt_after_s() -> None:
    snap = (full().running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .pending(bobs_job(waited_s=299)).build())
    assert plan_preemptions(snap, ON) == []


def test_never_a_job_younger_than_min_runtime_nor_one_not_preemptible_nor_one_preempted_too_often() -> None:
    # job 1 started 500 s ago (< 600), job 2 is not preemptible, job 3 was preempted twice this hour:
    # only job 4 (lost 5000 s) may go
    b = (cluster().nodes("n1", "n2", "n3", "n4", free=0).usage(alice=1000).at(NOW)
         .running(1, "alice", {"n1": 4}, 1e9, started_s=NOW - 500)
         .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 10, preemptible=False)
         .running(3, "alice", {"n3": 4}, 1e9, started_s=0, checkpoint_s=NOW - 10, preemptions_last_hour=2)
         .running(4, "alice", {"n4": 4}, 1e9, started_s=0, checkpoint_s=NOW - 5000))
    [p] = plan_preemptions(b.pending(bobs_job()).build(), ON)
    assert p.victims == (4,)
    # and without job 4, nobody: bob waits
    b._running = [r for r in b._running if r.id != 4]
    assert plan_preemptions(b.pending().build(), ON) == []


def test_a_job_preempted_before_must_run_min_runtime_s_doubled_for_each_time() -> None:
    # job 1 ran 1,199 s and was preempted once before: it needs 600 x 2 = 1,200 s, so it stays; job 2
    # ran 2,400 s after two earlier preemptions: 600 x 4 = 2,400 s, so it may go (it lost more work)
    b = (cluster().nodes("n1", "n2", free=0).usage(alice=1000).at(NOW)
         .running(1, "alice", {"n1": 4}, 1e9, started_s=NOW - 1199, preemptions=1)
         .running(2, "alice", {"n2": 4}, 1e9, started_s=NOW - 2400, checkpoint_s=NOW - 1000, preemptions=2))
    [p] = plan_preemptions(b.pending(bobs_job()).build(), ON)
    assert p.victims == (2,)
    assert preemption.min_runtime(b._running[0], ON) == 1200 and preemption.min_runtime(b._running[1], ON) == 2400
    # one second short for job 2 as well: nobody, and explain counts both as too young
    b._running[1] = replace(b._running[1], started_s=NOW - 2399)
    plan = preemption_plan(b.pending().build(), ON)
    assert plan.preemptions == [] and plan.nobody[10].endswith("ran less than min_runtime_s: 2")
    # min_runtime_backoff 1: min_runtime_s alone, whatever came before; job 1 lost less work and goes
    assert plan_preemptions(b.build(), replace(ON, min_runtime_backoff=1.0))[0].victims == (1,)
    assert preemption.min_runtime(b._running[1], replace(ON, min_runtime_backoff=3.0)) == 600 * 9


def test_among_equals_the_victim_on_the_preemptors_data() -> None:
    # they lost 100 s and 110 s: in the same step of preempt_equal_loss_s (300 s by default: 100 // 300 =
    # 110 // 300 = 0): equals; n2 holds bob's data set, so job 2 (on n2) goes although it loses 10 s more
    snap = (cluster().node("n1", free=0).node("n2", free=0).holds("imgs", [0, 1]).usage(alice=1000).at(NOW)
            .running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 110)
            .pending(bobs_job(dataset="imgs")).build())
    assert plan_preemptions(snap, ON)[0].victims == (2,)


def test_preempt_equal_loss_s_sets_which_victims_are_equals() -> None:
    # job 1 lost 100 s on n1, job 2 lost 500 s on n2, which holds bob's data.  In steps of 300 s (the
    # default) or 60 s they differ (0 vs 1, 1 vs 8): job 1 goes.  In steps of 600 s both are in the
    # first: equals, and job 2 goes for the data.  0: the least lost work, exactly.  (bob has waited
    # 1,000 s: past preempt_after_s + preempt_data_wait_s, so a victim off his data's nodes may go.)
    assert ON.preempt_equal_loss_s == 300
    snap = (cluster().node("n1", free=0).node("n2", free=0).holds("imgs", [0, 1]).usage(alice=1000).at(NOW)
            .running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 500)
            .pending(bobs_job(dataset="imgs", waited_s=1000)).build())
    assert plan_preemptions(snap, ON)[0].victims == (1,)
    assert plan_preemptions(snap, replace(ON, preempt_equal_loss_s=60))[0].victims == (1,)
    assert plan_preemptions(snap, replace(ON, preempt_equal_loss_s=600))[0].victims == (2,)
    assert plan_preemptions(snap, replace(ON, preempt_equal_loss_s=0))[0].victims == (1,)


def test_within_preempt_data_wait_s_victims_only_on_the_nodes_holding_the_data() -> None:
    # job 1 lost 100 s on n1, job 2 lost 500 s on n2, which holds bob's data: different steps of 300 s,
    # so by lost work job 1 would go.  bob may preempt once pending 300 s; for the 600 s after (the
    # default preempt_data_wait_s) he takes victims only on n2: at 400 s and 899 s job 2 goes, at 900 s
    # job 1.  With the wait 0, or for a job without a data set, job 1 at once.
    assert (ON.preempt_after_s, ON.preempt_data_wait_s) == (300, 600)
    b = (cluster().node("n1", free=0).node("n2", free=0).holds("imgs", [0, 1]).node("n3", free=0)
         .usage(alice=1000).at(NOW)
         .running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
         .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 500))

    def snap(waited_s: float = 400, dataset: str | None = "imgs") -> Snapshot:
        b._pending = [bobs_job(dataset=dataset, waited_s=waited_s)]
        return b.build()

    for waited, victim in ((400, 2), (899, 2), (900, 1)):
        [p] = plan_preemptions(snap(waited), ON)
        assert p.victims == (victim,), waited
    assert plan_preemptions(snap(), replace(ON, preempt_data_wait_s=0))[0].victims == (1,)
    assert plan_preemptions(snap(dataset=None), ON)[0].victims == (1,)
    # a data set no node holds: no node to wait for, any victim at once
    assert plan_preemptions(snap(dataset="other"), ON)[0].victims == (1,)
    # job 2 not a victim (too young): within the wait nobody, and explain says why, counted; job 3 on
    # n3 (not holding imgs) is counted with job 1 as off the data's nodes
    b._running[1] = replace(b._running[1], started_s=NOW - 60)
    b.running(3, "alice", {"n3": 4}, 1e9, started_s=0, checkpoint_s=NOW - 200)
    plan = preemption_plan(snap(), ON)
    assert plan.preemptions == []
    assert plan.nobody[10] == ("it would not fit even with every job it may preempt; the 3 running job(s) of other "
                               "users: ran less than min_runtime_s: 1; on nodes not holding imgs (within "
                               "preempt_data_wait_s it preempts only jobs on the nodes that hold its data): 2")
    assert plan_preemptions(snap(900), ON)[0].victims == (1,)


def test_nobody_is_preempted_for_a_job_that_would_not_fit_anyway() -> None:
    # bob needs 2 ranks x 4; only job 1 may go (job 2 is too young): 4 devices are not enough
    snap = (full().running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=NOW - 60)
            .pending(bobs_job(ranks=2)).build())
    assert plan_preemptions(snap, ON) == []


def test_a_victim_that_later_ones_made_unneeded_is_spared() -> None:
    # bob needs 4 devices on one node.  job 1 (2 devices on n1, loses 10 s) comes first but n1 still
    # has job 3's 2 (not preemptible); job 2 (4 on n2, 70 s) then makes it fit: job 1 is not needed.
    snap = (full().running(1, "alice", {"n1": 2}, 1e9, started_s=0, checkpoint_s=NOW - 10)
            .running(3, "alice", {"n1": 2}, 1e9, started_s=0, preemptible=False)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 70)
            .pending(bobs_job()).build())
    assert plan_preemptions(snap, ON)[0].victims == (2,)


def test_a_user_over_their_share_preempts_only_within_their_fair_part() -> None:
    # carol (usage 0, under her share) holds both nodes; alice (F 0.25, over hers) waits.  Demand: carol
    # 8, alice 4 (or 8); 8 devices split equally: parts 4 and 4.
    def carol_holds_both() -> ClusterBuilder:
        return (full().running(1, "carol", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
                .running(2, "carol", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 200))

    # alice's 4-device job: 0 + 4 <= her part 4, and carol keeps 8 - 4 = 4 >= hers: job 1 (least lost) goes
    alices = job(10, user="alice", devices_per_rank=4, pending_since_s=0)
    [p] = plan_preemptions(carol_holds_both().pending(alices).build(), ON)
    assert p.victims == (1,) and "within their fair part of the devices now (0 + 4 <= 4.0)" in p.why
    assert "under their share" not in p.why
    # alice's 8-device job would hold 8 > 4: by her factor she may not preempt, so she does not
    assert plan_preemptions(carol_holds_both().pending(replace(alices, ranks=2)).build(), ON) == []


def test_fair_parts_split_the_devices_among_users_that_ask_capped_by_what_they_ask() -> None:
    # 16 devices; alice asks 12 (holds 12), bob 8 (pending), carol 2 (holds 2), dave has a share and no
    # jobs.  Water-filling with equal shares: carol 2 (under 16 / 3), then 14 split: alice 7, bob 7.
    snap = (cluster().nodes("n1", "n2", "n3", "n4", free=0).shares(dave=1).at(NOW)
            .running(1, "alice", {"n1": 4, "n2": 4, "n3": 4}, 1e9, started_s=0)
            .running(2, "carol", {"n4": 2}, 1e9, started_s=0)
            .pending(job(10, user="bob", ranks=2, devices_per_rank=4, pending_since_s=0)).build())
    assert snapshot_parts(snap) == pytest.approx({"alice": 7.0, "bob": 7.0, "carol": 2.0})
    # bob asks 8 > 7, so not by his part; by his factor (no usage) he is under his share, but nobody
    # used anything, so nobody is over theirs: nobody is preempted
    assert plan_preemptions(snap, ON) == []


def test_only_users_with_jobs_count_in_who_is_under_their_share() -> None:
    # alice (usage 600) holds both nodes, bob (usage 400) waits, carol (1 share, no usage) has no jobs.
    # Over all three (S = 1/3) bob is over his share too: U 0.4, F = 2^(-1.2) = 0.435, and nobody could
    # preempt.  Among alice and bob (S = 1/2): bob F = 2^(-0.8) = 0.574 (under), alice 2^(-1.2) = 0.435
    # (over).  Held shares: bob (0 + 4) / 0.5 = 8 <= alice's (8 - 4) / 0.5 = 8 after: one victim.
    b = (cluster().node("n1", free=0).node("n2", free=0).usage(alice=600, bob=400).shares(carol=1).at(NOW)
         .running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
         .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 200))
    [p] = plan_preemptions(b.pending(bobs_job()).build(), ON)
    assert p.victims == (1,) and "factor 0.57" in p.why
    assert snapshot_factors(b.build(), ["bob"])["bob"] == pytest.approx(2 ** -1.2)  # the queue's factor
    # with carol running a job of her own she competes: bob is over his share again by usage, but the 12
    # devices split among the three, who ask for 8, 4 and 4, give each 4, and bob asks for no more than
    # his part: he preempts by that, alice keeping her part (8 - 4 = 4)
    b.running(3, "carol", {"n3": 4}, 1e9, started_s=0).node("n3", free=0)
    b._pending.clear()
    [p] = plan_preemptions(b.pending(bobs_job()).build(), ON)
    assert p.victims == (1,) and "under their share" not in p.why and "(0 + 4 <= 4.0)" in p.why
    # with a second job waiting bob asks for 8: parts carol 4, bob 4, alice 4; job 10 takes job 1 as
    # above; job 11 would give him 8 > 4, and by usage he is over his share: nobody more
    b._pending.clear()
    plans = plan_preemptions(b.pending(bobs_job(), replace(bobs_job(), id=11)).build(), ON)
    assert [(q.job, q.victims) for q in plans] == [(10, (1,))]


def test_two_waiting_jobs_do_not_count_the_same_devices() -> None:
    # alice holds four nodes of 4; bob's jobs 10 and 11 each need 4: two victims, one each, not the same
    # one twice.  Held shares (equal shares, S = 0.5): job 10, bob 4 / 0.5 = 8 <= alice (16 - 4) / 0.5
    # = 24; job 11, bob (4 + 4) / 0.5 = 16 <= alice (12 - 4) / 0.5 = 16.
    snap = (full().node("n3", free=0).node("n4", free=0)
            .running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 200)
            .running(3, "alice", {"n3": 4}, 1e9, started_s=0, checkpoint_s=NOW - 300)
            .running(4, "alice", {"n4": 4}, 1e9, started_s=0, checkpoint_s=NOW - 400)
            .pending(bobs_job(), replace(bobs_job(), id=11)).build())
    plans = plan_preemptions(snap, ON)
    assert [(p.job, p.victims) for p in plans] == [(10, (1,)), (11, (2,))]


def test_no_victim_that_would_leave_its_user_holding_less_for_their_share_than_the_preemptor() -> None:
    # alice holds 8 on two nodes.  bob's first job takes one of them: 4 / 0.5 = 8 <= (8 - 4) / 0.5.  His
    # second would leave alice 0 against his 8: refused, though alice is over her share by usage.
    snap = (full().running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 200)
            .pending(bobs_job(), replace(bobs_job(), id=11)).build())
    assert [(p.job, p.victims) for p in plan_preemptions(snap, ON)] == [(10, (1,))]
    # bob already holding 4 elsewhere (n3): his job would give him 8 against alice's 4: refused.
    snap = (full().node("n3", free=0)
            .running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 200)
            .running(5, "bob", {"n3": 4}, 1e9, started_s=0)
            .pending(bobs_job()).build())
    assert plan_preemptions(snap, ON) == []
    # With alice holding a third node, bob's 8 <= alice's (12 - 4) = 8 (equal shares): allowed.
    snap = replace(snap, running=(*snap.running, RunningView(6, "alice", (("n4", 4),), 1e9, started_s=0)))
    assert [p.victims for p in plan_preemptions(snap, ON)] == [(1,)]


def test_why_a_job_that_waited_preempts_nobody() -> None:
    # Four nodes of 4, all held by others.  alice's job 1 ran 500 s (< min_runtime_s 600), job 2 is not
    # preemptible, job 3 was preempted twice this hour; carol (usage 0, under her share) runs job 4.
    # bob needs 2 ranks x 4: with no job he may take he would not fit, and explain says why, counted.
    b = (cluster().nodes("n1", "n2", "n3", "n4", free=0).usage(alice=1000, bob=0, carol=0).at(NOW)
         .running(1, "alice", {"n1": 4}, 1e9, started_s=NOW - 500)
         .running(2, "alice", {"n2": 4}, 1e9, started_s=0, preemptible=False)
         .running(3, "alice", {"n3": 4}, 1e9, started_s=0, preemptions_last_hour=2)
         .running(4, "carol", {"n4": 4}, 1e9, started_s=0))
    plan = preemption_plan(b.pending(bobs_job(ranks=2)).build(), ON)
    assert plan.preemptions == []
    assert plan.nobody == {10: "it would not fit even with every job it may preempt; the 4 running job(s) of other "
                               "users: not preemptible: 1; ran less than min_runtime_s: 1; preempted "
                               "preempt_max_per_hour times in the last hour: 1; of users neither over their share "
                               "nor above their fair part: 1"}
    # one usable victim (job 1 once it has run 600 s) is not enough for two ranks: counted as such
    b._running[0] = replace(b._running[0], started_s=0)
    plan = preemption_plan(b.pending(bobs_job(ranks=2)).build(), ON)
    assert plan.preemptions == [] and "may be preempted, but not enough: 1" in plan.nobody[10]
    # the simulator's plan leaves the words out
    assert plan_preemptions(b.pending(bobs_job(ranks=2)).build(), ON) == []


def test_why_nobody_names_the_factor_and_the_held_share_rule_and_is_silent_when_it_fits_or_is_young() -> None:
    # alice (F 0.25, over her share) waits with 8 devices for bob's (her part of the 8: 4): both are why
    snap = (full().usage(alice=1000, bob=0).running(1, "bob", {"n1": 4}, 1e9, started_s=0)
            .running(2, "bob", {"n2": 4}, 1e9, started_s=0)
            .pending(job(10, user="alice", ranks=2, devices_per_rank=4, pending_since_s=0)).build())
    assert preemption_plan(snap, ON).nobody == {10: "alice is not under their share among users with jobs (factor "
                                                    "0.25; a job preempts only above 0.50) and would hold more than "
                                                    "their fair part of the devices now (0 + 8 > 4.0)"}
    # bob already holds 4 on n3: taking alice's job would leave her 4 against his 8 (see the test above)
    snap = (full().node("n3", free=0)
            .running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 200)
            .running(5, "bob", {"n3": 4}, 1e9, started_s=0)
            .pending(bobs_job()).build())
    assert "would leave their users holding less for their share than bob would: 2" in preemption_plan(snap, ON).nobody[10]
    # not waited preempt_after_s yet, or fits in free devices: nothing to say
    assert preemption_plan(full().running(1, "alice", {"n1": 4}, 1e9, started_s=0)
                           .pending(bobs_job(waited_s=299)).build(), ON).nobody == {}
    assert preemption_plan(cluster().node("n1", free=4).usage(alice=1000).at(NOW)
                           .pending(bobs_job()).build(), ON).nobody == {}
    # a job taken for a job ahead in the queue is counted as such
    snap = (full().running(1, "alice", {"n1": 4}, 1e9, started_s=0, checkpoint_s=NOW - 100)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=0, checkpoint_s=NOW - 200, preemptible=False)
            .pending(bobs_job(), replace(bobs_job(), id=11)).build())
    plan = preemption_plan(snap, ON)
    assert [p.job for p in plan.preemptions] == [10]
    assert plan.nobody[11].endswith("not preemptible: 1; taken for jobs ahead of it this cycle: 1")


def test_a_running_wide_job_within_the_window_is_not_taken_by_the_factor() -> None:
    # alice (F 0.25, over her share) runs job 1 on both nodes: 8 devices, started at 0, its limit
    # ending at NOW + 3600 (13,600 s).  bob (F 1) waits with 4.  Fair parts of the 8 devices: 4 each.
    # Job 1 is wide (8 > 4) and 8 x 13,600 = 108,800 <= 4 x 2 days (691,200): taking it would leave
    # alice nothing, so the factor rule leaves it (the part rule never takes it: alice would drop to
    # 0 < 4), and bob preempts nobody, told why.
    def snap(end_by_s: float) -> Snapshot:
        return (full().running(1, "alice", {"n1": 4, "n2": 4}, end_by_s, started_s=0)
                .pending(bobs_job()).build())

    plan = preemption_plan(snap(NOW + 3600), ON)
    assert plan.preemptions == []
    assert plan.nobody == {10: "it would not fit even with every job it may preempt; the 1 running job(s) of other "
                               "users: wider than their users' fair part and within preempt_wide_window_s: 1"}
    # with the window off, or a job longer than the window allows (8 x 86,401 > 4 x 2 days), the
    # factor takes it as before
    assert [p.victims for p in plan_preemptions(snap(NOW + 3600), replace(ON, preempt_wide_window_s=0))] == [(1,)]
    assert [p.victims for p in plan_preemptions(snap(86_401), ON)] == [(1,)]
    assert plan_preemptions(snap(86_400), ON) == []


# ---------------------------------------------------------------- no ping-pong, over random clusters


def _cycle_snapshot(now: float, nodes: dict[str, int], running: dict[int, dict], pending: dict[int, dict],
                    usage: dict[str, float], shares: dict[str, float], preempted_at: dict[int, list[float]]) -> Snapshot:
    held: dict[str, int] = defaultdict(int)
    for r in running.values():
        for n, d in r["placed"].items():
            held[n] += d
    views = []
    for jid, r in sorted(running.items()):
        ck = r["start"] + ((now - r["start"]) // r["epoch_s"]) * r["epoch_s"]
        views.append(RunningView(jid, r["user"], tuple(sorted(r["placed"].items())), 1e12, started_s=r["start"],
                                 checkpoint_s=ck if ck > r["start"] else None, preemptible=r["preemptible"],
                                 preemptions_last_hour=sum(1 for t in preempted_at[jid] if now - t < 3600),
                                 preemptions=len(preempted_at[jid])))
    return Snapshot(
        now_s=now, nodes={n: NodeView(n, "r1", d, d - held[n]) for n, d in nodes.items()}, shards={}, replicas={},
        pending=tuple(JobView(jid, p["user"], p["ranks"], p["dpr"], None, p["submit"], p["since"], 1e12)
                      for jid, p in sorted(pending.items())),
        running=tuple(views), usage=dict(usage), shares=dict(shares))


def _place(p: dict, free: dict[str, int]) -> dict[str, int] | None:
    placed: dict[str, int] = defaultdict(int)
    left = p["ranks"]
    for n in sorted(free, key=lambda n: (-free[n], n)):
        while left and free[n] - placed[n] >= p["dpr"]:
            placed[n] += p["dpr"]
            left -= 1
    return dict(placed) if left == 0 else None


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(min_value=0, max_value=10**9))
def test_no_ping_pong_over_random_clusters_and_queues(seed: int) -> None:
    """Each cycle: preemptors' users under share (among the users with jobs) or within their fair part,
    victims' over their share or left at or above their part, no job both; across cycles a victim ran
    min_runtime_s since its start, doubled for each time it was preempted before, and nobody is
    preempted more than 2 times in any hour."""
    rng = random.Random(seed)
    cfg = PolicyConfig(preempt=True, preempt_after_s=300, min_runtime_s=600, preempt_max_per_hour=2,
                       min_runtime_backoff=2.0, usage_half_life_s=rng.choice([3600.0, 86400.0]))
    nodes = {f"n{i}": rng.choice([2, 4, 8]) for i in range(rng.randint(1, 4))}
    users = ["u0", "u1", "u2"]
    shares = {u: rng.choice([1.0, 2.0, 4.0]) for u in users}
    usage = {u: rng.choice([0.0, rng.uniform(0, 50_000)]) for u in users}
    pending: dict[int, dict] = {}
    for jid in range(1, rng.randint(4, 16)):
        dpr = rng.choice([d for d in (1, 2, 4) if d <= max(nodes.values())])
        t = rng.uniform(0, 3000)
        pending[jid] = {"user": rng.choice(users), "ranks": rng.randint(1, 2), "dpr": dpr, "submit": t, "since": t,
                        "work_s": rng.uniform(600, 8000), "preemptible": rng.random() < 0.8,
                        "epoch_s": rng.choice([120.0, 300.0, 900.0])}
    running: dict[int, dict] = {}
    preempted_at: dict[int, list[float]] = defaultdict(list)
    dt = 60.0
    for step in range(200):
        now = step * dt
        snap = _cycle_snapshot(now, nodes, running, {j: p for j, p in pending.items() if p["submit"] <= now},
                               usage, shares, preempted_at)
        factors = snapshot_factors(snap, users)  # the queue's order
        # who is under or over their share: among the users with jobs now (competing_tree); their fair
        # parts of the devices now (snapshot_parts)
        among, _ = competing_tree(snap, [j.user for j in snap.pending] + [r.user for r in snap.running])
        parts = snapshot_parts(snap)
        plans = plan_preemptions(snap, cfg)
        preemptors = {p.job for p in plans}
        victims = [v for p in plans for v in p.victims]
        assert len(victims) == len(set(victims))  # nobody preempted twice in one cycle
        assert not preemptors & set(victims)
        held = defaultdict(int, {u: sum(sum(r["placed"].values()) for r in running.values() if r["user"] == u)
                                 for u in users})
        for p in plans:
            mine = pending[p.job]
            need = mine["ranks"] * mine["dpr"]
            by_part = held[mine["user"]] + need <= parts.get(mine["user"], 0.0) + 1e-9
            assert among[mine["user"]] > 0.5 or by_part  # under their share, or within their part
            for v in p.victims:
                r = running[v]
                assert r["preemptible"] and now - r["start"] >= 600 * 2 ** len(preempted_at[v])
                held[r["user"]] -= sum(r["placed"].values())
            for u in {running[v]["user"] for v in p.victims}:  # victims' users over their share, or
                assert among[u] < 0.5 or (by_part and held[u] >= parts.get(u, 0.0) - 1e-9)  # left their part
            held[mine["user"]] += need
        for v in victims:  # back to pending, keeping its age; work since its checkpoint is lost
            r = running.pop(v)
            done = ((now - r["start"]) // r["epoch_s"]) * r["epoch_s"]
            r["work_s"] -= done
            pending[v] = {**r, "since": r["since"]}
            preempted_at[v].append(now)
        free = {n: d - sum(r["placed"].get(n, 0) for r in running.values()) for n, d in nodes.items()}
        for jid in sorted((j for j, p in pending.items() if p["submit"] <= now),
                          key=lambda j: (-factors.get(pending[j]["user"], 1.0), pending[j]["submit"], j)):
            placed = _place(pending[jid], free)
            if placed is not None:
                for n, d in placed.items():
                    free[n] -= d
                running[jid] = {**pending.pop(jid), "placed": placed, "start": now}
        for u in users:
            held = sum(sum(r["placed"].values()) for r in running.values() if r["user"] == u)
            usage[u] = usage[u] * 2 ** (-dt / cfg.usage_half_life_s) + held * dt
        for jid in [j for j, r in running.items() if now + dt - r["start"] >= r["work_s"]]:
            del running[jid]
    for times in preempted_at.values():
        for t in times:
            assert sum(1 for u in times if t <= u < t + 3600) <= cfg.preempt_max_per_hour
        # the k-th preemption after the first came at least 600 x 2^k after the one before
        assert all(b - a >= 600 * 2 ** k for k, (a, b) in enumerate(pairwise(times), start=1))


def test_fits_counts_whole_ranks_per_node() -> None:
    j = job(1, ranks=2, devices_per_rank=3)
    def fits(free: dict[str, int]) -> bool:
        return _Free(free).fits(j)

    assert fits({"a": 3, "b": 3}) and fits({"a": 6}) and not fits({"a": 5}) and not fits({"a": 2, "b": 4})


def test_jobs_that_start_in_free_devices_take_the_most_free_nodes_first() -> None:
    # n1 4 free, n2 2, n3 4: the 2-rank job of 2 devices takes both ranks on n1 (most free, first by
    # name); then the next 2-rank job takes n3's 4; then a job of 4 devices fits nowhere but with victims
    free = _Free({"n1": 4, "n2": 2, "n3": 4})
    two = job(1, ranks=2, devices_per_rank=2)
    assert free.fits(two) and free.slots(2) == 5
    free.take(two)
    assert free.free == {"n1": 0, "n2": 2, "n3": 4} and free.slots(2) == 3
    free.take(two)
    assert free.free == {"n1": 0, "n2": 2, "n3": 0} and free.slots(2) == 1 and free.slots(1) == 2
    assert not free.fits(job(2, ranks=1, devices_per_rank=4))
    free.add("n1", 4)  # a victim's devices
    assert free.fits(job(2, ranks=1, devices_per_rank=4)) and free.slots(2) == 3


def test_each_waiting_job_of_one_user_and_shape_is_told_why_it_preempts_nobody() -> None:
    # alice's two jobs are not preemptible; bob's three identical jobs each get the same answer (the
    # plan asks once per user and shape until something changes)
    snap = (full().running(1, "alice", {"n1": 4}, 1e9, started_s=0, preemptible=False)
            .running(2, "alice", {"n2": 4}, 1e9, started_s=0, preemptible=False)
            .pending(bobs_job(), replace(bobs_job(), id=11), replace(bobs_job(), id=12)).build())
    plan = preemption_plan(snap, ON)
    assert plan.preemptions == [] and set(plan.nobody) == {10, 11, 12}
    assert len(set(plan.nobody.values())) == 1 and plan.nobody[12].endswith("not preemptible: 2")


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(min_value=0, max_value=10**9))
def test_skipping_the_victim_walk_when_no_job_could_be_taken_gives_the_walks_answer(seed: int) -> None:
    """The plan skips its walk over the victims for a job none of whose possible victims could be taken
    even alone (it only counts them then); with the shortcut off every job walks.  Both give the same
    preemptions and the same words for every job that preempts nobody, over random snapshots of up to
    five users with random shares, usage, holdings and checkpoints."""
    rng = random.Random(seed)
    users = [f"u{i}" for i in range(rng.randint(2, 5))]
    names = [f"n{i}" for i in range(rng.randint(1, 6))]
    size = rng.choice([2, 4, 8])
    b = cluster().at(NOW).usage(**{u: rng.choice([0.0, rng.uniform(0, 50_000)]) for u in users})
    b = b.shares(**{u: rng.choice([1.0, 2.0, 4.0]) for u in users})
    jid = 1
    for n in names:
        free = size
        while free and rng.random() < 0.8:
            d = rng.choice([d for d in (1, 2, 4, 8) if d <= free])
            b = b.running(jid, rng.choice(users), {n: d}, rng.choice([1e9, NOW + rng.uniform(0, 86400)]),
                          started_s=rng.choice([0.0, NOW - 300]),
                          checkpoint_s=rng.choice([None, NOW - rng.uniform(0, 900)]),
                          preemptible=rng.random() < 0.9)
            free -= d
            jid += 1
        b = b.node(n, devices=size, free=free)
    pending = [job(100 + i, user=rng.choice(users), ranks=rng.randint(1, 3),
                   devices_per_rank=rng.choice([d for d in (1, 2, 4) if d <= size]),
                   pending_since_s=NOW - rng.choice([100, 400, 4000])) for i in range(rng.randint(1, 12))]
    snap = b.pending(*pending).build()
    cfg = replace(ON, min_runtime_s=rng.choice([0, 600]))
    with_shortcut = preemption_plan(snap, cfg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "_nobody_usable", lambda *a, **k: None)
        walked = preemption_plan(snap, cfg)
    assert with_shortcut == walked
