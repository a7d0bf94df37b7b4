"""The ``--bench`` mode: one rank's training throughput on random data, for the device check.

No process group, no shards, no loader: the same model and input path as the train loop on a batch
already in memory, so the figure is the compute-only ceiling of what a rank can train.
:func:`print_bench` prints one JSON line of :func:`bench`'s figures per variant: on CUDA, each of bf16
autocast off/on x channels-last off/on; without CUDA, fp32 NCHW only.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.nn as nn

from agents.workloads.resnet_ddp.data import to_input
from agents.workloads.resnet_ddp.model import backward_accumulated, build_model
from agents.workloads.resnet_ddp.runtime import Runtime


def bench(
    image_shape: tuple[int, int, int] = (32, 32, 3),
    num_classes: int = 10,
    batch_size: int = 256,
    steps: int = 30,
    warmup_steps: int = 5,
    device: str = "auto",
    amp: bool = False,
    channels_last: bool = False,
) -> dict[str, Any]:
    """One rank's training throughput on random data, no process group: the device check's figure.

    Runs ``warmup_steps`` untimed then ``steps`` timed SGD steps of the same model and input path as
    the train loop (uint8 NHWC -> device -> normalise), and returns ``{"images_per_s", "step_time_s",
    "device", "amp", "channels_last", "batch_size", "image_shape"}``.
    """
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    dev = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.backends.cudnn.benchmark = True
    rt = Runtime(dev, amp, channels_last, 0)
    torch.manual_seed(0)
    model = build_model(num_classes, image_shape).to(dev)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    x = torch.randint(0, 256, (batch_size, *image_shape), dtype=torch.uint8)
    y = torch.randint(0, num_classes, (batch_size,))
    if use_cuda:
        x, y = x.pin_memory(), y.pin_memory()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        batch = [(to_input(x, dev, channels_last), y.to(dev, non_blocking=True))]
        backward_accumulated(model, batch, criterion, rt.autocast)
        opt.step()

    for _ in range(warmup_steps):
        step()
    if use_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if use_cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    return {
        "images_per_s": steps * batch_size / elapsed,
        "step_time_s": elapsed / steps,
        "device": torch.cuda.get_device_name(dev) if use_cuda else "cpu",
        "amp": "bf16" if amp else "off",
        "channels_last": channels_last,
        "batch_size": batch_size,
        "image_shape": list(image_shape),
    }


def print_bench(size: int, batch_size: int, steps: int) -> None:
    """Print one JSON line of :func:`bench` figures per variant on ``size`` x ``size`` RGB images."""
    variants = [(False, False), (True, False), (False, True), (True, True)]
    if not torch.cuda.is_available():
        variants = [(False, False)]
    for amp, cl in variants:
        figures = bench((size, size, 3), batch_size=batch_size, steps=steps, amp=amp, channels_last=cl)
        print(json.dumps(figures), flush=True)
