"""What the server hands a rank and what a rank is told to train: the one definition of each knob.

``TrainKnobs`` is the ``[train]`` table of a job.toml (scheduler/core/jobspec.py validates the job file
with it) and the ``train`` of a ``RankSpec``, the JSON file an agent writes for each
rank of the built-in workload (agents/workloads/resnet_ddp reads it with ``RankSpec``): one set of
names, bounds and defaults for both ends.

This module is part of the protocol between the server and the agents: it imports nothing else of
``scheduler`` (agents import only ``scheduler.protocol``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TrainKnobs(_Strict):
    epochs: int = Field(3, ge=1, le=10000)
    batch_size: int = Field(64, ge=1, le=65536)
    lr: float = Field(0.05, gt=0, le=10)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(5e-4, ge=0, le=1)
    grad_accum_steps: int = Field(1, ge=1, le=1024)
    lr_scaling: Literal["linear", "none"] = "none"
    warmup_epochs: float = Field(0, ge=0, le=1000)  # may be fractional: the schedule counts optimizer steps
    loader_workers: int = Field(0, ge=0, le=64)
    eval_every: int = Field(1, ge=0, le=10000)
    keep_checkpoints: int = Field(3, ge=0, le=10000)  # newest per-epoch checkpoints kept per copy; 0 keeps all
    checkpoint: bool = True  # false: no checkpoints written; a requeued job starts again from epoch 0
    seed: int = Field(0, ge=0, le=2**31 - 1)
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    amp: Literal["auto", "bf16", "off"] = "auto"
    channels_last: Literal["auto", "on", "off"] = "auto"  # true/false are read as "on"/"off"
    hflip: Literal["auto", "on", "off"] = "auto"  # auto: flip 3-channel images only (not digits)
    crop_padding: int | Literal["auto"] = Field("auto")  # random-crop padding in pixels; auto: side // 8

    @field_validator("crop_padding")
    @classmethod
    def _padding(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 0 <= v <= 64:
            raise ValueError("must be between 0 and 64, or 'auto'")
        return v

    @field_validator("keep_checkpoints")
    @classmethod
    def _keep(cls, v: int) -> int:
        if v == 1:  # the newest is still being mirrored when the next one is written
            raise ValueError("must be 0 (keep every one) or at least 2")
        return v

    @field_validator("lr", "momentum", "weight_decay", "warmup_epochs", mode="before")
    @classmethod
    def _int_is_float(cls, v: Any) -> Any:
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("channels_last", "hflip", mode="before")
    @classmethod
    def _bool_is_on_off(cls, v: Any) -> Any:
        return ("on" if v else "off") if isinstance(v, bool) else v


class RankSpec(_Strict):
    """One rank of the built-in workload: its shard files (absolute local paths, in assignment order),
    where it writes checkpoints and metric lines, the checkpoint it resumes from (None: epoch 0), and
    its ``train`` knobs (absent ones take job.toml's defaults)."""

    job_id: int = Field(ge=1)
    shards: list[str] = Field(min_length=1)
    num_classes: int = Field(ge=2)
    checkpoint_dir: str
    metrics_path: str
    resume_from: str | None = None
    stop_after_epochs: int | None = Field(None, ge=1)  # tests: stop (as if preempted) after this many
    train: TrainKnobs = TrainKnobs()
