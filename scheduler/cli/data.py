"""``gsched data make`` (build shards locally, upload each copy to its node), ``gsched data add`` (register
files the nodes already have, where they lie) and ``gsched data ls``."""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agents.shardfile import shard_path
from scheduler.core.lifecycle import ReplicaState
from scheduler.protocol.client import Client
from scheduler.protocol.http import open_url, send
from scheduler.protocol.peers import peer_context, peer_url, why
from scheduler.protocol.servererror import ServerError


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
                                   progress=lambda d, t: _bar(f"building {args.name}", d, t), fmt=args.format)
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
        tls = peer_context(c.servers.ca)  # agents serving HTTPS are verified with the CLI's --ca
        t0 = time.monotonic()
        moved = 0
        for i, up in enumerate(plan["uploads"]):
            path = shard_path(tmp, args.name, up["shard"])
            moved += _upload(up, args.name, path, shas[up["shard"]], tls)
            rate = moved / max(time.monotonic() - t0, 1e-6)
            _bar("uploading replicas", i + 1, total, extra=f" copies, {rate / 1e6:.1f} MB/s")
    return _await_healthy(c, args.name)


def _await_healthy(c: Client, name: str) -> int:
    """Wait until every shard has a healthy copy (the agents report each with its checksum on their next
    heartbeat); print the data set's summary and its name."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ds = next((d for d in c.get("/v1/datasets") if d["name"] == name), None)
        if ds and all(any(r["state"] == ReplicaState.HEALTHY for r in sh["replicas"]) for sh in ds["shards"]):
            healthy = ds["replicas_healthy_min"]
            print(f"data set {name}: {len(ds['shards'])} shards, {ds['samples']} samples, "
                  f"{ds['bytes'] / 1e6:.1f} MB, {healthy}/{ds['replicas_required']} healthy replicas per shard")
            print(name)
            return 0
        time.sleep(0.5)
    print("gsched data: stored, but the agents have not confirmed every shard yet; see `gsched data ls`",
          file=sys.stderr)
    return 1


class AddRefused(Exception):
    """``gsched data add`` cannot go on; the message names the node and the file."""


def _scan(scan: dict[str, Any], name: str, path: str, glob: str, tls: ssl.SSLContext) -> list[dict[str, Any]]:
    """Ask one node's agent to hash the files under ``path`` (streaming sha256, a progress bar per node);
    returns what it found.  Raises AddRefused with the agent's words."""
    body = json.dumps({"path": path, "glob": glob}).encode()
    headers = {"X-Gsched-Ticket": scan["ticket"], "X-Gsched-Time": str(scan["time"]),
               "Content-Type": "application/json", "Content-Length": str(len(body))}
    node = scan["node"]
    try:
        with open_url(peer_url(scan["address"], f"scan/{name}"), "POST", body, headers, timeout_s=600,
                      context=tls) as resp:
            while raw := resp.readline():
                msg = json.loads(raw)
                if "error" in msg:
                    raise AddRefused(msg["error"])
                if "files" in msg:
                    return list(msg["files"])
                _bar(f"hashing on {node}: {msg['file'][-40:]}", msg["done"], msg["total"])
    except ServerError as e:
        raise AddRefused(e.message.strip()) from None
    except OSError as e:
        raise AddRefused(f"node {node} ({scan['address']}) did not answer: {why(e)}") from None
    raise AddRefused(f"node {node} stopped answering while it hashed the files")


def add_dataset(c: Client, args: argparse.Namespace) -> int:
    """``gsched data add NAME --node N --path P [--glob G]``: the nodes' agents hash their files, the
    server stores the manifest (a file on several nodes is one shard with a copy on each), the agents
    make each file its shard (a hard link), and the cycle copies shards peer to peer up to R."""
    nodes = list(args.node)
    paths = list(args.path) * len(nodes) if len(args.path) == 1 else list(args.path)
    if len(paths) != len(nodes) or len(set(nodes)) != len(nodes):
        print("gsched data add: give one --path for all nodes or one per --node, each node once", file=sys.stderr)
        return 2
    plan = c.post(f"/v1/datasets/{args.name}/scan", {"nodes": nodes})
    found: dict[str, list[dict[str, Any]]] = {}
    tls = peer_context(c.servers.ca)  # agents serving HTTPS are verified with the CLI's --ca
    try:
        for scan, path in zip(plan["scans"], paths, strict=True):
            found[scan["node"]] = _scan(scan, args.name, path, args.glob, tls)
    except AddRefused as e:
        print(f"gsched data add: {e} (nothing was registered)", file=sys.stderr)
        return 2
    by_name: dict[str, dict[str, Any]] = {}
    holders: dict[str, dict[str, str]] = {}
    for node, files in found.items():
        for f in files:
            first = by_name.setdefault(f["name"], f)
            if first["sha256"] != f["sha256"]:
                other = next(n for n, p in holders[f["name"]].items())
                print(f"gsched data add: {f['name']} differs between node {other} and node {node} "
                      f"(sha256 {first['sha256'][:12]} vs {f['sha256'][:12]}); nothing was registered", file=sys.stderr)
                return 2
            holders.setdefault(f["name"], {})[node] = f["path"]
    names = sorted(by_name)
    labels = {label for f in by_name.values() for label in f.get("labels", [])}
    classes = args.classes or (max(labels) + 1 if labels else 1)
    shards = [{"index": i, "bytes": by_name[n]["bytes"], "sha256": by_name[n]["sha256"],
               "samples": by_name[n].get("samples", 0)} for i, n in enumerate(names)]
    in_place = [{"shard": i, "node": node, "path": p} for i, n in enumerate(names) for node, p in sorted(holders[n].items())]
    source = "in place: " + ", ".join(f"{node}:{path}" for node, path in zip(nodes, paths, strict=True))
    body = {"name": args.name, "source": source[:512], "classes": classes, "image_shape": [],
            "replicas": args.replicas, "span": args.span, "shards": shards, "in_place": in_place}
    reply = c.post("/v1/datasets", body)
    linked: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    errors: list[str] = []
    for link in reply["links"]:
        payload = json.dumps({"path": link["path"]}).encode()
        try:
            send(peer_url(link["address"], f"link/{args.name}/{link['shard']}?sha256={link['sha256']}"), "POST",
                 payload, {"X-Gsched-Ticket": link["ticket"], "Content-Type": "application/json",
                           "Content-Length": str(len(payload))}, timeout_s=600, context=tls)
        except ServerError as e:
            errors.append(e.message.strip())
        except OSError as e:
            errors.append(f"node {link['node']} ({link['address']}) did not answer: {why(e)}")
        else:
            linked.append({"shard": link["shard"], "node": link["node"]})
            continue
        failed.append({"shard": link["shard"], "node": link["node"]})
    if failed and _roll_back(c, args.name, linked, failed, errors):
        return 2
    return _await_healthy(c, args.name)


def _roll_back(c: Client, name: str, linked: list[dict[str, Any]], failed: list[dict[str, Any]],
               errors: list[str]) -> bool:
    """Links failed: say why, and ask the server to roll the registration back (it does when a shard is
    left with no copy).  True when the command is over (rolled back, or refused)."""
    for e in errors:
        print(f"gsched data add: {e}", file=sys.stderr)
    try:
        out = c.post(f"/v1/datasets/{name}/abandon", {"linked": linked, "failed": failed,
                                                       "reason": "; ".join(errors)[:2048]})
    except ServerError as e:
        print(f"gsched data add: {e.message.strip()}", file=sys.stderr)
        return True
    if not out["rolled_back"]:
        print(f"gsched data add: {name!r} is kept: {out['why']}", file=sys.stderr)
        return False
    print(f"gsched data add: the registration of {name!r} was rolled back ({out['why']}) and the name is free "
          f"again; fix the file and run gsched data add again", file=sys.stderr)
    return True


def _upload(up: dict[str, Any], name: str, path: Path, sha: str, tls: ssl.SSLContext) -> int:
    """PUT one copy of a shard to the agent the server chose, with the server's ticket for it; raises
    ``ServerError`` (the agent's status, or 0 when it did not answer) naming the shard and the node."""
    size = path.stat().st_size
    url = peer_url(up["address"], f"shards/{name}/{up['shard']}?sha256={sha}")
    with open(path, "rb") as f:
        try:
            send(url, "PUT", f, {"X-Gsched-Ticket": up["ticket"], "Content-Length": str(size),
                                 "Content-Type": "application/octet-stream"}, timeout_s=120, context=tls)
        except ServerError as e:
            raise ServerError(e.status, f"upload of shard {up['shard']} to {up['node']} refused: {e.message}") from None
        except OSError as e:
            raise ServerError(0, f"upload of shard {up['shard']} to {up['node']} ({up['address']}) failed: {why(e)}") from None
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
            for cp in sh.get("copies", []):  # copies under way: how far each has come
                pct = 100 * cp["done_bytes"] / cp["bytes"] if cp["bytes"] else 0
                reps += f" {cp['src']}->{cp['dst']}:{cp['state']} {pct:.0f}%"
            t.add_row(str(sh["index"]), human_bytes(sh["bytes"]), str(sh["samples"]), sh["sha256"][:12], reps)
        c.print(t)
