"""Request bodies, validated with limits (sizes, counts, name patterns) before anything is stored."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NODE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DATASET = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
SHA = r"^[0-9a-f]{64}$"
ADDRESS = r"^[A-Za-z0-9_.:\[\]-]{1,255}$"  # host:port, the data server peers connect to
MAX_ID = 2**53  # ids, attempts, offsets: exact in JSON, and far inside SQL's 64-bit integers
MAX_BYTES = 2**60


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorOut(BaseModel):
    """Every 4xx answer: what was wrong, and the field it was wrong in (when there is one)."""

    detail: str
    field: str | None = None


class DeviceIn(_In):
    index: int = Field(ge=0, le=1023)
    kind: Literal["cpu", "cuda"] = "cpu"
    model: str = Field("", max_length=128)
    memory_bytes: int = Field(0, ge=0, le=MAX_BYTES)
    healthy: bool = True


class ReplicaIn(_In):
    dataset: str = Field(pattern=DATASET)
    shard: int = Field(ge=0, le=99999)
    bytes: int = Field(ge=0, le=2**44)
    sha256: str = Field(pattern=SHA)


class RankIn(_In):
    job_id: int = Field(ge=1, le=MAX_ID)
    attempt: int = Field(ge=0, le=MAX_ID)
    rank: int = Field(ge=0, le=4096)
    state: Literal["STAGING", "READY", "RUNNING", "EXITED", "KILLED"]
    exit_code: int | None = Field(None, ge=-255, le=255)
    log_tail: str = Field("", max_length=8192)
    staged_bytes: int = Field(0, ge=0, le=MAX_BYTES)
    staging_total: int = Field(0, ge=0, le=MAX_BYTES)
    staging_rate_bps: float = Field(0, ge=0, le=1e15)
    staging_s: float = Field(0, ge=0, le=1e9)  # seconds this rank spent staging, once done
    master_port: int | None = Field(None, ge=1024, le=65535)
    error: str = Field("", max_length=4096)
    # "rendezvous": the rank ended on an infrastructure failure (no port, port taken, peers never
    # joined): the job is requeued rather than failed (agents/rankfail.py).
    failure: Literal["", "rendezvous"] = ""


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


MAX_LINE_CHARS = 16384


class _LineFields(BaseModel):
    type: str | None = Field(None, max_length=32)
    epoch: int | None = Field(None, ge=0, le=1_000_000)
    bytes: int | None = Field(None, ge=0, le=MAX_BYTES)
    path: str | None = Field(None, max_length=4096)
    mirrors: list[str] | None = Field(None, max_length=16)


class TransferIn(_In):
    id: int = Field(ge=1, le=MAX_ID)
    state: Literal["running", "done", "failed"]
    bytes: int = Field(0, ge=0, le=MAX_BYTES)
    reason: str = Field("", max_length=2048)


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


class JobSubmit(_In):
    spec: dict[str, Any]
    client_request_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$")


class UserAdd(_In):
    name: str = Field(max_length=32)
    shares: float = Field(1.0, gt=0, le=1e6)
    role: Literal["user", "admin"] = "user"


class SharesIn(_In):
    shares: float = Field(gt=0, le=1e6)


class AgentTokenIn(_In):
    node: str = Field(pattern=NODE)


class ShardIn(_In):
    index: int = Field(ge=0, le=99999)
    bytes: int = Field(ge=0, le=2**44)
    sha256: str = Field(pattern=SHA)
    samples: int = Field(ge=0, le=2**40)


class DatasetIn(_In):
    name: str = Field(pattern=DATASET)
    source: str = Field("", max_length=512)
    classes: int = Field(ge=1, le=100000)
    image_shape: list[Annotated[int, Field(ge=1, le=65536)]] = Field(min_length=3, max_length=3)
    replicas: int = Field(2, ge=1, le=16)
    shards: list[ShardIn] = Field(min_length=1, max_length=100000)

    @field_validator("name")
    @classmethod
    def _no_dots(cls, v: str) -> str:
        if ".." in v:  # agents refuse such names (agents.shardfile.valid_name): never store one
            raise ValueError("must not contain '..'")
        return v


class PlaceIn(_In):
    replicas: int = Field(ge=1, le=16)
