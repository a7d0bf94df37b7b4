"""The train loop: the learning rate, one optimizer step, one epoch, and :func:`train` over the epochs.

:func:`train` runs (or resumes) one rank's training inside an already-initialised default process
group; every rank calls it with specs that differ only in ``shards``, and every collective here is
entered by all ranks in the same order.  Ranks may hold different sample counts: every rank runs the
same number of optimizer steps per epoch, the all-reduced minimum of what each rank's data fills (full
batches only); the rest of a larger rank's samples wait for a later epoch's shuffle.  A stop (SIGTERM
sets ``stop_event``) is agreed by an all-reduce before every step on CPU and every 10th on CUDA, so
ranks stop together at a step boundary; the epoch in progress is dropped.

``lr_scaling = "linear"``: the rate actually used is ``lr * global_batch / 256`` with
``global_batch = world_size * batch_size * grad_accum_steps`` (Goyal et al.): ``lr`` is the rate for a
global batch of 256, so a job keeps its meaning when it is placed on more or fewer ranks.  The price is
that large global batches get large rates, which is why ``warmup_epochs`` exists.  ``"none"`` uses
``lr`` as is, whatever the world size.

``eval_every``: held-out accuracy costs a pass over one tenth of the data.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from agents.workloads.resnet_ddp.checkpoint import load_checkpoint, save_checkpoint
from agents.workloads.resnet_ddp.data import ShardStream, count_samples, split_counts, to_input
from agents.workloads.resnet_ddp.metrics import PROGRESS_EVERY_S, MetricsWriter
from agents.workloads.resnet_ddp.model import backward_accumulated, build_model, wrap_ddp
from agents.workloads.resnet_ddp.runtime import Runtime, resolve_runtime, seed_all
from agents.workloads.resnet_ddp.spec import SpecError, parse_spec
from scheduler.protocol.rankspec import RankSpec

REFERENCE_BATCH = 256


def scaled_lr(base_lr: float, world_size: int, batch_size: int, grad_accum_steps: int, mode: str) -> float:
    """The peak learning rate actually used.

    ``"linear"``: ``base_lr * (world_size * batch_size * grad_accum_steps) / 256`` (``base_lr`` is the
    rate for a global batch of 256).  ``"none"``: ``base_lr``.
    """
    if mode == "none":
        return float(base_lr)
    if mode == "linear":
        return float(base_lr) * (world_size * batch_size * grad_accum_steps) / REFERENCE_BATCH
    raise ValueError(f'lr_scaling must be "linear" or "none", got {mode!r}')


def lr_factor(step: int, steps_per_epoch: int, epochs: int, warmup_epochs: float) -> float:
    """Multiplier of the peak rate at optimizer step ``step`` (0-based): linear warmup, then cosine to 0."""
    total = max(1, steps_per_epoch * epochs)
    warmup = min(total, int(round(warmup_epochs * steps_per_epoch)))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@dataclass
class Run:
    """One rank's training as :func:`prepare` set it up: what every epoch and step works with."""

    spec: RankSpec
    rank: int
    world_size: int
    rt: Runtime
    metrics: MetricsWriter
    stop_event: threading.Event
    train_ds: ShardStream
    eval_ds: ShardStream
    steps_per_epoch: int
    model: nn.Module
    ddp: DDP
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    criterion: nn.Module
    start_epoch: int  # epochs done before this run (0, or the resumed checkpoint's)
    history: list[dict[str, Any]]  # the epoch records so far, the same on every rank

    @property
    def end_epoch(self) -> int:
        """The epoch count this run stops at: ``train.epochs``, or ``stop_after_epochs`` if fewer."""
        stop = self.spec.stop_after_epochs
        return self.spec.train.epochs if stop is None else min(self.spec.train.epochs, stop)


def train(
    spec: RankSpec | dict[str, Any],
    rank: int,
    world_size: int,
    *,
    local_rank: int = 0,
    stop_event: threading.Event | None = None,
) -> dict[str, Any]:
    """Run (or resume) training for this rank inside an already-initialised default process group.

    All ranks must call it with specs that differ only in ``shards``.  Returns a summary:
    ``{"epochs_done", "stopped" (True if stop_event ended it early), "history": [epoch metrics]}``.
    ``history`` is the same on every rank.  Raises SpecError for unusable specs or data.
    """
    spec = spec if isinstance(spec, RankSpec) else parse_spec(spec)
    rt = resolve_runtime(spec.train, local_rank)
    metrics = MetricsWriter(spec.metrics_path if rank == 0 else None, spec.job_id)
    run = prepare(spec, rank, world_size, rt, metrics, stop_event or threading.Event())
    epochs_done, stopped = run.start_epoch, False
    for epoch in range(run.start_epoch, run.end_epoch):
        record = train_epoch(run, epoch)
        if record is None:
            stopped = True
            break
        finish_epoch(run, record)
        epochs_done = epoch + 1
    metrics.write("done", epoch=epochs_done, stopped=stopped)
    return {"epochs_done": epochs_done, "stopped": stopped, "history": run.history}


def prepare(
    spec: RankSpec, rank: int, world_size: int, rt: Runtime, metrics: MetricsWriter, stop_event: threading.Event
) -> Run:
    """Collective: agree on the data with the other ranks, build the model (the same initial weights on
    every rank), optimizer and LR schedule, restore ``resume_from`` if given, wrap the model in DDP."""
    cfg = spec.train
    train_ds, eval_ds, image_shape, steps_per_epoch = _agree_on_data(spec, rank, rt)
    seed_all(cfg.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = build_model(spec.num_classes, image_shape).to(rt.device)
    if rt.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    peak_lr = scaled_lr(cfg.lr, world_size, cfg.batch_size, cfg.grad_accum_steps, cfg.lr_scaling)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=peak_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, steps_per_epoch, cfg.epochs, cfg.warmup_epochs)
    )
    seed_all(cfg.seed * 1000 + rank + 1)  # per-rank streams from here on
    start_epoch = 0
    history: list[dict[str, Any]] = []
    if spec.resume_from:
        start_epoch, history = load_checkpoint(
            spec.resume_from, model, optimizer, scheduler, steps_per_epoch, rank, world_size
        )
        # Each node's agent picks the newest checkpoint it can verify (agents/ckptverify.py): ranks on
        # nodes that verified different ones must not train on from different points.
        epochs: list[Any] = [None] * world_size
        dist.all_gather_object(epochs, start_epoch)
        if len(set(epochs)) > 1:
            raise SpecError(f"the ranks resumed from checkpoints of different epochs {epochs}: "
                            "a node could not verify the newest one (see the job's checkpoint.skipped events)")
    return Run(
        spec=spec,
        rank=rank,
        world_size=world_size,
        rt=rt,
        metrics=metrics,
        stop_event=stop_event,
        train_ds=train_ds,
        eval_ds=eval_ds,
        steps_per_epoch=steps_per_epoch,
        model=model,
        ddp=wrap_ddp(model, rt.device),
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=nn.CrossEntropyLoss(),
        start_epoch=start_epoch,
        history=history,
    )


def _agree_on_data(
    spec: RankSpec, rank: int, rt: Runtime
) -> tuple[ShardStream, ShardStream, tuple[int, int, int], int]:
    """Collective: this rank's training and held-out streams, the image shape every rank holds, and the
    steps per epoch every rank runs (the minimum any rank's data fills).  Raises SpecError when shards
    disagree on the shape or a rank cannot fill one step."""
    cfg = spec.train
    counts, shapes = [], set()
    for path in spec.shards:
        n, shape = count_samples(path)
        counts.append(split_counts(n)[0])
        if shape:
            shapes.add(shape)
    if len(shapes) > 1:
        raise SpecError(f"rank {rank}: shards hold images of different shapes {sorted(shapes)}")
    # Every rank must agree on the image shape: exchange it (a rank with empty shards sends zeros).
    local_shape = next(iter(shapes)) if shapes else (0, 0, 0)
    all_shapes = _allreduce([float(v) for v in local_shape], dist.ReduceOp.MAX, rt.device)
    image_shape = (int(all_shapes[0]), int(all_shapes[1]), int(all_shapes[2]))
    if shapes and image_shape != local_shape or 0 in image_shape:
        raise SpecError(
            f"ranks disagree on the image shape or hold no samples: {local_shape} vs {image_shape}"
        )

    pad = max(1, image_shape[0] // 8) if cfg.crop_padding == "auto" else int(cfg.crop_padding)
    hflip = image_shape[2] == 3 if cfg.hflip == "auto" else cfg.hflip == "on"
    train_ds = ShardStream(spec.shards, cfg.batch_size, True, cfg.seed, rank, hflip, pad)
    eval_ds = ShardStream(spec.shards, cfg.batch_size * 2, False, cfg.seed, rank)
    micro_local = train_ds.batches_per_epoch(counts, rt.loader_workers)
    steps_per_epoch = int(_allreduce([micro_local // cfg.grad_accum_steps], dist.ReduceOp.MIN, rt.device)[0])
    if steps_per_epoch < 1:
        raise SpecError(
            f"a rank has too few training samples for one step of batch_size={cfg.batch_size} x "
            f"grad_accum_steps={cfg.grad_accum_steps}: lower batch_size or give every rank more shards"
        )
    return train_ds, eval_ds, image_shape, steps_per_epoch


def train_epoch(run: Run, epoch: int) -> dict[str, Any] | None:
    """Collective: epoch ``epoch`` (0-based) of steps, then its figures reduced over all ranks and, when
    due, the held-out accuracy.  Returns the epoch record (the ``epoch`` metric line without ``type``,
    ``job_id`` and ``time``), or None when the ranks agreed to stop before the epoch ended."""
    rt = run.rt
    run.train_ds.set_epoch(epoch)
    loader = DataLoader(run.train_ds, **_loader_kwargs(rt))
    it = iter(loader)
    run.ddp.train()
    loss_sum = torch.zeros((), device=rt.device, dtype=torch.float64)
    wait_s = 0.0
    images = 0
    check_every = 1 if rt.device.type == "cpu" else 10
    last_progress = time.monotonic()
    t0 = time.perf_counter()
    for step in range(run.steps_per_epoch):
        if step % check_every == 0 and _stop_agreed(run):
            del it, loader
            return None
        loss, step_images, step_wait_s = train_step(run, it)
        loss_sum += loss
        images += step_images
        wait_s += step_wait_s
        now = time.monotonic()
        if run.rank == 0 and now - last_progress >= PROGRESS_EVERY_S:
            run.metrics.write("progress", epoch=epoch + 1, step=step + 1, steps=run.steps_per_epoch)
            last_progress = now
    del it, loader
    if rt.device.type == "cuda":
        torch.cuda.synchronize()
    epoch_s = time.perf_counter() - t0
    return _epoch_record(run, epoch, float(loss_sum.item()), images, wait_s, epoch_s)


def train_step(
    run: Run, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, int, float]:
    """One optimizer step over ``train.grad_accum_steps`` micro-batches taken from ``batches`` (one
    gradient all-reduce), then one step of the LR schedule.  Returns the step's mean loss (a tensor on
    the device, not synchronised), its image count and the seconds spent waiting for input."""
    rt = run.rt
    micro = []
    wait_s = 0.0
    images = 0
    for _ in range(run.spec.train.grad_accum_steps):
        tw = time.perf_counter()
        x, y = next(batches)
        wait_s += time.perf_counter() - tw
        micro.append((to_input(x, rt.device, rt.channels_last), y.to(rt.device, non_blocking=True)))
        images += len(y)
    run.optimizer.zero_grad(set_to_none=True)
    loss = backward_accumulated(run.ddp, micro, run.criterion, rt.autocast)
    run.optimizer.step()
    run.scheduler.step()
    return loss, images, wait_s


def finish_epoch(run: Run, record: dict[str, Any]) -> None:
    """Keep the epoch's record, write its metric line and log line, and (collective, unless
    ``train.checkpoint`` is false) the checkpoint."""
    spec, cfg = run.spec, run.spec.train
    run.history.append(record)
    run.metrics.write("epoch", **record)
    acc = record.get("accuracy")
    print(f"[job {spec.job_id} rank {run.rank}/{run.world_size}] epoch {record['epoch']}/{cfg.epochs}: "
          f"loss {record['loss']:.4f} accuracy {'-' if acc is None else f'{100 * acc:.1f}%'} "
          f"{record['images_per_s']:.0f} images/s data wait {100 * record['data_wait_fraction']:.0f}%", flush=True)
    if cfg.checkpoint:
        save_checkpoint(spec, run.rank, run.world_size, record["epoch"], run.model, run.optimizer, run.scheduler,
                        run.steps_per_epoch, run.history, run.metrics)


def _epoch_record(
    run: Run, epoch: int, loss_sum: float, images: int, wait_s: float, epoch_s: float
) -> dict[str, Any]:
    cfg, rt, world_size, steps = run.spec.train, run.rt, run.world_size, run.steps_per_epoch
    loss_total, images_total, wait_frac_sum, wait_total = _allreduce(
        [loss_sum, float(images), wait_s / max(epoch_s, 1e-9), wait_s], dist.ReduceOp.SUM, rt.device
    )
    (epoch_s_max,) = _allreduce([epoch_s], dist.ReduceOp.MAX, rt.device)
    accuracy = None
    eval_samples = 0
    if cfg.eval_every and ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs):
        correct, count = evaluate(run.model, run.eval_ds, rt)
        correct, count = _allreduce([correct, count], dist.ReduceOp.SUM, rt.device)
        accuracy = correct / count if count else None
        eval_samples = int(count)
    return {
        "epoch": epoch + 1,
        "loss": loss_total / (world_size * steps),
        "accuracy": accuracy,
        "eval_samples": eval_samples,
        "images_per_s": images_total / max(epoch_s_max, 1e-9),
        "images_per_s_rank": images_total / max(epoch_s_max, 1e-9) / world_size,
        "data_wait_fraction": wait_frac_sum / world_size,
        "data_wait_s": wait_total / world_size,
        "step_time_s": epoch_s_max / steps,
        "steps": steps,
        "lr": run.optimizer.param_groups[0]["lr"],
        "epoch_time_s": epoch_s_max,
        "world_size": world_size,
        # How the rank ran, so a job's metrics say which path (NCCL/CUDA or gloo/CPU) produced them.
        "backend": dist.get_backend(),
        "device": rt.device.type,
        "bf16": rt.amp,
        "channels_last": rt.channels_last,
    }


def evaluate(model: nn.Module, stream: ShardStream, rt: Runtime) -> tuple[float, float]:
    """(correct, count) over this rank's held-out samples; not reduced across ranks."""
    model.eval()
    correct = torch.zeros((), device=rt.device, dtype=torch.float64)
    count = 0
    with torch.no_grad():
        for x, y in stream:
            with rt.autocast():
                logits = model(to_input(x, rt.device, rt.channels_last))
            correct += (logits.argmax(1) == y.to(rt.device)).sum()
            count += len(y)
    model.train()
    return float(correct.item()), float(count)


def _loader_kwargs(rt: Runtime) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"batch_size": None, "num_workers": rt.loader_workers, "pin_memory": rt.device.type == "cuda"}
    if rt.loader_workers > 0:
        kwargs["prefetch_factor"] = 4
    return kwargs


def _stop_agreed(run: Run) -> bool:
    """Collective: whether any rank's ``stop_event`` is set."""
    return bool(_allreduce([1.0 if run.stop_event.is_set() else 0.0], dist.ReduceOp.MAX, run.rt.device)[0])


def _allreduce(values: list[float], op: Any, device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()
