"""The entry point: ``python -m agents.workloads.resnet_ddp --spec RANKSPEC.json`` (or ``--bench``).

:func:`main` reads the rank spec and the torch.distributed environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``), sets torch's CPU threads, turns SIGTERM into a stop at the next
step boundary, initialises the process group (backend ``train.backend``, "auto": NCCL with CUDA, else
gloo; timeout ``GSCHED_PG_TIMEOUT_S``, default 600 s), prints the ``started:`` line, trains and destroys
the group.  It returns the exit status: 0 finished (or stopped at ``stop_after_epochs``), 143 stopped by
SIGTERM, 2 a bad rank spec or environment (the reason on stderr), 1 any other error (traceback on
stderr).  ``--bench`` prints the bench's JSON lines instead and returns 0.

:func:`leave` ends the rank process with that status without the interpreter's shutdown (why: there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import traceback
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from agents.workloads.resnet_ddp.bench import print_bench
from agents.workloads.resnet_ddp.runtime import resolve_runtime, threads
from agents.workloads.resnet_ddp.spec import SpecError, parse_spec
from agents.workloads.resnet_ddp.train import train


def leave(code: int) -> NoReturn:
    """Flush stdout and stderr and end the process with ``code``, skipping the interpreter's shutdown.

    After a collective is waited on, PyTorch's gloo worker thread still drops its last references to
    the collective's tensors, and through them to Python objects, for which it takes the GIL; a rank
    that returns from its last collective straight into the interpreter's shutdown races it, and a
    thread that asks for the GIL once shutdown has begun is ended by Python, which the C++ runtime
    answers with abort(): SIGABRT ("terminate called without an active exception") after every epoch
    finished, about one two-rank run in ten of examples/ddp_train.py here.  destroy_process_group()
    does not join those threads while DDP still holds the group, so the rank leaves by ``os._exit``
    instead; every file it writes is closed by then (each write is a ``with`` block)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.workloads.resnet_ddp")
    parser.add_argument("--spec", help="path of this rank's RANKSPEC.json")
    parser.add_argument(
        "--bench",
        action="store_true",
        help="instead of training: one rank's images/s on random data, with and without bf16 and "
        "channels-last (on CUDA), one JSON line each",
    )
    parser.add_argument("--bench-size", type=int, default=32, help="image side for --bench (default 32)")
    parser.add_argument("--bench-batch", type=int, default=256, help="batch for --bench (default 256)")
    parser.add_argument("--bench-steps", type=int, default=30, help="timed steps for --bench (default 30)")
    args = parser.parse_args(argv)
    if args.bench:
        torch.set_num_threads(threads(1))
        print_bench(args.bench_size, args.bench_batch, args.bench_steps)
        return 0
    if not args.spec:
        parser.error("--spec is required (or --bench)")
    try:
        with open(args.spec, encoding="utf-8") as f:
            spec = parse_spec(json.load(f))
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except (OSError, ValueError, KeyError) as exc:
        print(f"resnet_ddp: cannot start: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    torch.set_num_threads(threads(local_world_size))
    initialised = False
    try:
        rt = resolve_runtime(spec.train, local_rank)
        backend = spec.train.backend
        if backend == "auto":
            backend = "nccl" if rt.device.type == "cuda" else "gloo"
        timeout_s = float(os.environ.get("GSCHED_PG_TIMEOUT_S", "600"))
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
            device_id=rt.device if backend == "nccl" else None,
        )
        initialised = True
        print(f"[job {spec.job_id} rank {rank}/{world_size}] started: device {rt.device}, backend {backend}, "
              f"{torch.get_num_threads()} CPU threads (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})",
              flush=True)
        result = train(spec, rank, world_size, local_rank=local_rank, stop_event=stop)
        return 143 if result["stopped"] else 0
    except SpecError as exc:
        print(f"resnet_ddp rank {rank}: {exc}", file=sys.stderr)
        return 2
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        if initialised:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
