"""Preemption on a real cluster (``[policy] preempt``): alice fills both agents with a long DDP job;
bob, under his share, submits; once bob's job has waited ``preempt_after_s`` the cycle preempts alice's
job (SIGTERM, the built-in stops at the next step), bob's job runs, and alice's job resumes from its
newest checkpoint and completes, with no epoch trained twice but the one that was interrupted."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from sqlalchemy import select

from scheduler.cli.localcluster import NodeSpec
from scheduler.store.db import Database
from scheduler.store.models import Metric
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration

PREEMPT_AFTER_S = 3.0
GRACE_S = 10.0  # the built-in's grace between SIGTERM and SIGKILL (agents.launcher)
SLACK_S = 15.0  # cycles (0.5 s), heartbeats (0.5 s), a rank's start and a loaded 2-core machine


def test_a_job_under_its_share_preempts_one_over_it_and_the_victim_resumes_from_its_checkpoint(
        make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    config = tmp_path / "gsched.toml"
    config.write_text(f"[policy]\npreempt = true\npreempt_after_s = {PREEMPT_AFTER_S}\nmin_runtime_s = 1\n"
                      "locality_wait_s = 0\n")
    c = make_cluster([NodeSpec("n1"), NodeSpec("n2")], ttl_s=6.0, config=str(config)).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "2")
    alice, bob = c.add_user("alice"), c.add_user("bob")
    long_spec, short_spec = tmp_path / "long.toml", tmp_path / "short.toml"
    # "long": its limit is 3 days.  (With the default 10 minutes it would be a wide job, 2 devices against
    # alice's part of 1, short enough for preempt_wide_window_s, which the factor rule does not take:
    # tests/db/test_preempt_cycle.py.)
    long_spec.write_text(job_toml("long", ranks=2, epochs=16, extra="seed = 3", limits='time = "3d"'))
    short_spec.write_text(job_toml("short", ranks=1, epochs=1, extra="checkpoint = false"))

    victim = int(c.cli("submit", str(long_spec), token=alice).stdout.split()[-1])
    # alice holds both devices and has a checkpoint to resume from
    c.wait_for(lambda: c.job(victim)["checkpoints"], 180, "alice's first checkpoint")
    preemptor = int(c.cli("submit", str(short_spec), token=bob).stdout.split()[-1])

    doc = c.wait_job(preemptor, {"COMPLETED", "FAILED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    submitted = doc["submitted_at"]
    bound = next(e["time"] for e in doc["events"] if e["kind"] == "job.bind")
    preempting = [e for e in doc["events"] if e["kind"] == "job.preempting"]
    assert len(preempting) == 1 and f"job {victim}" in preempting[0]["message"], doc["events"]
    assert "under their share" in preempting[0]["message"]

    mid = c.job(victim)
    preempts = [e for e in mid["events"] if e["kind"] == "job.preempt"]
    assert len(preempts) == 1, mid["events"]
    at = preempts[0]["time"]
    assert f"for job {preemptor}" in preempts[0]["message"] and "since its last checkpoint" in preempts[0]["message"]
    # Not before bob's job had waited preempt_after_s, and soon after; bob's job was bound within
    # the victim's grace (plus cycles and heartbeats) of the preemption, and RUNNING within
    # preempt_after_s + grace_s (plus cycles, heartbeats and its rank's start).
    assert submitted + PREEMPT_AFTER_S <= at <= submitted + PREEMPT_AFTER_S + SLACK_S, (submitted, at)
    assert at <= bound <= at + GRACE_S + SLACK_S, (at, bound)
    assert bound <= doc["started_at"] <= submitted + PREEMPT_AFTER_S + GRACE_S + SLACK_S, (submitted, doc)

    # alice's job went back to the queue keeping its age and restarts, and then completed.
    final = c.wait_job(victim, {"COMPLETED", "FAILED"}, timeout=300)
    assert final["state"] == "COMPLETED", final["reason"]
    assert final["restarts"] == 0 and final["attempt"] == 2
    assert final["pending_since"] < submitted  # its age counts from its own submit, not the preemption
    # It resumed from a checkpoint (its second attempt's first epoch is past 1), and no epoch was
    # trained twice but possibly the one the preemption interrupted.
    db = Database(f"sqlite:///{c.home / 'gsched.db'}")
    with db.read() as s:
        rows = list(s.execute(select(Metric.attempt, Metric.epoch).where(Metric.job_id == victim)
                              .order_by(Metric.id)))
    epochs_of = {a: sorted({e for att, e in rows if att == a}) for a in (1, 2)}
    assert epochs_of[1] and epochs_of[2] and epochs_of[2][0] > 1, epochs_of
    assert set(epochs_of[1]) | set(epochs_of[2]) == set(range(1, 17))
    twice = [e for e, n in Counter(e for _, e in {(a, e) for a, e in rows}).items() if n > 1]
    assert len(twice) <= 1 and all(e == epochs_of[1][-1] for e in twice), epochs_of

    # explain shows the preemption to bob while his job waits (checked through the event the
    # explanation reads); the events list records each preemption and the work it lost.
    events = json.loads(c.cli("events", "--json").stdout)
    assert any(e["kind"] == "job.preempt" and "loses" in e["message"] for e in events)
