"""The queue view's cells and layout, without drawing: which columns fit a width, what each cell says,
which style it has.  Shared by the rich views (scheduler/cli/render.py: ``--watch``, the demo) and the
plain one (scheduler/cli/queuetext.py: ``gsched queue``), so both show the same table.

The queue view fits itself to the width it is given: below ``WIDE`` columns it drops the columns a
person misses least (priority factor, epochs, local reads, nodes, ...) and abbreviates names, so each
job stays on one line.  Styles are rich's names ("bold red"); colour is only ever a second cue.
Standard library only (``gsched queue`` loads this on every start).
"""

from __future__ import annotations

import time
from collections import defaultdict

from scheduler.cli.queuefacts import elapsed_s, epochs_progress, eta_s, human_bytes, human_s, plain_reason
from scheduler.protocol.states import JobState, NodeState, RankState

TYPE_CHECKING = False  # typing: 2 ms of start-up, for annotations only
if TYPE_CHECKING:
    from typing import Any

_J = JobState
# Job, node and rank states; a rank's STAGING and RUNNING share the job's (equal strings, one key).
STATE_STYLE: dict[str, str] = {
    _J.PENDING: "yellow", _J.BOUND: "cyan", _J.STAGING: "cyan", _J.RUNNING: "green", _J.COMPLETED: "bold green",
    _J.FAILED: "bold red", _J.CANCELLED: "magenta", _J.TIMEOUT: "red", NodeState.UP: "green", NodeState.DOWN: "red",
    RankState.EXITED: "green", RankState.KILLED: "magenta", RankState.ASSIGNED: "cyan"}
ENDED_BADLY = (_J.FAILED, _J.TIMEOUT)

# Columns of the jobs table, in the order they are dropped when the terminal is too narrow (first
# dropped first).  ID, NAME, STATE, TIME and REASON always stay.  Below WIDE columns, EPOCH and ETA
# move into the reason column (then headed NOTE): "epoch 2/5, ETA 7m30s".
DROP_ORDER = ("FACTOR", "LOCAL", "EPOCH", "NODES", "ETA", "USER", "RxD")
WIDE = 120       # at least this many columns: every column, share and nodes side by side
REASON_MIN = 24  # the reason column keeps at least this much room before other columns are dropped
SIDE_BY_SIDE_NODES = 42  # at WIDE and over, the nodes table is fitted to the width less this (the share panel's)


def style(state: str) -> str:
    return STATE_STYLE.get(state, "")


def bar(filled: int, total: int, ascii_only: bool) -> str:
    on, off = ("#", ".") if ascii_only else ("■", "□")
    return on * max(0, filled) + off * max(0, total - filled)


def abbrev(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "~"


def nodes_cell(nodes: list[str], width: int) -> str:
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


SHORT_STATE: dict[str, str] = {_J.COMPLETED: "DONE", _J.CANCELLED: "CANCEL"}  # narrow terminals: every state fits 7 columns


def job_cells(j: dict[str, Any], now: float, narrow: bool, factors: dict[str, float] | None = None) -> dict[str, str]:
    epochs = j.get("epochs") or 0
    eta = eta_s(j, now)
    placed = j["state"] != _J.PENDING and bool(j.get("nodes"))  # a requeued job's old nodes are history
    cells = {
        "ID": str(j["id"]),
        "USER": j["user"],
        "NAME": abbrev(j["name"], 10 if narrow else 20),
        "STATE": SHORT_STATE.get(j["state"], j["state"]) if narrow else j["state"],
        "RxD": f"{j['ranks']}x{j['gpus_per_rank']}",
        "NODES": nodes_cell(j.get("nodes") or [], 12 if narrow else 24) if placed else "-",
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


JUSTIFY: dict[str, str] = {"ID": "right", "RxD": "right", "LOCAL": "right", "FACTOR": "right", "TIME": "right",
                           "EPOCH": "right", "ETA": "right"}  # the others are left
JOB_COLUMNS = ("ID", "USER", "NAME", "STATE", "RxD", "NODES", "LOCAL", "FACTOR", "TIME", "EPOCH", "ETA", "REASON")
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


class Layout:
    """One table laid out: ``headers`` (column -> header), the ``cols`` that fit and their ``widths``,
    ``rows`` of cells (column -> text) and ``styles`` (column -> style) per row, ``justify`` per column,
    the ``wrap`` column (the only one that may take more than one line; the others are cut with an
    ellipsis) and a ``title``."""

    __slots__ = ("cols", "headers", "justify", "rows", "styles", "title", "widths", "wrap")

    def __init__(self, headers: dict[str, str], cols: list[str], widths: dict[str, int], rows: list[dict[str, str]],
                 styles: list[dict[str, str]], justify: dict[str, str], wrap: str | None = None,
                 title: str | None = None) -> None:
        self.headers, self.cols, self.widths, self.rows, self.styles = headers, cols, widths, rows, styles
        self.justify, self.wrap, self.title = justify, wrap, title


def jobs_layout(view: dict[str, Any], width: int = 150, now: float | None = None) -> Layout:
    """One line per job, fitted to ``width`` columns (see ``fit_columns``)."""
    now = now if now is not None else view.get("time", time.time())
    jobs = view.get("jobs", [])
    narrow = width < WIDE
    factors = {u["user"]: float(u.get("factor") or 0) for u in view.get("users", [])}
    rows = [job_cells(j, now, narrow, factors) for j in jobs]
    headers = {c: HEADERS.get(c, c) for c in JOB_COLUMNS if not (narrow and c in ("EPOCH", "ETA"))}
    if narrow:
        headers["REASON"] = "NOTE"
    cols, widths = fit_columns(headers, rows, width, DROP_ORDER, flex="REASON")
    styles = [{"STATE": style(j["state"]), **({"REASON": "red"} if j["state"] in ENDED_BADLY else {})} for j in jobs]
    # Wide terminals show whole reasons (wrapped); narrow ones keep one line per job and cut them.
    return Layout(headers, cols, widths, rows, styles, JUSTIFY, wrap=None if narrow else "REASON")


def share_cells(users: list[dict[str, Any]], ascii_only: bool = False) -> list[tuple[str, str, str, str, str, str]]:
    """Per user: (user, shares and their normalised part, decayed usage as device time, factor, its bar,
    the bar's colour)."""
    out = []
    for u in users:
        f = float(u.get("factor") or 0)
        colour = "green" if f >= 0.5 else "yellow" if f >= 0.25 else "red"
        out.append((u["user"], f"{u['shares']:g} ({100 * (u.get('norm_shares') or 0):.0f}%)",
                    human_s(u.get("usage") or 0), f"{f:.2f} ", bar(round(10 * f), 10, ascii_only), colour))
    return out


NODE_HEADERS = {"NODE": "NODE", "RACK": "RACK", "STATE": "STATE", "DEVICES": "DEVICES BUSY", "SHARDS": "SHARDS",
                "STAGED": "STAGED IN", "SEEN": "HEARTBEAT", "NOTE": "NOTE"}
NODE_DROP_ORDER = ("RACK", "STAGED", "SHARDS", "SEEN")
NODE_JUSTIFY = {"SHARDS": "right", "STAGED": "right", "SEEN": "right"}


def node_note(n: dict[str, Any]) -> str:
    """Why some of a node's devices are not offered: ``drained: disk swap; device 1: XID 79 (device fault)``,
    ``low disk: 12.0 MB free, under the 30.0 MB floor (disk_floor_gb)``."""
    notes = [f"drained: {n.get('drain_reason') or 'no reason given'}"] if n.get("drained") else []
    notes += [n["low_disk"]] if n.get("low_disk") else []
    return "; ".join(notes + [f"device {d['index']}: {d['health']}" for d in n.get("unhealthy") or []])


def nodes_layout(nodes: list[dict[str, Any]], now: float | None = None, ascii_only: bool = False,
                 width: int = 150) -> Layout:
    """Per node: health, devices busy/total as a bar, shards held, bytes staged in, heartbeat age.  The
    DEVICES cell's bar is its first ``len(row["_bar"])`` characters, styled ``row["_bar_style"]``."""
    now = now if now is not None else time.time()
    rows = []
    for n in nodes:
        total = int(n.get("devices") or 0)
        up = n["state"] == NodeState.UP
        busy = total - int(n.get("devices_free") or 0) if up else 0
        kind = n.get("device_kind") or ""
        rows.append({"NODE": n["name"], "RACK": n.get("rack", ""),
                     "STATE": "drained" if n.get("drained") and up else n["state"],
                     "DEVICES": f"{bar(busy, total, ascii_only)} {busy}/{total} {kind}".rstrip(),
                     "SHARDS": str(n.get("shards", 0)), "STAGED": human_bytes(n.get("staged_bytes")),
                     "SEEN": f"{human_s(now - n['last_seen'])} ago" if n.get("last_seen") else "never",
                     "NOTE": node_note(n), "_bar": bar(busy, total, ascii_only), "_bar_style": "green" if up else "red"})
    if not rows:
        rows.append({**dict.fromkeys(NODE_HEADERS, ""), "NODE": "(no nodes)", "_bar": "", "_bar_style": "red"})
    busy_all = sum(int(n.get("devices") or 0) - int(n.get("devices_free") or 0) for n in nodes
                   if n["state"] == NodeState.UP)
    total_all = sum(int(n.get("devices") or 0) for n in nodes if n["state"] == NodeState.UP)
    # NOTE (why devices are not offered) only when some node has one; it takes what width is left.
    headers = NODE_HEADERS if any(r.get("NOTE") for r in rows) else {k: v for k, v in NODE_HEADERS.items() if k != "NOTE"}
    cols, widths = fit_columns(headers, rows, width, NODE_DROP_ORDER, flex="NOTE")
    styles = [{"STATE": style(r["STATE"])} for r in rows]
    return Layout(headers, cols, widths, rows, styles, NODE_JUSTIFY, title=f"nodes ({busy_all}/{total_all} devices busy)")


def summary(view: dict[str, Any], narrow: bool = False) -> tuple[str, str, str]:
    """The first line's parts: (title, server clock, job counts by state)."""
    now = view.get("time", time.time())
    counts: dict[str, int] = defaultdict(int)
    for j in view.get("jobs", []):
        counts[j["state"]] += 1
    parts = [f"{counts[s]} {s.lower()}" for s in (_J.RUNNING, _J.STAGING, _J.BOUND, _J.PENDING, _J.COMPLETED,
                                                 _J.FAILED, _J.CANCELLED, _J.TIMEOUT) if counts[s]]
    return ("" if narrow else "gsched queue  ", time.strftime("%H:%M:%S", time.localtime(now)),
            f"{len(view.get('jobs', []))} jobs" + (": " + ", ".join(parts) if parts else ""))
