"""``gsched queue``, ``history`` and ``nodes``: what they ask the server (filters are applied there,
every page is read: no cap) and how they print it (the cockpit view, drawn without rich by
scheduler/cli/queuetext.py; ``-o json``, ``-o wide`` or ``--format``, see scheduler/cli/columns.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from scheduler.cli import exitcodes
from scheduler.cli.columns import (
    HISTORY_DEFAULT,
    JOB_COLUMNS,
    JOB_DEFAULT,
    NODE_COLUMNS,
    NODE_DEFAULT,
    FormatError,
    pick,
    table,
)
from scheduler.protocol.client import Client
from scheduler.protocol.states import FINAL

TYPE_CHECKING = False  # typing: 2 ms of every listing's start, for annotations only
if TYPE_CHECKING:
    from typing import Any

RECENT_S = 600.0  # queue --watch keeps finished jobs on screen this long


def _columns(args: argparse.Namespace, columns: dict[str, Any], default: tuple[str, ...]) -> list[str] | None:
    """The plain-table columns asked for, or None for the verb's own view (or JSON)."""
    if args.output == "json" or not (args.output == "wide" or args.format):
        return None
    return pick(args.format, args.output == "wide", columns, default)


def _note(args: argparse.Namespace, me: str | None) -> str:
    parts = [f"user={args.user}"] * bool(args.user) + [f"state={args.state}"] * bool(args.state)
    parts += [f"name={args.name}"] * bool(args.name) + [f"mine ({me})"] * bool(args.mine and me)
    return ("filter: " + " ".join(parts)) if parts else ""


def cmd_queue(c: Client, args: argparse.Namespace) -> int:
    if args.json:
        args.output = "json"
    try:
        names = _columns(args, JOB_COLUMNS, JOB_DEFAULT)
    except FormatError as e:
        print(f"gsched queue: {e}", file=sys.stderr)
        return exitcodes.USAGE
    me = c.get("/v1/whoami")["name"] if args.mine else None
    query = {"user": me or args.user, "state": args.state, "name": args.name}
    if args.watch:
        from scheduler.cli.watch import watch

        def select(view: dict[str, Any]) -> dict[str, Any]:
            if args.all or args.state:
                return view
            recent = view["time"] - RECENT_S
            return {**view, "jobs": [j for j in view["jobs"]
                                     if j["state"] not in FINAL or (j.get("ended_at") or 0) >= recent]}

        def fresh() -> dict[str, Any]:
            if args.all or args.state:
                return {**query, "all": "true" if args.all else None}
            return {**query, "ended_after": time.time() - RECENT_S}

        return watch(c, select, args.interval, query=fresh, note=_note(args, me))
    view = c.every_page("/v1/jobs", **query, all="true" if args.all else None)
    if args.output == "json":
        from scheduler.cli.queuefacts import job_facts

        print(json.dumps({**view, "jobs": [{**j, **job_facts(j, view["time"])} for j in view["jobs"]]}, indent=2))
        return exitcodes.OK
    if names is not None:
        sys.stdout.write(table(view["jobs"], names, JOB_COLUMNS, view["time"]))
        return exitcodes.OK
    from scheduler.cli.queuetext import print_queue  # the rich view's screen, without rich's start-up

    print_queue(view, note=_note(args, me))
    return exitcodes.OK


def _time_arg(text: str | None, now: float, flag: str) -> float | None:
    """``--since``/``--until``: a date (``2026-12-04``, ``2026-12-04T13:00[:SS]``, local time) or a
    span before now (``2h``, ``1-00:00:00``, as durations are written)."""
    if not text:
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        pass
    from scheduler.core.durations import parse_duration

    try:
        return now - parse_duration(text)
    except ValueError:
        raise FormatError(f"{flag} {text!r}: give a date (2026-12-04, 2026-12-04T13:00) or a span back "
                          "from now (90m, 2h, 1-00:00:00)") from None


def cmd_history(c: Client, args: argparse.Namespace) -> int:
    try:
        names = _columns(args, JOB_COLUMNS, HISTORY_DEFAULT)
        now = time.time()
        since, until = _time_arg(args.since, now, "--since"), _time_arg(args.until, now, "--until")
    except FormatError as e:
        print(f"gsched history: {e}", file=sys.stderr)
        return exitcodes.USAGE
    query = {"user": args.user, "state": args.state, "name": args.name, "since": since, "until": until}
    if args.limit:
        doc = c.get("/v1/history", **query, limit=args.limit, after=args.after or None)
    else:
        doc = c.every_page("/v1/history", **query, after=args.after or None)
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return exitcodes.OK
    sys.stdout.write(table(doc["jobs"], names or list(HISTORY_DEFAULT), JOB_COLUMNS, doc["time"]))
    if doc.get("next") is not None:
        print(f"(more: gsched history --after {doc['next']} ...)", file=sys.stderr)
    return exitcodes.OK


def cmd_nodes(c: Client, args: argparse.Namespace) -> int:
    if args.json:
        args.output = "json"
    try:
        names = _columns(args, NODE_COLUMNS, NODE_DEFAULT)
    except FormatError as e:
        print(f"gsched nodes: {e}", file=sys.stderr)
        return exitcodes.USAGE
    rows = c.get("/v1/nodes")
    if args.output == "json":
        print(json.dumps(rows, indent=2))
        return exitcodes.OK
    if names is not None:
        sys.stdout.write(table(rows, names, NODE_COLUMNS, time.time()))
        return exitcodes.OK
    from scheduler.cli.queuetext import print_nodes  # the rich table's screen, without rich's start-up

    print_nodes(rows, time.time())
    return exitcodes.OK
