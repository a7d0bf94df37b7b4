"""Request bodies of the server's own routes, validated with limits (sizes, counts, name patterns) before
anything is stored.  The heartbeat's request and reply are in scheduler/protocol/messages.py, shared
with the agents; the patterns and limits below come from there, so a name means the same in both."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scheduler.protocol.messages import DATASET, NODE, SHA
from scheduler.protocol.messages import MAX_ID as MAX_ID  # the routes' path ids take the same bound


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorOut(BaseModel):
    """Every 4xx answer: what was wrong, and the field it was wrong in (when there is one)."""

    detail: str
    field: str | None = None


class JobSubmit(_In):
    spec: dict[str, Any]
    client_request_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    # sbatch's --dependency: afterok:ID[:ID...],afterany:ID,afternotok:ID (scheduler/core/dependency.py)
    dependency: str | None = Field(None, min_length=1, max_length=1000)
    # sbatch's --array: 0-9, 1,3,5-7, 0-99%4 (scheduler/core/arrays.py)
    array: str | None = Field(None, min_length=1, max_length=1000)


class JobUpdate(_In):
    """``PATCH /v1/jobs/{id}``: what to change (a key left out is left as it is)."""

    name: str | None = Field(None, min_length=1, max_length=64)
    time_limit_s: int | None = Field(None, ge=1, le=30 * 86400)


class NodeDrain(_In):
    reason: str = Field("", max_length=200)


UNIX_USER = r"^([a-z_][a-z0-9_.-]{0,30}[a-z0-9_.$-]?)?$"  # a POSIX-ish account name, or "" for none


class UserAdd(_In):
    name: str = Field(max_length=32)
    shares: float = Field(1.0, gt=0, le=1e6)
    role: Literal["user", "admin"] = "user"
    unix_user: str = Field("", pattern=UNIX_USER)  # the account its [run] jobs run as ("": none)
    account: str | None = Field(None, max_length=64)  # None: directly under root


class UnixUserIn(_In):
    unix_user: str = Field(pattern=UNIX_USER)  # "" removes the mapping


class AccountAdd(_In):
    name: str = Field(max_length=64)
    parent: str | None = Field(None, max_length=64)  # None or "root": under root
    shares: float = Field(1.0, gt=0, le=1e6)


class AccountIn(_In):
    account: str | None = Field(None, max_length=64)  # None or "root": directly under root


class ParentIn(_In):
    parent: str | None = Field(None, max_length=64)  # None or "root": under root


class SharesIn(_In):
    shares: float = Field(gt=0, le=1e6)


class AgentTokenIn(_In):
    node: str = Field(pattern=NODE)


class ShardIn(_In):
    index: int = Field(ge=0, le=99999)
    bytes: int = Field(ge=0, le=2**44)
    sha256: str = Field(pattern=SHA)
    samples: int = Field(ge=0, le=2**40)


class InPlaceIn(_In):
    """A file a node already has, to become a shard where it lies (``gsched data add``): ``path`` below
    that node's data dir, as its agent's scan reported it."""

    shard: int = Field(ge=0, le=99999)
    node: str = Field(pattern=NODE)
    path: str = Field(min_length=1, max_length=4096)


class DatasetIn(_In):
    name: str = Field(pattern=DATASET)
    source: str = Field("", max_length=512)
    classes: int = Field(ge=1, le=100000)
    # [h, w, c] of every image; empty where the files' readers find it (files registered in place)
    image_shape: list[Annotated[int, Field(ge=1, le=65536)]] = Field(max_length=3)
    replicas: int = Field(2, ge=1, le=16)
    span: int | None = Field(None, ge=1, le=4096)  # nodes its jobs spread over; None: default_span
    shards: list[ShardIn] = Field(min_length=1, max_length=100000)
    in_place: list[InPlaceIn] = Field(default_factory=list, max_length=1600000)

    @field_validator("image_shape")
    @classmethod
    def _three_or_none(cls, v: list[int]) -> list[int]:
        if len(v) not in (0, 3):
            raise ValueError("must be [height, width, channels], or [] for files registered in place")
        return v

    @field_validator("name")
    @classmethod
    def _no_dots(cls, v: str) -> str:
        if ".." in v:  # agents refuse such names (agents.shardfile.valid_name): never store one
            raise ValueError("must not contain '..'")
        return v


class ScanIn(_In):
    """``gsched data add`` asks for scan tickets: the data set's name (in the path) and its nodes."""

    nodes: list[str] = Field(min_length=1, max_length=4096)

    @field_validator("nodes")
    @classmethod
    def _node_names(cls, v: list[str]) -> list[str]:
        import re

        bad = [n for n in v if not re.fullmatch(NODE, n)]
        if bad:
            raise ValueError(f"not a node name: {bad[0]!r}")
        return v


class CopyRef(_In):
    shard: int = Field(ge=0, le=99999)
    node: str = Field(pattern=NODE)


class AbandonIn(_In):
    """``gsched data add`` whose link step failed: the copies it linked, those it could not, and why."""

    linked: list[CopyRef] = Field(default_factory=list, max_length=200000)
    failed: list[CopyRef] = Field(default_factory=list, max_length=200000)
    reason: str = Field("", max_length=2048)


class PlaceIn(_In):
    replicas: int = Field(ge=1, le=16)
