"""The model: torchvision ResNet-18 fitted to the data, wrapped in DDP, and one accumulated backward pass.

``resnet18(weights=None)`` with the first convolution taking the data's channel count.  For images of
at most 32 pixels the stem is the CIFAR one (3x3 convolution, stride 1, no max pool): the usual 7x7/2 +
pool would shrink a 16x16 digit to 4x4 before the first block.  Its cost grows with the input area, so
the digits source defaults to 16x16 (a quarter of the cost of 32x32); larger images keep ImageNet's
stem.

``grad_accum_steps``: gradients of ``k`` micro-batches are summed locally (``no_sync``) and all-reduced
once, so ranks synchronise ``k`` times less often and the global batch grows ``k``-fold without more
memory.  BatchNorm still sees micro-batch statistics.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torchvision.models import resnet18


def build_model(num_classes: int, image_shape: tuple[int, int, int]) -> nn.Module:
    """torchvision ResNet-18, random init, stem adapted to the image size and channel count."""
    h, w, c = image_shape
    model = resnet18(weights=None, num_classes=num_classes)
    if max(h, w) <= 32:
        model.conv1 = nn.Conv2d(c, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()  # type: ignore[assignment]
    elif c != 3:
        model.conv1 = nn.Conv2d(c, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def wrap_ddp(model: nn.Module, device: torch.device) -> DDP:
    """DDP as training uses it; gradients live in the all-reduce buckets (one copy less)."""
    return DDP(
        model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True
    )


def backward_accumulated(
    model: nn.Module,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    criterion: Callable[..., torch.Tensor],
    autocast: Callable[[], Any],
) -> torch.Tensor:
    """Forward and backward over ``micro_batches``, gradients averaged as one batch; returns the mean loss.

    The caller zeroes the gradients before and steps the optimizer after.  On a DDP model, every
    micro-step but the last runs under ``no_sync()``, so the gradient all-reduce happens once.
    Each micro-loss is divided by the number of micro-batches: with equal micro-batch sizes the
    accumulated gradient equals the gradient of the mean loss over their union.
    """
    k = len(micro_batches)
    total = torch.zeros((), device=micro_batches[0][0].device)
    for i, (x, y) in enumerate(micro_batches):
        sync = i == k - 1 or not isinstance(model, DDP)
        ctx = contextlib.nullcontext() if sync else model.no_sync()  # type: ignore[operator]
        with ctx:
            with autocast():
                loss = criterion(model(x), y) / k
            loss.backward()
        total += loss.detach().float()
    return total
