"""``gsched demo`` (``make demo``): a real embedded cluster on this machine, start to finish.

One server (SQLite in a temporary GSCHED_HOME), three agents posing as nodes in two racks (one CPU
device each), the ``digits`` data set (1,797 real 8x8 scans of handwritten digits shipped with
scikit-learn) cut into 6 shards with 2 replicas each, two users (alice, bob) each submitting a DDP
ResNet-18 job, the queue shown while they run, and a summary per job.  Every process is stopped on
exit, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scheduler.cli.localcluster import LocalCluster, NodeSpec
from scheduler.core.lifecycle import FINAL, JobState

JOB = """name = "{name}"
[resources]
ranks = {ranks}
gpus_per_rank = 1
[data]
dataset = "digits"
[train]
epochs = {epochs}
batch_size = 32
lr = 0.05
seed = {seed}
[limits]
time = "30m"
"""


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from scheduler.cli.render import print_queue

    console = Console()
    if not console.is_terminal:  # a log file or a pipe: wide enough for the queue's columns
        console = Console(width=150)
    root = Path(tempfile.mkdtemp(prefix="gsched-demo-"))
    cluster = LocalCluster(root, [NodeSpec("node-a1", "rack-a"), NodeSpec("node-a2", "rack-a"),
                                  NodeSpec("node-b1", "rack-b")], heartbeat_s=0.5, ttl_s=10, cycle_s=0.5)

    def _interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.monotonic()
    try:
        console.rule("[bold]gsched demo: an embedded cluster on loopback")
        console.print(f"GSCHED_HOME={cluster.home}  server={cluster.url}")
        cluster.start()
        console.print(f"server and {len(cluster.nodes)} agents up: " + ", ".join(
            f"{n.name} ({n.rack})" for n in cluster.nodes.values()))
        console.rule("data: digits, 6 shards x 2 replicas, rack-aware")
        out = cluster.cli("data", "make", "digits", "--source", "digits", "--shards", "6", "--replicas", "2")
        console.print(out.stdout.strip().splitlines()[0])
        console.print(cluster.cli("data", "ls").stdout)
        tokens = {"alice": cluster.add_user("alice"), "bob": cluster.add_user("bob")}
        console.rule("two users submit")
        jobs = {}
        for user, ranks, seed in (("alice", 2, 1), ("bob", 1, 2)):
            path = root / f"{user}.toml"
            path.write_text(JOB.format(name=f"{user}-resnet18", ranks=ranks, epochs=args.epochs, seed=seed))
            job_id = int(cluster.cli("submit", str(path), token=tokens[user]).stdout.strip().splitlines()[-1])
            jobs[job_id] = user
            console.print(f"{user} submitted job {job_id}: {ranks} rank(s) x 1 device, {args.epochs} epochs")
        time.sleep(2)
        console.rule(f"gsched explain {max(jobs)}: why is {jobs[max(jobs)]}'s job where it is?")
        console.print(cluster.cli("explain", str(max(jobs))).stdout)
        console.rule("queue (refreshing until both jobs finish)")
        last = 0.0
        while True:
            view = cluster.admin().get("/v1/jobs", all="true")
            states = {j["id"]: j["state"] for j in view["jobs"] if j["id"] in jobs}
            if time.monotonic() - last > 8 or all(s in FINAL for s in states.values()):
                console.print(time.strftime("[dim]%H:%M:%S[/dim]"))
                print_queue(view, console)
                last = time.monotonic()
            if len(states) == len(jobs) and all(s in FINAL for s in states.values()):
                break
            time.sleep(1)
        console.rule("summary")
        ok = True
        for job_id, user in jobs.items():
            doc = cluster.job(job_id)
            ok &= doc["state"] == JobState.COMPLETED
            console.print(f"[bold]job {job_id}[/bold] ({user}) {doc['state']} on {', '.join(doc['nodes'])}: "
                          f"local reads {100 * doc['local_fraction']:.0f}%, {doc['transfer_bytes']} bytes staged, "
                          f"{len(doc['checkpoints'])} checkpoints")
            for m in doc["metrics"]:
                acc = m.get("accuracy")
                console.print(f"   epoch {m['epoch']}: loss {m['loss']:.4f}  accuracy "
                              f"{'-' if acc is None else f'{100 * acc:.1f}%'}  {m.get('images_per_s', 0):.0f} images/s")
            if doc["state"] != JobState.COMPLETED:
                console.print(f"   reason: {doc['reason']}")
        console.print(cluster.cli("share").stdout)
        console.print(f"demo finished in {time.monotonic() - t0:.0f}s; logs under {root}")
        return 0 if ok else 1
    except KeyboardInterrupt:
        console.print("\ninterrupted: stopping every process")
        return 130
    finally:
        cluster.close()
        if not args.keep and root.exists():
            shutil.rmtree(root, ignore_errors=True)
        sys.stdout.flush()
