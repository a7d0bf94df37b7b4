"""``python -m benchmarks.device_check [--quick]``: one script that checks gsched on a GPU machine.

Made for a short session on a machine with one NVIDIA GPU (an H200 was the target), run as
``OUT=/some/folder .venv/bin/python -m benchmarks.device_check``; it writes ``$OUT/device_check.json``
(every figure) and ``$OUT/device_check.md`` (lines ready to paste into ``benchmarks/RESULTS.md``), plus
the logs it read, and prints both files.  ``$OUT`` defaults to ``./device-out``.  Parts, in order:

1. ``device``: torch, CUDA, cuDNN and NCCL versions, the device's name, memory and bf16 support (asked
   in a child process, so a hung driver cannot hang the check), and what ``nvidia-smi`` says (the
   agent's ``--gpus auto`` relies on it).
2. ``throughput``: one rank (world size 1) of the real workload, ``python -m
   agents.workloads.resnet_ddp --spec`` with the torch.distributed environment set as
   ``benchmarks/rank_by_env.py`` would get it from torchrun, training ResNet-18 on synthetic shards
   made with ``agents.datasets`` (32,768 images of 3x224x224 by default, about 5 GB in the scratch
   folder under ``$TMPDIR``; batch 128, so about 230 steps an epoch) for each of {bf16 autocast on/off}
   x {channels-last on/off}, chosen with the rank spec's ``train.amp`` ("bf16" | "off") and
   ``train.channels_last`` (true | false).  The figure is the workload's own ``epoch`` metrics line
   of the last of 2 epochs (``images_per_s``; the first epoch carries cuDNN autotuning), with its
   ``data_wait_fraction`` so an input-bound figure shows as such.  On CUDA the workload allows TF32,
   so "fp32" below means fp32 with TF32 matmuls and convolutions.
3. ``bench``: ``python -m agents.workloads.resnet_ddp --bench``: the same model on random data with no
   input pipeline and no process group, the compute-only ceiling for part 2's figures (on a machine
   without CUDA the workload runs its fp32 variant only).
4. ``cluster``: the NCCL path end to end.  A real :class:`scheduler.cli.localcluster.LocalCluster` (one
   server, one agent started with ``--gpus auto`` on CUDA, ``--gpus 1`` otherwise), a small synthetic
   data set made with ``gsched data make``, one 1-rank job submitted with ``gsched submit`` and
   followed to its end.  The job's document gives the per-epoch metrics; the backend actually used is
   read from the rank's log: the cluster runs with ``TORCH_DISTRIBUTED_DEBUG=INFO`` and
   ``TORCH_CPP_LOG_LEVEL=INFO`` so DDP logs ``backend_name: nccl|gloo``, and ``NCCL_DEBUG=INFO`` so NCCL
   prints its version; the workload's epoch metrics also carry ``backend`` and ``device``.

Expected on one H200 with 16 cores: about 4 minutes in all (not yet measured).

Each part is guarded: a failure is recorded (with the tail of the log it read) and the next part runs.
A hard budget (``--budget-s``, default 420 s) caps the whole run: every child gets at most the time
left, and parts that would start with too little time left are skipped with a message.  SIGTERM or
Ctrl-C stops the part in progress; both files are written after every part, so a run cut short still
leaves what it measured.  Every process started here is stopped on the way out (the cluster through
``LocalCluster.close()``, the ranks by their process group).

``--quick`` (for machines without a GPU, to prove the script works): tiny images, few steps, the
gloo/CPU path; its figures say nothing about any device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}
VARIANTS = [("off", False), ("bf16", False), ("off", True), ("bf16", True)]  # (amp, channels_last)

DEVICE_PROBE = r"""
import json, torch
d = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "cuda": torch.cuda.is_available()}
try:
    d["cudnn"] = torch.backends.cudnn.version()
except Exception as e:
    d["cudnn"] = None
if d["cuda"]:
    i = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(i)
    d.update(name=torch.cuda.get_device_name(i), device_count=torch.cuda.device_count(),
             capability=list(torch.cuda.get_device_capability(i)), memory_bytes=int(p.total_memory),
             bf16_supported=bool(torch.cuda.is_bf16_supported()))
    try:
        v = torch.cuda.nccl.version()
        d["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception as e:
        d["nccl"] = f"unknown ({e})"
print(json.dumps(d))
"""


class OutOfTime(Exception):
    """The overall budget does not leave enough time for the next step."""


@dataclass
class Settings:
    quick: bool
    cuda: bool
    size: int
    samples: int
    shards: int
    classes: int
    batch: int
    epochs: int
    loader_workers: int
    threads: int | None  # GSCHED_THREADS for the throughput ranks; None: the workload's default
    run_cap_s: float
    cl_size: int
    cl_samples: int
    cl_shards: int
    cl_batch: int
    cl_epochs: int
    cl_loader_workers: int
    bench_size: int
    bench_batch: int
    bench_steps: int


def settings(args: argparse.Namespace, cuda: bool) -> Settings:
    cores = os.cpu_count() or 1
    if args.quick:
        s = Settings(quick=True, cuda=cuda, size=8, samples=320, shards=2, classes=4, batch=32, epochs=2,
                     loader_workers=0, threads=1, run_cap_s=240, cl_size=8, cl_samples=320, cl_shards=2,
                     cl_batch=32, cl_epochs=2, cl_loader_workers=0, bench_size=8, bench_batch=32, bench_steps=5)
    else:
        workers = max(1, min(8, cores - 4)) if cuda else 0
        s = Settings(quick=False, cuda=cuda, size=224, samples=32768, shards=16, classes=100, batch=128,
                     epochs=2, loader_workers=workers, threads=None, run_cap_s=150, cl_size=64, cl_samples=4096,
                     cl_shards=4, cl_batch=128, cl_epochs=2, cl_loader_workers=min(4, workers) if cuda else 0,
                     bench_size=224, bench_batch=256, bench_steps=30)
    for name in ("size", "samples", "batch", "epochs", "loader_workers"):
        value = getattr(args, name)
        if value is not None:
            setattr(s, name, value)
    return s


class Budget:
    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.total_s - self.elapsed()

    def need(self, seconds: float, what: str) -> None:
        if self.left() < seconds:
            raise OutOfTime(f"time budget: {self.left():.0f} s of {self.total_s:.0f} s left, "
                            f"{what} needs about {seconds:.0f} s; not started")


# ------------------------------------------------------------------------------------------ processes


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a child started in its own session and anything it left (loader workers): TERM, then KILL."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            try:  # the leader is gone; children of its group may not be
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            break


def run_child(cmd: list[str], log_path: Path, timeout_s: float, env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` in its own session, output to ``log_path``; kill its group on timeout or interrupt."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{' '.join(cmd[-4:])} still running after {timeout_s:.0f} s; stopped") from None
        finally:
            _kill_group(proc)


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def free_port() -> int:
    from scheduler.cli.localcluster import free_port as take

    return take()


# ----------------------------------------------------------------------------------------------- data


def _write_one(job: tuple[str, str, str, int, list[int]]) -> tuple[int, dict[str, Any]]:
    from agents.datasets import open_source
    from agents.shardfile import shard_path, write_shard

    source_spec, out_dir, name, index, indices = job
    source = open_source(source_spec)
    entry = write_shard(shard_path(out_dir, name, index), (source.sample(i) for i in indices))
    return index, dict(entry)


def make_synthetic(source_spec: str, out_dir: Path, name: str, n_shards: int) -> tuple[list[str], int]:
    """The shards ``agents.datasets.make_shards`` would write (same order and split), built in parallel.

    Returns (shard paths, number of classes).  ``make_shards`` is serial; 224x224 images take a few
    milliseconds each to generate, so a process per shard keeps this to seconds on a 16-core machine.
    """
    import numpy as np

    from agents.datasets import open_source
    from agents.shardfile import shard_path

    source = open_source(source_spec)
    order = np.random.default_rng(0).permutation(len(source))
    jobs = [(source_spec, str(out_dir), name, i, [int(x) for x in chunk])
            for i, chunk in enumerate(np.array_split(order, n_shards))]
    procs = max(1, min(n_shards, os.cpu_count() or 1))
    with ProcessPoolExecutor(procs) as pool:
        for _ in pool.map(_write_one, jobs):
            pass
    return [str(shard_path(out_dir, name, i)) for i in range(n_shards)], len(source.classes)


def metric_records(metrics_path: Path, kind: str = "epoch") -> list[dict[str, Any]]:
    out = []
    try:
        text = metrics_path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("type") == kind:
            out.append(rec)
    return out


EPOCH_KEYS = ("epoch", "images_per_s", "data_wait_fraction", "step_time_s", "steps", "epoch_time_s", "loss",
              "accuracy", "world_size", "backend", "device", "bf16", "channels_last")


def slim(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: rec.get(k) for k in EPOCH_KEYS if k in rec}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


# ---------------------------------------------------------------------------------------------- parts


class Check:
    def __init__(self, args: argparse.Namespace, out: Path, tmp: Path) -> None:
        self.args = args
        self.out = out
        self.tmp = tmp
        self.budget = Budget(args.budget_s)
        self.result: dict[str, Any] = {
            "check": "gsched device check", "version": 1, "date": now(), "quick": bool(args.quick),
            "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "budget_s": args.budget_s, "command": " ".join([Path(sys.executable).name, "-m",
                                                            "benchmarks.device_check", *sys.argv[1:]]),
            "parts": {},
        }
        self.s: Settings | None = None

    # ---------------------------------------------------------------- part 1
    def device(self, res: dict[str, Any]) -> None:
        log = self.out / "device_probe.log"
        log.unlink(missing_ok=True)
        out_json = self.tmp / "probe.json"
        with open(out_json, "wb") as f, open(log, "ab") as err:
            proc = subprocess.Popen([sys.executable, "-c", DEVICE_PROBE], cwd=str(REPO), stdout=f,
                                    stderr=err, start_new_session=True)
            try:
                rc = proc.wait(min(120.0, max(1.0, self.budget.left())))
            except subprocess.TimeoutExpired:
                raise TimeoutError("the device probe (import torch, query CUDA) did not answer in time") from None
            finally:
                _kill_group(proc)
        if rc != 0:
            raise RuntimeError(f"device probe exited {rc}: {tail(log, 10)}")
        res.update(json.loads(out_json.read_text().strip().splitlines()[-1]))
        smi = shutil.which("nvidia-smi")
        res["nvidia_smi"] = smi
        if smi:
            try:
                res["nvidia_smi_gpus"] = subprocess.run(
                    [smi, "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
            except (OSError, subprocess.SubprocessError) as e:
                res["nvidia_smi_gpus"] = f"failed: {e}"
        if res.get("cuda"):
            print(f"device: {res['name']} ({res['memory_bytes'] / 2**30:.0f} GiB, sm_{''.join(map(str, res['capability']))}"
                  f", bf16 {'yes' if res['bf16_supported'] else 'no'}), torch {res['torch']}, CUDA {res['cuda_build']}, "
                  f"cuDNN {res.get('cudnn')}, NCCL {res.get('nccl')}; nvidia-smi: {smi or 'NOT FOUND'}", flush=True)
            if not smi:
                print("warning: nvidia-smi not found: the agent's --gpus auto will report a CPU device", flush=True)
        else:
            print(f"device: NO CUDA device visible (torch {res['torch']}, built for CUDA {res['cuda_build']}); "
                  "running on CPU", flush=True)

    # ---------------------------------------------------------------- part 2
    def throughput(self, res: dict[str, Any]) -> None:
        s = self._settings()
        self.budget.need(45 if not s.quick else 20, "the throughput part")
        source = f"synthetic:classes={s.classes},samples={s.samples},size={s.size},seed=1"
        res["config"] = {"source": source, "image_shape": [s.size, s.size, 3], "shards": s.shards,
                         "batch_size": s.batch, "epochs": s.epochs, "loader_workers": s.loader_workers,
                         "world_size": 1, "figure": "images_per_s of the last epoch (warm)",
                         "fp32_means": "fp32 with TF32 allowed" if s.cuda else "fp32"}
        t0 = time.perf_counter()
        shards, classes = make_synthetic(source, self.tmp / "data", "devcheck", s.shards)
        res["data_build_s"] = round(time.perf_counter() - t0, 1)
        print(f"[throughput] {s.samples} synthetic images {s.size}x{s.size} in {s.shards} shards built in "
              f"{res['data_build_s']} s", flush=True)
        runs: list[dict[str, Any]] = []
        res["runs"] = runs
        for i, (amp, cl) in enumerate(VARIANTS):
            self.budget.need(30 if not s.quick else 15, f"throughput run amp={amp} channels_last={cl}")
            run: dict[str, Any] = {"amp": amp, "channels_last": cl}
            runs.append(run)
            run_dir = self.tmp / f"run-{i}"
            run_dir.mkdir()
            spec = {"job_id": 9000 + i, "shards": shards, "num_classes": classes,
                    "checkpoint_dir": str(run_dir / "ckpt"), "metrics_path": str(run_dir / "metrics.jsonl"),
                    "train": {"epochs": s.epochs, "batch_size": s.batch, "lr": 0.1, "lr_scaling": "none",
                              "eval_every": 0, "amp": amp, "channels_last": cl,
                              "loader_workers": s.loader_workers, "backend": "auto", "device": "auto"}}
            spec_path = run_dir / "rank-0.spec.json"
            spec_path.write_text(json.dumps(spec, indent=1))
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                   "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "PYTHONUNBUFFERED": "1"}
            if s.threads:
                env["GSCHED_THREADS"] = str(s.threads)
            log = self.out / f"throughput-{amp}-{'cl' if cl else 'nchw'}.log"
            log.unlink(missing_ok=True)
            t1 = time.perf_counter()
            try:
                rc = run_child([sys.executable, "-m", "agents.workloads.resnet_ddp", "--spec", str(spec_path)],
                               log, min(s.run_cap_s, self.budget.left() - 3), env)
            except TimeoutError as e:
                run["error"] = str(e)
                rc = None
            run["wall_s"] = round(time.perf_counter() - t1, 1)
            run["exit_code"] = rc
            epochs = metric_records(run_dir / "metrics.jsonl")
            run["epochs"] = [slim(r) for r in epochs]
            progress = metric_records(run_dir / "metrics.jsonl", "progress")
            if progress and rc != 0:  # how far a stopped run got
                run["last_progress"] = {k: progress[-1].get(k) for k in ("epoch", "step", "steps")}
            if epochs:
                last = epochs[-1]
                run["images_per_s"] = round(float(last["images_per_s"]), 1)
                run["data_wait_fraction"] = round(float(last["data_wait_fraction"]), 3)
                run["step_time_s"] = last.get("step_time_s")
                run["warm_epoch"] = last["epoch"]
            if rc != 0 and "error" not in run:
                run["error"] = f"exit {rc}: {tail(log, 8)}"
            shutil.rmtree(run_dir / "ckpt", ignore_errors=True)
            print(f"[throughput] amp={amp:4} channels_last={cl!s:5}: "
                  + (f"{run['images_per_s']:.1f} images/s (epoch {run['warm_epoch']}, data wait "
                     f"{100 * run['data_wait_fraction']:.0f}%)" if "images_per_s" in run else "no figure")
                  + (f"; ERROR {run['error'][:300]}" if "error" in run else "")
                  + f" [{run['wall_s']:.0f} s]", flush=True)
        rate = {(r["amp"], r["channels_last"]): r.get("images_per_s") for r in runs}
        res["ratios"] = {
            "bf16_over_fp32_nchw": ratio(rate.get(("bf16", False)), rate.get(("off", False))),
            "bf16_over_fp32_channels_last": ratio(rate.get(("bf16", True)), rate.get(("off", True))),
            "channels_last_over_nchw_fp32": ratio(rate.get(("off", True)), rate.get(("off", False))),
            "channels_last_over_nchw_bf16": ratio(rate.get(("bf16", True)), rate.get(("bf16", False))),
            "bf16_channels_last_over_fp32_nchw": ratio(rate.get(("bf16", True)), rate.get(("off", False))),
        }
        failed = [r for r in runs if "images_per_s" not in r]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(runs)} runs gave no figure")

    # ---------------------------------------------------------------- part 3
    def cluster(self, res: dict[str, Any]) -> None:
        from scheduler.cli.localcluster import LocalCluster, NodeSpec

        s = self._settings()
        self.budget.need(60 if not s.quick else 30, "the cluster part")
        root = self.tmp / "cluster"
        # LocalCluster passes str(gpus) to the agent's --gpus, so "auto" reaches it as such: the agent then
        # asks nvidia-smi for the real devices.
        gpus: Any = "auto" if s.cuda else 1
        node = NodeSpec("gpu0" if s.cuda else "cpu0", gpus=gpus)
        debug_env = {"TORCH_DISTRIBUTED_DEBUG": "INFO", "TORCH_CPP_LOG_LEVEL": "INFO", "NCCL_DEBUG": "INFO"}
        threads = max(1, (os.cpu_count() or 1) // 2) if s.cuda else 1
        res["config"] = {"agent_gpus": str(gpus), "ranks": 1, "image_shape": [s.cl_size, s.cl_size, 3],
                         "samples": s.cl_samples, "shards": s.cl_shards, "batch_size": s.cl_batch,
                         "epochs": s.cl_epochs, "loader_workers": s.cl_loader_workers, "threads_per_rank": threads,
                         "env": debug_env}
        cluster = LocalCluster(root, [node], heartbeat_s=0.5, cycle_s=0.5, threads_per_rank=threads,
                               extra_env=debug_env)
        t0 = time.perf_counter()
        job_id: int | None = None
        try:
            cluster.start()
            res["cluster_start_s"] = round(time.perf_counter() - t0, 1)
            nodes = cluster.admin().get("/v1/nodes")
            res["nodes"] = [{k: n.get(k) for k in ("name", "state", "devices", "device_kind", "device_model")}
                            for n in nodes]
            print(f"[cluster] server and agent up in {res['cluster_start_s']} s; node reports "
                  + ", ".join(f"{n['name']}: {n.get('devices')} x {n.get('device_kind')} {n.get('device_model')}"
                              for n in nodes), flush=True)
            token = cluster.add_user("devcheck")
            source = f"synthetic:classes=10,samples={s.cl_samples},size={s.cl_size},seed=3"
            t1 = time.perf_counter()
            cluster.cli("data", "make", "devcheck", "--source", source, "--shards", str(s.cl_shards),
                        "--replicas", "1", timeout=max(5.0, min(180.0, self.budget.left())))
            res["data_make_s"] = round(time.perf_counter() - t1, 1)
            job_toml = root / "job.toml"
            job_toml.write_text(
                f'name = "device-check"\n[resources]\nranks = 1\ngpus_per_rank = 1\n[data]\ndataset = "devcheck"\n'
                f'[train]\nepochs = {s.cl_epochs}\nbatch_size = {s.cl_batch}\nlr = 0.05\n'
                f'loader_workers = {s.cl_loader_workers}\n[limits]\ntime = "10m"\n')
            submitted = time.perf_counter()
            job_id = int(cluster.cli("submit", str(job_toml), token=token).stdout.strip().split()[-1])
            res["job_id"] = job_id
            print(f"[cluster] data set made in {res['data_make_s']} s; job {job_id} submitted", flush=True)
            try:
                job = cluster.wait_job(job_id, FINAL, timeout=max(5.0, min(240.0, self.budget.left() - 10)))
            except TimeoutError as e:
                res["error"] = "job did not end in time: " + " | ".join(str(e).splitlines()[:6])[:800]
                job = cluster.job(job_id)
            res["job_wall_s"] = round(time.perf_counter() - submitted, 1)
            res["state"] = job.get("state")
            res["reason"] = job.get("reason")
            if job.get("started_at") and job.get("submitted_at"):
                res["submit_to_running_s"] = round(job["started_at"] - job["submitted_at"], 2)
            res["ranks"] = [{k: r.get(k) for k in ("rank", "node", "devices", "state", "exit_code")}
                            for r in job.get("ranks", [])]
            res["metrics"] = [slim(m) for m in job.get("metrics", [])]
            text = self._rank_log(cluster, job_id, node.name)
            (self.out / "cluster-rank0.log").write_text(text)
            found = re.findall(r"backend_name:\s*(\w+)", text)
            reported = [m.get("backend") for m in job.get("metrics", []) if m.get("backend")]
            if reported:  # the workload's own epoch metrics say which backend and device it ran on
                res["backend"] = reported[-1]
                res["backend_evidence"] = (f"the epoch metrics (backend {reported[-1]}, device "
                                           f"{job['metrics'][-1].get('device')})"
                                           + (f'; "backend_name: {found[-1]}" in the rank log' if found else ""))
            else:
                res["backend"] = found[-1] if found else None
                res["backend_evidence"] = (f'"backend_name: {found[-1]}" in the rank log' if found
                                           else "no backend_name line in the rank log")
            nccl = re.search(r"NCCL version (\S+)", text)
            res["nccl_version_in_log"] = nccl.group(1) if nccl else None
            visible = re.findall(r"cuda_visible_devices:[ \t]*([^\n]*)", text)
            res["cuda_visible_devices"] = visible[-1].strip() if visible else None
            print(f"[cluster] job {job_id} {res['state']} in {res['job_wall_s']} s, backend {res['backend']}"
                  + (f" (NCCL {res['nccl_version_in_log']})" if res["nccl_version_in_log"] else "") + "; epochs: "
                  + ", ".join(f"{m.get('epoch')}: {m.get('images_per_s', 0):.0f} images/s" for m in res["metrics"]),
                  flush=True)
            if res["state"] != "COMPLETED":
                raise RuntimeError(f"job {job_id} ended {res['state']}: {res.get('reason')}")
            if s.cuda and res["backend"] != "nccl":
                raise RuntimeError(f"CUDA is present but the rank used {res['backend']!r}, not nccl")
        except BaseException:
            if "log_tails" not in res:
                res["log_tails"] = cluster.tail_logs(20)[-4000:]
            raise
        finally:
            cluster.close()
            left = cluster.rank_pids()
            res["processes_left"] = left
            for log in root.glob("*.log"):
                shutil.copyfile(log, self.out / f"cluster-{log.name}")

    def _rank_log(self, cluster: Any, job_id: int, node: str) -> str:
        parts = []
        try:
            chunks = cluster.admin().get(f"/v1/jobs/{job_id}/logs", rank=0).get("chunks", [])
            parts.append("".join(c["text"] for c in chunks))
        except Exception as e:  # noqa: BLE001 - fall back to the agent's file
            parts.append(f"(logs API failed: {e})\n")
        for path in sorted((cluster.data_dir(node) / ".gsched" / "jobs" / str(job_id)).glob("attempt-*/rank-0.log")):
            parts.append(f"\n--- {path.name} of {path.parent.name} (agent's file)\n" + path.read_text(errors="replace"))
        return "".join(parts)

    # ---------------------------------------------------------------- part 4
    def bench(self, res: dict[str, Any]) -> None:
        s = self._settings()
        self.budget.need(25 if not s.quick else 15, "the compute-only bench")
        res["config"] = {"image_shape": [s.bench_size, s.bench_size, 3], "batch_size": s.bench_batch,
                         "timed_steps": s.bench_steps, "data": "random, already in memory, no loader"}
        log = self.out / "bench.log"
        log.unlink(missing_ok=True)
        env = dict(os.environ)
        if s.threads:
            env["GSCHED_THREADS"] = str(s.threads)
        rc = run_child([sys.executable, "-m", "agents.workloads.resnet_ddp", "--bench", "--bench-size",
                        str(s.bench_size), "--bench-batch", str(s.bench_batch), "--bench-steps", str(s.bench_steps)],
                       log, min(180.0, self.budget.left() - 3), env)
        runs = []
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    runs.append(json.loads(line))
                except ValueError:
                    pass
        res["runs"] = runs
        for r in runs:
            print(f"[bench] amp={r['amp']:4} channels_last={r['channels_last']!s:5}: {r['images_per_s']:.1f} images/s",
                  flush=True)
        rate = {(r["amp"], r["channels_last"]): r["images_per_s"] for r in runs}
        res["ratios"] = {
            "bf16_over_fp32_nchw": ratio(rate.get(("bf16", False)), rate.get(("off", False))),
            "bf16_over_fp32_channels_last": ratio(rate.get(("bf16", True)), rate.get(("off", True))),
            "channels_last_over_nchw_fp32": ratio(rate.get(("off", True)), rate.get(("off", False))),
            "channels_last_over_nchw_bf16": ratio(rate.get(("bf16", True)), rate.get(("bf16", False))),
        }
        if rc != 0:
            raise RuntimeError(f"--bench exited {rc}: {tail(log, 8)}")

    # ---------------------------------------------------------------- driver
    def _settings(self) -> Settings:
        if self.s is None:
            dev = self.result["parts"].get("device", {})
            self.s = settings(self.args, bool(dev.get("cuda")))
        return self.s

    def run(self, parts: list[tuple[str, Callable[[dict[str, Any]], None]]]) -> None:
        stop: str | None = None
        for name, fn in parts:
            res: dict[str, Any] = {}
            self.result["parts"][name] = res
            if stop:
                res["status"] = "skipped"
                res["error"] = stop
                print(f"[{name}] skipped: {stop}", flush=True)
                continue
            print(f"== {name} ({self.budget.left():.0f} s of budget left)", flush=True)
            t0 = time.perf_counter()
            try:
                fn(res)
                res["status"] = "ok"
            except OutOfTime as e:
                res["status"] = "skipped"
                res["error"] = str(e)
                stop = f"stopped: the {self.budget.total_s:.0f} s time budget ran out before this part"
                print(f"[{name}] {e}", flush=True)
            except KeyboardInterrupt:
                res["status"] = "interrupted"
                res["error"] = "interrupted (SIGTERM or Ctrl-C)"
                stop = "stopped: the check was interrupted"
                print(f"[{name}] interrupted", flush=True)
            except Exception as e:  # noqa: BLE001 - report it and go on with the next part
                res["status"] = "failed"
                res["error"] = f"{type(e).__name__}: {e}"[:2000]
                res["traceback"] = traceback.format_exc()[-3000:]
                print(f"[{name}] FAILED: {res['error'][:600]}", flush=True)
            res["wall_s"] = round(time.perf_counter() - t0, 1)
            if self.budget.left() <= 0 and not stop:
                stop = f"stopped: the {self.budget.total_s:.0f} s time budget is spent"
            self.write()

    def write(self) -> None:
        self.result["elapsed_s"] = round(self.budget.elapsed(), 1)
        (self.out / "device_check.json").write_text(json.dumps(self.result, indent=1, default=str) + "\n")
        (self.out / "device_check.md").write_text(markdown(self.result))


def now() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M")


def _f(x: Any, fmt: str = ".0f") -> str:
    return format(x, fmt) if isinstance(x, int | float) else "n/a"


def markdown(r: dict[str, Any]) -> str:
    parts = r["parts"]
    dev = parts.get("device", {})
    quick = " (--quick: tiny images on whatever device is present; proves the script, not the device)" \
        if r["quick"] else ""
    lines = [f"## Device check, {r['date']}{quick}", ""]
    if dev.get("cuda"):
        lines.append(f"- device: {dev.get('name')} ({_f(dev.get('memory_bytes', 0) / 2**30)} GiB, "
                     f"sm_{''.join(map(str, dev.get('capability', [])))}), torch {dev.get('torch')}, CUDA "
                     f"{dev.get('cuda_build')}, cuDNN {dev.get('cudnn')}, NCCL {dev.get('nccl')}; {r['cpus']} CPUs")
    elif dev.get("status") == "ok":
        lines.append(f"- device: no CUDA device (torch {dev.get('torch')}, CPU only); {r['cpus']} CPUs")
    else:
        lines.append(f"- device: probe {dev.get('status', 'not run')}: {dev.get('error', '')}")
    lines.append(f"- command: `{r['command']}`; wall time {_f(r.get('elapsed_s'))} s of a {_f(r['budget_s'])} s budget")

    tp = parts.get("throughput", {})
    if tp.get("runs"):
        c = tp["config"]
        figs = []
        for run in tp["runs"]:
            label = f"{'bf16' if run['amp'] == 'bf16' else 'fp32'}/{'channels-last' if run['channels_last'] else 'NCHW'}"
            if "images_per_s" in run:
                figs.append(f"{label} {run['images_per_s']:.1f} images/s (data wait "
                            f"{100 * run['data_wait_fraction']:.0f}%)")
            else:
                figs.append(f"{label} failed")
        q = tp.get("ratios", {})
        lines.append(
            f"- [device] one rank of DDP ResNet-18 (world size 1), synthetic {c['image_shape'][0]}x"
            f"{c['image_shape'][1]}x3 shards, batch {c['batch_size']}, {c['loader_workers']} loader workers, "
            f"epoch {c['epochs']} of {c['epochs']} ({c['fp32_means']}): " + ", ".join(figs)
            + f"; bf16/fp32 {_f(q.get('bf16_over_fp32_nchw'), '.2f')} (NCHW), "
            f"{_f(q.get('bf16_over_fp32_channels_last'), '.2f')} (channels-last); channels-last/NCHW "
            f"{_f(q.get('channels_last_over_nchw_fp32'), '.2f')} (fp32), "
            f"{_f(q.get('channels_last_over_nchw_bf16'), '.2f')} (bf16)")
    if tp.get("status") not in (None, "ok"):
        lines.append(f"- [device] throughput part {tp['status']}: {str(tp.get('error', ''))[:300]}")

    cl = parts.get("cluster", {})
    if cl.get("state"):
        c = cl["config"]
        node = (cl.get("nodes") or [{}])[0]
        epochs = ", ".join(f"epoch {m.get('epoch')} {_f(m.get('images_per_s'))} images/s"
                           + (f" accuracy {100 * m['accuracy']:.0f}%" if isinstance(m.get("accuracy"), float) else "")
                           for m in cl.get("metrics", []))
        lines.append(
            f"- [device] gsched end to end: one server, one agent `--gpus {c['agent_gpus']}` (node reports "
            f"{node.get('devices')} x {node.get('device_kind')} {node.get('device_model')}), 1-rank job on "
            f"{c['image_shape'][0]}x{c['image_shape'][1]}x3 synthetic data, batch {c['batch_size']}: {cl['state']} in "
            f"{_f(cl.get('job_wall_s'))} s (submit -> running {_f(cl.get('submit_to_running_s'), '.2f')} s), "
            f"backend {cl.get('backend')} ({cl.get('backend_evidence')}"
            + (f", NCCL {cl['nccl_version_in_log']}" if cl.get("nccl_version_in_log") else "") + f"); {epochs}")
    if cl.get("status") not in (None, "ok"):
        lines.append(f"- [device] cluster part {cl['status']}: {str(cl.get('error', ''))[:300]}")

    b = parts.get("bench", {})
    if b.get("runs"):
        c = b["config"]
        figs = [f"{'bf16' if x['amp'] == 'bf16' else 'fp32'}/{'channels-last' if x['channels_last'] else 'NCHW'} "
                f"{x['images_per_s']:.1f} images/s" for x in b["runs"]]
        lines.append(f"- [device] compute only (`resnet_ddp --bench`: random data in memory, no loader, no DDP), "
                     f"{c['image_shape'][0]}x{c['image_shape'][1]}x3, batch {c['batch_size']}, {c['timed_steps']} timed "
                     f"steps: " + ", ".join(figs))
    if b.get("status") not in (None, "ok"):
        lines.append(f"- [device] bench part {b['status']}: {str(b.get('error', ''))[:300]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, to prove the script works (no GPU needed)")
    p.add_argument("--budget-s", type=float, default=420.0, help="hard limit for the whole run (default 420)")
    p.add_argument("--out", default=None, help="output folder (default $OUT, else ./device-out)")
    p.add_argument("--only", default="throughput,bench,cluster",
                   help="comma-separated parts to run after the device probe: throughput, bench, cluster")
    p.add_argument("--size", type=int, default=None, help="image side for the throughput part (default 224)")
    p.add_argument("--samples", type=int, default=None, help="synthetic images for the throughput part (default 32768)")
    p.add_argument("--batch", type=int, default=None, help="batch per step for the throughput part (default 128)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per throughput run (default 2; the last counts)")
    p.add_argument("--loader-workers", type=int, default=None, help="loader workers for the throughput runs")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (data, cluster) for inspection")
    args = p.parse_args(argv)

    out = Path(args.out or os.environ.get("OUT") or "device-out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gsched-devcheck-"))

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    check = Check(args, out, tmp)
    wanted = {x.strip() for x in args.only.split(",") if x.strip()}
    parts: list[tuple[str, Callable[[dict[str, Any]], None]]] = [("device", check.device)]
    parts += [(n, getattr(check, n)) for n in ("throughput", "bench", "cluster") if n in wanted]
    print(f"gsched device check: output in {out}, scratch in {tmp}, budget {args.budget_s:.0f} s"
          + (" (quick)" if args.quick else ""), flush=True)
    try:
        check.run(parts)
    finally:
        check.write()
        if args.keep:
            print(f"scratch kept in {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\n=== device_check.md ===\n" + (out / "device_check.md").read_text(), flush=True)
    print("=== device_check.json ===\n" + (out / "device_check.json").read_text(), flush=True)
    statuses = {n: check.result["parts"][n].get("status") for n, _ in parts}
    print("parts: " + ", ".join(f"{n} {st}" for n, st in statuses.items())
          + f"; {check.budget.elapsed():.0f} s", flush=True)
    return 0 if all(st == "ok" for st in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
