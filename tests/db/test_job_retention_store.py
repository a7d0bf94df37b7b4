"""The server's part of the agents' job retention, on a real database (SQLite and PostgreSQL, ``db``): a
heartbeat that lists the node's job directories is told which of those jobs ended, and how long ago."""

from __future__ import annotations

from scheduler.core.clock import FakeClock
from scheduler.server import service as svc
from scheduler.server.auth import Identity
from scheduler.server.heartbeat import process_heartbeat
from scheduler.store.db import Database
from tests.db.test_store import ALICE, SPEC, heartbeat, setup_cluster

ONE = {**SPEC, "resources": {"ranks": 1, "gpus_per_rank": 1}}


def test_a_heartbeat_listing_job_directories_learns_which_jobs_ended_and_how_long_ago(db: Database) -> None:
    clock = FakeClock(1000.0)
    setup_cluster(db, clock)
    with db.session() as s:
        done, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)
        waiting, _ = svc.submit_job(s, clock.now(), ALICE, ONE, None)
        svc.cancel_job(s, clock.now(), ALICE, done)  # pending: it ends at once, at t=1000
    with db.session() as s:
        hb = heartbeat("n1").model_copy(update={"job_dirs": [done, waiting, 999]})
        reply = process_heartbeat(s, clock.advance(3600), Identity("agent", "n1"), hb)
    # the cancelled job ended an hour ago; the pending one has not ended; job 999 is unknown: both kept
    assert reply["ended"] == [{"job_id": done, "ago_s": 3600.0}]
    with db.session() as s:  # a heartbeat that lists nothing is not answered
        assert "ended" not in process_heartbeat(s, clock.now(), Identity("agent", "n1"), heartbeat("n1"))
