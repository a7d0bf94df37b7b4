"""``gsched fetch JOB [--out DIR]``: save a job's final checkpoint, metric lines and logs, before the
nodes' job retention removes its directories (``gsched agent --job-retention``).

Into ``DIR`` (default ``./job-JOB``): ``metrics.jsonl`` (every metric line, oldest first, with its
attempt), ``rank-N.log`` (each rank's output, every attempt), and the checkpoint under its own name
(``epoch-NNNN.pt``), fetched from a node holding it and kept only if it hashes to the SHA-256 the
server recorded.  Only the job's owner and admins may (the server says so: 403).
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import sys
from pathlib import Path
from typing import Any

from scheduler.cli import exitcodes
from scheduler.protocol.client import Client
from scheduler.protocol.http import ServerError, open_url
from scheduler.protocol.peers import peer_context, peer_url, why

CHUNK = 1 << 20


def fetch_job(c: Client, job_id: int, out: Path) -> int:
    """Save job ``job_id``'s files under ``out``; prints what it saved.  Returns the exit code: 0, or
    ``exitcodes.JOB_FAILED`` when no node gave a checkpoint that matches its SHA-256 (logs and metrics
    are saved all the same)."""
    doc = c.get(f"/v1/jobs/{job_id}/fetch")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "metrics.jsonl", "w") as f:
        for line in doc["metrics"]:
            f.write(json.dumps(line) + "\n")
    ranks = save_logs(c, job_id, out)
    print(f"job {job_id} ({doc['state']}): {len(doc['metrics'])} metric lines -> {out / 'metrics.jsonl'}; "
          f"logs of {len(ranks)} rank(s) -> {out}/rank-N.log")
    ck = doc.get("checkpoint")
    if ck is None:
        print(f"job {job_id} recorded no checkpoint")
        return exitcodes.OK
    if not ck["sha256"]:
        print(f"checkpoint {ck['name']}: no SHA-256 recorded, so it cannot be verified; not fetched", file=sys.stderr)
        return exitcodes.JOB_FAILED
    problems = []
    tls = peer_context(c.servers.ca)  # agents serving HTTPS are verified with the CLI's --ca
    for src in ck["sources"]:
        try:
            path = download(src, job_id, ck["name"], ck["sha256"], out, tls)
        except (ServerError, ValueError) as e:
            problems.append(f"{src['node']}: {e}")
            continue
        except OSError as e:
            problems.append(f"{src['node']}: {why(e)}")
            continue
        print(f"checkpoint epoch {ck['epoch']} ({ck['bytes']} bytes, sha256 {ck['sha256'][:12]}...) from "
              f"{src['node']} -> {path}")
        return exitcodes.OK
    where = "; ".join(problems) or "no node holding it is up"
    print(f"checkpoint {ck['name']}: not fetched ({where}); its nodes may have removed it already "
          "(gsched agent --job-retention)", file=sys.stderr)
    return exitcodes.JOB_FAILED


def save_logs(c: Client, job_id: int, out: Path) -> set[int]:
    """Every log chunk of the job, appended to ``out/rank-N.log`` per rank; returns the ranks seen."""
    after, ranks = 0, set()
    files: dict[int, Any] = {}
    try:
        while True:
            page = c.get(f"/v1/jobs/{job_id}/logs", after=after)
            for chunk in page["chunks"]:
                rank = int(chunk["rank"])
                if rank not in files:
                    files[rank] = open(out / f"rank-{rank}.log", "w")  # noqa: SIM115 - closed below
                    ranks.add(rank)
                files[rank].write(chunk["text"])
            if not page["chunks"] or page["next"] == after:
                return ranks
            after = page["next"]
    finally:
        for f in files.values():
            f.close()


def download(src: dict[str, Any], job_id: int, name: str, sha256: str, out: Path,
             tls: ssl.SSLContext | None = None) -> Path:
    """Stream the checkpoint from one node's data server into ``out/name``, through a temporary file
    that is renamed into place only if its bytes hash to ``sha256``."""
    if "/" in name or name.startswith("."):
        raise ValueError(f"refusing the file name {name!r}")
    final, part = out / name, out / f".{name}.part"
    headers = {"X-Gsched-Ticket": src["ticket"], "X-Gsched-Time": str(src["time"])}
    h = hashlib.sha256()
    try:
        with open_url(peer_url(src["address"], f"checkpoints/{job_id}/{name}"), headers=headers, timeout_s=60,
                      context=tls, direct=True) as resp, open(part, "wb") as f:
            while block := resp.read(CHUNK):
                h.update(block)
                f.write(block)
        if h.hexdigest() != sha256:
            raise ValueError(f"its bytes hash to {h.hexdigest()[:12]}..., not the recorded {sha256[:12]}...")
        os.replace(part, final)
    finally:
        part.unlink(missing_ok=True)
    return final
