"""Prometheus text exposition of the server's state (``GET /metrics``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler import states as st
from scheduler.models import ClusterSample, Job, Node, Transfer


def render(s: Session, ctx: Any) -> str:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    now = ctx.clock.now()
    jobs = Gauge("gsched_jobs", "Jobs by state", ["state"], registry=reg)
    counts = dict(s.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    for state in sorted(st.TRANSITIONS):
        jobs.labels(state).set(counts.get(state, 0))
    phase = Gauge("gsched_cycle_phase_seconds", "Duration of the last cycle's phases", ["phase"], registry=reg)
    last = s.scalars(select(ClusterSample).order_by(ClusterSample.id.desc()).limit(1)).first()
    if last is not None:
        for name, value in sorted((last.durations or {}).items()):
            phase.labels(name).set(value)
    busy = Gauge("gsched_devices", "Devices by use", ["use"], registry=reg)
    busy.labels("busy").set(last.devices_busy if last else 0)
    busy.labels("total").set(last.devices_total if last else 0)
    age = Gauge("gsched_node_heartbeat_age_seconds", "Seconds since each node's last heartbeat", ["node", "state"],
                registry=reg)
    for n in s.scalars(select(Node)):
        age.labels(n.name, n.state).set(max(0.0, now - n.last_seen))
    moved = Gauge("gsched_bytes_staged", "Bytes moved between nodes", ["kind"], registry=reg)
    done = s.execute(select(Transfer.job_id.is_(None), func.sum(Transfer.bytes)).where(Transfer.state == "done")
                     .group_by(Transfer.job_id.is_(None))).all()
    for is_repl, total in done:
        moved.labels("replication" if is_repl else "staging").set(total or 0)
    from scheduler.views import share_rows

    fs = Gauge("gsched_fairshare_factor", "Fair-share factor per user", ["user"], registry=reg)
    for row in share_rows(s, now, ctx.settings.policy):
        fs.labels(row["user"]).set(row["factor"])
    decisions = Gauge("gsched_jobs_bound_total", "Jobs bound so far (attempts)", registry=reg)
    decisions.set(s.scalar(select(func.coalesce(func.sum(Job.attempt), 0))) or 0)
    return generate_latest(reg).decode()
