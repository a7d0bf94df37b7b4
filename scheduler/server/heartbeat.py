"""An agent's heartbeat: what the node reports, and what the server answers.

Contract (called by ``POST /v1/agent/heartbeat`` with an agent identity bound to ``hb.node``):

* the node, its devices and (when ``hb.replicas`` is not None) its full shard inventory are upserted;
  a replica whose sha256 differs from the manifest is recorded ``corrupt``;
* each reported rank updates its row; a rank the server does not expect (stale attempt, cancelled or
  requeued job, node that was declared down) is answered with a kill;
* metrics, checkpoints, log text and transfer results are stored, only for ranks and transfers the
  server gave this node (an agent cannot write into another node's jobs);
* the jobs touched are re-derived from their ranks (``sync_job``);
* the reply lists the ranks the node must start or is still getting ready (idempotent: the agent
  starts those it does not have and updates the others; a rank it reports RUNNING needs nothing more
  and is left out, so a node in steady training costs the server a few queries per heartbeat, not a
  dozen per rank), the ranks to kill, and the replica copies to make.

Processing the same heartbeat twice is harmless: updates are absolute, and log text is keyed by offset.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from scheduler.core import arrays
from scheduler.core.diskfloor import floor_reason, under_floor
from scheduler.core.errors import Forbidden
from scheduler.core.lifecycle import (
    ACTIVE,
    RANK_FINAL,
    RANK_LIVE,
    JobState,
    NodeState,
    RankState,
    ReplicaState,
    TransferState,
    derive,
)
from scheduler.protocol.messages import (
    Assignment,
    DeleteOrder,
    Heartbeat,
    HeartbeatReply,
    Kill,
    Resume,
    ShardSource,
    TransferOrder,
)
from scheduler.protocol.peers import peer_host
from scheduler.server.auth import Identity
from scheduler.server.mirrors import mirror_peers
from scheduler.server.quiet import Settled
from scheduler.server.retention import ended_jobs
from scheduler.server.service import forget_cluster_limits, peer_key, record, requeue_job
from scheduler.store.effects import move
from scheduler.store.models import (
    Checkpoint,
    Dataset,
    Device,
    Job,
    LogChunk,
    Metric,
    Node,
    Rank,
    Replica,
    Shard,
    ShardAssignment,
    Transfer,
    User,
)

LIVE_RANK = RANK_LIVE
SHA256 = re.compile(r"[0-9a-f]{64}")
DROP_GRACE_S = 120.0  # how long a dropped copy the agent still lists is not taken back as a copy
MAX_RESUME = 8  # checkpoints an assignment names to resume from: the newest, then older ones to fall back on
IN_CHUNK = 500  # ids in one ``IN (...)`` list (SQLite's limit on bound parameters is far above)


def process_heartbeat(s: Session, now: float, who: Identity, hb: Heartbeat, failure_grace_s: float = 0.0,
                      single_team: bool = False, disk_floor_bytes: int = 0,
                      settled: Settled | None = None) -> dict[str, Any]:
    """``single_team``: the server's ``run_as_agent_user`` (a [run] job runs as the agent's account).
    ``disk_floor_bytes``: the server's disk floor; a node crossing it is recorded (``node.low_disk``,
    ``node.disk_ok``), and nodes under it are no mirror peers (``mirrors.mirror_peers``).  ``settled``: told what
    this heartbeat wrote of the node once it is committed (``scheduler.server.quiet``)."""
    if not who.is_agent or who.name != hb.node:
        raise Forbidden(f"this token may not report for node {hb.node!r}")
    node = s.get(Node, hb.node)
    restarted = False
    if node is None:
        node = Node(name=hb.node, rack=hb.rack, address=hb.address, state=NodeState.UP, incarnation=hb.incarnation,
                    last_seen=now)
        s.add(node)
        record(s, now, who.actor, "node.join", f"{hb.node} rack={hb.rack} devices={len(hb.devices)}", node=hb.node)
    else:
        restarted = node.incarnation != hb.incarnation
        if node.state != NodeState.UP:
            record(s, now, who.actor, "node.up", f"{hb.node} is back", node=hb.node)
            node.state = NodeState.UP
            node.down_since = None
        _assign(node, rack=hb.rack, address=hb.address, incarnation=hb.incarnation, last_seen=now)
    if under_floor(node.free_bytes, disk_floor_bytes) != under_floor(hb.free_bytes, disk_floor_bytes):
        low = under_floor(hb.free_bytes, disk_floor_bytes)
        record(s, now, who.actor, "node.low_disk" if low else "node.disk_ok",
               floor_reason(hb.free_bytes, disk_floor_bytes) if low else f"{hb.node}: free disk above the floor again",
               node=hb.node)
    _assign(node, free_bytes=hb.free_bytes)
    _devices(s, hb)
    if hb.replicas is not None:
        _inventory(s, now, hb)
    touched: set[int] = set()
    kill: list[dict[str, int]] = []
    jobs: dict[int, Job] = {}  # every job this heartbeat reads, loaded once and held for its length
    here = _ranks(s, now, hb, restarted, touched, kill, jobs)
    mine = _ranks_here(s, hb)
    _logs(s, hb, mine)
    _metrics(s, now, hb, touched, mine, jobs)
    _transfers(s, now, hb)
    _load_jobs(s, touched, jobs)
    synced = [jobs[j] for j in sorted(touched) if j in jobs]
    ranks = ranks_of(s, synced)
    for job in synced:
        sync_job(s, now, job, failure_grace_s, ranks[job.id])
    s.flush()
    out = _reply(s, hb.node, kill, here, single_team, jobs, disk_floor_bytes)
    if hb.job_dirs is not None:  # the agent's job retention asks which of its jobs' directories may go
        out["ended"] = ended_jobs(s, now, hb.job_dirs)
    if settled is not None:
        settled.after_commit(s, hb, {(r.job_id, r.attempt, r.rank): r.id for r in here if r.state == RankState.RUNNING})
    return out


def _assign(row: Any, **values: Any) -> None:
    """Set the attributes whose value differs.  Setting one to the value it has still marks the row
    dirty, and every flush of the batch (each query autoflushes) then went over the heartbeat's eight
    unchanged devices to find nothing to write: a third of a heartbeat's time."""
    for name, value in values.items():
        if getattr(row, name) != value:
            setattr(row, name, value)


def _load_jobs(s: Session, ids: Iterable[int], jobs: dict[int, Job]) -> None:
    """Add the jobs of ``ids`` not in ``jobs`` yet, read in one query.  Holding them in ``jobs`` keeps
    them in the session's identity map (which holds unchanged rows weakly), so none is read twice."""
    missing = sorted(set(ids) - set(jobs))
    for at in range(0, len(missing), IN_CHUNK):
        for job in s.scalars(select(Job).where(Job.id.in_(missing[at:at + IN_CHUNK]))):
            jobs[job.id] = job


def ranks_of(s: Session, jobs: Iterable[Job]) -> dict[int, list[Rank]]:
    """Each job's ranks of its current attempt (by rank), read in one query per ``IN_CHUNK`` jobs:
    what ``sync_job`` and the reply need, instead of a query per job."""
    by_id = {j.id: j for j in jobs}
    out: dict[int, list[Rank]] = {j: [] for j in by_id}
    ids = sorted(by_id)
    for at in range(0, len(ids), IN_CHUNK):
        for r in s.scalars(select(Rank).where(Rank.job_id.in_(ids[at:at + IN_CHUNK])).order_by(Rank.rank)):
            if r.attempt == by_id[r.job_id].attempt:
                out[r.job_id].append(r)
    return out


def _devices(s: Session, hb: Heartbeat) -> None:
    have = {d.index: d for d in s.scalars(select(Device).where(Device.node == hb.node))}
    seen = set()
    changed = False
    for d in hb.devices:
        seen.add(d.index)
        row = have.get(d.index)
        if row is None:
            s.add(Device(node=hb.node, index=d.index, kind=d.kind, model=d.model, memory_bytes=d.memory_bytes,
                         uuid=d.uuid, healthy=d.healthy, health=d.health))
            changed = True
        else:
            changed = changed or row.healthy != d.healthy
            _assign(row, kind=d.kind, model=d.model, memory_bytes=d.memory_bytes, healthy=d.healthy, uuid=d.uuid,
                    health=d.health)
    for idx, row in have.items():
        if idx not in seen:
            s.delete(row)
            changed = True
    if changed:
        forget_cluster_limits()


def _inventory(s: Session, now: float, hb: Heartbeat) -> None:
    assert hb.replicas is not None
    names = sorted({rep.dataset for rep in hb.replicas})
    manifest = {(d, i): (sha, size) for d, i, sha, size in s.execute(
        select(Shard.dataset, Shard.index, Shard.sha256, Shard.bytes).where(Shard.dataset.in_(names)))} if names else {}
    rows = {(r.dataset, r.shard): r for r in s.scalars(select(Replica).where(Replica.node == hb.node))}
    # copies the server dropped lately (lower R, a re-balance: an order with src == dst): the agent may
    # list one until it has acted on the order, and it must not come back as a copy meanwhile; unless a
    # copy was sent here since (the latest order for the shard here decides)
    dropped: dict[tuple[str, int], bool] = {}
    for d, i, src in s.execute(select(Transfer.dataset, Transfer.shard, Transfer.src).where(
            Transfer.dst == hb.node, Transfer.created_at > now - DROP_GRACE_S).order_by(Transfer.id)):
        dropped[(d, i)] = src == hb.node
    reported = set()
    for rep in hb.replicas:
        key = (rep.dataset, rep.shard)
        sh = manifest.get(key)
        if sh is None:
            continue  # a file the cluster does not know; left alone
        if key not in rows and dropped.get(key, False):
            continue
        reported.add(key)
        state = ReplicaState.HEALTHY if rep.sha256 == sh[0] and rep.bytes == sh[1] else ReplicaState.CORRUPT
        row = rows.get(key)
        if row is None:
            row = Replica(dataset=rep.dataset, shard=rep.shard, node=hb.node, state=state, updated_at=now)
            s.add(row)
        elif row.state != state:
            if state == ReplicaState.CORRUPT:
                record(s, now, f"agent:{hb.node}", "replica.corrupt", f"{rep.dataset}/{rep.shard} on {hb.node}: "
                       f"sha256 {rep.sha256[:12]} != {sh[0][:12]}", node=hb.node)
            row.state, row.updated_at = state, now
    for key, row in rows.items():
        if key not in reported and row.state != ReplicaState.STAGING:
            if row.state != ReplicaState.MISSING:
                row.state, row.updated_at = ReplicaState.MISSING, now


def _ranks(s: Session, now: float, hb: Heartbeat, restarted: bool, touched: set[int],
           kill: list[dict[str, int]], jobs: dict[int, Job]) -> list[Rank]:
    """Apply the reported ranks; returns the node's ranks that were not final before (the reply
    picks the live and the killing ones among them, so it need not read them again).  Their jobs are
    read into ``jobs`` in one query."""
    rows = {(r.job_id, r.attempt, r.rank): r
            for r in s.scalars(select(Rank).where(Rank.node == hb.node, Rank.state.not_in(RANK_FINAL)))}
    _load_jobs(s, {r.job_id for r in rows.values()}, jobs)
    reported = set()
    for rr in hb.ranks:
        key = (rr.job_id, rr.attempt, rr.rank)
        reported.add(key)
        row = rows.get(key)
        if row is None:
            if rr.state not in RANK_FINAL:
                kill.append({"job_id": rr.job_id, "attempt": rr.attempt, "rank": rr.rank})
            continue
        touched.add(row.job_id)
        if rr.log_tail:
            row.log_tail = rr.log_tail
        if row.state == RankState.KILLING:
            if rr.state in RANK_FINAL:
                row.state, row.exit_code, row.ended_at = RankState.KILLED, rr.exit_code, now
            else:
                kill.append({"job_id": rr.job_id, "attempt": rr.attempt, "rank": rr.rank})
            continue
        if rr.state == RankState.EXITED:
            row.state, row.exit_code, row.ended_at = RankState.EXITED, rr.exit_code, now
        elif rr.state == RankState.KILLED:
            row.state, row.exit_code, row.ended_at = RankState.KILLED, rr.exit_code, now
        else:
            row.state = RankState(rr.state)
            if rr.state == RankState.RUNNING and row.started_at is None:
                row.started_at = now
        job = jobs.get(row.job_id)
        if job is None:
            continue
        if rr.error:
            job.progress = {**(job.progress or {}), "error": rr.error}
            if rr.state == RankState.EXITED and rr.exit_code not in (0, None):
                row.log_tail = (row.log_tail + "\n" + rr.error)[-8192:]
        if (rr.state == RankState.EXITED and rr.failure in ("rendezvous", "fenced") and job.state in ACTIVE
                and job.attempt == row.attempt):
            # Not the job's fault: back to the queue (max_restarts bounds it), its retries untouched.
            requeue_job(s, now, job, f"{rr.error or rr.failure + ' failed'} (rank {row.rank} on {hb.node})")
            continue
        if rr.master_port and row.rank == 0 and job.attempt == row.attempt and job.master_port is None:
            job.master_port = rr.master_port
        if rr.staging_s and rr.staging_total:
            done = dict((job.progress or {}).get("staged_ranks", {}))
            if str(row.rank) not in done:
                done[str(row.rank)] = {"bytes": rr.staged_bytes, "seconds": rr.staging_s}
                job.progress = {**(job.progress or {}), "staged_ranks": done}
        if rr.state == RankState.STAGING and rr.staging_total:
            stage = dict((job.progress or {}).get("staging", {}))
            stage[str(row.rank)] = {"bytes": rr.staged_bytes, "total": rr.staging_total, "rate_bps": rr.staging_rate_bps}
            job.progress = {**(job.progress or {}), "staging": stage}
    # Ranks the agent no longer has: a restarted agent lost them, or they ended while unreported.
    for key, row in rows.items():
        if key in reported or row.state == RankState.ASSIGNED:
            continue
        if row.state == RankState.KILLING:
            row.state, row.ended_at = RankState.KILLED, now
        else:
            row.state, row.exit_code, row.ended_at = RankState.KILLED, None, now
            job = jobs.get(row.job_id)
            if job is not None and job.state in ACTIVE and job.attempt == row.attempt:
                why = "restarted" if restarted else "lost the rank"
                requeue_job(s, now, job, f"node {hb.node} {why} (rank {row.rank})")
        touched.add(row.job_id)
    return [rows[k] for k in sorted(rows)]


def _ranks_here(s: Session, hb: Heartbeat) -> set[tuple[int, int, int]]:
    """(job, attempt, rank) of every rank, in any state, that the server placed on this node and that
    this heartbeat mentions in its logs or metrics."""
    jobs = {c.job_id for c in hb.logs} | {m.job_id for m in hb.metrics}
    if not jobs:
        return set()
    q = select(Rank.job_id, Rank.attempt, Rank.rank).where(Rank.node == hb.node, Rank.job_id.in_(jobs))
    return {(j, a, r) for j, a, r in s.execute(q)}


def _logs(s: Session, hb: Heartbeat, mine: set[tuple[int, int, int]]) -> None:
    for chunk in hb.logs:
        if chunk.text and (chunk.job_id, chunk.attempt, chunk.rank) in mine:
            s.add(LogChunk(job_id=chunk.job_id, attempt=chunk.attempt, rank=chunk.rank, offset=0, text=chunk.text))


def _metrics(s: Session, now: float, hb: Heartbeat, touched: set[int], mine: set[tuple[int, int, int]],
             jobs: dict[int, Job]) -> None:
    attempts_here = {(j, a) for j, a, _ in mine}
    _load_jobs(s, {m.job_id for m in hb.metrics}, jobs)
    for m in hb.metrics:
        job = jobs.get(m.job_id)
        if job is None or m.attempt != job.attempt or (m.job_id, m.attempt) not in attempts_here:
            continue
        line = m.line
        kind = line.get("type")
        epoch = line.get("epoch")
        if kind == "epoch" and isinstance(epoch, int):
            s.execute(delete(Metric).where(Metric.job_id == job.id, Metric.epoch == epoch))
            s.add(Metric(job_id=job.id, attempt=m.attempt, epoch=epoch, data=line, time=now))
            job.progress = {**(job.progress or {}), "epoch": epoch}
        elif kind == "checkpoint" and isinstance(epoch, int):
            nodes = [hb.node] + [n for n in line.get("mirrors", []) if isinstance(n, str)]
            s.execute(delete(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.epoch == epoch))
            sha = line.get("sha256")
            s.add(Checkpoint(job_id=job.id, epoch=epoch, path=str(line.get("path", ""))[:512], nodes=nodes,
                             bytes=int(line.get("bytes", 0) or 0), created_at=now,
                             sha256=sha if isinstance(sha, str) and SHA256.fullmatch(sha) else ""))
            keep = job.parsed_spec.knobs.keep_checkpoints
            if keep > 0:  # the agents deleted the older files; their rows go too
                s.execute(delete(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.epoch <= epoch - keep))
        elif kind == "checkpoint_skipped" and isinstance(epoch, int):
            record(s, now, f"agent:{hb.node}", "checkpoint.skipped",
                   f"job {job.id} epoch {epoch} on {hb.node}: {str(line.get('reason', ''))[:300]}",
                   job_id=job.id, node=hb.node)
        elif kind == "progress":
            job.progress = {**(job.progress or {}), "train": {k: line.get(k) for k in ("epoch", "step", "steps")}}
        touched.add(job.id)


def _transfers(s: Session, now: float, hb: Heartbeat) -> None:
    for t in hb.transfers:
        row = s.get(Transfer, t.id)
        if row is None or row.dst != hb.node:
            continue
        row.state, row.reason = TransferState(t.state), t.reason
        if t.state == TransferState.RUNNING:
            row.done_bytes = t.bytes  # the bytes so far: `gsched data ls` shows the copy's progress
        if t.state in (TransferState.DONE, TransferState.FAILED):
            row.ended_at = now
        if t.state == TransferState.DONE:
            row.bytes = t.bytes
            node = s.get(Node, hb.node)
            if node is not None:
                node.staged_bytes += t.bytes


def sync_job(s: Session, now: float, job: Job, failure_grace_s: float = 0.0, ranks: list[Rank] | None = None) -> None:
    """Make the move an active job's ranks call for (``lifecycle.derive``: fail after ``failure_grace_s``,
    retry, complete, run, stage), if any.  Idempotent: the cycle calls it again for every active job,
    which settles a failure once its grace has passed.  ``ranks``: the job's ranks of its current
    attempt, when the caller read them already (``ranks_of``); else they are read here."""
    if job.state not in ACTIVE:
        return
    if ranks is None:
        ranks = list(s.scalars(select(Rank).where(Rank.job_id == job.id, Rank.attempt == job.attempt)))
    retries = job.parsed_spec.limits.retry_on_failure
    step = derive(job, ranks, now, failure_grace_s, retries)
    if step is None:
        return
    if step.to == JobState.PENDING:  # a retry: requeue_job adds what a requeue needs (max_restarts)
        requeue_job(s, now, job, step.reason, **step.context)
    else:
        move(s, now, job, step.to, step.reason, **step.context)


def _reads(s: Session, jobs: list[Job]) -> dict[tuple[int, int], list[ShardAssignment]]:
    """(job, rank) -> the rank's shard reads of the job's current attempt, by shard; one query."""
    attempt = {j.id: j.attempt for j in jobs}
    out: dict[tuple[int, int], list[ShardAssignment]] = {}
    if not attempt:
        return out
    for a in s.scalars(select(ShardAssignment).where(ShardAssignment.job_id.in_(sorted(attempt)))
                       .order_by(ShardAssignment.job_id, ShardAssignment.rank, ShardAssignment.shard)):
        if a.attempt == attempt[a.job_id]:
            out.setdefault((a.job_id, a.rank), []).append(a)
    return out


def _checkpoints(s: Session, job_ids: list[int]) -> dict[int, list[Checkpoint]]:
    """Job -> its ``MAX_RESUME`` newest checkpoints, newest first; one query."""
    out: dict[int, list[Checkpoint]] = {}
    if not job_ids:
        return out
    for c in s.scalars(select(Checkpoint).where(Checkpoint.job_id.in_(job_ids))
                       .order_by(Checkpoint.job_id, Checkpoint.epoch.desc())):
        newest = out.setdefault(c.job_id, [])
        if len(newest) < MAX_RESUME:
            newest.append(c)
    return out


def _resume(ckpt: Checkpoint, book: _NodeBook) -> Resume:
    return Resume(epoch=ckpt.epoch, path=ckpt.path, nodes=ckpt.nodes, sha256=ckpt.sha256,
                  addresses=[book.address(n) for n in ckpt.nodes])


class _NodeBook:
    """Addresses and states of the nodes a reply names, loaded by name as needed (one small query per
    batch of names), so a heartbeat never reads the whole node table."""

    def __init__(self, s: Session) -> None:
        self.s = s
        self.rows: dict[str, tuple[str, str]] = {}

    def load(self, names: set[str]) -> None:
        missing = {n for n in names if n and n not in self.rows}
        if missing:
            for name, address, state in self.s.execute(
                    select(Node.name, Node.address, Node.state).where(Node.name.in_(sorted(missing)))):
                self.rows[name] = (address, state)
            for n in missing:
                self.rows.setdefault(n, ("", "unknown"))

    def address(self, name: str) -> str:
        return self.rows.get(name, ("", ""))[0]

    def up(self, name: str) -> bool:
        return self.rows.get(name, ("", ""))[1] == NodeState.UP


def run_as(s: Session, job: Job, single_team: bool) -> str | None:
    """The Unix account a rank of ``job`` runs as (``Assignment.run_as``): None for the built-in and in
    single-team mode (the agent's own account), else the account mapped to the job's user, "" if none."""
    if job.parsed_spec.run is None or single_team:
        return None
    user = s.get(User, job.user)
    return user.unix_user if user is not None else ""


def _groups(ranks: list[Rank], node_name: str) -> tuple[int, int]:
    """(this node's index among the job's nodes, in the order of their lowest rank; how many nodes)."""
    order: list[str] = []
    for r in sorted(ranks, key=lambda x: x.rank):
        if r.node not in order:
            order.append(r.node)
    return (order.index(node_name) if node_name in order else 0), max(1, len(order))


def _reply(s: Session, node_name: str, kill: list[dict[str, int]], here: list[Rank],
           single_team: bool = False, jobs: dict[int, Job] | None = None,
           disk_floor_bytes: int = 0) -> dict[str, Any]:
    """The ``HeartbeatReply`` for this node, as its JSON body (``HeartbeatReply.wire``).

    ``kill``: the ranks ``_ranks`` found to kill (the node's KILLING ranks are added, each once).
    ``here``: the node's ranks not final before this heartbeat (``_ranks``), states as updated since.
    Under SQLite the transaction holds the write lock, so no rank is bound in the meantime; under
    PostgreSQL a rank bound between the two reads goes out with the node's next heartbeat.  Pending
    transfers to this node are marked running, and its delete orders done, as they are sent.
    ``jobs``: the jobs of ``here`` as read already (``_ranks``); read here when not given.

    What the assignments need is read once for all of them (each job's ranks, shard reads and newest
    checkpoints: a query each), not once per rank."""
    assignments = []
    live = [r for r in here if r.state in LIVE_RANK]
    book = _NodeBook(s)
    jobs = jobs if jobs is not None else {}
    _load_jobs(s, {r.job_id for r in live if r.state != RankState.RUNNING}, jobs)
    # Reported RUNNING by this very heartbeat: it has its port, shards and checkpoint, and is left out.
    todo = [(r, jobs[r.job_id]) for r in live if r.state != RankState.RUNNING and r.job_id in jobs
            and jobs[r.job_id].state in ACTIVE and jobs[r.job_id].attempt == r.attempt]
    ranks_by_job = ranks_of(s, {job.id: job for _, job in todo}.values())
    reads_by_rank = _reads(s, [job for _, job in todo if job.parsed_spec.dataset])
    ckpts_by_job = _checkpoints(s, sorted({job.id for _, job in todo}))
    datasets: dict[str, Dataset | None] = {}
    for r, job in todo:
        ranks = ranks_by_job[job.id]
        rank0 = next((x for x in ranks if x.rank == 0), None)
        reads = reads_by_rank.get((job.id, r.rank), [])
        name = job.parsed_spec.dataset
        if name and name not in datasets:
            datasets[name] = s.get(Dataset, name)
        dataset = datasets[name] if name else None
        wanted = {a.shard for a in reads}
        shas = {sh.index: sh.sha256 for sh in s.scalars(select(Shard).where(
            Shard.dataset == dataset.name, Shard.index.in_(sorted(wanted))))} if dataset and wanted else {}
        holders: dict[int, list[str]] = {}
        if dataset is not None and wanted:
            for shard, node in s.execute(select(Replica.shard, Replica.node).where(
                    Replica.dataset == dataset.name, Replica.state == ReplicaState.HEALTHY, Replica.shard.in_(sorted(wanted)))):
                holders.setdefault(shard, []).append(node)
        ckpts = ckpts_by_job.get(job.id, [])
        ckpt = ckpts[0] if ckpts else None
        spec = job.parsed_spec
        group_rank, group_world_size = _groups(ranks, node_name)
        book.load({rank0.node if rank0 else ""} | {a.source for a in reads}
                  | {n for ns in holders.values() for n in ns} | {n for c in ckpts for n in c.nodes})
        assignments.append(Assignment(
            job_id=job.id, attempt=job.attempt, rank=r.rank, local_rank=r.local_rank,
            world_size=len(ranks), local_world_size=sum(1 for x in ranks if x.node == node_name),
            devices=r.devices,
            master_addr=peer_host(book.address(rank0.node)) if rank0 else "",
            master_port=job.master_port,
            train=spec.knobs.model_dump(mode="json"),  # every knob, defaults filled
            run=spec.run.model_dump(mode="json") if spec.run is not None else None,
            run_as=run_as(s, job, single_team), user=job.user, dataset=spec.dataset or "",
            group_rank=group_rank, group_world_size=group_world_size,
            num_classes=dataset.classes if dataset else 10,
            env=arrays.env(job.array_job_id, job.array_index or 0, job.array_count or 1) if job.array_job_id else {},
            shards=[ShardSource(dataset=a.dataset, index=a.shard, sha256=shas.get(a.shard, ""), bytes=a.bytes,
                                source=a.source, source_address=book.address(a.source),
                                alternates=[book.address(n) for n in sorted(holders.get(a.shard, []))
                                            if n != a.source and book.up(n)])
                    for a in reads],
            resume=_resume(ckpt, book) if ckpt else None,
            resume_older=[_resume(c, book) for c in ckpts[1:]],
        ))
    kills = [Kill.model_validate(k) for k in kill]
    for r in (x for x in here if x.state == RankState.KILLING):
        item = Kill(job_id=r.job_id, attempt=r.attempt, rank=r.rank)
        if item not in kills:
            kills.append(item)
    transfers = []
    mine = list(s.scalars(select(Transfer).where(Transfer.dst == node_name,
                                                 Transfer.state.in_((TransferState.PENDING, TransferState.RUNNING, TransferState.DELETE)))
                          .order_by(Transfer.id)))
    pending = [t for t in mine if t.state != TransferState.DELETE]
    book.load({t.src for t in pending})
    for t in pending:
        sh = s.get(Shard, (t.dataset, t.shard))
        if sh is None:
            continue
        t.state = TransferState.RUNNING
        transfers.append(TransferOrder(id=t.id, dataset=t.dataset, shard=t.shard, sha256=sh.sha256, bytes=sh.bytes,
                                       source=t.src, source_address=book.address(t.src)))
    deletes = []
    for t in (x for x in mine if x.state == TransferState.DELETE):
        t.state = TransferState.DONE
        deletes.append(DeleteOrder(dataset=t.dataset, shard=t.shard))
    reply = HeartbeatReply(assignments=assignments, kill=kills, transfers=transfers, delete=deletes,
                           peer_key=peer_key(s),
                           # only a node running ranks has checkpoints to mirror
                           peers=mirror_peers(s, node_name, disk_floor_bytes) if live else None)
    return reply.wire()
