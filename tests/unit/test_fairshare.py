"""Fair share: decay, normalisation, Slurm's classic factor, priority and queue order."""

import math

import pytest

from scheduler.core.fairshare import decay, factor, normalized_shares, order_key, priority, queue_order
from scheduler.core.policy_config import PolicyConfig
from tests.builders import cluster, job

DAY = 24 * 3600.0


@pytest.mark.parametrize(
    ("usage", "elapsed_s", "half_life_s", "expected"),
    [
        (100.0, 0.0, DAY, 100.0),
        (100.0, DAY, DAY, 50.0),  # one half-life
        (100.0, 2 * DAY, DAY, 25.0),  # two half-lives
        (100.0, 7 * DAY, 7 * DAY, 50.0),  # the default half-life, a week
    ],
)
def test_decay(usage: float, elapsed_s: float, half_life_s: float, expected: float) -> None:
    assert decay(usage, elapsed_s, half_life_s) == pytest.approx(expected)


def test_normalized_shares_with_default_share_for_unknown_users() -> None:
    # a=2, b=1, c=1 -> 2/4, 1/4, 1/4
    assert normalized_shares({"a": 2, "b": 1, "c": 1}) == {"a": 0.5, "b": 0.25, "c": 0.25}
    # d has no entry: default share 1 -> total 5: a=2/5, b=c=d=1/5
    assert normalized_shares({"a": 2, "b": 1, "c": 1}, ["d"])["d"] == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("user", "usage", "shares", "expected"),
    [
        # no usage at all: everybody 1.0
        ("alice", {}, {"alice": 1, "bob": 1}, 1.0),
        # U_norm = 30/40 = 0.75, S_norm = 0.5 -> 2^-1.5
        ("alice", {"alice": 30, "bob": 10}, {"alice": 1, "bob": 1}, 2**-1.5),
        # U_norm = 10/40 = 0.25, S_norm = 0.5 -> 2^-0.5
        ("bob", {"alice": 30, "bob": 10}, {"alice": 1, "bob": 1}, 2**-0.5),
        # usage exactly at share: U_norm = S_norm -> 0.5
        ("alice", {"alice": 20, "bob": 10}, {"alice": 2, "bob": 1}, 0.5),
        # carol has no shares entry: default 1 -> S_norm 1/2, U_norm 10/20 -> 0.5
        ("carol", {"alice": 10, "carol": 10}, {"alice": 1}, 0.5),
        # a user who used nothing gets 1.0 whatever the others did
        ("bob", {"alice": 1000}, {"alice": 1, "bob": 1}, 1.0),
        # zero shares and some usage: 0
        ("bob", {"alice": 10, "bob": 10}, {"alice": 1, "bob": 0}, 0.0),
    ],
)
def test_factor(user: str, usage: dict, shares: dict, expected: float) -> None:
    assert factor(user, usage, shares) == pytest.approx(expected)


def test_priority_combines_fairshare_and_age() -> None:
    cfg = PolicyConfig(fairshare_weight=1000, age_weight=100, age_max_s=1000)
    snap = cluster().usage(alice=10, bob=10).at(500).build()
    j = job(1, user="alice", submit_s=0)
    # factor: U_norm 0.5 / S_norm 0.5 -> 2^-1 = 0.5 -> 500; age 500/1000 -> 0.5 * 100 = 50
    assert priority(j, snap, cfg) == pytest.approx(550)
    # age saturates at 1.0: pending for 2000 s -> 500 + 100
    assert priority(j, cluster().usage(alice=10, bob=10).at(2000).build(), cfg) == pytest.approx(600)


def test_lower_usage_user_goes_first() -> None:
    snap = (
        cluster()
        .usage(alice=100, bob=0)
        .pending(job(1, user="alice", submit_s=0), job(2, user="bob", submit_s=10))
        .at(10)
        .build()
    )
    ordered, prios, factors = queue_order(snap, PolicyConfig())
    assert [j.id for j in ordered] == [2, 1]
    assert factors == {1: pytest.approx(2**-2), 2: 1.0}  # alice: U_norm 1 / S_norm 0.5
    assert prios[2] > prios[1]


def test_ties_break_by_submit_time_then_id() -> None:
    snap = (
        cluster()
        .pending(job(3, submit_s=5, pending_since_s=0), job(2, submit_s=5, pending_since_s=0))
        .pending(job(1, submit_s=9, pending_since_s=0))
        .build()
    )
    ordered, prios, _ = queue_order(snap, PolicyConfig())
    assert [j.id for j in ordered] == [2, 3, 1]  # equal priority: submit 5, 5, 9; then id 2 < 3
    assert ordered == sorted(snap.pending, key=lambda j: order_key(j, prios[j.id]))  # the order order_key states
    assert order_key(job(7), 1.5) == (-1.5, 0.0, 7)
    assert not math.isnan(priority(job(7), snap, PolicyConfig()))


def test_the_queue_orders_by_the_same_priority_that_priority_gives() -> None:
    snap = (
        cluster()
        .usage(alice=100, bob=10)
        .pending(job(1, user="alice", submit_s=0, pending_since_s=0), job(2, user="bob", submit_s=10, pending_since_s=500))
        .pending(job(3, user="carol", submit_s=20, pending_since_s=900))
        .at(3600)
        .build()
    )
    cfg = PolicyConfig(age_max_s=1800)
    ordered, prios, factors = queue_order(snap, cfg)
    by_user = {j.user: factors[j.id] for j in snap.pending}
    assert prios == {j.id: priority(j, snap, cfg, by_user) for j in snap.pending}  # exactly: one formula
    assert ordered == sorted(snap.pending, key=lambda j: order_key(j, prios[j.id]))


def test_the_queue_order_is_worked_out_once_per_snapshot_and_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    import scheduler.core.fairshare as fs

    calls: list[bool] = []
    real = fs._queue_order

    def counted(snapshot, cfg, shortest):  # type: ignore[no-untyped-def]
        calls.append(shortest)
        return real(snapshot, cfg, shortest)

    monkeypatch.setattr(fs, "_queue_order", counted)
    snap = (cluster().usage(alice=100, bob=0)
            .pending(job(1, user="alice", submit_s=0), job(2, user="bob", submit_s=10), job(3, user="bob", submit_s=20))
            .at(30).build())
    cfg = PolicyConfig()
    first = queue_order(snap, cfg)
    first[0].reverse()  # a caller's own copy: changing it changes nothing for the next one
    first[1].clear()
    again = queue_order(snap, PolicyConfig())  # an equal config: the same order, not worked out again
    assert calls == [False]
    assert [j.id for j in again[0]] == [2, 3, 1] and set(again[1]) == {1, 2, 3}
    assert again == real(snap, cfg, False)
    queue_order(snap, cfg, shortest=True)  # another question: worked out
    queue_order(snap, PolicyConfig(age_max_s=1.0))  # another config: worked out
    assert calls == [False, True, False]
    other = cluster().usage(alice=0, bob=100).pending(job(1, user="alice"), job(2, user="bob")).at(30).build()
    assert [j.id for j in queue_order(other, cfg)[0]] == [1, 2]  # another snapshot: its own order
    assert len(calls) == 4
    kept = len(fs._orders)
    del snap, other, first, again
    gc.collect()
    assert len(fs._orders) == kept - 2  # the entries go with their snapshots
