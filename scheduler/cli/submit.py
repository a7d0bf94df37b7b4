"""``gsched submit FILE``: read a job.toml, apply the flags that override it, send it, and (``--wait``)
wait for the job's end.

Overrides, as sbatch's flags override ``#SBATCH`` lines: ``--name``, ``--ranks``, ``--gpus-per-rank``,
``--time`` (durations as in job.toml: a bare number is seconds, not minutes as in Slurm) and
``--dataset``; the server validates the result as it would the file.  A submit whose answer is lost is
retried with the same request id (never two jobs), for ``--retry-s`` seconds, saying so on stderr.
``--wait`` prints the final state and exits 0 for COMPLETED, 1 for FAILED, CANCELLED or TIMEOUT.
``--dependency afterok:ID[:ID],afterany:ID,afternotok:ID`` (sbatch's) holds the job until the jobs it
names end as it asks; one that can never be met ends the job FAILED, saying why.  ``--array 0-9%4``
makes one job per index (the first id is the array's), at most 4 of them active at once; with
``--wait``, the status is 0 only if every one COMPLETED.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from scheduler.cli import exitcodes
from scheduler.protocol.client import Client
from scheduler.protocol.servererror import ServerError
from scheduler.protocol.states import FINAL

TYPE_CHECKING = False  # typing: 2 ms of submit's start, for annotations only
if TYPE_CHECKING:
    from typing import Any


def overridden(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``spec`` with the values the flags give in place of the file's (``ValueError`` for a bad ``--time``)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in spec.items()}
    if args.name is not None:
        out["name"] = args.name
    if args.ranks is not None:
        out.setdefault("resources", {})["ranks"] = args.ranks
    if args.gpus_per_rank is not None:
        out.setdefault("resources", {})["gpus_per_rank"] = args.gpus_per_rank
    if args.time is not None:
        from scheduler.core.durations import parse_duration

        try:
            out.setdefault("limits", {})["time"] = parse_duration(args.time)
        except ValueError as e:
            raise ValueError(f"--time: {e}") from None
    if args.dataset is not None:
        out.setdefault("data", {})["dataset"] = args.dataset
    return out


def send(c: Client, spec: dict[str, Any], request_id: str, retry_s: float,
         extra: dict[str, str] | None = None) -> list[int] | ServerError:
    """The new jobs' ids (one, or an array's, the array's id first); the ``ServerError`` the server
    answered with (a refusal), or raises when no answer came within ``retry_s``.  ``extra``: more of
    the body (``dependency``, ``array``)."""
    deadline = time.monotonic() + retry_s
    attempt = 0
    while True:  # a lost answer is retried with the same request id: never two jobs
        try:
            out = c.request("POST", "/v1/jobs", {"spec": spec, "client_request_id": request_id, **(extra or {})})
            return [int(i) for i in out.get("ids") or [out["id"]]]
        except ServerError as e:
            if e.status != 0 and e.status < 500:
                return e
            if time.monotonic() >= deadline:
                raise
            if attempt == 0:
                print(f"gsched submit: {e.message}\ngsched submit: retrying with request id {request_id} for up "
                      f"to {retry_s:g} s (--retry-s)", file=sys.stderr)
            time.sleep(min(1.0, 0.1 * 2**attempt, max(0.0, deadline - time.monotonic())))
            attempt += 1


def wait(c: Client, job_id: int, interval_s: float = 1.0) -> str:
    """The job's final state, once it has one (polled every ``interval_s``)."""
    while True:
        state = str(c.get(f"/v1/jobs/{job_id}")["state"])
        if state in FINAL:
            return state
        time.sleep(interval_s)


def cmd_submit(c: Client, args: argparse.Namespace) -> int:
    from scheduler.cli.jobfile import JobFileError, read_job_file

    try:
        spec = overridden(read_job_file(args.file), args)
    except (JobFileError, ValueError) as e:
        print(f"gsched submit: {e}", file=sys.stderr)
        return exitcodes.USAGE
    request_id = args.request_id or os.urandom(16).hex()  # as random as uuid4().hex, without uuid's import
    retry_s = args.retry_s if args.retry_s is not None else float(os.environ.get("GSCHED_SUBMIT_RETRY_S", "10"))
    extra = {k: v for k, v in (("dependency", args.dependency), ("array", args.array)) if v}
    out = send(c, spec, request_id, retry_s, extra)
    if isinstance(out, ServerError):
        print(f"gsched submit: {args.file}: {out.message}", file=sys.stderr)
        return exitcodes.for_error(out)
    print(out[0], flush=True)
    if len(out) > 1:
        print(f"gsched submit: array job {out[0]}: jobs {', '.join(map(str, out))}", file=sys.stderr)
    if not args.wait:
        return exitcodes.OK
    states = [wait(c, job_id) for job_id in out]
    for job_id, state in zip(out, states, strict=True):
        print(f"job {job_id}: {state}")
    return exitcodes.OK if all(state == "COMPLETED" for state in states) else exitcodes.JOB_FAILED
