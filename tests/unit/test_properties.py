"""Invariants over random clusters and queues (hypothesis), for stage 1 and every arbiter.

- no device is given twice and no node gives more than its free devices;
- every gang is whole: a binding places exactly ``ranks`` ranks of ``devices_per_rank`` devices;
- every shard of the job's data set is read by exactly one rank, each rank floor or ceil of even;
- a read is local only where the node holds a copy, else it is staged from a node that holds one;
- the recorded bytes and cost equal the cost model's recomputation;
- every pending job is ordered, every job left unbound has a reason, and no bound job is waiting.
"""

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.registry import ARBITERS
from scheduler.core.costmodel import reads_cost_ms
from scheduler.core.decide import decide
from scheduler.core.placement import Candidate
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import JobView, NodeView, RunningView, ShardView, Snapshot

SIZES = [1, 10**6, 10**9, 3 * 10**9 + 7]


@st.composite
def snapshots(draw) -> Snapshot:
    n_racks = draw(st.integers(1, 3))
    nodes = {}
    running = []
    for i in range(draw(st.integers(1, 6))):
        devices = draw(st.integers(1, 8))
        free = draw(st.integers(0, devices))
        nodes[f"n{i}"] = NodeView(f"n{i}", f"r{i % n_racks}", devices, free)
        if free < devices:
            running.append(
                RunningView(100 + i, "dave", ((f"n{i}", devices - free),), draw(st.floats(0, 5000)))
            )
    names = sorted(nodes)
    shards, replicas = {}, {}
    for d in range(draw(st.integers(0, 2))):
        ds = f"d{d}"
        shards[ds] = tuple(
            ShardView(ds, s, draw(st.sampled_from(SIZES)), 10) for s in range(draw(st.integers(0, 6)))
        )
        for s in shards[ds]:
            replicas[(ds, s.index)] = tuple(draw(st.lists(st.sampled_from(names), max_size=3, unique=True)))
    jobs = []
    for j in range(draw(st.integers(0, 8))):
        submit = draw(st.floats(0, 100))
        jobs.append(
            JobView(
                id=j + 1,
                user=draw(st.sampled_from(["alice", "bob", "carol"])),
                ranks=draw(st.integers(1, 4)),
                devices_per_rank=draw(st.integers(1, 3)),
                dataset=draw(st.sampled_from([None, *sorted(shards)])),
                submit_s=submit,
                pending_since_s=submit,
                time_limit_s=draw(st.floats(1, 5000)),
                waiting_since_s=draw(st.one_of(st.none(), st.floats(0, 100))),  # a locality wait begun
            )
        )
    usage = {u: draw(st.floats(0, 1e6)) for u in ["alice", "bob"]}
    return Snapshot(
        now_s=draw(st.floats(100, 300)),
        nodes=nodes,
        shards=shards,
        replicas=replicas,
        pending=tuple(jobs),
        running=tuple(running),
        usage=usage,
        shares={"alice": draw(st.integers(0, 3)), "bob": 1},
    )


def check_candidate(c: Candidate, job: JobView, snap: Snapshot, cfg: PolicyConfig) -> None:
    assert c.job_id == job.id
    assert len(c.rank_nodes) == job.ranks and c.devices_per_rank == job.devices_per_rank
    for n, d in c.devices_by_node().items():
        assert d <= snap.nodes[n].free, f"job {job.id}: {d} devices on {n}, {snap.nodes[n].free} free"
    shards = snap.shards.get(job.dataset, ()) if job.dataset else ()
    assert sorted(r.shard for r in c.reads) == [s.index for s in shards]
    per_rank = Counter(r.rank for r in c.reads)
    n, ranks = len(shards), job.ranks
    for rank in range(ranks):
        assert per_rank.get(rank, 0) in (n // ranks, -(-n // ranks))
    moved = 0
    for r in c.reads:
        assert r.node == c.rank_nodes[r.rank]
        holders = snap.replicas.get((job.dataset, r.shard), ())
        assert r.source in holders and r.source in snap.nodes
        moved += 0 if r.local else r.bytes
    racks = {v.name: v.rack for v in snap.nodes.values()}
    assert c.transfer_bytes == moved
    assert c.transfer_cost_ms == reads_cost_ms(c.reads, racks, cfg)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=snapshots(), arbiter=st.sampled_from(sorted(ARBITERS)), wait=st.sampled_from([0.0, 30.0]),
       preempt=st.booleans())
def test_invariants_hold_for_every_arbiter(snap: Snapshot, arbiter: str, wait: float, preempt: bool) -> None:
    # preempt: with it on, twostage's longer locality wait (and its end in an uncontended cycle) is in play
    cfg = PolicyConfig(arbiter=arbiter, candidates_per_job=3, locality_wait_s=wait, preempt=preempt,
                       preempt_locality_wait_s=400.0)
    candidates, d = decide(snap, cfg, ARBITERS[cfg.arbiter])
    jobs = {j.id: j for j in snap.pending}
    for jid, cands in candidates.items():
        assert len(cands) <= cfg.candidates_per_job
        for c in cands:
            check_candidate(c, jobs[jid], snap, cfg)
    used: Counter[str] = Counter()
    for jid, c in d.bindings.items():
        check_candidate(c, jobs[jid], snap, cfg)
        used.update(c.devices_by_node())
    for n, count in used.items():
        assert count <= snap.nodes[n].free, f"{arbiter}: node {n} given {count}, {snap.nodes[n].free} free"
    assert sorted(d.order) == sorted(jobs)
    assert set(d.reasons) == set(jobs) - set(d.bindings)
    assert all(r.text() for r in d.reasons.values())
    assert not set(d.waiting) & set(d.bindings), "a bound job is not waiting for locality"
