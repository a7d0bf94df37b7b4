"""Human views of the API's JSON with rich (imported only here, so ``--json`` output stays fast).

Who calls: the CLI (``queue``, ``show``, ``explain``, ``nodes``, ``share``), ``watch`` and the demo.
Every view is a pure function of the API document and the server's time (the view's ``"time"``), so
a recording console renders it byte for byte the same in tests.  The queue's cells and layout are
scheduler/cli/queuecells.py's, shared with the plain ``gsched queue`` (scheduler/cli/queuetext.py).
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

from scheduler.cli.queuecells import (
    ENDED_BADLY,
    SIDE_BY_SIDE_NODES,
    WIDE,
    Layout,
    bar,
    fit_columns,
    jobs_layout,
    node_note,
    nodes_layout,
    share_cells,
    style,
)
from scheduler.cli.queuecells import summary as summary_parts
from scheduler.cli.queuefacts import elapsed_s, eta_s, human_bytes, human_s, plain_reason
from scheduler.core.lifecycle import ACTIVE, JobState

__all__ = ["QueueView", "explain", "fit_columns", "human_bytes", "human_s", "job_detail", "jobs_table", "node_note",
           "nodes_table", "print_queue", "queue_renderable", "share_table"]

_J = JobState
_style, _bar, _ENDED_BADLY = style, bar, ENDED_BADLY


def _fitted_table(layout: Layout) -> Table:
    """A rich table of a ``Layout``: only its ``wrap`` column may take more than one line."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), expand=False,
              header_style="bold", title=layout.title, title_justify="left", title_style="bold")
    for c in layout.cols:
        t.add_column(layout.headers[c], justify=layout.justify.get(c, "left"), no_wrap=c != layout.wrap,  # type: ignore[arg-type]
                     overflow="fold" if c == layout.wrap else "ellipsis", width=layout.widths[c])
    return t


def jobs_table(view: dict[str, Any], width: int = 150, now: float | None = None) -> Table:
    """One line per job, fitted to ``width`` columns (see ``queuecells.fit_columns``)."""
    layout = jobs_layout(view, width, now)
    t = _fitted_table(layout)
    for r, st in zip(layout.rows, layout.styles, strict=True):
        t.add_row(*[Text(r[c], style=st[c]) if c in st else r[c] for c in layout.cols])
    return t


def share_table(users: list[dict[str, Any]], ascii_only: bool = False) -> Table:
    """Per user: shares (and their normalised part), decayed usage as device time, factor with a bar."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold",
              title="fair share", title_justify="left", title_style="bold")
    for col in ("USER", "SHARES", "USAGE", "FACTOR"):
        t.add_column(col, justify="left" if col in ("USER", "FACTOR") else "right", no_wrap=True)
    for user, shares, usage, factor, factor_bar, colour in share_cells(users, ascii_only):
        t.add_row(user, shares, usage, Text.assemble((factor, ""), (factor_bar, colour)))
    if not users:
        t.add_row("(no users)", "", "", "")
    return t


def nodes_table(nodes: list[dict[str, Any]], now: float | None = None, ascii_only: bool = False,
                width: int = 150) -> Table:
    """Per node: health, devices busy/total as a bar, shards held, bytes staged in, heartbeat age."""
    layout = nodes_layout(nodes, now, ascii_only, width)
    t = _fitted_table(layout)
    for r, st in zip(layout.rows, layout.styles, strict=True):
        cells: list[RenderableType] = []
        for c in layout.cols:
            if c == "STATE":
                cells.append(Text(r[c], style=st[c]))
            elif c == "DEVICES":
                cells.append(Text.assemble((r["_bar"], r["_bar_style"]), r[c][len(r["_bar"]):]))
            else:
                cells.append(str(r[c]))
        t.add_row(*cells)
    return t


def queue_summary(view: dict[str, Any], note: str = "", narrow: bool = False) -> Text:
    """The first line: server time and job counts by state; ``note`` (filters, errors) appended."""
    title, clock, counts = summary_parts(view, narrow)
    text = Text.assemble((title, "bold"), (clock, "bold"), "  ", counts)
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
                            width=width - SIDE_BY_SIDE_NODES if side_by_side else width)
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
        ahead, older = doc.get("own_ahead") or 0, doc.get("own_older") or 0
        if ahead > older:  # some of the user's newer jobs went first
            c.print(f"{ahead} of {doc['user']}'s own jobs are ahead of it, {older} of them older: a user's "
                    "own jobs go smallest first (devices x time limit), and near-ties to those that read locally, "
                    "the smallest first")
        lower = doc.get("lower_ahead") or 0
        if lower:  # the arbiter moved jobs of a lower priority ahead of it
            c.print(Text(f"{lower} job{'s' if lower != 1 else ''} of a lower priority {'are' if lower != 1 else 'is'} "
                         "ahead of it: near-ties in priority ([policy] tie_window_s, tie_fairshare) go to the jobs "
                         "that read locally, the smallest first, then the cheapest to place; a job that can only "
                         "stage counts stage_penalty of the factor lower; a job pending past max_wait_s and one "
                         "others were preempted for go first"))
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
    if doc.get("preempts_nobody"):
        c.print(f"preempts nobody: {doc['preempts_nobody']}")
    if doc.get("stopping"):
        c.print("waits first for its last attempt's ranks to stop: " + ", ".join(
            f"rank {x['rank']} on {x['node']} ({x['state']})" for x in doc["stopping"]))
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
