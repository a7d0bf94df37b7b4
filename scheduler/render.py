"""Human views of the API's JSON with rich (imported here only, so JSON output stays fast)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

STATE_STYLE = {"PENDING": "yellow", "BOUND": "cyan", "STAGING": "cyan", "RUNNING": "green", "COMPLETED": "bold green",
               "FAILED": "bold red", "CANCELLED": "magenta", "TIMEOUT": "red", "up": "green", "down": "red"}


def human_bytes(n: float | None) -> str:
    n = float(n or 0)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _eta(job: dict[str, Any], now: float) -> str:
    done, total = job.get("epochs_done") or 0, job.get("epochs") or 0
    if job["state"] != "RUNNING" or not done or not job.get("started_at"):
        return "-"
    per = (now - job["started_at"]) / done
    return human_s(per * max(0, total - done))


def jobs_table(view: dict[str, Any], now: float | None = None) -> Table:
    now = now if now is not None else view.get("time", time.time())
    t = Table(title="jobs", title_justify="left", expand=False, pad_edge=False)
    for col, kw in [("ID", {"justify": "right"}), ("USER", {}), ("NAME", {"overflow": "ellipsis", "max_width": 18}),
                    ("STATE", {}), ("RANKSxDEV", {"justify": "center"}), ("NODES", {"overflow": "fold"}),
                    ("LOCAL", {"justify": "right"}), ("PRIO", {"justify": "right"}), ("TIME", {"justify": "right"}),
                    ("EPOCH", {"justify": "right"}), ("ETA", {"justify": "right"}), ("REASON", {"overflow": "fold", "ratio": 1})]:
        t.add_column(col, **kw)
    for j in view.get("jobs", []):
        running = j["state"] in ("RUNNING", "STAGING", "BOUND")
        if j["state"] == "PENDING":
            waited = now - j["pending_since"]
        elif running:
            waited = now - (j.get("started_at") or j["pending_since"])
        else:
            waited = (j.get("ended_at") or now) - (j.get("started_at") or j["submitted_at"])
        reason = j.get("reason", "") if j["state"] in ("PENDING", "FAILED", "TIMEOUT", "CANCELLED") else ""
        stage = (j.get("progress") or {}).get("staging")
        if j["state"] == "STAGING" and stage:
            got = sum(v.get("bytes", 0) for v in stage.values())
            tot = sum(v.get("total", 0) for v in stage.values())
            reason = f"staging {human_bytes(got)}/{human_bytes(tot)}"
        t.add_row(str(j["id"]), j["user"], j["name"], Text(j["state"], style=STATE_STYLE.get(j["state"], "")),
                  f"{j['ranks']}x{j['gpus_per_rank']}", ",".join(j.get("nodes") or []) or "-",
                  f"{100 * (j.get('local_fraction') or 0):.0f}%" if j.get("nodes") else "-",
                  f"{j.get('factor', 0):.2f}", human_s(waited), f"{j.get('epochs_done', 0)}/{j.get('epochs', 0)}",
                  _eta(j, now), reason.splitlines()[0] if reason else "")
    if not view.get("jobs"):
        t.add_row("", "", "(no jobs)", "", "", "", "", "", "", "", "", "")
    return t


def share_table(users: list[dict[str, Any]]) -> Table:
    t = Table(title="fair share", title_justify="left", pad_edge=False)
    for col in ("USER", "SHARES", "NORM", "USAGE (dev-s)", "FACTOR"):
        t.add_column(col, justify="left" if col == "USER" else "right")
    for u in users:
        t.add_row(u["user"], f"{u['shares']:g}", f"{u.get('norm_shares', 0):.2f}", f"{u['usage']:.0f}",
                  f"{u['factor']:.3f}")
    return t


def nodes_table(nodes: list[dict[str, Any]]) -> Table:
    t = Table(title="nodes", title_justify="left", pad_edge=False)
    for col in ("NODE", "RACK", "STATE", "DEVICES", "BUSY", "SHARDS", "STAGED IN", "LAST SEEN"):
        t.add_column(col, justify="right" if col in ("DEVICES", "BUSY", "SHARDS", "STAGED IN") else "left")
    now = time.time()
    for n in nodes:
        busy = n["devices"] - n["devices_free"] if n["state"] == "up" else 0
        bar = "#" * busy + "." * max(0, n["devices"] - busy)
        t.add_row(n["name"], n["rack"], Text(n["state"], style=STATE_STYLE.get(n["state"], "")),
                  f"{n['devices']} {n.get('device_kind', '')}", bar or "-", str(n.get("shards", 0)),
                  human_bytes(n.get("staged_bytes")), f"{human_s(now - n['last_seen'])} ago")
    return t


def queue_renderable(view: dict[str, Any]) -> Group:
    return Group(jobs_table(view), share_table(view.get("users", [])), nodes_table(view.get("nodes", [])))


def print_queue(view: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(queue_renderable(view))


def job_detail(doc: dict[str, Any], console: Console | None = None) -> None:
    c = console or Console()
    c.print(f"[bold]job {doc['id']}[/bold] {doc['name']}  user={doc['user']}  state=", Text(doc["state"], style=STATE_STYLE.get(doc["state"], "")),
            f"  attempt={doc.get('attempt')}  restarts={doc.get('restarts')}")
    if doc.get("reason"):
        c.print(f"reason: {doc['reason']}")
    c.print(f"placement: nodes={', '.join(doc.get('nodes') or []) or '-'}  local-read={100 * doc['local_fraction']:.0f}%  "
            f"staged={human_bytes(doc['transfer_bytes'])} (est. {doc.get('transfer_cost_ms', 0)} ms)")
    if doc.get("ranks"):
        t = Table(title="ranks", title_justify="left", pad_edge=False)
        for col in ("RANK", "NODE", "DEVICES", "STATE", "EXIT"):
            t.add_column(col)
        for r in doc["ranks"]:
            t.add_row(str(r["rank"]), r["node"], ",".join(map(str, r["devices"])), r["state"],
                      "" if r["exit_code"] is None else str(r["exit_code"]))
        c.print(t)
    if doc.get("shards"):
        t = Table(title="shard map", title_justify="left", pad_edge=False)
        for col in ("SHARD", "RANK", "NODE", "FROM", "BYTES"):
            t.add_column(col)
        for sh in doc["shards"]:
            t.add_row(str(sh["shard"]), str(sh["rank"]), sh["node"], "local" if sh["local"] else sh["source"],
                      human_bytes(sh["bytes"]))
        c.print(t)
    stage = (doc.get("progress") or {}).get("staging")
    if stage:
        for rank, p in sorted(stage.items()):
            rate = p.get("rate_bps") or 0
            eta = (p["total"] - p["bytes"]) / rate if rate else 0
            c.print(f"staging rank {rank}: {human_bytes(p['bytes'])}/{human_bytes(p['total'])} "
                    f"at {human_bytes(rate)}/s, ETA {human_s(eta)}")
    if doc.get("metrics"):
        t = Table(title="epochs", title_justify="left", pad_edge=False)
        for col in ("EPOCH", "LOSS", "ACCURACY", "IMAGES/S", "DATA WAIT", "STEP"):
            t.add_column(col, justify="right")
        for m in doc["metrics"]:
            acc = m.get("accuracy")
            t.add_row(str(m["epoch"]), f"{m.get('loss', float('nan')):.4f}", "-" if acc is None else f"{100 * acc:.1f}%",
                      f"{m.get('images_per_s', 0):.0f}", f"{100 * (m.get('data_wait_fraction') or 0):.0f}%",
                      f"{1000 * (m.get('step_time_s') or 0):.0f} ms")
        c.print(t)
    if doc.get("checkpoints"):
        for ck in doc["checkpoints"]:
            c.print(f"checkpoint epoch {ck['epoch']}: {human_bytes(ck['bytes'])} on {', '.join(ck['nodes'])}")
    ex = doc.get("explain") or {}
    if ex and doc["state"] == "PENDING":
        c.print(f"explain: position {ex.get('queue_position')}/{ex.get('queue_length')}, factor {ex.get('factor', 0):.3f}: "
                f"{ex.get('reason', '')}")
    if doc.get("events"):
        c.print("[bold]events[/bold]")
        for e in doc["events"][-15:]:
            c.print(f"  {time.strftime('%H:%M:%S', time.localtime(e['time']))} {e['kind']:<14} {e['message']}")


def explain(doc: dict[str, Any], console: Console | None = None) -> None:
    c = console or Console()
    c.print(f"[bold]job {doc['job']}[/bold] ({doc['user']}) is {doc['state']}; fair-share factor {doc['factor']:.3f}, "
            f"queue position {doc.get('queue_position') or '-'} of {doc.get('queue_length') or '-'}")
    if doc["state"] == "PENDING":
        c.print(f"why pending: {doc.get('pending_reason') or doc.get('reason')}")
    else:
        c.print(f"placed with {100 * doc['local_fraction']:.0f}% local reads, {human_bytes(doc['transfer_bytes'])} staged")
    if doc.get("reservation"):
        r = doc["reservation"]
        c.print(f"reservation: job {r['job']} holds {r['nodes']} from t={r['start_s']:.0f}")
    if doc.get("candidates"):
        t = Table(title="candidates (last cycle)", title_justify="left", pad_edge=False)
        for col in ("#", "NODES", "LOCAL", "BYTES", "EST. STAGING", "CHOSEN", "WHY NOT"):
            t.add_column(col)
        for i, cand in enumerate(doc["candidates"]):
            t.add_row(str(i), ",".join(f"{n}x{k}" for n, k in (cand.get("ranks_per_node") or {}).items()) or ",".join(cand["nodes"]),
                      f"{100 * cand['local_fraction']:.0f}%", human_bytes(cand["transfer_bytes"]),
                      f"{cand['transfer_cost_ms']} ms", "yes" if cand["chosen"] else "", "" if cand["chosen"] else cand.get("reason", ""))
        c.print(t)
