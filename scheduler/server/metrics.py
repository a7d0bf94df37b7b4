"""Observability reads of the server's state: Prometheus ``GET /metrics`` and the cluster history.

Who calls: the API (``/metrics``, unauthenticated like most exporters; ``/v1/cluster/history``).
Both are read-only and cheap (a handful of aggregate queries), so scraping every 15 s costs little.
Values that only grow (decisions, bytes staged, cycles) are counters; everything else is a gauge
of the current state.  Series (the ``_total`` suffix is added by the exposition format):

==========================================  ======================================================
``gsched_jobs{state}``                       jobs in each state (every state, 0 included)
``gsched_jobs_pending_by_reason{reason}``    pending jobs by their reason's kind (``PENDING_KINDS``)
``gsched_cycle_phase_seconds{phase}``        each phase's duration in the last cycle
``gsched_cycle_last_timestamp_seconds``      when the last cycle ran (alert when it stops moving)
``gsched_cycles_total``                      cycles recorded
``gsched_decisions_total{decision}``         bind and requeue decisions so far (from the event log)
``gsched_devices{use}``                      devices ``busy`` and ``total`` at the last cycle
``gsched_staged_bytes_total{kind}``          bytes copied between nodes: ``staging`` or ``replication``
``gsched_node_up{node}``                     1 while a node heartbeats, 0 once it is declared down
``gsched_node_heartbeat_age_seconds{node}``  seconds since each node's last heartbeat
``gsched_fairshare_factor{user}``            2^(-usage/shares), 1 for a user who used nothing
``gsched_fairshare_usage_device_seconds``    decayed usage per user
``gsched_fairshare_shares{user}``            configured shares per user
==========================================  ======================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.core.lifecycle import JobState, NodeState, TransferState
from scheduler.core.reasons import ReasonKind
from scheduler.server.views import share_rows
from scheduler.store.models import ClusterSample, Event, Job, Node, Transfer

DECISIONS = {"job.bind": "bind", "job.requeue": "requeue"}


PENDING_KINDS: tuple[ReasonKind, ...] = (
    ReasonKind.NEW, ReasonKind.DEVICES_BUSY, ReasonKind.LOCALITY_WAIT, ReasonKind.RESERVED, ReasonKind.TOO_LARGE,
    ReasonKind.DATA_MISSING, ReasonKind.QUEUE_ORDER, ReasonKind.REQUEUED, ReasonKind.PREEMPTED,
    ReasonKind.HELD, ReasonKind.DEPENDENCY, ReasonKind.OTHER)
"""The label values of ``gsched_jobs_pending_by_reason``: a few fixed kinds, so the series' cardinality
stays small and dashboards see stable series.  A pending job's kind is its reason's
(``explain["why"]["kind"]``, written with ``Job.reason``); a kind not listed here (``bind_failed``,
whose words the series counted as ``other`` before reasons were data) or none counts as ``other``."""


def pending_by_kind(s: Session) -> Counter[str]:
    """Pending jobs by the kind of their reason, folded into ``PENDING_KINDS``.  Reads the kind out of
    each pending job's explanation in SQL (one short string a job), never the reason's words."""
    kind = Job.explain[("why", "kind")].as_string()
    return Counter(k if k in PENDING_KINDS else ReasonKind.OTHER.value
                   for k in s.scalars(select(kind).where(Job.state == JobState.PENDING)))


def history_rows(s: Session, since: float | None, limit: int) -> list[dict[str, Any]]:
    """``GET /v1/cluster/history``: the latest ``limit`` cluster samples at or after ``since``, oldest first."""
    q = select(ClusterSample)
    if since is not None:
        q = q.where(ClusterSample.time >= since)
    rows = list(s.scalars(q.order_by(ClusterSample.time.desc(), ClusterSample.id.desc()).limit(limit)))
    return [{"time": r.time, "devices_total": r.devices_total, "devices_busy": r.devices_busy, "pending": r.pending,
             "running": r.running, "durations": r.durations or {}} for r in reversed(rows)]


def collect(s: Session, ctx: Any) -> Iterator[Any]:
    """The metric families, read from the database now (one consistent-enough look per scrape)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    now = ctx.clock.now()
    jobs = GaugeMetricFamily("gsched_jobs", "Jobs by state", labels=["state"])
    counts = dict(s.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    for state in sorted(JobState):
        jobs.add_metric([state], counts.get(state, 0))
    yield jobs

    why = GaugeMetricFamily("gsched_jobs_pending_by_reason", "Pending jobs by why they wait", labels=["reason"])
    kinds = pending_by_kind(s)
    for pending_kind in PENDING_KINDS:  # every kind, 0 included, so dashboards see stable series
        why.add_metric([pending_kind.value], kinds.get(pending_kind, 0))
    yield why

    last = s.scalars(select(ClusterSample).order_by(ClusterSample.id.desc()).limit(1)).first()
    phase = GaugeMetricFamily("gsched_cycle_phase_seconds", "Duration of each phase in the last cycle",
                              labels=["phase"])
    for name, value in sorted(((last.durations or {}) if last else {}).items()):
        phase.add_metric([name], float(value))
    yield phase
    yield GaugeMetricFamily("gsched_cycle_last_timestamp_seconds", "When the last cycle ran (Unix time)",
                            value=last.time if last else 0.0)
    yield CounterMetricFamily("gsched_cycles", "Scheduling cycles recorded",
                              value=s.scalar(select(func.count()).select_from(ClusterSample)) or 0)

    decisions = CounterMetricFamily("gsched_decisions", "Scheduling decisions so far", labels=["decision"])
    by_kind = dict(s.execute(select(Event.kind, func.count()).where(Event.kind.in_(DECISIONS))
                             .group_by(Event.kind)).all())
    for kind, label in sorted(DECISIONS.items(), key=lambda kv: kv[1]):
        decisions.add_metric([label], by_kind.get(kind, 0))
    yield decisions

    devices = GaugeMetricFamily("gsched_devices", "Devices at the last cycle", labels=["use"])
    devices.add_metric(["busy"], last.devices_busy if last else 0)
    devices.add_metric(["total"], last.devices_total if last else 0)
    yield devices

    moved = CounterMetricFamily("gsched_staged_bytes", "Bytes copied between nodes", labels=["kind"])
    done = dict(s.execute(select(Transfer.job_id.is_(None), func.sum(Transfer.bytes)).where(Transfer.state == TransferState.DONE)
                          .group_by(Transfer.job_id.is_(None))).all())
    moved.add_metric(["staging"], float(done.get(False) or 0))
    moved.add_metric(["replication"], float(done.get(True) or 0))
    yield moved

    up = GaugeMetricFamily("gsched_node_up", "1 while a node heartbeats, 0 once declared down", labels=["node"])
    age = GaugeMetricFamily("gsched_node_heartbeat_age_seconds", "Seconds since each node's last heartbeat",
                            labels=["node"])
    for n in s.scalars(select(Node).order_by(Node.name)):
        up.add_metric([n.name], 1 if n.state == NodeState.UP else 0)
        age.add_metric([n.name], max(0.0, now - n.last_seen))
    yield up
    yield age

    factor = GaugeMetricFamily("gsched_fairshare_factor", "Fair-share factor per user", labels=["user"])
    usage = GaugeMetricFamily("gsched_fairshare_usage_device_seconds", "Decayed usage per user", labels=["user"])
    shares = GaugeMetricFamily("gsched_fairshare_shares", "Shares per user", labels=["user"])
    for row in share_rows(s, now, ctx.settings.policy):
        factor.add_metric([row["user"]], row["factor"])
        usage.add_metric([row["user"]], row["usage"])
        shares.add_metric([row["user"]], row["shares"])
    yield factor
    yield usage
    yield shares


def render(s: Session, ctx: Any) -> str:
    """The Prometheus text exposition (format 0.0.4) of ``collect``."""
    from prometheus_client import CollectorRegistry, generate_latest

    families = list(collect(s, ctx))

    class _Snapshot:
        def collect(self) -> list[Any]:
            return families

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Snapshot())  # type: ignore[arg-type]
    return generate_latest(reg).decode()
