"""What the API does, over one database transaction at a time.

Every function takes an open ``Session`` and the caller's ``Identity``; permission checks happen
here (not in the routes) so every entry point obeys the same rules: anybody may read the queue, only
a job's owner or an admin may act on it.
"""

from __future__ import annotations

import secrets
import time
import weakref
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from scheduler.core import arrays
from scheduler.core import dependency as dep
from scheduler.core.diskfloor import floor_reason
from scheduler.core.errors import Conflict, Forbidden, NotFound, Unprocessable
from scheduler.core.jobspec import JobSpecError, validate_spec
from scheduler.core.lifecycle import (
    FINAL,
    RANK_FINAL,
    JobState,
    NodeState,
    ReplicaState,
    TransferState,
    gives_up,
)
from scheduler.core.reasons import Reason, ReasonKind
from scheduler.server.auth import AGENT_PREFIX, USER_PREFIX, Identity, hash_token, new_token
from scheduler.server.jobfilter import JobFilter
from scheduler.store.effects import move, record, record_at_commit
from scheduler.store.models import (
    AgentToken,
    Checkpoint,
    Dataset,
    Device,
    Event,
    Job,
    LogChunk,
    Metric,
    Node,
    Rank,
    Replica,
    Setting,
    Shard,
    ShardAssignment,
    Transfer,
    User,
)

USER_NAME_RE = r"^[a-z_][a-z0-9_-]{0,31}$"


def get_setting(s: Session, key: str, make: Any = None) -> str | None:
    row = s.get(Setting, key)
    if row is None and make is not None:
        row = Setting(key=key, value=make())
        s.add(row)
        s.flush()
    return row.value if row else None


_peer_keys: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def peer_key(s: Session) -> str:
    """The key of the tickets between nodes, made on first use.  It never changes once made, so it is
    kept per database once read back committed (every heartbeat's reply carries it: a query each)."""
    bind = s.get_bind()
    key = _peer_keys.get(bind)
    if key is not None:
        return key
    row = s.get(Setting, "peer_key")
    if row is None or s.info.get("peer_key_made"):  # made in this transaction: kept once another reads it
        s.info["peer_key_made"] = True
        return get_setting(s, "peer_key", make=lambda: secrets.token_hex(32)) or ""
    _peer_keys[bind] = row.value
    return row.value


# ---------------------------------------------------------------- identities


def authenticate(s: Session, token: str | None) -> Identity | None:
    if not token:
        return None
    h = hash_token(token)
    if token.startswith(USER_PREFIX):
        user = s.scalar(select(User).where(User.token_hash == h))
        if user is not None:
            return Identity("admin" if user.role == "admin" else "user", user.name)
    elif token.startswith(AGENT_PREFIX):
        at = s.scalar(select(AgentToken).where(AgentToken.token_hash == h))
        if at is not None:
            return Identity("agent", at.node)
    return None


def require_admin(who: Identity) -> None:
    if not who.is_admin:
        raise Forbidden("only an admin may do this")


def require_person(who: Identity) -> None:
    if who.is_agent:
        raise Forbidden("agent tokens cannot act as users")


def add_user(s: Session, now: float, who: Identity | None, name: str, shares: float, role: str = "user",
             unix_user: str = "") -> str:
    """Create a user; returns its token (shown once).  ``who`` None means bootstrap by the server.
    ``unix_user``: the account the user's [run] jobs run as on the nodes ("": none yet)."""
    import re

    if who is not None:
        require_admin(who)
    if not re.fullmatch(USER_NAME_RE, name):
        raise Unprocessable(f"name: {name!r} is not a valid user name (lowercase letters, digits, _ and -)", "name")
    if not (0 < shares <= 1e6):
        raise Unprocessable("shares: must be a number greater than 0", "shares")
    if role not in ("user", "admin"):
        raise Unprocessable("role: must be 'user' or 'admin'", "role")
    if s.get(User, name) is not None:
        raise Conflict(f"user {name!r} already exists")
    token = new_token(USER_PREFIX)
    s.add(User(name=name, token_hash=hash_token(token), shares=float(shares), role=role, created_at=now,
               unix_user=unix_user))
    record(s, now, who.actor if who else "server", "user.add", f"{name} shares={shares} role={role}"
           + (f" unix_user={unix_user}" if unix_user else ""))
    return token


def set_unix_user(s: Session, now: float, who: Identity, name: str, unix_user: str) -> None:
    """Map user ``name`` to the Unix account its [run] jobs run as ("" removes it); admins only.  Jobs
    already submitted run as the account mapped when their ranks start."""
    require_admin(who)
    user = s.get(User, name)
    if user is None:
        raise NotFound(f"no user {name!r}")
    user.unix_user = unix_user
    record(s, now, who.actor, "user.unix_user", f"{name} unix_user={unix_user or '(none)'}")


def set_shares(s: Session, now: float, who: Identity, name: str, shares: float) -> None:
    require_admin(who)
    user = s.get(User, name)
    if user is None:
        raise NotFound(f"no user {name!r}")
    if not (0 < shares <= 1e6):
        raise Unprocessable("shares: must be a number greater than 0", "shares")
    user.shares = float(shares)
    record(s, now, who.actor, "user.shares", f"{name} shares={shares}")


def remove_user(s: Session, now: float, who: Identity, name: str) -> None:
    require_admin(who)
    user = s.get(User, name)
    if user is None:
        raise NotFound(f"no user {name!r}")
    if user.role == "admin" and s.scalar(select(func.count()).select_from(User).where(User.role == "admin")) == 1:
        raise Conflict(f"{name!r} is the last admin: add another admin first (gsched user add NAME --admin)")
    s.delete(user)
    record(s, now, who.actor, "user.remove", name)


def list_users(s: Session, who: Identity) -> list[dict[str, Any]]:
    require_admin(who)
    return [{"name": u.name, "shares": u.shares, "role": u.role, "unix_user": u.unix_user}
            for u in s.scalars(select(User).order_by(User.name))]


def create_agent_token(s: Session, now: float, who: Identity, node: str) -> str:
    import re

    require_admin(who)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", node):
        raise Unprocessable(f"node: {node!r} is not a valid node name", "node")
    token = new_token(AGENT_PREFIX)
    s.add(AgentToken(node=node, token_hash=hash_token(token), created_at=now))
    record(s, now, who.actor, "agent-token.create", node, node=node)
    return token


# ---------------------------------------------------------------- jobs


_LIMITS_TTL_S = 2.0
_limits_cache: weakref.WeakKeyDictionary[Any, tuple[float, tuple[int, int]]] = weakref.WeakKeyDictionary()


def forget_cluster_limits() -> None:
    """Called when a heartbeat adds, removes or changes devices: the next submit recounts."""
    _limits_cache.clear()


def cluster_limits(s: Session) -> tuple[int, int]:
    """(most healthy devices on one node, healthy devices in the whole cluster), over known nodes.

    Counting 8,000 devices costs a few ms, more than the rest of a submit, so the answer is kept for
    ``_LIMITS_TTL_S`` per database and dropped at once when this process sees devices change; another
    server process on the same database sees a change at most that late."""
    key = s.get_bind()
    hit = _limits_cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < _LIMITS_TTL_S:
        return hit[1]
    per_node = (select(func.count().label("n")).where(Device.healthy.is_(True)).group_by(Device.node)).subquery()
    most, total = s.execute(select(func.max(per_node.c.n), func.sum(per_node.c.n))).one()
    value = (int(most or 0), int(total or 0))
    _limits_cache[key] = (time.monotonic(), value)
    return value


def _held(s: Session, row: Any) -> Any:
    """``row``, held by the session for its length: the identity map holds an unchanged row weakly, so
    that the next ``s.get`` of it in the same transaction (the next submit of a group commit naming
    the same data set) finds it without a query, where it read it again (and autoflushed first)."""
    if row is not None:
        s.info.setdefault("held", []).append(row)
    return row


SUBMITTED = Reason(ReasonKind.NEW, "submitted")  # a new job's reason until its first cycle


def submit_job(s: Session, now: float, who: Identity, spec_doc: Any, client_request_id: str | None,
               dependency: str | None = None, array: str | None = None,
               single_team: bool = False, non_preemptible: Sequence[str] = ()) -> tuple[int, bool]:
    """``stage_job``, flushed: (the job's id, created)."""
    job, created = stage_job(s, now, who, spec_doc, client_request_id, dependency, array, single_team,
                             non_preemptible)
    s.flush()
    return job.id, created


def stage_job(s: Session, now: float, who: Identity, spec_doc: Any, client_request_id: str | None,
              dependency: str | None = None, array: str | None = None,
              single_team: bool = False, non_preemptible: Sequence[str] = ()) -> tuple[Job, bool]:
    """Validate and add a job as PENDING.  Returns (the job, created).  Does no scheduling.

    The job is added, not flushed (an array's first job is: its id names the array): the submits of one
    group commit are written in one INSERT when it commits, and each job has its id from then on
    (``expire_on_commit`` is off).  Its ``job.submit`` event is written at commit too.

    With a ``client_request_id`` already used by this user, returns that job instead (idempotent retry),
    one of this transaction's not yet written included.  Two retries racing in two transactions: the
    unique (user, client_request_id) fails the second's commit; its group commit then runs each call
    alone (``WriteBatcher``), and the retry finds the first's job.
    ``dependency`` (sbatch's ``--dependency``) must name jobs that exist; the job is not scheduled until
    it is met (``upkeep.settle_dependencies``).  ``array`` (sbatch's ``--array``, ``0-9%4``) makes one job
    per index, the same but for it; the id returned is the first's, which is the array's id
    (``array_members`` lists them all).
    A ``[run]`` job is refused unless its user has a Unix account to run as, or ``single_team`` (the
    server's ``run_as_agent_user``) runs every job as the agents' account.  ``[limits] preemptible =
    false`` is for admins and the users ``non_preemptible`` names (the server's ``non_preemptible_users``;
    ``*``: everyone).
    """
    require_person(who)
    if client_request_id is not None:
        existing = next((j for j in s.new if isinstance(j, Job) and j.user == who.name
                         and j.client_request_id == client_request_id), None)
        if existing is None:
            with s.no_autoflush:  # this transaction's new jobs were looked at above
                existing = s.scalar(select(Job).where(Job.user == who.name, Job.client_request_id == client_request_id))
        if existing is not None:
            return existing, False
    try:
        spec = validate_spec(spec_doc)
    except JobSpecError as e:
        raise Unprocessable("invalid job spec: " + "; ".join(e.errors), e.errors[0].split(":")[0]) from None
    if spec.dataset is not None and _held(s, s.get(Dataset, spec.dataset)) is None:
        known = ", ".join(s.scalars(select(Dataset.name).order_by(Dataset.name))) or "none yet"
        raise Unprocessable(f"data.dataset: no data set {spec.dataset!r} (known: {known})", "data.dataset")
    if spec.run is not None and not single_team:
        user = s.get(User, who.name)
        if user is None or not user.unix_user:
            raise Unprocessable(f"run: user {who.name} has no Unix account to run a [run] job as: an admin maps "
                                f"one with `gsched user set {who.name} --unix-user ACCOUNT` (or runs the server "
                                f"in single-team mode, run_as_agent_user = true)", "run")
    if not spec.limits.preemptible and not who.is_admin and not {"*", who.name} & set(non_preemptible):
        raise Forbidden(f"limits.preemptible: user {who.name} may not opt out of preemption: an admin lists "
                        "the users who may in the server's non_preemptible_users", "limits.preemptible")
    per_node, total = cluster_limits(s)
    need = spec.resources.ranks * spec.resources.gpus_per_rank
    if spec.resources.gpus_per_rank > per_node:
        raise Unprocessable(f"resources.gpus_per_rank: {spec.resources.gpus_per_rank} devices per rank, but no node "
                            f"has more than {per_node}", "resources.gpus_per_rank")
    if need > total:
        raise Unprocessable(f"resources: the job needs {need} devices ({spec.resources.ranks} ranks x "
                            f"{spec.resources.gpus_per_rank}) but the cluster has {total}", "resources.ranks")
    try:
        indexes, max_running = arrays.parse(array) if array else ([], None)
    except ValueError as e:
        raise Unprocessable(f"array: {e}", "array") from None
    deps = _dependencies(s, dependency)
    why = SUBMITTED if not deps else Reason(ReasonKind.DEPENDENCY, f"waiting for dependency {dep.text(deps)}")
    job = Job(name=spec.name, user=who.name, spec=spec.model_dump(), state=JobState.PENDING, reason=why.text(),
              client_request_id=client_request_id, submitted_at=now, pending_since=now,
              explain={"why": why.as_dict()}, progress={}, dependency=[list(d) for d in deps] or None,
              deps_met=not deps)
    s.add(job)
    if indexes:
        s.flush()
        job.array_job_id, job.array_index, job.array_count = job.id, indexes[0], len(indexes)
        job.array_max_running = max_running
        for index in indexes[1:]:
            s.add(Job(name=job.name, user=job.user, spec=job.spec, state=JobState.PENDING, reason=job.reason,
                      submitted_at=now, pending_since=now, explain=dict(job.explain), progress={},
                      dependency=job.dependency, deps_met=job.deps_met, array_job_id=job.id, array_index=index,
                      array_count=len(indexes), array_max_running=max_running))
        s.flush()
    record_at_commit(s, now, who.actor, "job.submit", f"{spec.name}: {spec.resources.ranks}x{spec.resources.gpus_per_rank} on "
           f"{spec.dataset or 'no data'}" + (" (own command)" if spec.run else ""), job=job)
    return job, True


def array_members(s: Session, array_job_id: int) -> list[int]:
    """The ids of an array's jobs, by index (just ``[array_job_id]`` for a job that is no array's)."""
    ids = list(s.scalars(select(Job.id).where(Job.array_job_id == array_job_id).order_by(Job.array_index)))
    return ids or [array_job_id]


def _dependencies(s: Session, text: str | None) -> list[dep.Dependency]:
    """The parsed ``--dependency``, its jobs known to exist; 422 (field ``dependency``) otherwise."""
    if not text:
        return []
    try:
        deps = dep.parse(text)
    except ValueError as e:
        raise Unprocessable(f"dependency: {e}", "dependency") from None
    ids = sorted({job for _, job in deps})
    known = set(s.scalars(select(Job.id).where(Job.id.in_(ids))))
    missing = [i for i in ids if i not in known]
    if missing:
        raise Unprocessable(f"dependency: no job {', '.join(map(str, missing))}", "dependency")
    return deps


def get_job(s: Session, job_id: int) -> Job:
    job = s.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


def require_owner(job: Job, who: Identity) -> None:
    require_person(who)
    if not (who.is_admin or job.user == who.name):
        raise Forbidden(f"job {job.id} belongs to {job.user}; only its owner or an admin may do this")


def cancel_job(s: Session, now: float, who: Identity, job_id: int) -> str:
    """Cancel a job that has not ended (its owner or an admin): Conflict once it has."""
    job = get_job(s, job_id)
    require_owner(job, who)
    if job.state in FINAL:
        raise Conflict(f"job {job_id} is already {job.state}")
    move(s, now, job, JobState.CANCELLED, f"cancelled by {who.name}", actor=who.actor)
    return job.state


def finish_job(s: Session, now: float, job: Job, state: JobState, reason: str) -> None:
    """End a job COMPLETED, FAILED or TIMEOUT (``lifecycle.TABLE``): its live ranks are stopped."""
    move(s, now, job, state, reason)


def requeue_job(s: Session, now: float, job: Job, reason: str, retry: bool = False) -> None:
    """Put an active job back in the queue after losing a node; fail it past max_restarts, with the
    messages of its earlier requeues.  ``retry``: a retry after a rank failed (``lifecycle.derive``)."""
    max_restarts = job.parsed_spec.limits.max_restarts
    earlier: list[str] = []
    if gives_up(job.restarts, max_restarts):
        earlier = [e.message for e in s.scalars(select(Event).where(Event.job_id == job.id, Event.kind == "job.requeue")
                                                .order_by(Event.id))]
    move(s, now, job, JobState.PENDING, reason, max_restarts=max_restarts, earlier=earlier, retry=retry)


def queue_rows(s: Session, include_done: bool = False, where: JobFilter | None = None) -> list[dict[str, Any]]:
    """The jobs ``where`` picks (default: all, up to its limit, and one more to show there is a next
    page), not ended ones only unless ``include_done``; oldest id first, as ``job_summary`` writes them."""
    q = select(Job)
    if not include_done:
        q = q.where(Job.state.not_in(FINAL))
    jobs = list(s.scalars((where or JobFilter()).apply(q)))
    ids = [j.id for j in jobs]
    nodes_by_job: dict[tuple[int, int], set[str]] = defaultdict(set)
    if ids:
        for jid, attempt, node in s.execute(select(Rank.job_id, Rank.attempt, Rank.node).where(Rank.job_id.in_(ids))):
            nodes_by_job[(jid, attempt)].add(node)
    last_epoch: dict[int, int] = {}
    if ids:
        for jid, ep in s.execute(select(Metric.job_id, func.max(Metric.epoch)).where(Metric.job_id.in_(ids))
                                 .group_by(Metric.job_id)):
            last_epoch[jid] = ep
    return [job_summary(j, sorted(nodes_by_job.get((j.id, j.attempt), set())), last_epoch.get(j.id, 0))
            for j in jobs]


def pending_why(j: Job) -> dict[str, Any] | None:
    """A pending job's reason as data (``Reason.as_dict()``: kind, message, at_s, at_word), the same
    reason whose words are ``j.reason``; None for a job that is not pending (its explanation's reason
    is then a past one) or that has none stored."""
    if j.state != JobState.PENDING:
        return None
    why = (j.explain or {}).get("why")
    return why if isinstance(why, dict) else None


def job_summary(j: Job, nodes: list[str], epochs_done: int) -> dict[str, Any]:
    """One job as ``GET /v1/jobs`` lists it.  ``reason`` is its reason's words; for a pending job
    ``why`` is that reason as data (``pending_why``), and ``reason_kind`` and ``reason_at_s`` its kind
    and the scheduler time it names (None when not pending, or naming no time)."""
    spec = j.spec or {}
    res = spec.get("resources", {})
    why = pending_why(j)
    return {
        "id": j.id,
        "name": j.name,
        "user": j.user,
        "state": j.state,
        "ranks": res.get("ranks", 1),
        "gpus_per_rank": res.get("gpus_per_rank", 1),
        "dataset": (spec.get("data") or {}).get("dataset"),
        "nodes": nodes,
        "local_fraction": j.local_fraction,
        "transfer_bytes": j.transfer_bytes,
        "factor": j.factor,
        "priority": j.priority,
        "submitted_at": j.submitted_at,
        "pending_since": j.pending_since,
        "started_at": j.started_at,
        "ended_at": j.ended_at,
        "epochs": (spec.get("train") or {}).get("epochs", 0),
        "epochs_done": epochs_done,
        "restarts": j.restarts,
        "held_by": j.held_by,
        "dependency": dep.text(j.dependency) if j.dependency else None,
        "array_job_id": j.array_job_id,
        "array_index": j.array_index,
        "array_count": j.array_count,
        "time_limit_s": (spec.get("limits") or {}).get("time"),
        "reason": j.reason,
        "reason_kind": why["kind"] if why else None,
        "reason_at_s": why.get("at_s") if why else None,
        "why": why,
        "progress": j.progress or {},
    }


def job_detail(s: Session, job: Job, with_logs: bool = True) -> dict[str, Any]:
    """Everything about one job.  Without ``with_logs`` (a reader who is not its owner or an admin), the
    ranks' log tails are left out: only the owner and admins may read a job's output."""
    ranks = list(s.scalars(select(Rank).where(Rank.job_id == job.id, Rank.attempt == job.attempt).order_by(Rank.rank)))
    assigns = list(s.scalars(select(ShardAssignment).where(ShardAssignment.job_id == job.id,
                                                          ShardAssignment.attempt == job.attempt)
                             .order_by(ShardAssignment.rank, ShardAssignment.shard)))
    metrics = list(s.scalars(select(Metric).where(Metric.job_id == job.id).order_by(Metric.epoch, Metric.id)))
    by_epoch: dict[int, dict[str, Any]] = {}
    for m in metrics:  # the latest attempt's figure for an epoch wins
        by_epoch[m.epoch] = {"epoch": m.epoch, **{k: v for k, v in (m.data or {}).items() if k not in ("type", "epoch")}}
    ckpts = list(s.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.epoch)))
    events = list(s.scalars(select(Event).where(Event.job_id == job.id).order_by(Event.id).limit(200)))
    history = list(s.scalars(select(Rank).where(Rank.job_id == job.id).order_by(Rank.attempt, Rank.rank)))
    doc = job_summary(job, sorted({r.node for r in ranks}), max(by_epoch, default=0))
    doc.update({
        "spec": job.spec,
        "attempt": job.attempt,
        "ranks": [{"rank": r.rank, "node": r.node, "devices": r.devices, "state": r.state,
                   "exit_code": r.exit_code, "log_tail": r.log_tail if with_logs else ""} for r in ranks],
        "rank_count": job.parsed_spec.resources.ranks,
        "shards": [{"shard": a.shard, "rank": a.rank, "node": a.node, "source": a.source,
                    "local": a.source == a.node, "bytes": a.bytes, "staged_bytes": a.staged_bytes} for a in assigns],
        "metrics": [by_epoch[e] for e in sorted(by_epoch)],
        "checkpoints": [{"epoch": c.epoch, "path": c.path, "nodes": c.nodes, "bytes": c.bytes, "sha256": c.sha256}
                        for c in ckpts],
        "events": [{"time": e.time, "actor": e.actor, "kind": e.kind, "message": e.message} for e in events],
        "history": [{"attempt": r.attempt, "rank": r.rank, "node": r.node, "devices": r.devices, "state": r.state,
                     "exit_code": r.exit_code, "bound_at": r.bound_at, "started_at": r.started_at,
                     "ended_at": r.ended_at} for r in history],
        "explain": job.explain or {},
        "transfer_cost_ms": job.transfer_cost_ms,
        "master_port": job.master_port,  # the rendezvous port rank 0 listens on (this attempt)
    })
    return doc


def job_logs(s: Session, job: Job, rank: int | None, after_id: int = 0, limit: int = 2000) -> dict[str, Any]:
    q = select(LogChunk).where(LogChunk.job_id == job.id, LogChunk.id > after_id)
    if rank is not None:
        q = q.where(LogChunk.rank == rank)
    chunks = list(s.scalars(q.order_by(LogChunk.id).limit(limit)))
    return {"job": job.id, "state": job.state, "next": chunks[-1].id if chunks else after_id,
            "chunks": [{"rank": c.rank, "attempt": c.attempt, "text": c.text} for c in chunks]}


# ---------------------------------------------------------------- nodes and data


def node_rows(s: Session, disk_floor_bytes: int = 0) -> list[dict[str, Any]]:
    """``gsched nodes``: every node with its devices, shards and why it takes no new work: ``drained``
    (with ``drain_reason``) and ``low_disk``, the words of ``scheduler.core.diskfloor.floor_reason``
    when its reported free disk is under ``disk_floor_bytes`` ("" otherwise)."""
    busy: dict[str, int] = defaultdict(int)
    for node, devs in s.execute(select(Rank.node, Rank.devices).where(Rank.state.not_in(RANK_FINAL))):
        busy[node] += len(devs or [])
    devices: dict[str, list[Device]] = defaultdict(list)
    for d in s.scalars(select(Device).order_by(Device.node, Device.index)):
        devices[d.node].append(d)
    held: dict[str, int] = defaultdict(int)
    for node, count in s.execute(
            select(Replica.node, func.count()).where(Replica.state == ReplicaState.HEALTHY).group_by(Replica.node)):
        held[node] = count
    out = []
    for n in s.scalars(select(Node).order_by(Node.name)):
        healthy = sum(1 for d in devices[n.name] if d.healthy)
        out.append({
            "name": n.name, "rack": n.rack, "state": n.state, "address": n.address, "last_seen": n.last_seen,
            "drained": n.drained_at is not None, "drained_at": n.drained_at, "drain_reason": n.drain_reason,
            "devices": healthy, "devices_free": max(0, healthy - busy[n.name]) if n.state == NodeState.UP else 0,
            "device_kind": devices[n.name][0].kind if devices[n.name] else "",
            "device_model": devices[n.name][0].model if devices[n.name] else "",
            "shards": held[n.name], "staged_bytes": n.staged_bytes, "free_bytes": n.free_bytes,
            "low_disk": floor_reason(n.free_bytes, disk_floor_bytes),
            "unhealthy": [{"index": d.index, "uuid": d.uuid, "health": d.health or "unhealthy"}
                          for d in devices[n.name] if not d.healthy],
        })
    return out


def dataset_rows(s: Session) -> list[dict[str, Any]]:
    replicas: dict[tuple[str, int], list[dict[str, str]]] = defaultdict(list)
    up = {n.name for n in s.scalars(select(Node).where(Node.state == NodeState.UP))}
    for r in s.scalars(select(Replica).order_by(Replica.dataset, Replica.shard, Replica.node)):
        state = r.state if r.node in up or r.state != ReplicaState.HEALTHY else ReplicaState.MISSING
        replicas[(r.dataset, r.shard)].append({"node": r.node, "state": state})
    copies: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)  # copies under way, per shard
    for t in s.scalars(select(Transfer).where(Transfer.state.in_((TransferState.PENDING, TransferState.RUNNING)),
                                              Transfer.src != Transfer.dst).order_by(Transfer.id)):
        copies[(t.dataset, t.shard)].append({"src": t.src, "dst": t.dst, "state": t.state, "done_bytes": t.done_bytes,
                                             "bytes": t.bytes, "job_id": t.job_id})
    out: list[dict[str, Any]] = []
    for d in s.scalars(select(Dataset).order_by(Dataset.name)):
        shards: list[dict[str, Any]] = []
        for sh in s.scalars(select(Shard).where(Shard.dataset == d.name).order_by(Shard.index)):
            shards.append({"index": sh.index, "bytes": sh.bytes, "sha256": sh.sha256, "samples": sh.samples,
                           "replicas": replicas.get((d.name, sh.index), []),
                           "copies": copies.get((d.name, sh.index), [])})
        healthy_min = min((sum(1 for rep in sh["replicas"] if rep["state"] == ReplicaState.HEALTHY) for sh in shards), default=0)
        out.append({"name": d.name, "source": d.source, "classes": d.classes, "image_shape": d.image_shape,
                    "replicas_required": d.replicas_required, "span": d.span, "replicas_healthy_min": healthy_min,
                    "bytes": sum(sh["bytes"] for sh in shards), "samples": sum(sh["samples"] for sh in shards),
                    "shards": shards})
    return out


def transfer_rows(s: Session) -> list[dict[str, Any]]:
    """Bytes moved per node pair: staging for jobs and re-replication, finished transfers only."""
    q = (select(Transfer.src, Transfer.dst, Transfer.job_id.is_(None), func.count(), func.sum(Transfer.bytes))
         .where(Transfer.state == TransferState.DONE, Transfer.src != Transfer.dst)
         .group_by(Transfer.src, Transfer.dst, Transfer.job_id.is_(None)))
    return [{"src": src, "dst": dst, "kind": "replication" if repl else "staging", "transfers": n, "bytes": int(b or 0)}
            for src, dst, repl, n, b in s.execute(q)]


def delete_job_data(s: Session, job_id: int) -> None:  # used by tests that reset state
    for model in (Rank, ShardAssignment, Metric, Checkpoint, LogChunk, Transfer):
        s.execute(delete(model).where(model.job_id == job_id))  # type: ignore[attr-defined]
