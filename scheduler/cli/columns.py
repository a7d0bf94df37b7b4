"""Plain tables for ``queue``, ``history`` and ``nodes`` with ``-o wide`` or ``--format id,user,...``,
as ``squeue -o`` and ``sacct --format`` print them: one line a row, columns padded, no colour, so
that ``awk`` and ``cut`` read them.  ``-o json`` prints the rows as the server sent them.

Each column is a name, a header and how to read it from a row; ``JOB_COLUMNS`` and ``NODE_COLUMNS``
list them (``gsched queue --format help`` prints the names).  Only the standard library: the CLI loads
this on every listing.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False  # typing: 2 ms of every listing's start, for annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Row = dict[str, Any]


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "-"


def _span(seconds: float | None) -> str:
    """Slurm's elapsed form: ``D-HH:MM:SS``, or ``HH:MM:SS`` under a day."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    d, rest = divmod(s, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{d}-{text}" if d else text


def _elapsed(j: Row, now: float) -> str:
    start = j.get("started_at")
    return _span((j.get("ended_at") or now) - start) if start else "-"


JOB_COLUMNS: dict[str, tuple[str, Callable[[Row, float], Any]]] = {
    "id": ("JOBID", lambda j, now: j["id"]),
    "name": ("NAME", lambda j, now: j["name"]),
    "user": ("USER", lambda j, now: j["user"]),
    "state": ("STATE", lambda j, now: j["state"] + ("(held)" if j.get("held_by") else "")),
    "ranks": ("RANKS", lambda j, now: j["ranks"]),
    "gpus": ("GPUS/RANK", lambda j, now: j["gpus_per_rank"]),
    "array": ("ARRAY", lambda j, now: f"{j['array_job_id']}_{j['array_index']}" if j.get("array_job_id") else "-"),
    "dataset": ("DATASET", lambda j, now: j.get("dataset") or "-"),
    "nodes": ("NODES", lambda j, now: ",".join(j.get("nodes") or []) or "-"),
    "submitted": ("SUBMITTED", lambda j, now: _when(j.get("submitted_at"))),
    "started": ("STARTED", lambda j, now: _when(j.get("started_at"))),
    "ended": ("ENDED", lambda j, now: _when(j.get("ended_at"))),
    "elapsed": ("ELAPSED", _elapsed),
    "time_limit": ("TIMELIMIT", lambda j, now: _span(j.get("time_limit_s"))),
    "restarts": ("RESTARTS", lambda j, now: j.get("restarts", 0)),
    "epochs": ("EPOCHS", lambda j, now: f"{j.get('epochs_done', 0)}/{j.get('epochs', 0)}"),
    "local": ("LOCAL", lambda j, now: f"{float(j.get('local_fraction') or 0):.0%}"),
    "reason": ("REASON", lambda j, now: (j.get("reason") or "").splitlines()[0] if j.get("reason") else "-"),
}
JOB_DEFAULT = ("id", "name", "user", "state", "ranks", "gpus", "elapsed", "time_limit", "nodes", "reason")
HISTORY_DEFAULT = ("id", "name", "user", "state", "ranks", "gpus", "submitted", "elapsed", "ended", "reason")

NODE_COLUMNS: dict[str, tuple[str, Callable[[Row, float], Any]]] = {
    "name": ("NODE", lambda n, now: n["name"]),
    "rack": ("RACK", lambda n, now: n["rack"]),
    "state": ("STATE", lambda n, now: ("drained" if n.get("drained") else n["state"])),
    "devices": ("DEVICES", lambda n, now: n["devices"]),
    "free": ("FREE", lambda n, now: n["devices_free"]),
    "kind": ("KIND", lambda n, now: n.get("device_kind") or "-"),
    "model": ("MODEL", lambda n, now: n.get("device_model") or "-"),
    "shards": ("SHARDS", lambda n, now: n["shards"]),
    "address": ("ADDRESS", lambda n, now: n.get("address") or "-"),
    "last_seen": ("LAST_SEEN", lambda n, now: _when(n.get("last_seen"))),
    "reason": ("REASON", lambda n, now: "; ".join(r for r in (n.get("drain_reason"), n.get("low_disk")) if r) or "-"),
}
NODE_DEFAULT = ("name", "rack", "state", "devices", "free", "kind", "shards", "reason")


class FormatError(ValueError):
    pass


def pick(fmt: str | None, wide: bool, columns: dict[str, Any], default: tuple[str, ...]) -> list[str]:
    """The column names ``--format`` asks for (comma-separated), else every column (``-o wide``), else
    ``default``; ``FormatError`` naming an unknown one and listing the known."""
    if fmt:
        names = [n.strip().lower() for n in fmt.split(",") if n.strip()]
        unknown = [n for n in names if n not in columns]
        if unknown or not names:
            raise FormatError(f"--format: unknown column {', '.join(unknown) or '(none given)'} "
                              f"(known: {','.join(columns)})")
        return names
    return list(columns) if wide else list(default)


def table(rows: list[Row], names: list[str], columns: dict[str, tuple[str, Callable[[Row, float], Any]]],
          now: float) -> str:
    """The rows as aligned text, a header line first; the last column is not padded."""
    cells = [[columns[n][0] for n in names]] + [[str(columns[n][1](r, now)) for n in names] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(names))]
    out = []
    for line in cells:
        parts = [c.ljust(w) for c, w in zip(line[:-1], widths[:-1], strict=True)] + [line[-1]]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out) + "\n"
