"""The trace-driven simulator (``gsched simulate``): an exact hand-worked schedule, determinism, the
same decisions as the server's cycle on one recorded snapshot, and a replay of a real trace slice."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import scheduler.sim.simulator as simmod
from policies.registry import get_arbiter
from scheduler.cli import main as cli
from scheduler.core.decide import decide
from scheduler.core.jobspec import validate_spec
from scheduler.core.lifecycle import JobState, RankState
from scheduler.core.placement import Decision
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import Snapshot
from scheduler.sim.simulator import ClusterSpec, DataSpec, FailureSpec, Simulation, TraceJob, simulate
from scheduler.store.binder import bind
from scheduler.store.db import Database
from scheduler.store.models import Dataset, Device, Job, Node, Rank, Replica, Shard, Usage, User
from scheduler.store.snapshot_reader import build_snapshot

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
if not TRACES.is_dir():
    TRACES = Path("/work/shared/traces")


def write_trace(path: Path, rows: list[tuple[str, float, str, int, float]]) -> Path:
    lines = ["job_id,submit_time_s,user,num_gpus,duration_s,extra"]
    lines += [f"{k},{t},{u},{g},{d},ignored" for k, t, u, g, d in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------ (a) a schedule worked out by hand


def test_fifo_tiny_trace_gives_the_hand_computed_schedule(tmp_path: Path) -> None:
    # Cluster: n0000 and n0001, 2 devices each, one rack.  One data set d000 of one 3,125 MB shard with
    # one replica; place_replicas puts it on n0000 (least loaded, ties by name).  Staging it to n0001
    # (same rack, 25 Gb/s = 3.125e9 B/s) costs 3.125e9 / 3.125e9 s = 1000 ms = 1 s.  Cycles on 10 s ticks.
    #
    #   job  submit  gpus  duration
    #   A    0       2     100
    #   B    5       2     50
    #   C    12      4     30
    #   D    15      1     20
    #
    # t=0   A arrives; cycle at 0: A's 2 ranks on n0000 (holds the shard: local, cost 0). A ends 100.
    # t=5   B arrives; cycle at tick 10: only n0001 is free; rank 0 stages the shard from n0000 (1 s).
    #       B runs 10 + 1 + 50 -> ends 61.
    # t=12  C (4 gpus), t=15 D (1 gpu) arrive; tick 20: no device free, the cycle is skipped.
    # t=61  B ends; tick 70: 2 free.  FIFO head is C (needs 4): it does not fit, so D waits behind it
    #       (head-of-line blocking: fifo never backfills).
    # t=100 A ends; tick 100: 4 free: C takes n0000 x2 + n0001 x2 (shard read on n0000: local).
    #       C ends 130; D is behind nothing now but no device is free.
    # t=130 C ends; tick 130: D on n0000 (local), ends 150.
    #
    # JCT: A 100, B 61-5=56, C 130-12=118, D 150-15=135; mean 409/4 = 102.25; p50 = (100+118)/2 = 109.
    # Queueing: A 0, B 5, C 88, D 115; mean 52.  Makespan 150.
    # Busy device-seconds: A 2x100 + B 2x51 + C 4x30 + D 1x20 = 442 of 4x150 = 600: 0.736667.
    # Reads: 4 x 3.125e9 bytes, one staged (B's): local fraction 0.75, bytes moved 3.125e9, none
    # across racks.  No failures: 0 restarts.
    trace = write_trace(tmp_path / "tiny.csv", [("A", 0, "u1", 2, 100), ("B", 5, "u2", 2, 50),
                                                ("C", 12, "u1", 4, 30), ("D", 15, "u2", 1, 20)])
    r = simulate(simmod.load_trace(trace), "fifo", ClusterSpec(nodes=2, devices_per_node=2, racks=1),
                 DataSpec(datasets=1, shards=1, shard_mb=3125, replicas=1), seed=0, cycle_s=10)
    assert r.schedule == {"A": (0, 100), "B": (10, 61), "C": (100, 130), "D": (130, 150)}
    assert sorted(r.jcts_s) == [56, 100, 118, 135]
    assert (r.jobs, r.mean_jct_s, r.p50_jct_s, r.mean_queue_s, r.makespan_s) == (4, 102.25, 109, 52, 150)
    assert r.utilization == pytest.approx(442 / 600, abs=1e-6)
    assert (r.local_fraction, r.bytes_moved, r.cross_rack_bytes, r.restarts) == (0.75, 3_125_000_000, 0, 0)


def test_twostage_on_the_same_trace_waits_for_locality_and_orders_by_fair_share(tmp_path: Path) -> None:
    # The same cluster and trace under twostage (locality wait 30 s set here, threshold 0 ms):
    # t=0   A on n0000 (local), ends 100.
    # tick 10: B fits only on n0001, where staging costs 1000 ms > 0; a local placement would exist on
    #       n0000 if it were idle, so B waits for locality until 5 + 30 = 35 (next tick: 40).
    # tick 20: fair-share order is u2 (no usage) before u1 (A's): B, D, C.  B and D wait for locality
    #       (D until 45); C (4 devices, 2 free) gets a reservation from t=100 (A's end).
    # tick 40: B's wait is over: n0001, 1 s staging: runs 40 -> 41 + 50 = 91.
    # B ends 91, A ends 100 -> tick 100: 4 free; u2 still has less usage (102 vs 200 device-seconds),
    #       so D goes first: n0000, local, 100 -> 120; C needs 4 of the 3 left: reserved from 120.
    # tick 120: C on both nodes, 120 -> 150.
    trace = write_trace(tmp_path / "tiny.csv", [("A", 0, "u1", 2, 100), ("B", 5, "u2", 2, 50),
                                                ("C", 12, "u1", 4, 30), ("D", 15, "u2", 1, 20)])
    r = simulate(simmod.load_trace(trace), "twostage", ClusterSpec(nodes=2, devices_per_node=2, racks=1),
                 DataSpec(datasets=1, shards=1, shard_mb=3125, replicas=1), seed=0, cycle_s=10,
                 cfg=PolicyConfig(locality_wait_s=30))
    assert r.schedule == {"A": (0, 100), "B": (40, 91), "C": (120, 150), "D": (100, 120)}


def test_jobs_bound_in_one_cycle_move_a_shard_to_a_node_once(tmp_path: Path) -> None:
    # Two nodes of 2 devices, one data set of one shard whose only copy is on n0000; fifo; no cache.
    # A (2 devices) takes n0000 at t=0 (local).  B and C (1 device each) arrive at t=5 and both go to
    # n0001 at tick 10, each reading the shard from n0000: the agent fetches it once for both, so the
    # bytes move once and C reads it off n0001's disk.  Reads 3 x 3.125e9, moved 3.125e9: 2/3 local.
    # With C a cycle later (arriving at t=15, bound at tick 20) and no cache, it is fetched again.
    cluster, data = ClusterSpec(nodes=2, devices_per_node=2, racks=1), DataSpec(datasets=1, shards=1, shard_mb=3125,
                                                                                  replicas=1)
    together = write_trace(tmp_path / "together.csv", [("A", 0, "u1", 2, 100), ("B", 5, "u2", 1, 50),
                                                        ("C", 5, "u2", 1, 50)])
    r = simulate(simmod.load_trace(together), "fifo", cluster, data, seed=0, cycle_s=10)
    assert (r.schedule["B"][0], r.schedule["C"][0]) == (10, 10)
    assert (r.bytes_moved, r.local_fraction) == (3_125_000_000, pytest.approx(2 / 3, abs=1e-6))
    apart = write_trace(tmp_path / "apart.csv", [("A", 0, "u1", 2, 100), ("B", 5, "u2", 1, 50),
                                                  ("C", 15, "u2", 1, 50)])
    r = simulate(simmod.load_trace(apart), "fifo", cluster, data, seed=0, cycle_s=10)
    assert (r.schedule["B"][0], r.schedule["C"][0]) == (10, 20)
    assert (r.bytes_moved, r.local_fraction) == (6_250_000_000, pytest.approx(1 / 3, abs=1e-6))


# ------------------------------------------------------------------ (b) determinism


def _json_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"trace folder {TRACES} is missing (CI has ../shared beside the clone)")
def test_same_seed_gives_identical_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(TRACES / "itp_500.csv"), "--limit", "150", "--nodes", "8", "--racks", "2",
            "--policy", "twostage,fairshare", "--seed", "7", "--json",
            "--data", "datasets=10,shards=4,zipf=1.2,cache_gb=20",
            "--failures", "rate=3,down_s=1800,checkpoint_s=600,rereplicate_s=300"]
    first = _json_run(argv, capsys)
    second = _json_run(argv, capsys)
    assert first == second
    out = json.loads(first)
    assert out[0]["restarts"] > 0  # failures happened, and happened the same way twice
    other = _json_run([("8" if a == "7" else a) for a in argv], capsys)
    assert other != first  # the seed does matter


# ------------------------------------------------------------------ (c) the same decisions as the server


def _record_cycle(policy: str) -> tuple[Snapshot, Decision, PolicyConfig]:
    """Run a small replay and keep the busiest cycle that bound something while others ran."""
    rows = [TraceJob(f"j{i}", 20.0 * (i // 3), f"u{i % 3}", 1 + (i % 4 == 0) * 3, 200.0 + 37 * i) for i in range(40)]
    cfg = PolicyConfig(arbiter=policy)
    sim = Simulation(rows, cfg, ClusterSpec(nodes=4, devices_per_node=4, racks=2),
                     DataSpec(datasets=3, shards=4, shard_mb=800, replicas=2, cache_gb=4), seed=3)
    seen: list[tuple[Snapshot, Decision]] = []

    def recording_decide(snap: Snapshot, c: PolicyConfig, arbiter=None):  # type: ignore[no-untyped-def]
        cands, d = decide(snap, c, arbiter)
        seen.append((snap, d))
        return cands, d

    mp = pytest.MonkeyPatch()
    mp.setattr(simmod, "decide", recording_decide)
    try:
        sim.run(policy)
    finally:
        mp.undo()
    useful = [(s, d) for s, d in seen if d.bindings and s.running and len(s.pending) > len(d.bindings)]
    assert useful, "the replay should have a contended cycle"
    snap, d = max(useful, key=lambda sd: (len(sd[0].pending), len(sd[0].running), sd[0].now_s))
    return snap, d, cfg


def _spec(name: str, ranks: int, gpus: int, dataset: str | None, time_s: float) -> dict[str, Any]:
    """A job's spec as a submit stores it (validated, then dumped with every default)."""
    assert dataset is not None and time_s == int(time_s), (dataset, time_s)  # what a job.toml can say
    return validate_spec({"name": name, "resources": {"ranks": ranks, "gpus_per_rank": gpus},
                          "data": {"dataset": dataset}, "limits": {"time": int(time_s)}}).model_dump()


def _store(db: Database, snap: Snapshot) -> None:
    """Write the snapshot's world into the server's tables (as agents and submits would have)."""
    now = snap.now_s
    with db.session() as s:
        users = sorted(set(snap.shares) | set(snap.usage))
        for u in users:
            s.add(User(name=u, token_hash=f"h-{u}", shares=snap.shares.get(u, 1.0), created_at=0.0))
            s.add(Usage(user=u, device_seconds=snap.usage.get(u, 0.0), updated_at=now))
        for n in snap.nodes.values():
            s.add(Node(name=n.name, rack=n.rack, state="up", last_seen=now))
            s.flush()  # parents before children: the schema has foreign keys
            for i in range(n.devices):
                s.add(Device(node=n.name, index=i, healthy=True))
        for ds, shards in snap.shards.items():
            s.add(Dataset(name=ds, replicas_required=2, created_at=0.0))
            s.flush()
            for sh in shards:
                s.add(Shard(dataset=ds, index=sh.index, bytes=sh.bytes, sha256="0" * 64, samples=sh.samples))
                for n in snap.replicas.get((ds, sh.index), ()):
                    s.add(Replica(dataset=ds, shard=sh.index, node=n, state="healthy", updated_at=now))
        next_free = {n: 0 for n in snap.nodes}
        some_dataset = min(snap.shards)  # a running job's data set is not in the snapshot: any will do
        for r in snap.running:
            limit = math.ceil(r.end_by_s - now + 5.0)  # whole seconds, as a job.toml gives them
            started = r.end_by_s - limit  # at least 5 s ago, and started + limit ends where the simulator's does
            s.add(Job(id=r.id, name=f"job{r.id}", user=r.user, state=JobState.RUNNING, submitted_at=0.0,
                      pending_since=0.0, started_at=started, attempt=1,
                      spec=_spec(f"job{r.id}", sum(d for _, d in r.devices_by_node), 1, some_dataset, limit)))
            s.flush()
            rank = 0
            for node, devices in r.devices_by_node:
                for _ in range(devices):
                    s.add(Rank(job_id=r.id, attempt=1, rank=rank, node=node, devices=[next_free[node]],
                               state=RankState.RUNNING))
                    next_free[node] += 1
                    rank += 1
        for j in snap.pending:
            s.add(Job(id=j.id, name=f"job{j.id}", user=j.user, state=JobState.PENDING, submitted_at=j.submit_s,
                      pending_since=j.pending_since_s, locality_wait_since=j.waiting_since_s,
                      spec=_spec(f"job{j.id}", j.ranks, j.devices_per_rank, j.dataset, j.time_limit_s)))


@pytest.mark.parametrize("policy", ["twostage", "flow", "fifo"])
def test_simulator_and_server_decide_the_same_on_a_recorded_snapshot(tmp_path: Path, policy: str) -> None:
    sim_snap, sim_decision, cfg = _record_cycle(policy)
    db = Database(f"sqlite:///{tmp_path / 'gsched.db'}")
    db.upgrade()
    _store(db, sim_snap)
    with db.session() as s:
        server_snap = build_snapshot(s, sim_snap.now_s)
    # The server reads back exactly the world the simulator decided over ...
    assert server_snap.nodes == sim_snap.nodes
    assert server_snap.pending == sim_snap.pending
    assert sorted(server_snap.running, key=lambda r: r.id) == sorted(sim_snap.running, key=lambda r: r.id)
    assert dict(server_snap.usage) == dict(sim_snap.usage) and dict(server_snap.shares) == dict(sim_snap.shares)
    assert {k: v for k, v in server_snap.replicas.items() if v} == {k: v for k, v in sim_snap.replicas.items() if v}
    # ... its cycle's decide + bind (as run_cycle does) binds the same jobs to the same placements ...
    _, server_decision = decide(server_snap, cfg, get_arbiter(cfg.arbiter))  # as the cycle looks it up
    assert server_decision.bindings == sim_decision.bindings
    bound = []
    for job_id, cand in server_decision.bindings.items():
        with db.session() as s:
            if bind(s, sim_snap.now_s, job_id, cand):
                bound.append(job_id)
    assert sorted(bound) == sorted(sim_decision.bindings)
    # ... and the ranks it wrote sit on the nodes the simulator chose.
    with db.session() as s:
        for job_id, cand in sim_decision.bindings.items():
            ranks = sorted(s.query(Rank).filter(Rank.job_id == job_id, Rank.state == RankState.ASSIGNED),
                           key=lambda r: r.rank)
            assert tuple(r.node for r in ranks) == cand.rank_nodes
            assert s.get(Job, job_id).state == JobState.BOUND
    db.dispose()


# ------------------------------------------------------------------ (d) a real trace slice through the CLI


@pytest.mark.skipif(not (TRACES / "philly_500.csv").is_file(),
                    reason=f"{TRACES / 'philly_500.csv'} is missing (CI has ../shared/traces beside the clone)")
def test_gsched_simulate_on_philly_500(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "sim.png"
    out = json.loads(_json_run(["simulate", "--trace", str(TRACES / "philly_500.csv"), "--nodes", "32",
                                "--racks", "4", "--policy", "twostage,fifo", "--json", "--plot", str(plot),
                                "--data", "cache_gb=100"], capsys))
    assert [r["policy"] for r in out] == ["twostage", "fifo"]
    for r in out:
        assert tuple(r) == simmod.JSON_FIELDS
        assert r["jobs"] == 500
        assert 0 <= r["local_fraction"] <= 1 and 0 < r["jain"] <= 1 and 0 < r["utilization"] <= 1
        assert 0 < r["p50_jct_s"] <= r["p95_jct_s"] <= r["p99_jct_s"] and r["mean_queue_s"] >= 0
        assert r["makespan_s"] >= r["p99_jct_s"] and 0 <= r["cross_rack_bytes"] <= r["bytes_moved"]
        assert r["restarts"] == 0
    assert plot.stat().st_size > 10_000


def test_bad_inputs_are_messages_a_user_can_act_on(tmp_path: Path) -> None:
    with pytest.raises(simmod.BadRequest, match="--data: cannot read 'sets=4'"):
        DataSpec.parse("sets=4")
    with pytest.raises(simmod.BadRequest, match="rate must be a float"):
        FailureSpec.parse("rate=often")
    with pytest.raises(simmod.BadRequest, match="missing column"):
        simmod.load_trace(_headerless(tmp_path))
    with pytest.raises(simmod.BadRequest, match="unknown arbiter 'nope'"):
        simulate([TraceJob("a", 0, "u", 1, 1)], "nope")


def _headerless(tmp_path: Path) -> Path:
    p = tmp_path / "bad.csv"
    p.write_text("id,t\n1,2\n")
    return p


def test_wide_jobs_are_clipped_and_counted() -> None:
    r = simulate([TraceJob("wide", 0, "u", 64, 10), TraceJob("small", 0, "u", 1, 10)], "twostage",
                 ClusterSpec(nodes=2, devices_per_node=4, racks=1), DataSpec(datasets=1, shards=2))
    assert (r.jobs, r.clipped, r.unfinished) == (2, 1, 0)


def test_data_none_reads_nothing_and_moves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two nodes of 2 devices, one rack.  A (2 gpus, 100 s) at t=0 and B (2 gpus, 50 s) at t=5.
    # Without a data model nothing is staged, so no job pays a staging second: A runs 0 -> 100 on
    # one node, B is bound at the tick of t=10 on the other and runs 10 -> 60 (with data it would
    # stage 1 s first, as in the hand-worked schedule above).
    assert DataSpec.parse("none") == DataSpec(none=True) and DataSpec.parse(" None ").none
    trace = write_trace(tmp_path / "t.csv", [("A", 0, "u1", 2, 100), ("B", 5, "u2", 2, 50)])
    out = json.loads(_json_run(["simulate", "--trace", str(trace), "--nodes", "2", "--devices-per-node", "2",
                                "--racks", "1", "--policy", "twostage,fifo", "--json", "--data", "none"], capsys))
    for r in out:
        assert (r["bytes_moved"], r["cross_rack_bytes"], r["local_fraction"]) == (0, 0, 1.0)
        assert r["mean_jct_s"] == (100 + (60 - 5)) / 2  # A 100 s, B 55 s
    sim = Simulation(simmod.load_trace(trace), PolicyConfig(), ClusterSpec(2, 2, 1), DataSpec(none=True))
    assert sim.shards == {} and all(j.dataset is None for j in sim.jobs.values())


def test_simulate_reads_the_servers_policy_knobs_from_config(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # The hand-worked trace above with `[policy] locality_wait_s = 3600` (and jobs by age: each user's,
    # `shortest_first = false`, and tied ones, `tie_shortest_first = false`) from a gsched.toml: B waits
    # for n0000 until A ends (100 -> 150), then D
    # (150 -> 170) and C (170 -> 200): JCTs 100, 145, 188, 155.
    trace = write_trace(tmp_path / "tiny.csv", [("A", 0, "u1", 2, 100), ("B", 5, "u2", 2, 50),
                                                ("C", 12, "u1", 4, 30), ("D", 15, "u2", 1, 20)])
    args = ["simulate", "--trace", str(trace), "--nodes", "2", "--devices-per-node", "2", "--racks", "1",
            "--data", "datasets=1,shards=1,shard_mb=3125,replicas=1", "--cycle-s", "10", "--json"]
    toml = tmp_path / "gsched.toml"
    toml.write_text("[policy]\nlocality_wait_s = 3600\nshortest_first = false\ntie_shortest_first = false\n")
    [waited] = json.loads(_json_run([*args, "--config", str(toml)], capsys))
    assert waited["mean_jct_s"] == (100 + 145 + 188 + 155) / 4
    [default] = json.loads(_json_run(args, capsys))
    assert default["mean_jct_s"] != waited["mean_jct_s"]
    # a key the server would refuse is refused here too, named
    toml.write_text("[policy]\nlocality_wait = 3600\n")
    assert cli.main([*args, "--config", str(toml)]) == 2
    err = capsys.readouterr().err
    assert "--config" in err and "policy.locality_wait" in err and "unknown key" in err


def test_time_limits_as_users_write_them_are_rounded_over_estimates() -> None:
    # run time x factor, rounded up to the next usual limit; whole days past 30 days
    assert simmod.user_limit(1000, 1.0) == 1800  # 16.7 min -> 30 min
    assert simmod.user_limit(600, 1.5) == 900  # 15 min exactly
    assert simmod.user_limit(3 * 3600, 2.0) == 8 * 3600  # 6 h -> 8 h
    assert simmod.user_limit(20 * 3600, 1.3) == 2 * 86400  # 26 h -> 2 days
    assert simmod.user_limit(40 * 86400 + 1, 1.0) == 41 * 86400


def test_estimates_users_give_each_job_a_seeded_limit_at_least_its_run_time(tmp_path: Path) -> None:
    rows = [(f"j{i}", 10 * i, "u1" if i % 2 else "u2", 1 + i % 3, 50 + 997 * i) for i in range(40)]
    trace = simmod.load_trace(write_trace(tmp_path / "t.csv", rows), None)
    cluster, data = ClusterSpec(2, 4, 1), DataSpec(none=True)
    exact = Simulation(trace, PolicyConfig(), cluster, data)
    users = Simulation(trace, PolicyConfig(), cluster, data, seed=3, estimates="users")
    again = Simulation(trace, PolicyConfig(arbiter="backfill"), cluster, data, seed=3, estimates="users")
    other = Simulation(trace, PolicyConfig(), cluster, data, seed=4, estimates="users")
    assert all(j.limit_s is None for j in exact.jobs.values())
    limits = {i: j.limit_s for i, j in users.jobs.items()}
    for i, j in users.jobs.items():
        assert limits[i] is not None and limits[i] >= j.remaining_s  # over-estimates, never under
        assert limits[i] in simmod.USUAL_LIMITS_S or limits[i] % 86400 == 0
        assert limits[i] <= simmod.user_limit(j.remaining_s, 8.0)
    assert {i: j.limit_s for i, j in again.jobs.items()} == limits  # the same for every policy
    assert {i: j.limit_s for i, j in other.jobs.items()} != limits  # drawn from the seed
    # what the arbiters read: the declared limit while pending; the true remaining time with exact ones
    job = users.jobs[5]
    users._make_pending(job, 0.0)
    exact._make_pending(exact.jobs[5], 0.0)
    assert job.view is not None and job.view.time_limit_s == limits[5]
    assert exact.jobs[5].view is not None and exact.jobs[5].view.time_limit_s == exact.jobs[5].remaining_s
    # and, running, an end at its last start plus that limit
    job.bound_s, job.end_s = 100.0, 100.0 + job.remaining_s
    assert users._end_by(job, 200.0) == 100.0 + limits[5]
    with pytest.raises(simmod.BadRequest, match="--estimates"):
        Simulation(trace, PolicyConfig(), cluster, data, estimates="guess")
    # and the whole replay runs with them
    r = simulate(trace, "backfill", cluster, data, seed=3, estimates="users")
    assert r.unfinished == 0 and len(r.schedule) == len(rows)
