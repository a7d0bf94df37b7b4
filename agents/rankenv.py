"""The environment a rank process starts with: torchrun's, then gsched's (the one list of both).

A plain PyTorch script started by gsched sees what ``torchrun`` would give it (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ... so ``dist.init_process_group()`` with the default
``env://`` rendezvous works unchanged), and what gsched adds: where its shard files are, where to write
checkpoints and metric lines, and which checkpoint to resume from.  ``rank_env`` is pure: the launcher
(agents/launcher.py) passes what it knows and gets the variables to set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Inherited variables a rank never sees: the agent's own credentials and settings (GSCHED_TOKEN, ...)
# are not the job's, and any GSCHED_* a rank sees is one gsched set for it.
_SCRUBBED_PREFIXES = ("GSCHED_",)
_PASSED = frozenset({"GSCHED_PG_TIMEOUT_S"})  # an operator's setting for the built-in's process group


@dataclass(frozen=True)
class RankFacts:
    """What the launcher knows about one rank when it starts it."""

    job_id: int
    attempt: int
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int  # this node's index among the job's nodes (torchrun's node rank)
    group_world_size: int  # how many nodes the job spans
    master_addr: str
    master_port: int
    devices: Sequence[int]
    device_kind: str  # "cuda" or "cpu"
    threads: int
    dataset: str
    shards: Sequence[str]  # absolute local paths, in assignment order
    shard_list: str  # a file with the same paths, one per line
    checkpoint_dir: str
    resume_from: str  # "" on a first start
    metrics_file: str


def rank_env(base: Mapping[str, str], facts: RankFacts, extra: Mapping[str, str] | None = None,
             account: Mapping[str, str] | None = None, net_iface: str = "",
             assigned: Mapping[str, str] | None = None) -> dict[str, str]:
    """The rank's environment: ``base`` (the agent's, less its GSCHED_* variables), then ``account``
    (HOME, USER, LOGNAME, SHELL of the account it runs as, when that is not the agent's), then
    ``extra`` (the job's ``[run.env]``: it cannot name what follows), then torchrun's and gsched's,
    then the ``GSCHED_ARRAY_*`` variables of ``assigned`` (the assignment's ``env``: an array job's
    index; no other name is taken from it)."""
    env = {k: v for k, v in base.items() if k in _PASSED or not k.startswith(_SCRUBBED_PREFIXES)}
    env.update(account or {})
    env.update(extra or {})
    f = facts
    threads = str(f.threads)
    env.update({
        # torchrun's, as torch.distributed.run sets them for each worker
        "RANK": str(f.rank), "LOCAL_RANK": str(f.local_rank), "WORLD_SIZE": str(f.world_size),
        "LOCAL_WORLD_SIZE": str(f.local_world_size), "GROUP_RANK": str(f.group_rank),
        "GROUP_WORLD_SIZE": str(f.group_world_size), "ROLE_NAME": "default", "ROLE_RANK": str(f.rank),
        "ROLE_WORLD_SIZE": str(f.world_size), "MASTER_ADDR": f.master_addr or "127.0.0.1",
        "MASTER_PORT": str(f.master_port), "TORCHELASTIC_RESTART_COUNT": str(max(0, f.attempt - 1)),
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": f"gsched-{f.job_id}",
        # the rank's CPU threads: OpenMP's (as torchrun sets it) and torch's own pool (the built-in)
        "OMP_NUM_THREADS": threads, "GSCHED_THREADS": threads, "PYTHONUNBUFFERED": "1",
        # gsched's
        "GSCHED_JOB_ID": str(f.job_id), "GSCHED_ATTEMPT": str(f.attempt), "GSCHED_DATASET": f.dataset,
        "GSCHED_SHARDS": os.pathsep.join(f.shards), "GSCHED_SHARD_LIST": f.shard_list,
        "GSCHED_CHECKPOINT_DIR": f.checkpoint_dir, "GSCHED_RESUME_FROM": f.resume_from,
        "GSCHED_METRICS_FILE": f.metrics_file, "GSCHED_DEVICES": ",".join(str(d) for d in f.devices),
    })
    env.update({k: str(v) for k, v in (assigned or {}).items() if k.startswith("GSCHED_ARRAY_")})
    if net_iface:  # which interface gloo and NCCL bind on multi-homed hosts
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = net_iface
    if f.device_kind == "cuda":
        # NVML (the agent's inventory) numbers devices in PCI bus order; CUDA's default is fastest
        # first. With this, index i means the same device to the agent, the server and the rank.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in f.devices)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env
