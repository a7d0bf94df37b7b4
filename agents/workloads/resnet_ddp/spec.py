"""The rank spec: the JSON file an agent writes for each rank, read and validated here.

Rank spec (JSON; unknown keys are refused)::

    {
      "job_id": 7,                          # int, for log lines
      "shards": ["/data/digits/00000.shard", ...],   # absolute paths this rank reads (>= 1)
      "num_classes": 10,
      "checkpoint_dir": "/ckpt/job-7",      # epoch-0001.pt, epoch-0002.pt, ... (written by rank 0)
      "resume_from": null,                  # a checkpoint path, or null to start fresh
      "metrics_path": "/ckpt/job-7/metrics.jsonl",   # rank 0 appends JSON lines here
      "stop_after_epochs": null,            # optional: stop (exit 0) after this many epochs in total,
                                            # as if preempted; for tests and drills
      "train": {
        "epochs": 5,              # total epochs, counting those before a resume
        "batch_size": 32,         # per rank, per micro-step
        "lr": 0.1,                # base rate; see lr_scaling
        "grad_accum_steps": 1,    # micro-steps per optimizer step
        "lr_scaling": "linear",   # "linear" | "none"
        "warmup_epochs": 0,       # linear warmup (may be fractional), then cosine decay to 0
        "loader_workers": "auto", # int, or "auto": 0 on CPU, min(4, cores per rank) on CUDA
        "eval_every": 1,          # held-out accuracy every N epochs and after the last; 0: never
        "seed": 0,
        "backend": "auto",        # "auto" | "gloo" | "nccl"   (auto: nccl with CUDA, else gloo)
        "device": "auto",         # "auto" | "cpu" | "cuda"    (auto: cuda when visible)
        "amp": "auto",            # "auto" | "bf16" | "off"    (auto: bf16 on CUDA if supported)
        "channels_last": "auto",  # "auto" | true | false      (auto: true on CUDA)
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "hflip": "auto",          # random horizontal flip: true | false | "auto" (3-channel only)
        "crop_padding": "auto",   # int, or "auto": max(1, image size // 8) pixels
        "checkpoint": true        # false: no checkpoint is written (a restart begins at epoch 0)
      }
    }

:func:`parse_spec` validates a parsed spec and raises :class:`SpecError`, whose message names the
field, for anything that cannot run.  ``SpecError`` is also what the other modules raise for a spec that
validates but cannot run on this rank's data or machine; the entry point exits 2 for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


class SpecError(ValueError):
    """A rank spec that cannot run; the message names the field."""


@dataclass
class TrainConfig:
    epochs: int
    batch_size: int
    lr: float
    grad_accum_steps: int = 1
    lr_scaling: str = "linear"
    warmup_epochs: float = 0.0
    loader_workers: int | str = "auto"
    eval_every: int = 1
    seed: int = 0
    backend: str = "auto"
    device: str = "auto"
    amp: str = "auto"
    channels_last: bool | str = "auto"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    hflip: bool | str = "auto"
    crop_padding: int | str = "auto"
    keep_checkpoints: int = 0  # 0 keeps every epoch's checkpoint
    checkpoint: bool = True  # false: write none (a restarted job begins at epoch 0)


@dataclass
class RankSpec:
    job_id: int
    shards: list[str]
    train: TrainConfig
    num_classes: int
    checkpoint_dir: str
    metrics_path: str
    resume_from: str | None = None
    stop_after_epochs: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_CHOICES = {
    "lr_scaling": ("linear", "none"),
    "backend": ("auto", "gloo", "nccl"),
    "device": ("auto", "cpu", "cuda"),
    "amp": ("auto", "bf16", "off"),
}


def parse_spec(raw: dict[str, Any]) -> RankSpec:
    """Validate a rank spec dict (see the module docstring); raise SpecError naming the field."""
    if not isinstance(raw, dict):
        raise SpecError("rank spec must be a JSON object")
    top = {
        "job_id",
        "shards",
        "train",
        "num_classes",
        "checkpoint_dir",
        "metrics_path",
        "resume_from",
        "stop_after_epochs",
    }
    unknown = set(raw) - top
    if unknown:
        raise SpecError(f"unknown rank spec field(s): {', '.join(sorted(unknown))}")
    for key in ("job_id", "shards", "train", "num_classes", "checkpoint_dir", "metrics_path"):
        if key not in raw:
            raise SpecError(f"rank spec is missing {key!r}")
    train_raw = raw["train"]
    if not isinstance(train_raw, dict):
        raise SpecError("train must be an object")
    names = {f.name for f in fields(TrainConfig)}
    unknown = set(train_raw) - names
    if unknown:
        raise SpecError(
            f"unknown train field(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(names))}"
        )
    for key in ("epochs", "batch_size", "lr"):
        if key not in train_raw:
            raise SpecError(f"train.{key} is required")
    cfg = TrainConfig(**train_raw)

    def need(cond: bool, name: str, what: str) -> None:
        if not cond:
            raise SpecError(f"train.{name} must be {what}, got {getattr(cfg, name)!r}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    need(is_int(cfg.epochs) and cfg.epochs >= 1, "epochs", "an integer >= 1")
    need(is_int(cfg.batch_size) and cfg.batch_size >= 1, "batch_size", "an integer >= 1")
    need(isinstance(cfg.lr, int | float) and cfg.lr > 0, "lr", "a number > 0")
    need(is_int(cfg.grad_accum_steps) and cfg.grad_accum_steps >= 1, "grad_accum_steps", "an integer >= 1")
    need(
        isinstance(cfg.warmup_epochs, int | float) and cfg.warmup_epochs >= 0,
        "warmup_epochs",
        "a number >= 0",
    )
    need(
        cfg.loader_workers == "auto" or (is_int(cfg.loader_workers) and int(cfg.loader_workers) >= 0),
        "loader_workers",
        '"auto" or an integer >= 0',
    )
    need(is_int(cfg.eval_every) and cfg.eval_every >= 0, "eval_every", "an integer >= 0")
    need(is_int(cfg.keep_checkpoints) and cfg.keep_checkpoints >= 0, "keep_checkpoints", "an integer >= 0")
    need(is_int(cfg.seed), "seed", "an integer")
    need(isinstance(cfg.checkpoint, bool), "checkpoint", "true or false")
    need(cfg.channels_last in ("auto", True, False), "channels_last", '"auto", true or false')
    need(cfg.hflip in ("auto", True, False), "hflip", '"auto", true or false')
    need(
        cfg.crop_padding == "auto" or (is_int(cfg.crop_padding) and int(cfg.crop_padding) >= 0),
        "crop_padding",
        '"auto" or an integer >= 0',
    )
    need(isinstance(cfg.momentum, int | float) and 0 <= cfg.momentum < 1, "momentum", "in [0, 1)")
    need(isinstance(cfg.weight_decay, int | float) and cfg.weight_decay >= 0, "weight_decay", ">= 0")
    for name, allowed in _CHOICES.items():
        need(getattr(cfg, name) in allowed, name, " | ".join(f'"{a}"' for a in allowed))

    shards = raw["shards"]
    if not isinstance(shards, list) or not shards or not all(isinstance(s, str) for s in shards):
        raise SpecError("shards must be a non-empty list of shard file paths")
    if not (isinstance(raw["num_classes"], int) and raw["num_classes"] >= 2):
        raise SpecError(f"num_classes must be an integer >= 2, got {raw['num_classes']!r}")
    stop = raw.get("stop_after_epochs")
    if stop is not None and not (isinstance(stop, int) and stop >= 1):
        raise SpecError(f"stop_after_epochs must be null or an integer >= 1, got {stop!r}")
    return RankSpec(
        job_id=int(raw["job_id"]),
        shards=list(shards),
        train=cfg,
        num_classes=int(raw["num_classes"]),
        checkpoint_dir=str(raw["checkpoint_dir"]),
        metrics_path=str(raw["metrics_path"]),
        resume_from=raw.get("resume_from"),
        stop_after_epochs=stop,
    )
