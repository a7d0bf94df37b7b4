"""``gsched fetch JOB``: what the CLI needs to save a job's final checkpoint, metrics and logs before the
nodes' job retention removes them (``gsched agent --job-retention``).

The checkpoint is read from a node's data server with a *fetch* ticket: an HMAC over ``("fetch", job,
file, time)``, good for 5 minutes, that the data servers take for reading that one file only (not for
writing it, as the agents' ``ckpt`` tickets also allow).  The logs come from ``GET
/v1/jobs/{id}/logs``, as ``gsched logs`` reads them.  The route lets the job's owner and admins only.
"""

from __future__ import annotations

import time
from pathlib import PurePosixPath
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.core.lifecycle import NodeState
from scheduler.protocol.tickets import ticket
from scheduler.server.service import peer_key
from scheduler.store.models import Checkpoint, Job, Metric, Node


def fetch_manifest(s: Session, job: Job) -> dict[str, Any]:
    """The job's final checkpoint (its newest recorded, by epoch) with one fetch ticket per up node
    holding it, in the order recorded (the writer first), or None when it has none; and every metric
    line the job reported, oldest first.  Reads only; tickets are made fresh on each call."""
    ck = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id)
                   .order_by(Checkpoint.epoch.desc(), Checkpoint.id.desc()).limit(1)).first()
    checkpoint = None
    if ck is not None:
        name = PurePosixPath(ck.path).name
        up = dict(s.execute(select(Node.name, Node.address).where(Node.state == NodeState.UP)).all())
        key, ts = peer_key(s), int(time.time())  # the data servers check a ticket's age with their own clocks
        checkpoint = {"epoch": ck.epoch, "name": name, "bytes": ck.bytes, "sha256": ck.sha256,
                      "sources": [{"node": n, "address": up[n], "time": ts, "ticket": ticket(key, "fetch", job.id, name, ts)}
                                  for n in dict.fromkeys(ck.nodes or ()) if n in up]}
    metrics = [dict(m.data or {}) | {"attempt": m.attempt} for m in
               s.scalars(select(Metric).where(Metric.job_id == job.id).order_by(Metric.id))]
    return {"job": job.id, "state": job.state, "checkpoint": checkpoint, "metrics": metrics}
