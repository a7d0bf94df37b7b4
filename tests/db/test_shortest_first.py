"""Each user's own jobs shortest first (``[policy] shortest_first``) through the server's cycle, on
SQLite and PostgreSQL alike: the time limit of job.toml (``limits.time``) reaches the arbiter, the
short job of a user takes the devices before the same user's older long one, the stored priorities
follow the order, and lowering a pending job's limit (``gsched update ID --time 30m``) moves it
ahead of its owner's others.  Across users, tied jobs that read locally go smallest first too
(``[policy] tie_shortest_first``), and ``gsched explain`` counts the jobs of a lower priority ahead."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core.clock import FakeClock
from scheduler.core.policy_config import PolicyConfig
from scheduler.server import jobcontrol
from scheduler.server import service as svc
from scheduler.server.auth import Identity
from scheduler.server.config import Settings
from scheduler.server.cycle import run_cycle
from scheduler.store.db import Database
from scheduler.store.models import Job
from tests.db.test_store import ALICE, SPEC, setup_cluster


def settings(**policy) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(heartbeat_ttl_s=1e9, policy=replace(PolicyConfig(locality_wait_s=0), **policy))


def _submit(db: Database, clock: FakeClock, limit: str) -> int:
    with db.session() as s:
        job_id, _ = svc.submit_job(s, clock.advance(1), ALICE, {**SPEC, "limits": {"time": limit}}, None)
    return job_id


def test_by_age_a_users_older_long_job_starts_first(db: Database) -> None:
    # Two nodes of one device; each job has 2 ranks, so one job fills the cluster.
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    long_job = _submit(db, clock, "2d")
    _submit(db, clock, "10m")
    # By age the long one goes first (its priority is higher: it has waited a second longer).  Both
    # read d locally and tie, so the tie's smallest-first rule is turned off too.
    assert run_cycle(db, settings(shortest_first=False, tie_shortest_first=False), clock.advance(1)).bound == [long_job]


def test_by_default_the_short_job_goes_first_and_takes_the_older_ones_priority(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    long_job = _submit(db, clock, "2d")
    short_job = _submit(db, clock, "10m")
    report = run_cycle(db, settings(), clock.advance(1))
    assert report.bound == [short_job]
    with db.read() as s:
        waiting = s.get(Job, long_job)
        assert waiting.state == "PENDING" and waiting.explain["queue_position"] == 2  # of 2, 1-based
        # the places' priorities: the older job's (a second more of age) went to the short one
        started = s.get(Job, short_job)
        assert started.priority is not None and waiting.priority is not None
        assert started.priority > waiting.priority
        # explain: one of alice's jobs was ahead of it (the short one, newer), none older
        assert (waiting.explain["own_ahead"], waiting.explain["own_older"]) == (1, 0)
        # the short job took the older one's place and priority: no job of a lower priority is ahead
        assert waiting.explain["lower_ahead"] == 0


def test_lowering_a_pending_jobs_time_limit_moves_it_ahead_of_its_owners_others(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    first = _submit(db, clock, "4h")
    second = _submit(db, clock, "8h")
    with db.session() as s:
        jobcontrol.update_job(s, clock.now(), ALICE, second, None, 1800)
    assert run_cycle(db, settings(), clock.advance(1)).bound == [second]
    with db.read() as s:
        assert s.get(Job, first).state == "PENDING"


def test_own_jobs_ahead_counts_a_users_jobs_ahead_in_the_order_and_older() -> None:
    from scheduler.server.report import own_jobs_ahead
    from tests.builders import cluster, job
    snap = (cluster().node("n1")
            .pending(job(1, submit_s=0), job(2, user="bob", submit_s=1), job(3, submit_s=2), job(4, submit_s=3))
            .build())
    # alice's jobs 1, 3, 4 (oldest first); bob's 2.  Order 4, 2, 1, 3: job 4 went first of alice's.
    assert own_jobs_ahead([4, 2, 1, 3], snap) == {4: (0, 2), 2: (0, 0), 1: (1, 0), 3: (2, 1)}
    # in age order nobody has more of their own jobs ahead than older
    assert all(a == o for a, o in own_jobs_ahead([1, 2, 3, 4], snap).values())


def test_lower_ahead_counts_the_jobs_of_a_lower_priority_ahead_of_each() -> None:
    import random

    from scheduler.server.report import lower_ahead

    prios = {1: 9.0, 2: 7.0, 3: 7.0, 4: 5.0, 5: 1.0}
    assert lower_ahead([1, 2, 3, 4, 5], prios) == dict.fromkeys(range(1, 6), 0)  # by priority: nobody
    # 5 (the job pending past max_wait_s, say) went first; 4 passed 2 and 3 in a tie
    assert lower_ahead([5, 1, 4, 2, 3], prios) == {5: 0, 1: 1, 4: 1, 2: 2, 3: 2}  # equals do not pass
    rng = random.Random(7)
    for _ in range(200):  # against counting pairs one by one
        n = rng.randrange(1, 30)
        p = {j: float(rng.randrange(6)) for j in range(n)}
        order = rng.sample(range(n), n)
        assert lower_ahead(order, p) == {j: sum(p[k] < p[j] for k in order[:i]) for i, j in enumerate(order)}


@pytest.mark.parametrize("tie_shortest_first", [True, False])
def test_a_tied_users_smaller_local_job_goes_before_another_users_older_long_one(
        db: Database, tie_shortest_first: bool) -> None:
    # alice and bob have used nothing (factor 1.0 each), so alice's 2-day job and bob's 10-minute job,
    # submitted a second later, tie; both read d locally on either node and each fills the cluster.
    # Bob's, the smaller, goes first; with tie_shortest_first off, alice's, the older, does.
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    with db.session() as s:
        svc.add_user(s, clock.now(), None, "bob", 1)
    long_job = _submit(db, clock, "2d")
    with db.session() as s:
        short_job, _ = svc.submit_job(s, clock.advance(1), Identity("user", "bob"),
                                      {**SPEC, "limits": {"time": "10m"}}, None)
    report = run_cycle(db, settings(tie_shortest_first=tie_shortest_first), clock.advance(1))
    assert report.bound == ([short_job] if tie_shortest_first else [long_job])
    waiting = long_job if tie_shortest_first else short_job
    with db.read() as s:
        assert s.get(Job, waiting).state == "PENDING" and s.get(Job, waiting).explain["queue_position"] == 2
        # explain: bob's job, a second younger (a lower priority), passed alice's only through the tie
        assert s.get(Job, waiting).explain["lower_ahead"] == (1 if tie_shortest_first else 0)
