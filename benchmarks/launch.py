"""Section ``launch``: a DDP ResNet-18 job started by gsched against the same ranks under ``torchrun``.

One local cluster (server + one agent with 2 devices, CPU here) on loopback, at the shipped intervals
(heartbeat and cycle every 2 s, as ``gsched server`` starts without a config: the test clusters' 0.5 s
cost the training ranks CPU on these 2 cores); a synthetic data set of
4 shards with its replica on that node (data local).  A 2-rank job (1 device each) is submitted with
``gsched submit``; submit-to-all-ranks-running latency is the server's ``started_at - submitted_at``
(the job turns RUNNING when every rank runs).  Then the very rank spec files the agent wrote (same
shards per rank, same training knobs, same threads per rank) are run by
``torchrun --nproc-per-node 2 -m benchmarks.rank_by_env`` on the same node, alone.  Throughput is
rank 0's median ``images_per_s`` over the warm epochs (2 to 5) in each metrics file; ratio gsched /
torchrun.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Figure, Report
from scheduler.localcluster import LocalCluster, NodeSpec


def _warm_rate(metrics: Path) -> float:
    """The median ``images_per_s`` of the warm epochs (all but the first): one epoch alone moved the
    ratio between 0.74 and 1.07 from run to run on 2 shared cores."""
    import statistics

    rates = [json.loads(line)["images_per_s"] for line in metrics.read_text().splitlines()
             if line.strip() and json.loads(line).get("type") == "epoch"]
    warm = rates[1:] or rates
    return float(statistics.median(warm)) if warm else float("nan")


def run(report: Report) -> None:
    samples, size, epochs = (320, 8, 2) if report.quick else (2400, 16, 5)
    source = f"synthetic:classes=4,samples={samples},size={size},seed=5"
    with tempfile.TemporaryDirectory(prefix="gsched-launch-") as tmp:
        cluster = LocalCluster(Path(tmp), [NodeSpec("n1", gpus=2)], heartbeat_s=2.0, cycle_s=2.0, ttl_s=15.0)
        try:
            cluster.start()
            token = cluster.add_user("bench")
            cluster.cli("data", "make", "bench", "--source", source, "--shards", "4", "--replicas", "1")
            job_toml = Path(tmp) / "job.toml"
            job_toml.write_text(f'name = "launch"\n[resources]\nranks = 2\ngpus_per_rank = 1\n[data]\n'
                                f'dataset = "bench"\n[train]\nepochs = {epochs}\nbatch_size = 32\nlr = 0.05\n'
                                f'eval_every = 0\n[limits]\ntime = "30m"\n')
            job_id = int(cluster.cli("submit", str(job_toml), token=token).stdout.strip().split()[-1])
            try:
                job = cluster.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=180 if report.quick else 600)
            except TimeoutError as e:
                first = str(e).splitlines()
                report.note("launch", f"gsched job {job_id} did not end: {' | '.join(first[:4])[:600]}")
                return
            if job["state"] != "COMPLETED":
                report.note("launch", f"gsched job ended {job['state']}: {job.get('reason')}")
                return
            latency = job["started_at"] - job["submitted_at"]
            runs = sorted((cluster.data_dir("n1") / ".gsched" / "jobs" / str(job_id)).glob("attempt-*"))
            run_dir = runs[-1]
            g_rate = _warm_rate(run_dir / "metrics.jsonl")
            specs = Path(tmp) / "torchrun"
            specs.mkdir()
            for r in (0, 1):
                spec = json.loads((run_dir / f"rank-{r}.spec.json").read_text())
                spec["metrics_path"] = str(specs / "metrics.jsonl")
                spec["checkpoint_dir"] = str(specs / "ckpt")
                (specs / f"rank-{r}.spec.json").write_text(json.dumps(spec))
        finally:
            cluster.close()
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
        env = {**os.environ, "GSCHED_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
        t0 = time.perf_counter()
        out = subprocess.run([torchrun, "--nproc-per-node", "2", "-m", "benchmarks.rank_by_env",
                              "--spec-dir", str(specs)], env=env, capture_output=True, text=True, timeout=900,
                             cwd=str(Path(__file__).resolve().parents[1]))
        if out.returncode != 0:
            report.note("launch", f"torchrun failed ({out.returncode}): {out.stderr[-800:]}")
            return
        t_rate = _warm_rate(specs / "metrics.jsonl")
        report.note("launch", f"torchrun baseline ran {time.perf_counter() - t0:.0f} s")
        report.add(Figure("launch", f"DDP ResNet-18, 2 ranks x 1 CPU device, {samples} images {size}x{size}, "
                          f"median of epochs 2-{epochs}", f"gsched {g_rate:.1f} images/s, torchrun {t_rate:.1f} images/s",
                          f"ratio {g_rate / t_rate:.3f}", ">= 0.97", g_rate / t_rate >= 0.97))
        report.add(Figure("launch", "submit -> all ranks running (data local)", f"{latency:.2f} s",
                          "no baseline (torchrun has no queue): ratio n/a", "< 2 s", latency < 2.0))
