"""Human views of the API's JSON with rich (imported only here, so ``--json`` output stays fast).

Who calls: the CLI (``queue``, ``show``, ``explain``, ``nodes``, ``share``), ``watch`` and the demo.
Every view is a pure function of the API document and the server's time (the view's ``"time"``), so
a recording console renders it byte for byte the same in tests.  The queue view fits itself to the
width it is given: below about 120 columns it drops the columns a person misses least (priority
factor, epochs, local reads, nodes, ...) and abbreviates names, so each job stays on one line.
Colour is only ever a second cue: states and bars read the same with ``NO_COLOR``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from scheduler.cli.queuefacts import elapsed_s, epochs_progress, eta_s, human_bytes, human_s, plain_reason
from scheduler.core.lifecycle import ACTIVE, JobState, NodeState, RankState

__all__ = ["QueueView", "explain", "human_bytes", "human_s", "job_detail", "jobs_table", "nodes_table",
           "print_queue", "queue_renderable", "share_table"]

_J = JobState
# Job, node and rank states; a rank's STAGING and RUNNING share the job's (equal strings, one key).
STATE_STYLE: dict[str, str] = {
    _J.PENDING: "yellow", _J.BOUND: "cyan", _J.STAGING: "cyan", _J.RUNNING: "green", _J.COMPLETED: "bold green",
    _J.FAILED: "bold red", _J.CANCELLED: "magenta", _J.TIMEOUT: "red", NodeState.UP: "green", NodeState.DOWN: "red",
    RankState.EXITED: "green", RankState.KILLED: "magenta", RankState.ASSIGNED: "cyan"}
_ENDED_BADLY = (_J.FAILED, _J.TIMEOUT)

# Columns of the jobs table, in the order they are dropped when the terminal is too narrow (first
# dropped first).  ID, NAME, STATE, TIME and REASON always stay.  Below WIDE columns, EPOCH and ETA
# move into the reason column (then headed NOTE): "epoch 2/5, ETA 7m30s".
DROP_ORDER = ("FACTOR", "LOCAL", "EPOCH", "NODES", "ETA", "USER", "RxD")
WIDE = 120       # at least this many columns: every column, share and nodes side by side
REASON_MIN = 24  # the reason column keeps at least this much room before other columns are dropped


def _style(state: str) -> str:
    return STATE_STYLE.get(state, "")


def _bar(filled: int, total: int, ascii_only: bool) -> str:
    on, off = ("#", ".") if ascii_only else ("■", "□")
    return on * max(0, filled) + off * max(0, total - filled)


def _abbrev(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "~"


def _nodes_cell(nodes: list[str], width: int) -> str:
    """``n1,n2,n3`` or, past ``width``, as many names as fit and a count: ``n1,n2,+3``."""
    text = ",".join(nodes)
    if len(text) <= width:
        return text or "-"
    shown: list[str] = []
    for i, n in enumerate(nodes):
        rest = f",+{len(nodes) - i}"
        if len(",".join([*shown, n])) + len(f",+{len(nodes) - i - 1}") > width:
            return (",".join(shown) + rest) if shown else f"{n[: width - len(rest)]}{rest}"
        shown.append(n)
    return text  # pragma: no cover - the loop returns once the text is too long


# ------------------------------------------------------------------ the queue


SHORT_STATE: dict[str, str] = {_J.COMPLETED: "DONE", _J.CANCELLED: "CANCEL"}  # narrow terminals: every state fits 7 columns


def _job_cells(j: dict[str, Any], now: float, narrow: bool, factors: dict[str, float] | None = None) -> dict[str, str]:
    epochs = j.get("epochs") or 0
    eta = eta_s(j, now)
    placed = j["state"] != _J.PENDING and bool(j.get("nodes"))  # a requeued job's old nodes are history
    cells = {
        "ID": str(j["id"]),
        "USER": j["user"],
        "NAME": _abbrev(j["name"], 10 if narrow else 20),
        "STATE": SHORT_STATE.get(j["state"], j["state"]) if narrow else j["state"],
        "RxD": f"{j['ranks']}x{j['gpus_per_rank']}",
        "NODES": _nodes_cell(j.get("nodes") or [], 12 if narrow else 24) if placed else "-",
        "LOCAL": f"{100 * (j.get('local_fraction') or 0):.0f}%" if placed else "-",
        # The user's factor now (as in the fair-share strip); a job's own was frozen when it was bound.
        "FACTOR": f"{(factors or {}).get(j['user'], j.get('factor') or 0):.2f}",
        "TIME": human_s(elapsed_s(j, now)),
        "EPOCH": f"{int(epochs_progress(j))}/{epochs}" if epochs else "-",
        "ETA": human_s(eta) if eta is not None else "-",
        "REASON": plain_reason(j, now),
    }
    if narrow and j["state"] == _J.RUNNING:  # no EPOCH/ETA columns: say it in the note
        progress = f"epoch {cells['EPOCH']}" + (f", ETA {cells['ETA']}" if eta is not None else "")
        cells["REASON"] = f"{progress}; {cells['REASON']}" if cells["REASON"] else progress
    return cells


COLUMNS: dict[str, dict[str, Any]] = {
    "ID": {"justify": "right"}, "USER": {}, "NAME": {}, "STATE": {}, "RxD": {"justify": "right"}, "NODES": {},
    "LOCAL": {"justify": "right"}, "FACTOR": {"justify": "right"}, "TIME": {"justify": "right"},
    "EPOCH": {"justify": "right"}, "ETA": {"justify": "right"}, "REASON": {},
}
HEADERS = {"RxD": "RANKS", "TIME": "WAIT/RUN"}
SEP = 2  # characters between two columns (the table's right padding plus its blank divider)


def fit_columns(headers: dict[str, str], rows: list[dict[str, str]], width: int, drop_order: tuple[str, ...],
                flex: str | None = None, flex_min: int = REASON_MIN) -> tuple[list[str], dict[str, int]]:
    """Which columns fit ``width`` and how wide each is.

    Every column but ``flex`` is as wide as its widest cell (never wrapped); ``drop_order`` columns are
    removed, first first, until the rest plus ``min(flex's natural width, flex_min)`` fit.  ``flex``
    (the reason) gets what is left and is cut with an ellipsis.
    """
    cols = list(headers)
    natural = {c: max([len(headers[c])] + [len(r[c]) for r in rows]) for c in cols}

    def fixed(cs: list[str]) -> int:
        return sum(natural[c] for c in cs if c != flex) + SEP * (len(cs) - 1)

    def fits(cs: list[str]) -> bool:
        return fixed(cs) + (min(natural[flex], flex_min) if flex in cs else 0) <= width

    for victim in drop_order:
        if fits(cols):
            break
        if victim in cols:
            cols.remove(victim)
    widths = {c: natural[c] for c in cols}
    if flex in cols:
        widths[flex] = max(1, min(natural[flex], width - fixed(cols)))
    return cols, widths


def _fitted_table(title: str | None, headers: dict[str, str], cols: list[str], widths: dict[str, int],
                  justify: dict[str, str], wrap: str | None = None) -> Table:
    """A table of ``fit_columns``' result; only the ``wrap`` column may take more than one line."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), expand=False,
              header_style="bold", title=title, title_justify="left", title_style="bold")
    for c in cols:
        t.add_column(headers[c], justify=justify.get(c, "left"), no_wrap=c != wrap,  # type: ignore[arg-type]
                     overflow="fold" if c == wrap else "ellipsis", width=widths[c])
    return t


def jobs_table(view: dict[str, Any], width: int = 150, now: float | None = None) -> Table:
    """One line per job, fitted to ``width`` columns (see ``fit_columns``)."""
    now = now if now is not None else view.get("time", time.time())
    jobs = view.get("jobs", [])
    narrow = width < WIDE
    factors = {u["user"]: float(u.get("factor") or 0) for u in view.get("users", [])}
    rows = [_job_cells(j, now, narrow, factors) for j in jobs]
    headers = {c: HEADERS.get(c, c) for c in COLUMNS if not (narrow and c in ("EPOCH", "ETA"))}
    if narrow:
        headers["REASON"] = "NOTE"
    cols, widths = fit_columns(headers, rows, width, DROP_ORDER, flex="REASON")
    # Wide terminals show whole reasons (wrapped); narrow ones keep one line per job and cut them.
    t = _fitted_table(None, headers, cols, widths, {c: kw.get("justify", "left") for c, kw in COLUMNS.items()},
                      wrap=None if narrow else "REASON")
    for j, r in zip(jobs, rows, strict=True):
        cells: list[RenderableType] = []
        for c in cols:
            if c == "STATE":
                cells.append(Text(r[c], style=_style(j["state"])))
            elif c == "REASON" and j["state"] in _ENDED_BADLY:
                cells.append(Text(r[c], style="red"))
            else:
                cells.append(r[c])
        t.add_row(*cells)
    return t


def share_table(users: list[dict[str, Any]], ascii_only: bool = False) -> Table:
    """Per user: shares (and their normalised part), decayed usage as device time, factor with a bar."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold",
              title="fair share", title_justify="left", title_style="bold")
    for col in ("USER", "SHARES", "USAGE", "FACTOR"):
        t.add_column(col, justify="left" if col in ("USER", "FACTOR") else "right", no_wrap=True)
    for u in users:
        f = float(u.get("factor") or 0)
        bar = _bar(round(10 * f), 10, ascii_only)
        colour = "green" if f >= 0.5 else "yellow" if f >= 0.25 else "red"
        t.add_row(u["user"], f"{u['shares']:g} ({100 * (u.get('norm_shares') or 0):.0f}%)",
                  human_s(u.get("usage") or 0), Text.assemble((f"{f:.2f} ", ""), (bar, colour)))
    if not users:
        t.add_row("(no users)", "", "", "")
    return t


NODE_HEADERS = {"NODE": "NODE", "RACK": "RACK", "STATE": "STATE", "DEVICES": "DEVICES BUSY", "SHARDS": "SHARDS",
                "STAGED": "STAGED IN", "SEEN": "HEARTBEAT", "NOTE": "NOTE"}
NODE_DROP_ORDER = ("RACK", "STAGED", "SHARDS", "SEEN")


def node_note(n: dict[str, Any]) -> str:
    """Why some of a node's devices are not offered: ``drained: disk swap; device 1: XID 79 (device fault)``,
``low disk: 12.0 MB free, under the 30.0 MB floor (disk_floor_gb)``."""
    notes = [f"drained: {n.get('drain_reason') or 'no reason given'}"] if n.get("drained") else []
    notes += [n["low_disk"]] if n.get("low_disk") else []
    return "; ".join(notes + [f"device {d['index']}: {d['health']}" for d in n.get("unhealthy") or []])


def nodes_table(nodes: list[dict[str, Any]], now: float | None = None, ascii_only: bool = False,
                width: int = 150) -> Table:
    """Per node: health, devices busy/total as a bar, shards held, bytes staged in, heartbeat age."""
    now = now if now is not None else time.time()
    rows = []
    for n in nodes:
        total = int(n.get("devices") or 0)
        up = n["state"] == NodeState.UP
        busy = total - int(n.get("devices_free") or 0) if up else 0
        kind = n.get("device_kind") or ""
        rows.append({"NODE": n["name"], "RACK": n.get("rack", ""),
                     "STATE": "drained" if n.get("drained") and up else n["state"],
                     "DEVICES": f"{_bar(busy, total, ascii_only)} {busy}/{total} {kind}".rstrip(),
                     "SHARDS": str(n.get("shards", 0)), "STAGED": human_bytes(n.get("staged_bytes")),
                     "SEEN": f"{human_s(now - n['last_seen'])} ago" if n.get("last_seen") else "never",
                     "NOTE": node_note(n), "_bar": _bar(busy, total, ascii_only), "_up": up})
    if not rows:
        rows.append({**dict.fromkeys(NODE_HEADERS, ""), "NODE": "(no nodes)", "_bar": "", "_up": False})
    busy_all = sum(int(n.get("devices") or 0) - int(n.get("devices_free") or 0) for n in nodes
                   if n["state"] == NodeState.UP)
    total_all = sum(int(n.get("devices") or 0) for n in nodes if n["state"] == NodeState.UP)
    # NOTE (why devices are not offered) only when some node has one; it takes what width is left.
    headers = NODE_HEADERS if any(r.get("NOTE") for r in rows) else {k: v for k, v in NODE_HEADERS.items() if k != "NOTE"}
    cols, widths = fit_columns(headers, rows, width, NODE_DROP_ORDER, flex="NOTE")
    t = _fitted_table(f"nodes ({busy_all}/{total_all} devices busy)", headers, cols, widths,
                      {"SHARDS": "right", "STAGED": "right", "SEEN": "right"})
    for r in rows:
        cells: list[RenderableType] = []
        for c in cols:
            if c == "STATE":
                cells.append(Text(r[c], style=_style(r[c])))
            elif c == "DEVICES":
                bar = str(r["_bar"])
                cells.append(Text.assemble((bar, "green" if r["_up"] else "red"), r[c][len(bar):]))
            else:
                cells.append(str(r[c]))
        t.add_row(*cells)
    return t


def queue_summary(view: dict[str, Any], note: str = "", narrow: bool = False) -> Text:
    """The first line: server time and job counts by state; ``note`` (filters, errors) appended."""
    now = view.get("time", time.time())
    counts: dict[str, int] = defaultdict(int)
    for j in view.get("jobs", []):
        counts[j["state"]] += 1
    parts = [f"{counts[s]} {s.lower()}" for s in (_J.RUNNING, _J.STAGING, _J.BOUND, _J.PENDING, _J.COMPLETED,
                                                 _J.FAILED, _J.CANCELLED, _J.TIMEOUT) if counts[s]]
    text = Text.assemble(("" if narrow else "gsched queue  ", "bold"), (time.strftime("%H:%M:%S", time.localtime(now)), "bold"),
                         "  ",
                         f"{len(view.get('jobs', []))} jobs" + (": " + ", ".join(parts) if parts else ""))
    if note:
        text.append(f"  {note}", style="dim")
    return text


class QueueView:
    """The whole queue (summary line, jobs, fair share, nodes), laid out for the width it renders at.

    A rich renderable, so ``Live`` re-lays it out after a terminal resize without extra code.
    """

    def __init__(self, view: dict[str, Any], note: str = "") -> None:
        self.view = view
        self.note = note

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        now = self.view.get("time", time.time())
        ascii_only = options.ascii_only
        yield queue_summary(self.view, self.note, narrow=width < WIDE)
        yield Text("")
        if self.view.get("jobs"):
            yield jobs_table(self.view, width=width, now=now)
        else:
            yield Text("(no jobs)", style="dim")
        yield Text("")
        shares = share_table(self.view.get("users", []), ascii_only)
        side_by_side = width >= WIDE
        nodes = nodes_table(self.view.get("nodes", []), now, ascii_only,
                            width=width - 42 if side_by_side else width)
        if side_by_side:
            grid = Table.grid(padding=(0, 4))
            grid.add_column()
            grid.add_column()
            grid.add_row(shares, nodes)
            yield grid
        else:
            yield shares
            yield Text("")
            yield nodes


def queue_renderable(view: dict[str, Any], note: str = "") -> QueueView:
    return QueueView(view, note)


def print_queue(view: dict[str, Any], console: Console | None = None, note: str = "") -> None:
    (console or Console()).print(queue_renderable(view, note))


# ------------------------------------------------------------------ one job


def _kv(rows: list[tuple[str, RenderableType]]) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    for k, v in rows:
        t.add_row(k, v)
    return t


def _table(title: str, cols: list[str], right: tuple[str, ...] = ()) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
    for col in cols:
        t.add_column(col, justify="right" if col in right else "left")
    return t


def shard_map(doc: dict[str, Any]) -> Table:
    """Which rank reads which shard from where, one line per rank: local shards, staged shards (source)."""
    t = _table("shard map", ["RANK", "NODE", "READS LOCALLY", "STAGED FROM PEERS", "BYTES", "STAGED"],
               right=("BYTES", "STAGED"))
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for sh in doc.get("shards") or []:
        by_rank[sh["rank"]].append(sh)
    for rank in sorted(by_rank):
        shards = by_rank[rank]
        local = [str(s["shard"]) for s in shards if s["local"]]
        remote = [f"{s['shard']} ({s['source']})" for s in shards if not s["local"]]
        total = sum(s.get("bytes") or 0 for s in shards)
        staged = sum(s.get("staged_bytes") or 0 for s in shards if not s["local"])
        need = sum(s.get("bytes") or 0 for s in shards if not s["local"])
        t.add_row(str(rank), shards[0]["node"], ", ".join(local) or "-", ", ".join(remote) or "-",
                  human_bytes(total), f"{human_bytes(staged)}/{human_bytes(need)}" if need else "-")
    return t


def job_detail(doc: dict[str, Any], console: Console | None = None, now: float | None = None) -> None:
    """``gsched show JOB``: summary, placement, shard map, staging, epochs, checkpoints, restarts, events."""
    c = console or Console()
    now = now if now is not None else time.time()
    state = doc["state"]
    head = Text.assemble((f"job {doc['id']}", "bold"), f"  {doc['name']}  ", (state, _style(state)),
                         f"  user {doc['user']}")
    c.print(head)
    rows: list[tuple[str, RenderableType]] = []
    spec = doc.get("spec") or {}
    ranks, per_rank = int(doc.get("rank_count") or 1), int(doc.get("gpus_per_rank") or 1)
    rows.append(("gang", f"{ranks} rank{'s' * (ranks != 1)} x {per_rank} device{'s' * (per_rank != 1)} "
                         f"on data set {doc.get('dataset') or '-'}"))
    summary = dict(doc, ranks=doc.get("rank_count", 1))
    timing = f"submitted {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(doc['submitted_at']))}"
    if doc.get("started_at"):
        timing += f", started after {human_s(doc['started_at'] - doc['submitted_at'])} in the queue"
    label = "waiting" if state == _J.PENDING else "running" if state in ACTIVE else "ran"
    timing += f"; {label} {human_s(elapsed_s(summary, now))}"
    rows.append(("time", timing))
    epochs = doc.get("epochs") or 0
    if epochs:
        eta = eta_s(summary, now)
        rows.append(("epochs", f"{doc.get('epochs_done', 0)}/{epochs} done" + (f", ETA {human_s(eta)}" if eta else "")))
    if doc.get("attempt", 1) > 1 or doc.get("restarts"):
        rows.append(("restarts", f"{doc.get('restarts', 0)} (attempt {doc.get('attempt')})"))
    reason = plain_reason(summary, now) if state not in (_J.RUNNING, _J.BOUND) else ""  # restarts have a row
    if reason:
        rows.append(("reason", Text(reason, style="red" if state in _ENDED_BADLY else "")))
    if doc.get("nodes"):
        rows.append(("placement", f"{', '.join(doc['nodes'])}; {100 * (doc.get('local_fraction') or 0):.0f}% of "
                                  f"bytes read locally, {human_bytes(doc.get('transfer_bytes'))} to stage "
                                  f"(estimated {doc.get('transfer_cost_ms') or 0} ms)"))
    if spec.get("train"):
        tr = spec["train"]
        rows.append(("train", ", ".join([f"{k} {tr[k]}" for k in ("batch_size", "lr", "grad_accum_steps") if k in tr]
                                        + ([] if tr.get("checkpoint", True) else ["no checkpoints"]))))
    if spec.get("run"):
        run = spec["run"]
        cmd = run.get("command")
        shown = cmd if isinstance(cmd, str) else " ".join(str(x) for x in cmd or [])
        rows.append(("command", shown[:200] + (f"  (in {run['workdir']})" if run.get("workdir") else "")))
    c.print(_kv(rows))

    if doc.get("ranks") and isinstance(doc["ranks"], list):
        t = _table("ranks", ["RANK", "NODE", "DEVICES", "STATE", "EXIT"], right=("RANK", "EXIT"))
        for r in doc["ranks"]:
            t.add_row(str(r["rank"]), r["node"], ",".join(map(str, r["devices"])),
                      Text(r["state"], style=_style(r["state"])),
                      "" if r["exit_code"] is None else str(r["exit_code"]))
        c.print(Text(""), t)
    if doc.get("shards"):
        c.print(Text(""), shard_map(doc))
    stage = (doc.get("progress") or {}).get("staging")
    if stage and state == _J.STAGING:
        t = _table("staging", ["RANK", "PROGRESS", "BYTES", "RATE", "ETA"], right=("BYTES", "RATE", "ETA"))
        for rank, p in sorted(stage.items(), key=lambda kv: int(kv[0])):
            total, got, rate = p.get("total") or 0, p.get("bytes") or 0, p.get("rate_bps") or 0
            frac = got / total if total else 1.0
            t.add_row(str(rank), f"{_bar(round(20 * frac), 20, c.options.ascii_only)} {100 * frac:.0f}%",
                      f"{human_bytes(got)}/{human_bytes(total)}", f"{human_bytes(rate)}/s",
                      human_s((total - got) / rate) if rate and got < total else "-")
        c.print(Text(""), t)
    if doc.get("metrics"):
        t = _table("epochs", ["EPOCH", "LOSS", "ACCURACY", "IMAGES/S", "DATA WAIT", "STEP"],
                   right=("EPOCH", "LOSS", "ACCURACY", "IMAGES/S", "DATA WAIT", "STEP"))
        for m in doc["metrics"]:
            acc, loss = m.get("accuracy"), m.get("loss")
            t.add_row(str(m["epoch"]), "-" if loss is None else f"{loss:.4f}", "-" if acc is None else f"{100 * acc:.1f}%",
                      f"{m.get('images_per_s') or 0:.0f}", f"{100 * (m.get('data_wait_fraction') or 0):.0f}%",
                      f"{1000 * (m.get('step_time_s') or 0):.0f} ms")
        c.print(Text(""), t)
        last_m = doc["metrics"][-1]
        if last_m.get("backend"):
            c.print(Text(f"ran with {last_m['backend']} on {last_m.get('device', '?')}: bf16 "
                         f"{'on' if last_m.get('bf16') else 'off'}, channels-last "
                         f"{'on' if last_m.get('channels_last') else 'off'}", style="dim"))
    if doc.get("checkpoints"):
        cks = doc["checkpoints"]
        last = cks[-1]
        c.print()
        c.print(Text.assemble(("checkpoints", "bold"), f"  epochs {', '.join(str(k['epoch']) for k in cks)}; latest "
                              f"(epoch {last['epoch']}) {human_bytes(last['bytes'])} on {', '.join(last['nodes'])}"))
    attempts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in doc.get("history") or []:
        attempts[r["attempt"]].append(r)
    if len(attempts) > 1:
        t = _table("attempts", ["ATTEMPT", "NODES", "RANK STATES", "EXITS"])
        for a in sorted(attempts):
            rs = attempts[a]
            t.add_row(str(a), ", ".join(sorted({r["node"] for r in rs})), ", ".join(sorted({r["state"] for r in rs})),
                      ", ".join(str(r["exit_code"]) for r in rs if r["exit_code"] is not None) or "-")
        c.print(Text(""), t)
    ex = doc.get("explain") or {}
    if ex and state == _J.PENDING:
        c.print(Text.assemble(("explain", "bold"), f"  queue position {ex.get('queue_position') or '-'} of "
                              f"{ex.get('queue_length') or '-'}, fair-share factor {ex.get('factor') or 0:.3f}; "
                              f"{len(ex.get('candidates') or [])} candidate placements (gsched explain {doc['id']})"))
    failed = [r for r in doc.get("ranks") or [] if isinstance(r, dict) and r.get("exit_code") not in (0, None)]
    if failed and state in _ENDED_BADLY and failed[0].get("log_tail"):
        tail = failed[0]["log_tail"].rstrip().splitlines()[-10:]
        c.print(Text(f"rank {failed[0]['rank']} log (last lines)", style="bold"))
        c.print(Text("\n".join("  " + line for line in tail), style="dim"))
    if doc.get("events"):
        t = _table("events", ["TIME", "WHO", "WHAT", "DETAIL"])
        for e in doc["events"][-15:]:
            t.add_row(time.strftime("%H:%M:%S", time.localtime(e["time"])), e.get("actor", ""), e["kind"], e["message"])
        c.print(Text(""), t)


def explain(doc: dict[str, Any], console: Console | None = None) -> None:
    """``gsched explain JOB``: why it waits (or where it went), and every candidate of the last cycle."""
    c = console or Console()
    now = doc.get("decided_at") or time.time()
    c.print(Text.assemble((f"job {doc['job']}", "bold"), f" ({doc['user']}) is ", (doc["state"], _style(doc["state"])),
                          f"; fair-share factor {doc['factor']:.3f}, queue position "
                          f"{doc.get('queue_position') or '-'} of {doc.get('queue_length') or '-'}"))
    if doc["state"] == _J.PENDING:
        why = plain_reason({"state": _J.PENDING, "reason": doc.get("pending_reason") or doc.get("reason"),
                            "why": doc.get("why")}, now)
        c.print(f"why pending: {why}")
    else:
        c.print(f"placed with {100 * (doc.get('local_fraction') or 0):.0f}% local reads, "
                f"{human_bytes(doc.get('transfer_bytes'))} staged")
    if doc.get("reservation"):
        r = doc["reservation"]
        nodes = ", ".join(f"{n} x{k}" for n, k in (r["nodes"] or {}).items())
        c.print(f"reservation: devices on {nodes} are held for job {r['job']} from {human_s(r['start_s'] - now)} "
                "after this decision")
    for words in doc.get("preemptions") or []:
        c.print(f"preemption: {words}")
    if doc.get("left_out"):
        c.print("nodes left out (no new ranks): " + "; ".join(f"{o['node']} ({o['reason']})" for o in doc["left_out"]))
    if doc.get("candidates"):
        t = _table("candidates (last cycle)", ["#", "RANKS PER NODE", "LOCAL", "TO STAGE", "EST. STAGING", "CHOSEN",
                                               "WHY NOT"], right=("LOCAL", "TO STAGE", "EST. STAGING"))
        for i, cand in enumerate(doc["candidates"]):
            per_node = ",".join(f"{n}x{k}" for n, k in (cand.get("ranks_per_node") or {}).items())
            t.add_row(str(i), per_node or ",".join(cand["nodes"]), f"{100 * cand['local_fraction']:.0f}%",
                      human_bytes(cand["transfer_bytes"]), f"{cand['transfer_cost_ms']} ms",
                      "yes" if cand["chosen"] else "",
                      "" if cand["chosen"] else plain_reason({"state": _J.PENDING, "reason": cand.get("reason", ""),
                                                               "why": cand.get("why")}, now))
        c.print(Text(""), t)
