"""The heartbeat, both ways: what an agent reports (``Heartbeat``) and what the server answers
(``HeartbeatReply``), the one definition of each for the server and the agents.

``POST /v1/agent/heartbeat`` takes a ``Heartbeat`` and answers a ``HeartbeatReply``.

* Request models forbid unknown fields and carry limits (sizes, counts, name patterns), checked before
  anything is stored: an agent cannot make the server store more, or other, than this allows.
* Reply models ignore unknown fields, so an agent keeps working with a newer server that sends more.
  The server builds the reply with them (scheduler/server/heartbeat.py) and sends ``reply.wire()``;
  the agent reads it with ``HeartbeatReply.model_validate`` and uses attributes only.
* An ``Assignment`` carries the job's ``train`` table as stored at submit (``TrainKnobs`` values);
  ``Assignment.knobs()`` reads it as ``TrainKnobs``, whose defaults fill keys an older server left out.
  It is not validated with the reply: a knob this agent does not know fails that rank's launch, never
  the heartbeat that also carries kills and transfers.

Part of the protocol between the server and the agents: it imports nothing of ``scheduler`` but
``scheduler.protocol`` (agents import only ``scheduler.protocol``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scheduler.protocol.rankspec import TrainKnobs
from scheduler.protocol.runspec import RunTable
from scheduler.protocol.states import REPORTED_RANK, REPORTED_TRANSFER, RankState, TransferState

NODE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DATASET = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
SHA = r"^[0-9a-f]{64}$"
# the data server peers connect to: host:port (plain HTTP) or https://host:port (scheduler/protocol/peers.py)
ADDRESS = r"^(https://)?[A-Za-z0-9_.:\[\]-]{1,247}$"
MAX_ID = 2**53  # ids, attempts, offsets: exact in JSON, and far inside SQL's 64-bit integers
MAX_BYTES = 2**60
MAX_LINE_CHARS = 16384


# ---------------------------------------------------------------- agent -> server


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceIn(_In):
    index: int = Field(ge=0, le=1023)
    kind: Literal["cpu", "cuda"] = "cpu"
    model: str = Field("", max_length=128)
    memory_bytes: int = Field(0, ge=0, le=MAX_BYTES)
    uuid: str = Field("", max_length=96)  # NVML's, for GPUs
    healthy: bool = True
    health: str = Field("", max_length=200)  # why a device is not healthy (agents/devices.py)


class ReplicaIn(_In):
    dataset: str = Field(pattern=DATASET)
    shard: int = Field(ge=0, le=99999)
    bytes: int = Field(ge=0, le=2**44)
    sha256: str = Field(pattern=SHA)


class RankIn(_In):
    job_id: int = Field(ge=1, le=MAX_ID)
    attempt: int = Field(ge=0, le=MAX_ID)
    rank: int = Field(ge=0, le=4096)
    state: RankState  # one of REPORTED_RANK (the others are the server's to set)
    exit_code: int | None = Field(None, ge=-255, le=255)
    log_tail: str = Field("", max_length=8192)
    staged_bytes: int = Field(0, ge=0, le=MAX_BYTES)
    staging_total: int = Field(0, ge=0, le=MAX_BYTES)
    staging_rate_bps: float = Field(0, ge=0, le=1e15)
    staging_s: float = Field(0, ge=0, le=1e9)  # seconds this rank spent staging, once done
    master_port: int | None = Field(None, ge=1024, le=65535)
    error: str = Field("", max_length=4096)
    # "rendezvous": the rank ended on an infrastructure failure (no port, port taken, peers never
    # joined); "fenced": the node's fence stopped it while its agent was silent (agents/fence.py).
    # Either way the job is requeued rather than failed (agents/rankfail.py).
    failure: Literal["", "rendezvous", "fenced"] = ""

    @field_validator("state")
    @classmethod
    def _state_is_reported(cls, v: str) -> str:
        return _reported(v, REPORTED_RANK, "rank's state")


class LogIn(_In):
    job_id: int = Field(ge=1, le=MAX_ID)
    attempt: int = Field(ge=0, le=MAX_ID)
    rank: int = Field(ge=0, le=4096)
    text: str = Field(max_length=65536)


class MetricIn(_In):
    """One JSON line a rank printed (``type`` epoch, checkpoint, progress...), passed on by its agent.

    The fields the server reads are checked here; the rest is stored as given, within ``MAX_LINE_CHARS``.
    """

    job_id: int = Field(ge=1, le=MAX_ID)
    attempt: int = Field(ge=0, le=MAX_ID)
    line: dict[str, Any] = Field(max_length=64)

    @field_validator("line")
    @classmethod
    def _known_fields(cls, line: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(line, default=str)) > MAX_LINE_CHARS:
            raise ValueError(f"longer than {MAX_LINE_CHARS} characters")
        _LineFields.model_validate({k: line[k] for k in _LineFields.model_fields if k in line})
        return line


class _LineFields(BaseModel):
    type: str | None = Field(None, max_length=32)
    epoch: int | None = Field(None, ge=0, le=1_000_000)
    bytes: int | None = Field(None, ge=0, le=MAX_BYTES)
    path: str | None = Field(None, max_length=4096)
    mirrors: list[str] | None = Field(None, max_length=16)


def _reported(value: str, allowed: frozenset[str], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"an agent reports a {what} as one of {', '.join(sorted(allowed))}, not {value}")
    return value


class TransferIn(_In):
    id: int = Field(ge=1, le=MAX_ID)
    state: TransferState  # one of REPORTED_TRANSFER
    bytes: int = Field(0, ge=0, le=MAX_BYTES)
    reason: str = Field("", max_length=2048)

    @field_validator("state")
    @classmethod
    def _state_is_reported(cls, v: str) -> str:
        return _reported(v, REPORTED_TRANSFER, "copy's state")


class Heartbeat(_In):
    node: str = Field(pattern=NODE)
    rack: str = Field("rack0", pattern=NODE)
    address: str = Field(pattern=ADDRESS)
    incarnation: str = Field(max_length=64)
    devices: list[DeviceIn] = Field(default_factory=list, max_length=1024)
    free_bytes: int = Field(0, ge=0, le=MAX_BYTES)
    replicas: list[ReplicaIn] | None = Field(None, max_length=200000)  # None: unchanged since last full report
    ranks: list[RankIn] = Field(default_factory=list, max_length=4096)
    logs: list[LogIn] = Field(default_factory=list, max_length=4096)
    metrics: list[MetricIn] = Field(default_factory=list, max_length=4096)
    transfers: list[TransferIn] = Field(default_factory=list, max_length=4096)
    # Ids of the jobs whose directory (DATA_DIR/.gsched/jobs/ID) is on this node, sent now and then for
    # the job retention; None: not asked this time.  The reply's ``ended`` answers it.
    job_dirs: list[Annotated[int, Field(ge=1, le=MAX_ID)]] | None = Field(None, max_length=100000)

    @field_validator("devices")
    @classmethod
    def _one_report_per_device(cls, devices: list[DeviceIn]) -> list[DeviceIn]:
        if len({d.index for d in devices}) != len(devices):
            raise ValueError("each device index may appear once")
        return devices

    @field_validator("replicas")
    @classmethod
    def _one_report_per_replica(cls, replicas: list[ReplicaIn] | None) -> list[ReplicaIn] | None:
        if replicas is not None and len({(r.dataset, r.shard) for r in replicas}) != len(replicas):
            raise ValueError("each (dataset, shard) may appear once")
        return replicas


# ---------------------------------------------------------------- server -> agent


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Kill(_Out):
    """Stop this rank (a cancelled or requeued job, a stale attempt, a rank the server does not expect)."""

    job_id: int
    attempt: int
    rank: int


class ShardSource(_Out):
    """One shard a rank reads, in assignment order: where to fetch it when it is not on this node.

    ``source_address`` is the planned source's data server; ``alternates`` the data servers of the other
    up nodes holding a healthy copy, tried in order when the source fails.  ``sha256`` is the
    manifest's ("" when the server has no such shard): a fetched copy must hash to it."""

    dataset: str
    index: int
    sha256: str
    bytes: int
    source: str
    source_address: str
    alternates: list[str] = Field(default_factory=list)


class Resume(_Out):
    """A recorded checkpoint of the job: its file name is ``Path(path).name``, held by ``nodes``
    (``addresses``: their data servers, in the same order); ``sha256`` of its bytes as reported when
    it was written ("": none recorded, and the copy is never loaded)."""

    epoch: int
    path: str
    nodes: list[str] = Field(default_factory=list)
    addresses: list[str] = Field(default_factory=list)
    sha256: str = ""


class Assignment(_Out):
    """One rank this node must start, or is still getting ready (sent again, with what changed, until
    the node reports it RUNNING).  ``master_port`` is None until rank 0 has reported its port;
    ``devices`` are this node's device indexes for the rank.  ``run`` is the job's ``[run]`` table as
    stored (None: the built-in, with ``train``); read it with ``command()``.  ``run_as`` is the Unix
    account the rank runs as (None: the agent's own; "": the job's user has none, and the rank fails
    saying so: agents/runas.py).  ``group_rank`` is this node's index among the job's nodes (in the
    order of their first rank), ``group_world_size`` how many nodes the job spans."""

    job_id: int
    attempt: int
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    devices: list[int]
    master_addr: str = ""
    master_port: int | None = None
    train: dict[str, Any] = Field(default_factory=dict)  # the job's [train] as stored; read with knobs()
    run: dict[str, Any] | None = None  # the job's [run] as stored; read with command()
    run_as: str | None = None
    user: str = ""  # the job's gsched user
    dataset: str = ""  # the data set the shards are of ("": a job without data)
    group_rank: int = 0
    group_world_size: int = 1
    num_classes: int = 10
    shards: list[ShardSource]
    resume: Resume | None = None  # the newest checkpoint
    resume_older: list[Resume] = Field(default_factory=list)  # the ones before it, newest first
    # Variables the rank's environment gets besides the launcher's own: an array job's
    # GSCHED_ARRAY_JOB_ID, GSCHED_ARRAY_INDEX and GSCHED_ARRAY_COUNT (scheduler/core/arrays.py).
    env: dict[str, str] = Field(default_factory=dict)

    @property
    def key(self) -> tuple[int, int, int]:
        """(job, attempt, rank): how the agent and the server name a rank."""
        return (self.job_id, self.attempt, self.rank)

    def knobs(self) -> TrainKnobs:
        """The job's train table as ``TrainKnobs`` (defaults for keys it lacks); raises ``ValueError``
        naming the knobs when this agent's ``TrainKnobs`` refuses it (a newer server's knob)."""
        try:
            return TrainKnobs.model_validate(self.train)
        except ValueError as e:
            raise ValueError(f"job {self.job_id}: its [train] table does not fit this agent: {e}") from None

    def command(self) -> RunTable | None:
        """The job's ``[run]`` as ``RunTable`` (None for the built-in); raises ``ValueError`` when this
        agent's ``RunTable`` refuses it (a newer server's key)."""
        if self.run is None:
            return None
        try:
            return RunTable.model_validate(self.run)
        except ValueError as e:
            raise ValueError(f"job {self.job_id}: its [run] table does not fit this agent: {e}") from None


class TransferOrder(_Out):
    """Copy replica ``dataset/shard`` from node ``source`` (data server ``source_address``) to this node;
    the copy must hash to ``sha256``.  The agent reports it back as a ``TransferIn`` with this ``id``."""

    id: int
    dataset: str
    shard: int
    sha256: str
    bytes: int
    source: str
    source_address: str


class DeleteOrder(_Out):
    """Delete this node's copy of ``dataset/shard`` (the data set's replica count was lowered)."""

    dataset: str
    shard: int


class Peer(_Out):
    """A node to mirror checkpoints to, and its data server's address."""

    name: str
    address: str


class Ended(_Out):
    """A job of the heartbeat's ``job_dirs`` that has ended, ``ago_s`` seconds before the server
    answered (an age, not a time: the node's clock need not agree with the server's)."""

    job_id: int
    ago_s: float


class HeartbeatReply(_Out):
    """The answer to one heartbeat.  Every list is complete for this heartbeat (applying the same reply
    twice is harmless).  ``peers`` is None (left out on the wire) when the node runs no ranks: the
    agent then keeps the peers it has.  ``heartbeat_s`` is the server's interval and ``ttl_s`` how long
    it waits for a heartbeat before it declares the node down (the agent's fence, agents/fence.py), both set by the route.
    ``ended``: for a heartbeat that sent ``job_dirs``, those of its jobs that have ended (None: not asked)."""

    assignments: list[Assignment] = Field(default_factory=list)
    kill: list[Kill] = Field(default_factory=list)
    transfers: list[TransferOrder] = Field(default_factory=list)
    delete: list[DeleteOrder] = Field(default_factory=list)
    peer_key: str = ""
    peers: list[Peer] | None = None
    heartbeat_s: float | None = None
    ttl_s: float | None = None
    ended: list[Ended] | None = None

    def wire(self) -> dict[str, Any]:
        """The JSON body: every field, but ``peers``, ``heartbeat_s``, ``ttl_s`` and ``ended`` only when they are set."""
        return self.model_dump(exclude={k for k in ("peers", "heartbeat_s", "ttl_s", "ended") if getattr(self, k) is None})
