"""Where and how a rank computes: device, precision, memory format, loader workers, CPU threads, seeds.

:func:`resolve_runtime` turns the spec's ``device``, ``amp`` and ``channels_last`` ("auto" decided for
this machine: CUDA when visible, bf16 where CUDA supports it, channels-last with CUDA) and
``loader_workers`` into a :class:`Runtime`; on CUDA it also selects the rank's device (``LOCAL_RANK``
modulo the visible devices) and allows cuDNN autotuning and TF32.  :func:`threads` is the size of
torch's CPU thread pool.

``loader_workers``: decode and augment in background processes; on CUDA they hide input time behind
the GPU, on a small CPU node they compete with the training threads.
"""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agents.workloads.resnet_ddp.spec import SpecError
from scheduler.protocol.rankspec import TrainKnobs


@dataclass
class Runtime:
    device: torch.device
    amp: bool
    channels_last: bool
    loader_workers: int

    def autocast(self) -> Any:
        """bf16 autocast on the device when ``amp``; otherwise a context that does nothing."""
        if self.amp:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


def resolve_runtime(cfg: TrainKnobs, local_rank: int) -> Runtime:
    """Pick device, precision, memory format and loader workers from the config and the machine; raises
    SpecError when ``device`` is "cuda" and none is visible."""
    cuda_ok = torch.cuda.is_available()
    if cfg.device == "cuda" and not cuda_ok:
        raise SpecError('train.device is "cuda" but no CUDA device is visible to this rank')
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and cuda_ok)
    if use_cuda:
        index = local_rank % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
    if cfg.amp == "bf16":
        amp = True
    elif cfg.amp == "off":
        amp = False
    else:
        amp = use_cuda and torch.cuda.is_bf16_supported()
    channels_last = use_cuda if cfg.channels_last == "auto" else cfg.channels_last == "on"
    return Runtime(device, amp, channels_last, cfg.loader_workers)


def threads(local_world_size: int) -> int:
    """torch's CPU threads for one of ``local_world_size`` ranks on this machine: ``GSCHED_THREADS`` when
    set (the agent sets it), else the machine's cores shared evenly (at least 1)."""
    env = os.environ.get("GSCHED_THREADS")
    if env:
        return max(1, int(env))
    return max(1, (os.cpu_count() or 1) // max(1, local_world_size))


def seed_all(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
