"""``gsched cancel``, ``hold``, ``release``, ``requeue`` and ``update``: act on jobs by id, as Slurm's
``scancel`` and ``scontrol`` do.

Each id is acted on in turn and gets one line on stdout (``job 12: CANCELLED``) or one on stderr
(``gsched cancel: job 13: no job 13``); the exit status is the worst of them (docs/cli.md: 4 for a
missing job, 5 for another user's, 2 for one in a state that does not allow it), 0 when all succeeded.
``cancel --user U --state S --name N`` first asks the server for the jobs that match (all of them,
page by page), then cancels each.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from scheduler.cli import exitcodes
from scheduler.core.lifecycle import FINAL
from scheduler.protocol.client import Client
from scheduler.protocol.servererror import ServerError


def _state_line(out: dict[str, Any]) -> str:
    extra = f" (held by {out['held_by']})" if out.get("held_by") else ""
    return f"job {out['id']}: {out['state']}{extra}"


def each(verb: str, ids: list[int], act: Callable[[int], Any], line: Callable[[Any], str] = _state_line) -> int:
    """``act(id)`` for every id, printing ``line`` of each answer; returns the exit status (the worst
    failure).  No answer or a 5xx ends the loop at once: the rest would fail the same way."""
    worst = exitcodes.OK
    for job_id in ids:
        try:
            out = act(job_id)
        except ServerError as e:
            if e.status == 0 or e.status >= 500:
                raise
            print(f"gsched {verb}: job {job_id}: {e.message}", file=sys.stderr)
            worst = max(worst, exitcodes.for_error(e))
            continue
        print(line(out))
    return worst


def matching(c: Client, args: argparse.Namespace) -> list[int]:
    """The ids of the jobs not ended that ``--user``, ``--state`` and ``--name`` pick (every page)."""
    ids: list[int] = []
    after = 0
    while True:
        page = c.get("/v1/jobs", user=args.user, state=args.state, name=args.name, after=after or None)
        ids += [j["id"] for j in page["jobs"] if j["state"] not in FINAL]
        if page.get("next") is None:
            return ids
        after = page["next"]


def cmd_act(c: Client, args: argparse.Namespace) -> int:
    """``cancel``, ``hold``, ``release``, ``requeue`` on the ids given (``cancel``: or those matching)."""
    verb = args.verb
    ids = list(args.jobs)
    filters = verb == "cancel" and (args.user or args.state or args.name)
    if filters:
        if ids:
            print("gsched cancel: give job ids or --user/--state/--name, not both", file=sys.stderr)
            return exitcodes.USAGE
        ids = matching(c, args)
        if not ids:
            print("gsched cancel: no job matches", file=sys.stderr)
            return exitcodes.OK
    if not ids:
        print(f"gsched {verb}: give one or more job ids", file=sys.stderr)
        return exitcodes.USAGE
    return each(verb, ids, lambda job_id: c.post(f"/v1/jobs/{job_id}/{verb}"))


def cmd_update(c: Client, args: argparse.Namespace) -> int:
    """``update ID --time T --name N``."""
    from scheduler.core.durations import parse_duration

    body: dict[str, Any] = {}
    if args.name is not None:
        body["name"] = args.name
    if args.time is not None:
        try:
            body["time_limit_s"] = parse_duration(args.time)
        except ValueError as e:
            print(f"gsched update: --time: {e}", file=sys.stderr)
            return exitcodes.USAGE
    if not body:
        print("gsched update: give --time and/or --name", file=sys.stderr)
        return exitcodes.USAGE

    return each("update", list(args.jobs), lambda job_id: c.request("PATCH", f"/v1/jobs/{job_id}", body),
                lambda out: f"job {out['id']}: name {out['name']}, time limit {out['time_limit_s']} s")
