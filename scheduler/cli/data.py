"""``gsched data make`` and ``gsched data ls``: build shards locally, upload each copy to its node."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agents.shardfile import shard_path
from scheduler.core.lifecycle import ReplicaState
from scheduler.protocol.http import Client, ServerError, send


def _bar(label: str, done: float, total: float, width: int = 30, extra: str = "") -> None:
    if not sys.stderr.isatty() and done not in (0, total):
        return
    filled = int(width * done / total) if total else width
    end = "\n" if done >= total else ""
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done:.0f}/{total:.0f}{extra}{end}")
    sys.stderr.flush()


def make_dataset(c: Client, args: argparse.Namespace) -> int:
    from agents.datasets import SourceError, make_shards

    with tempfile.TemporaryDirectory(prefix="gsched-data-") as tmp:
        try:
            manifest = make_shards(args.source, tmp, args.name, args.shards, seed=args.seed,
                                   progress=lambda d, t: _bar(f"building {args.name}", d, t))
        except (SourceError, ValueError) as e:
            print(f"gsched data make: {e}", file=sys.stderr)
            return 2
        body = {"name": args.name, "source": args.source, "classes": manifest["num_classes"],
                "image_shape": manifest["image_shape"], "replicas": args.replicas, "span": args.span,
                "shards": [{k: sh[k] for k in ("index", "bytes", "sha256", "samples")} for sh in manifest["shards"]]}
        plan = c.post("/v1/datasets", body)
        if plan.get("warning"):
            print(f"warning: {plan['warning']}", file=sys.stderr)
        shas = {sh["index"]: sh["sha256"] for sh in manifest["shards"]}
        total = len(plan["uploads"])
        t0 = time.monotonic()
        moved = 0
        for i, up in enumerate(plan["uploads"]):
            path = shard_path(tmp, args.name, up["shard"])
            moved += _upload(up, args.name, path, shas[up["shard"]])
            rate = moved / max(time.monotonic() - t0, 1e-6)
            _bar("uploading replicas", i + 1, total, extra=f" copies, {rate / 1e6:.1f} MB/s")
    # The agents report each copy with its checksum on their next heartbeat.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ds = next((d for d in c.get("/v1/datasets") if d["name"] == args.name), None)
        if ds and all(any(r["state"] == ReplicaState.HEALTHY for r in sh["replicas"]) for sh in ds["shards"]):
            healthy = ds["replicas_healthy_min"]
            print(f"data set {args.name}: {len(ds['shards'])} shards, {ds['samples']} samples, "
                  f"{ds['bytes'] / 1e6:.1f} MB, {healthy}/{ds['replicas_required']} healthy replicas per shard")
            print(args.name)
            return 0
        time.sleep(0.5)
    print("gsched data make: uploaded, but the agents have not confirmed every shard yet; see `gsched data ls`",
          file=sys.stderr)
    return 1


def _upload(up: dict[str, Any], name: str, path: Path, sha: str) -> int:
    """PUT one copy of a shard to the agent the server chose, with the server's ticket for it; raises
    ``ServerError`` (the agent's status, or 0 when it did not answer) naming the shard and the node."""
    size = path.stat().st_size
    url = f"http://{up['address']}/shards/{name}/{up['shard']}?sha256={sha}"
    with open(path, "rb") as f:
        try:
            send(url, "PUT", f, {"X-Gsched-Ticket": up["ticket"], "Content-Length": str(size),
                                 "Content-Type": "application/octet-stream"}, timeout_s=120)
        except ServerError as e:
            raise ServerError(e.status, f"upload of shard {up['shard']} to {up['node']} refused: {e.message}") from None
        except OSError as e:
            raise ServerError(0, f"upload of shard {up['shard']} to {up['node']} ({up['address']}) failed: {e}") from None
    return size


def print_datasets(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    from scheduler.cli.render import human_bytes

    c = Console()
    if not rows:
        c.print("no data sets yet: gsched data make NAME --source digits")
    for d in rows:
        t = Table(title=f"{d['name']}  ({d['source']}, {d['samples']} samples, {human_bytes(d['bytes'])}, "
                        f"replicas {d['replicas_healthy_min']}/{d['replicas_required']})", title_justify="left",
                  pad_edge=False)
        for col in ("SHARD", "BYTES", "SAMPLES", "SHA256", "REPLICAS"):
            t.add_column(col)
        for sh in d["shards"]:
            reps = " ".join(f"{r['node']}:{r['state']}" for r in sh["replicas"])
            t.add_row(str(sh["index"]), human_bytes(sh["bytes"]), str(sh["samples"]), sh["sha256"][:12], reps)
        c.print(t)
