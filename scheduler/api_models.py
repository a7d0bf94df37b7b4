"""Request bodies, validated with limits (sizes, counts, name patterns) before anything is stored."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NODE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DATASET = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
SHA = r"^[0-9a-f]{64}$"


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceIn(_In):
    index: int = Field(ge=0, le=1023)
    kind: Literal["cpu", "cuda"] = "cpu"
    model: str = Field("", max_length=128)
    memory_bytes: int = Field(0, ge=0, le=2**50)
    healthy: bool = True


class ReplicaIn(_In):
    dataset: str = Field(pattern=DATASET)
    shard: int = Field(ge=0, le=99999)
    bytes: int = Field(ge=0, le=2**44)
    sha256: str = Field(pattern=SHA)


class RankIn(_In):
    job_id: int = Field(ge=1)
    attempt: int = Field(ge=0)
    rank: int = Field(ge=0, le=4096)
    state: Literal["STAGING", "READY", "RUNNING", "EXITED", "KILLED"]
    exit_code: int | None = Field(None, ge=-255, le=255)
    log_tail: str = Field("", max_length=8192)
    staged_bytes: int = Field(0, ge=0, le=2**50)
    staging_total: int = Field(0, ge=0, le=2**50)
    staging_rate_bps: float = Field(0, ge=0)
    master_port: int | None = Field(None, ge=1024, le=65535)
    error: str = Field("", max_length=4096)


class LogIn(_In):
    job_id: int = Field(ge=1)
    attempt: int = Field(ge=0)
    rank: int = Field(ge=0, le=4096)
    text: str = Field(max_length=65536)


class MetricIn(_In):
    job_id: int = Field(ge=1)
    attempt: int = Field(ge=0)
    line: dict[str, Any]


class TransferIn(_In):
    id: int = Field(ge=1)
    state: Literal["running", "done", "failed"]
    bytes: int = Field(0, ge=0, le=2**50)
    reason: str = Field("", max_length=2048)


class Heartbeat(_In):
    node: str = Field(pattern=NODE)
    rack: str = Field("rack0", pattern=NODE)
    address: str = Field(max_length=256)
    incarnation: str = Field(max_length=64)
    devices: list[DeviceIn] = Field(default_factory=list, max_length=1024)
    free_bytes: int = Field(0, ge=0)
    replicas: list[ReplicaIn] | None = Field(None, max_length=200000)  # None: unchanged since last full report
    ranks: list[RankIn] = Field(default_factory=list, max_length=4096)
    logs: list[LogIn] = Field(default_factory=list, max_length=4096)
    metrics: list[MetricIn] = Field(default_factory=list, max_length=4096)
    transfers: list[TransferIn] = Field(default_factory=list, max_length=4096)


class JobSubmit(_In):
    spec: dict[str, Any]
    client_request_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$")


class UserAdd(_In):
    name: str = Field(max_length=32)
    shares: float = 1.0
    role: Literal["user", "admin"] = "user"


class SharesIn(_In):
    shares: float


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
    image_shape: list[int] = Field(min_length=3, max_length=3)
    replicas: int = Field(2, ge=1, le=16)
    shards: list[ShardIn] = Field(min_length=1, max_length=100000)


class PlaceIn(_In):
    replicas: int = Field(ge=1, le=16)
