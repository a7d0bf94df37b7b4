"""Phase 6 of the cycle, preempt (with ``[policy] preempt`` on): the server acts on the arbiter layer's
plan (``policies.preemption.plan_preemptions``, a pure function of the cycle's snapshot).

Each victim goes back to PENDING at once (``lifecycle`` requeue with ``preempted_for``): its ranks are
stopped as a cancel's are (SIGTERM to each rank's process group, SIGKILL after the job's ``grace_s``;
the built-in writes its checkpoints at epoch ends and stops at the next step), it keeps its age and its
restarts, its reason is "preempted for job N", and it resumes from its newest checkpoint when it runs
again.  Each victim's ``job.preempt`` event names the preemptor and the work it loses; the preemptor's
``job.preempting`` event names the victims and why (``gsched explain`` shows it while it waits).

The preemptor is bound by a later cycle, once the victims' ranks have exited and their devices are free;
meanwhile the plan counts those devices as free (``RunningView.stopping``), so nothing more is taken
for it.  A victim that is no longer active when the phase runs (it ended or was cancelled since the
snapshot) is skipped.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from policies.preemption import Preemption, devices, lost_work_s
from scheduler.core.lifecycle import ACTIVE, PREEMPTING_EVENT, JobState
from scheduler.core.snapshot import Snapshot
from scheduler.store.effects import move, record
from scheduler.store.models import Job


def act_on_preemptions(s: Session, snap: Snapshot, plans: list[Preemption]) -> dict[int, dict[str, Any]]:
    """Preempt each plan's victims at ``snap.now_s``.  Returns, by preemptor, what was done:
    ``{"victims": [{"job", "user", "devices", "lost_s"}], "lost_device_s", "why"}``, the victims being
    those actually preempted (a plan none of whose victims is still active is left out)."""
    now = snap.now_s
    running = {r.id: r for r in snap.running}
    out: dict[int, dict[str, Any]] = {}
    for p in plans:
        taken: list[dict[str, Any]] = []
        for victim_id in p.victims:
            job = s.get(Job, victim_id)
            r = running.get(victim_id)
            if job is None or r is None or job.state not in ACTIVE:
                continue
            lost = lost_work_s(r, now)
            held = devices(r)
            since = "its last checkpoint" if r.checkpoint_s is not None else "it started"
            move(s, now, job, JobState.PENDING,
                 f"for job {p.job}: loses {lost:.0f} s of work on {held} device(s) since {since}",
                 max_restarts=job.restarts, preempted_for=p.job)
            taken.append({"job": victim_id, "user": r.user, "devices": held, "lost_s": round(lost, 1)})
        if not taken:
            continue
        lost_ds = sum(float(v["lost_s"]) * int(v["devices"]) for v in taken)
        out[p.job] = {"victims": taken, "lost_device_s": round(lost_ds, 1), "why": p.why}
        names = ", ".join(f"job {v['job']}" for v in taken)
        record(s, now, "server", PREEMPTING_EVENT, f"preempted {names}: {p.why}", job_id=p.job)
    return out
