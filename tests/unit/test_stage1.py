"""Stage 1: candidate placements, shard assignment, sources and costs.

Shards are 1 GB: 320 ms from another node of the rack, 800 ms from another rack (see builders).
"""

import pytest

from policies.registry import ARBITERS
from scheduler.core.costmodel import reads_cost_ms
from scheduler.core.decide import decide
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.reasons import Reason, ReasonKind
from scheduler.core.stage1 import build_index, infeasible_reason, missing_data_reason, propose, propose_packed
from tests.builders import GB, cluster, job

CFG = PolicyConfig(candidates_per_job=8)


def shards_by_rank(c) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in c.reads:
        out.setdefault(r.rank, []).append(r.shard)
    return out


def test_job_goes_where_its_shards_are() -> None:
    snap = (
        cluster()
        .node("a", rack="r1").holds("digits", shards=[0, 1])
        .node("b", rack="r1")
        .pending(job(1, ranks=2, dataset="digits"))
        .build()
    )  # fmt: skip
    best = propose(snap.pending[0], snap, CFG)[0]
    # both ranks on a (4 free devices), each reading one local shard: nothing moves
    assert best.rank_nodes == ("a", "a")
    assert (best.transfer_bytes, best.transfer_cost_ms) == (0, 0)
    assert best.local_fraction == 1.0


def test_ranks_follow_the_data_across_nodes() -> None:
    snap = (
        cluster()
        .node("a", rack="r1").holds("d", shards=[0, 1])
        .node("b", rack="r2").holds("d", shards=[2, 3])
        .node("c", rack="r1")
        .pending(job(1, ranks=2, dataset="d"))
        .build()
    )  # fmt: skip
    cands = propose(snap.pending[0], snap, CFG)
    best = cands[0]
    # one rank on a reading 0,1 and one on b reading 2,3: all local, cost 0
    assert best.rank_nodes == ("a", "b")
    assert shards_by_rank(best) == {0: [0, 1], 1: [2, 3]}
    assert best.transfer_cost_ms == 0
    # every other candidate costs more, and they come cheapest first
    assert [c.transfer_cost_ms for c in cands] == sorted(c.transfer_cost_ms for c in cands)
    assert len({c.rank_nodes for c in cands}) == len(cands)  # no duplicates


def test_a_gang_that_can_read_half_locally_is_not_sent_where_it_reads_nothing() -> None:
    # The multi-host case: one device per node, every shard on h1 (rack a), h2 and h3 empty (rack b).
    # h1 is the only holder, so it is "contended", but {h1, h2} stages half the bytes and {h2, h3} all
    # of them: the half-local gang comes first (the contention order applies among placements that
    # stage about the same share, not across them).
    snap = (
        cluster()
        .node("h1", rack="a", devices=1).holds("wide", shards=[0, 1, 2, 3])
        .node("h2", rack="b", devices=1)
        .node("h3", rack="b", devices=1)
        .pending(job(1, ranks=2, dataset="wide"))
        .build()
    )  # fmt: skip
    best = propose(snap.pending[0], snap, CFG)[0]
    assert "h1" in best.rank_nodes and best.local_fraction == 0.5
    _, d = decide(snap, PolicyConfig(locality_wait_s=0), ARBITERS["twostage"])
    assert "h1" in d.bindings[1].rank_nodes


def test_each_rank_gets_floor_or_ceil_of_the_shards() -> None:
    snap = (
        cluster().node("a").holds("d", shards=[0, 1, 2, 3, 4]).pending(job(1, ranks=2, dataset="d")).build()
    )
    best = propose(snap.pending[0], snap, CFG)[0]
    # 5 shards over 2 ranks: 3 and 2
    assert sorted(len(s) for s in shards_by_rank(best).values()) == [2, 3]
    assert sorted(r.shard for r in best.reads) == [0, 1, 2, 3, 4]


def test_more_ranks_than_shards_leaves_some_ranks_without_shards() -> None:
    snap = cluster().node("a").holds("d", shards=[0]).pending(job(1, ranks=3, dataset="d")).build()
    best = propose(snap.pending[0], snap, CFG)[0]
    assert len(best.reads) == 1 and best.transfer_cost_ms == 0


def test_missing_shards_come_from_the_cheapest_replica() -> None:
    snap = (
        cluster()
        .node("far", rack="r2", free=0).holds("d", shards=[0])
        .node("near", rack="r1", free=0).holds("d", shards=[0])
        .node("dest", rack="r1")
        .pending(job(1, ranks=1, dataset="d"))
        .build()
    )  # fmt: skip
    (best,) = propose(snap.pending[0], snap, CFG)
    # only dest is free; staging from near (same rack) costs 320 ms, from far 800 ms
    assert best.reads[0].source == "near"
    assert (best.transfer_bytes, best.transfer_cost_ms) == (GB, 320)


def test_equal_sources_tie_by_name() -> None:
    snap = (
        cluster()
        .node("y", rack="r1", free=0).holds("d", shards=[0])
        .node("x", rack="r1", free=0).holds("d", shards=[0])
        .node("dest", rack="r1")
        .pending(job(1, dataset="d"))
        .build()
    )  # fmt: skip
    assert propose(snap.pending[0], snap, CFG)[0].reads[0].source == "x"


def test_job_without_data_reads_nothing_and_costs_nothing() -> None:
    snap = cluster().node("a").node("b").pending(job(1, ranks=6)).build()
    cands = propose(snap.pending[0], snap, CFG)
    assert cands and all(c.reads == () and c.transfer_cost_ms == 0 for c in cands)
    # fewest nodes first among equal costs: 6 ranks on a (4) + b (2)
    assert cands[0].devices_by_node() == {"a": 4, "b": 2}


def test_only_free_devices_and_whole_ranks() -> None:
    snap = (
        cluster()
        .node("a", devices=4, free=3)
        .node("b", devices=4, free=1)
        .pending(job(1, ranks=2, devices_per_rank=2), job(2, ranks=3, devices_per_rank=2))
        .build()
    )
    # a fits one 2-device rank (3 free), b none: 2 ranks do not fit now
    assert propose(snap.pending[0], snap, CFG) == []
    idx = build_index(snap)
    assert infeasible_reason(snap.pending[0], idx) is None  # but they will once devices free up


@pytest.mark.parametrize(
    ("the_job", "reason"),
    [
        (job(1, ranks=11), "more devices than the cluster has up: needs 11, the up nodes have 10"),
        (job(1, devices_per_rank=5), "each rank needs 5 devices on one node; the largest node has 4"),
        (
            job(1, ranks=3, devices_per_rank=3),  # 9 <= 10 devices, but a, b fit one rank each, c none
            "3 ranks of 3 devices do not fit on the cluster's nodes (at most 2 such ranks)",
        ),
    ],
)
def test_jobs_that_can_never_run(the_job, reason: str) -> None:
    snap = cluster().node("a").node("b").node("c", devices=2).pending(the_job).build()
    assert infeasible_reason(the_job, build_index(snap)) == Reason(ReasonKind.TOO_LARGE, reason)
    assert propose(the_job, snap, CFG) == []


def test_missing_data_is_reported() -> None:
    snap = cluster().node("a").dataset("d", shards=2).pending(job(1, dataset="d")).build()
    assert missing_data_reason(snap.pending[0], snap, build_index(snap)) == Reason(
        ReasonKind.DATA_MISSING, "data set 'd': 2 shard(s) have no copy on a live node (first: shard 0)"
    )
    assert propose(snap.pending[0], snap, CFG) == []


def test_at_most_k_candidates() -> None:
    snap = (
        cluster()
        .node("a", rack="r1").holds("d", shards=[0])
        .node("b", rack="r2").holds("d", shards=[1])
        .nodes("c", "e", "f", rack="r3")
        .pending(job(1, ranks=2, dataset="d"))
        .build()
    )  # fmt: skip
    assert len(propose(snap.pending[0], snap, PolicyConfig(candidates_per_job=2))) == 2
    assert len(propose(snap.pending[0], snap, PolicyConfig(candidates_per_job=1))) == 1


def test_free_override_and_recorded_cost_matches_cost_model() -> None:
    snap = (
        cluster()
        .node("a", rack="r1", free=0).holds("d", shards=[0, 1])
        .node("b", rack="r2").holds("d", shards=[2])
        .node("c", rack="r1")
        .pending(job(1, ranks=2, dataset="d"))
        .build()
    )  # fmt: skip
    j = snap.pending[0]
    racks = {n: v.rack for n, v in snap.nodes.items()}
    for c in propose(j, snap, CFG):
        assert c.transfer_cost_ms == reads_cost_ms(c.reads, racks, CFG)
        assert "a" not in c.nodes
    # over all devices (a idle), a placement reading everything locally on a and b exists
    idx = build_index(snap)
    assert propose(j, snap, CFG, idx, free=dict(idx.devices))[0].transfer_cost_ms == 0


def test_packed_placement_ignores_data() -> None:
    snap = (
        cluster()
        .node("a", rack="r1", free=2).holds("d", shards=[0, 1])
        .node("b", rack="r2")
        .pending(job(1, ranks=2, dataset="d"))
        .build()
    )  # fmt: skip
    c = propose_packed(snap.pending[0], snap, CFG)
    # most free first: b (4 free) takes both ranks; both shards cross racks: 2 x 800 ms
    assert c is not None and c.rank_nodes == ("b", "b") and c.transfer_cost_ms == 1600


def test_decide_shares_stage1_work_between_jobs_of_one_shape() -> None:
    snap = (
        cluster()
        .node("a").holds("d", shards=[0, 1])
        .node("b")
        .pending(job(1, ranks=2, dataset="d"), job(2, ranks=2, dataset="d"), job(3, ranks=1))
        .build()
    )  # fmt: skip
    cands, _ = decide(snap, CFG, ARBITERS[CFG.arbiter])
    idx = build_index(snap)
    for j in snap.pending:
        assert cands[j.id] == propose(j, snap, CFG, idx)


def test_free_devices_stay_in_fill_order_under_updates() -> None:
    from scheduler.core.stage1 import FreeDevices

    fd = FreeDevices({"a": 2, "b": 4, "c": 4, "d": 0}, {"a": "r1", "b": "r1", "c": "r2", "d": "r2"})
    assert list(fd.desc(1)) == ["b", "c", "a"]  # most free first, then name; d has nothing free
    fd.set("b", 1)
    fd.set("a", 3)
    assert list(fd.desc(1)) == ["c", "a", "b"]
    assert list(fd.desc(2, rack="r1")) == ["a"]
    fd.set("c", 0)
    assert dict(fd) == {"a": 3, "b": 1}


def contended_snapshot():
    # d is held whole on a and b (1 free each: F_d = 2); e only on a (F_e = 1); f on c, which is busy.
    return (
        cluster()
        .node("a", rack="r1", free=1).holds("d", shards=[0, 1]).holds("e", shards=[0])
        .node("b", rack="r1", free=1).holds("d", shards=[0, 1])
        .node("c", rack="r1", free=0).holds("f", shards=[0])
        .node("z", rack="r2", free=2)
        .pending(job(1, dataset="d"))
        .build()
    )  # fmt: skip


def test_contention_sums_the_share_of_free_local_room_each_node_stands_for() -> None:
    from scheduler.core.stage1 import node_contention

    snap = contended_snapshot()
    idx = build_index(snap)
    # a: 1/F_d + 1/F_e = 1/2 + 1/1; b: 1/F_d; z holds nothing whole; c has nothing free (left out)
    assert node_contention(snap, idx.free) == {"a": 1.5, "b": 0.5, "z": 0.0}
    assert idx.contention == {"a": 1.5, "b": 0.5, "z": 0.0}
    assert idx.calm == ("z", "b", "a")  # least contended first


def test_among_equal_holders_the_least_contended_is_taken() -> None:
    snap = contended_snapshot()
    best = propose(snap.pending[0], snap, CFG)[0]
    # a and b both hold all of d; a's free device is also e's only local room: b is taken
    assert best.rank_nodes == ("b",) and best.transfer_cost_ms == 0


def test_a_job_that_must_stage_takes_the_least_contended_devices_even_if_dearer() -> None:
    snap = (
        cluster()
        .node("h", rack="r1", free=0).holds("d", shards=[0])  # d's only copy: busy
        .node("x", rack="r1", free=1).holds("e", shards=[0])  # e's only local room
        .node("y", rack="r2", free=1)
        .pending(job(1, dataset="d"))
        .build()
    )  # fmt: skip
    cands = propose(snap.pending[0], snap, CFG)
    # x would stage d from h in the rack (320 ms), y across racks (800 ms); both stage all of d,
    # but only y leaves e's local room alone
    assert [(c.nodes, c.transfer_cost_ms) for c in cands] == [(("y",), 800), (("x",), 320)]


def test_local_candidates_still_go_cheapest_then_fewest_nodes_before_contention() -> None:
    snap = (
        cluster()
        .node("a", devices=2).holds("d", shards=[0]).holds("e", shards=[0])
        .node("b", devices=2)
        .pending(job(1, ranks=2, dataset="d"))
        .build()
    )  # fmt: skip
    cands = propose(snap.pending[0], snap, CFG)
    # splitting the gang (a + b, rank 1 reads nothing) would also be local and less contended, but
    # one node is better for a gang: a x2 first
    assert cands[0].rank_nodes == ("a", "a") and cands[0].transfer_cost_ms == 0
    assert any(c.nodes == ("a", "b") and c.transfer_cost_ms == 0 for c in cands[1:])


def test_without_whole_holdings_the_order_is_the_plain_cost_order() -> None:
    from scheduler.core.stage1 import candidate_key

    snap = (
        cluster()
        .node("a", rack="r1", free=1).holds("d", shards=[0, 1])
        .node("b", rack="r2").holds("d", shards=[2, 3])
        .node("c", rack="r1")
        .pending(job(1, ranks=3, dataset="d"))
        .build()
    )  # fmt: skip
    idx = build_index(snap)
    assert set(idx.contention.values()) == {0.0}  # no node holds all four shards
    cands = propose(snap.pending[0], snap, CFG, idx)
    assert cands == sorted(cands, key=candidate_key)


def test_calm_over_a_few_free_nodes_matches_walking_every_node() -> None:
    """``_calm`` puts the few nodes still free in the index's calm order instead of walking all of
    them; the placements must be exactly those of the plain walk, for every width and free pattern."""
    import random

    from benchmarks.cycle import synthetic_snapshot
    from scheduler.core.stage1 import FreeDevices, _calm, _Fit

    def walk(index, free, dpr: int, ranks: int):  # type: ignore[no-untyped-def]
        """The plain definition: every calm node in turn, by how many ranks it has room for."""
        caps = [(n, free.get(n, 0) // dpr) for n in index.calm]
        whole = next((n for n, c in caps if c >= ranks), None) if ranks > 1 else None
        if whole is not None:
            return {whole: ranks}
        out, left = {}, ranks
        for n, c in caps:
            if left and c:
                out[n] = min(c, left)
                left -= out[n]
        return None if left else out

    snap = synthetic_snapshot(400, 40, seed=3, datasets=30)
    index = build_index(snap)
    rng = random.Random(7)
    checked = fast = 0
    for trial in range(40):
        view = FreeDevices(index.free, index.racks)
        keep = rng.uniform(0.0, 0.3)  # the share of free nodes left free: the fast path below 1/4
        for n in list(view):
            if rng.random() > keep:
                view.set(n, rng.choice([0] * 18 + [1, 3]))
        fast += 4 * len(view) < len(index.calm)
        for ranks, dpr in ((1, 1), (2, 1), (3, 2), (8, 1), (12, 1), (40, 1)):
            j = job(1000 + trial, ranks=ranks, dataset="d001", devices_per_rank=dpr)
            assert _calm(_Fit(j, index, view)) == walk(index, view, dpr, ranks)
            checked += 1
    assert checked == 240 and 10 <= fast <= 30  # both paths were exercised


def test_decide_holds_off_the_garbage_collector_and_gives_it_back() -> None:
    import gc

    from scheduler.core.placement import Decision

    snap = cluster().node("a", rack="r1").holds("digits", shards=[0, 1]).pending(job(1, dataset="digits")).build()
    seen: list[bool] = []

    class Spy:
        name = "spy"

        def arbitrate(self, snap, candidates, cfg, index=None):  # type: ignore[no-untyped-def]
            seen.append(gc.isenabled())
            return Decision()

    assert gc.isenabled()
    decide(snap, CFG, arbiter=Spy())
    assert seen == [False] and gc.isenabled()  # paused while deciding, back on after
    gc.disable()
    try:
        decide(snap, CFG, arbiter=Spy())
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
