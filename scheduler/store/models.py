"""The database schema (SQLAlchemy 2.0).  Alembic migrations in ``migrations/`` are the only way it changes.

Every piece of cluster state lives here, so a server restart loses nothing.  Times are UNIX seconds
(float) taken from the server's ``Clock``; JSON columns hold small, schema-checked documents.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from scheduler.core.jobspec import JobSpec, stored
from scheduler.core.lifecycle import NodeState, ReplicaState, TransferState


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    shares: Mapped[float] = mapped_column(Float, default=1.0)
    role: Mapped[str] = mapped_column(String(16), default="user")  # user | admin
    # The Unix account the user's [run] jobs run as on the nodes ("": none; agents/runas.py).
    unix_user: Mapped[str] = mapped_column(String(32), default="", server_default="")
    created_at: Mapped[float] = mapped_column(Float)
    account: Mapped[str | None] = mapped_column(String(64), nullable=True)  # None: directly under root


class Account(Base):
    """A node of the fair-share tree (scheduler.core.accounts): its parent (None: root) and shares."""

    __tablename__ = "accounts"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    parent: Mapped[str | None] = mapped_column(String(64), nullable=True)
    shares: Mapped[float] = mapped_column(Float, default=1.0)
    created_at: Mapped[float] = mapped_column(Float)


class AgentToken(Base):
    """An agent credential, bound to one node name."""

    __tablename__ = "agent_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(64), index=True)
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[float] = mapped_column(Float)


class Node(Base):
    __tablename__ = "nodes"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    rack: Mapped[str] = mapped_column(String(64), default="rack0")
    address: Mapped[str] = mapped_column(String(256), default="")  # host:port of the agent's data server
    state: Mapped[str] = mapped_column(String(16), default=NodeState.UP)  # NodeState
    incarnation: Mapped[str] = mapped_column(String(64), default="")  # changes when the agent restarts
    last_seen: Mapped[float] = mapped_column(Float, default=0.0)
    down_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    free_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # Bytes moved by staging on this node (as destination).
    staged_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # Drained (`gsched node drain`): no new ranks or shard copies land here; running ranks finish.
    drained_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    drain_reason: Mapped[str] = mapped_column(String(200), default="")


class Device(Base):
    __tablename__ = "devices"
    node: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), default="cpu")  # cpu | cuda
    model: Mapped[str] = mapped_column(String(128), default="")
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    uuid: Mapped[str] = mapped_column(String(96), default="")
    health: Mapped[str] = mapped_column(String(200), default="")  # why it is not healthy


class Dataset(Base):
    __tablename__ = "datasets"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    source: Mapped[str] = mapped_column(String(512), default="")
    classes: Mapped[int] = mapped_column(Integer, default=0)
    image_shape: Mapped[Any] = mapped_column(JSON, default=list)
    replicas_required: Mapped[int] = mapped_column(Integer, default=2)
    # how many nodes the data set's jobs spread over: its layout stripes copies over this many
    # (scheduler.core.replicas.lay_out); 1 keeps every copy whole on one node
    span: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # how many nodes each of its latest jobs spanned, oldest first (scheduler.core.replicas.seen_spans,
    # written at bind): the cycle re-balances the layout toward the span most of them had
    job_spans: Mapped[Any] = mapped_column(JSON, default=list, server_default="[]")
    owner: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[float] = mapped_column(Float)


class Shard(Base):
    __tablename__ = "shards"
    dataset: Mapped[str] = mapped_column(ForeignKey("datasets.name", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    samples: Mapped[int] = mapped_column(Integer)


class Replica(Base):
    """A copy of a shard on a node, as its agent last reported it (or as the server expects it)."""

    __tablename__ = "replicas"
    dataset: Mapped[str] = mapped_column(String(64), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), default=ReplicaState.MISSING)  # ReplicaState
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)
    last_read_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # a job bound to read it here


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("user", "client_request_id", name="uq_jobs_user_request"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    user: Mapped[str] = mapped_column(String(64), index=True)
    spec: Mapped[Any] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)  # JobState
    reason: Mapped[str] = mapped_column(Text, default="")
    client_request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    submitted_at: Mapped[float] = mapped_column(Float)
    pending_since: Mapped[float] = mapped_column(Float)
    # When the job first waited for locality in its current pending spell (None: it has not): the
    # locality wait counts from here, not from pending_since (see policies.twostage).
    locality_wait_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # bumps at every bind
    restarts: Mapped[int] = mapped_column(Integer, default=0)  # requeues after losing a node
    failures: Mapped[int] = mapped_column(Integer, default=0)  # retries after a rank failed
    master_port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    transfer_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    transfer_cost_ms: Mapped[int] = mapped_column(Integer, default=0)
    local_fraction: Mapped[float] = mapped_column(Float, default=1.0)
    factor: Mapped[float] = mapped_column(Float, default=1.0)
    priority: Mapped[float] = mapped_column(Float, default=0.0)
    explain: Mapped[Any] = mapped_column(JSON, default=dict)  # the last cycle's view of this job
    progress: Mapped[Any] = mapped_column(JSON, default=dict)  # staging / training progress
    held_by: Mapped[str | None] = mapped_column(String(64), nullable=True)  # `gsched hold`: not scheduled
    spec_rev: Mapped[int] = mapped_column(Integer, default=0)  # bumped when `gsched update` changes the spec
    # `submit --dependency`: [[kind, job id], ...] (scheduler/core/dependency.py); not scheduled until met
    dependency: Mapped[Any] = mapped_column(JSON, nullable=True)
    deps_met: Mapped[bool] = mapped_column(Boolean, default=True)
    # `submit --array`: the array's first job, this job's index, how many jobs, how many may be active at once
    array_job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_count: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_max_running: Mapped[int | None] = mapped_column(Integer, nullable=True)

    @property
    def parsed_spec(self) -> JobSpec:
        """The stored ``spec`` as a ``JobSpec`` (``jobspec.stored``: every default in one place), read
        once per loaded row and again only if ``spec`` is replaced."""
        cached = self.__dict__.get("_parsed_spec")
        if cached is None or cached[0] is not self.spec:
            cached = (self.spec, stored(self.spec))
            self.__dict__["_parsed_spec"] = cached
        return cached[1]


class Rank(Base):
    __tablename__ = "ranks"
    __table_args__ = (Index("ix_ranks_node_state", "node", "state"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    local_rank: Mapped[int] = mapped_column(Integer, default=0)
    node: Mapped[str] = mapped_column(String(64))
    devices: Mapped[Any] = mapped_column(JSON)  # device indices on the node
    # RankState: ASSIGNED -> STAGING -> READY -> RUNNING -> EXITED;  KILLING -> KILLED
    state: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    log_tail: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    bound_at: Mapped[float] = mapped_column(Float, default=0.0)


class ShardAssignment(Base):
    __tablename__ = "shard_assignments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    dataset: Mapped[str] = mapped_column(String(64))
    shard: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    staged_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class Metric(Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    epoch: Mapped[int] = mapped_column(Integer)
    data: Mapped[Any] = mapped_column(JSON)
    time: Mapped[float] = mapped_column(Float)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(512))
    nodes: Mapped[Any] = mapped_column(JSON)  # nodes holding a copy
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    sha256: Mapped[str] = mapped_column(String(64), default="", server_default="")  # "": not verifiable


class LogChunk(Base):
    __tablename__ = "log_chunks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    offset: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)


class Transfer(Base):
    """Bytes moved between nodes: staging for a job, or re-replication (job_id NULL)."""

    __tablename__ = "transfers"
    __table_args__ = (Index("ix_transfers_dst_state", "dst", "state"),)  # a node's open orders (heartbeats)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    dataset: Mapped[str] = mapped_column(String(64))
    shard: Mapped[int] = mapped_column(Integer)
    src: Mapped[str] = mapped_column(String(64))
    dst: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    done_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # so far, while RUNNING
    state: Mapped[str] = mapped_column(String(16), default=TransferState.PENDING)  # TransferState
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Usage(Base):
    """A user's decayed usage in device-seconds, as of ``updated_at``."""

    __tablename__ = "usage"
    user: Mapped[str] = mapped_column(String(64), primary_key=True)
    device_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)


class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(80))
    kind: Mapped[str] = mapped_column(String(48))
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    node: Mapped[str | None] = mapped_column(String(64), nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")


class ClusterSample(Base):
    """One row per cycle for `gsched plot --cluster`: device use and queue length over time."""

    __tablename__ = "cluster_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    devices_total: Mapped[int] = mapped_column(Integer)
    devices_busy: Mapped[int] = mapped_column(Integer)
    pending: Mapped[int] = mapped_column(Integer)
    running: Mapped[int] = mapped_column(Integer)
    durations: Mapped[Any] = mapped_column(JSON, default=dict)
    leader: Mapped[str] = mapped_column(String(64), default="")  # the server that ran the cycle


class Lease(Base):
    """A named lease in the database: the holder of ``cycle`` is the one server that schedules."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[float] = mapped_column(Float)
    acquired_at: Mapped[float] = mapped_column(Float)


class Setting(Base):
    """Small cluster-wide values kept in the database (e.g. the peer transfer key)."""

    __tablename__ = "settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
