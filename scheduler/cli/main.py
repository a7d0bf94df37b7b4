"""``gsched``: the command line.  One verb per line of ``--help``; heavy modules load only when used."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from scheduler.cli import exitcodes
from scheduler.cli.completion import SHELLS, complete, mark
from scheduler.cli.connect import client
from scheduler.cli.userconfig import UserConfigError
from scheduler.protocol.servererror import ServerError

TYPE_CHECKING = False  # typing itself is 2 ms of every command's start
if TYPE_CHECKING:
    from typing import Any

VERBS = {
    "login": "remember a server, token and CA in ~/.config/gsched/config.toml (mode 0600)",
    "server": "run the central scheduler (API + scheduling cycles)",
    "agent": "run the node daemon: report devices and shards, run ranks",
    "db": "database maintenance (upgrade to the latest schema)",
    "user": "add, list, remove users or change their shares (admin)",
    "agent-token": "create an agent token bound to one node (admin)",
    "data": "make, list and re-replicate sharded data sets",
    "submit": "submit a job.toml; prints the job id (with --wait, then its final state)",
    "queue": "show jobs, fair share and nodes (--watch for a live view)",
    "history": "ended jobs, as sacct: filtered by user, state, name and time, every page",
    "show": "one job in detail: placement, shard map, epochs, checkpoints, events",
    "cancel": "cancel jobs by id, or those --user/--state/--name pick (kills their ranks, frees their devices)",
    "hold": "keep pending jobs from being scheduled until released",
    "release": "let held jobs be scheduled again",
    "requeue": "stop running jobs and put them back in the queue (they resume from their last checkpoint)",
    "update": "change jobs' time limit (a running job's only down) or a pending job's name",
    "logs": "a job's rank logs (--follow to stream)",
    "fetch": "save a job's final checkpoint (verified), metrics and logs before the nodes remove them",
    "nodes": "list nodes with their devices, shards, state and why one takes no new work (drained, low disk)",
    "node": "drain a node (no new ranks or shard copies; running ranks finish) or resume it (admin)",
    "explain": "why a job is pending (and which nodes are left out, and why), or why it landed where it did",
    "share": "the fair-share tree like sshare -l: shares, usage, effective usage, factor, devices held and fair part now",
    "account": "add, list or move fair-share accounts (admin)",
    "events": "the audit log: who did what, when",
    "plot": "draw a job's training curves or the cluster's history to PNG",
    "simulate": "replay a cluster trace through the scheduling policies",
    "demo": "run the embedded demo cluster on this machine",
    "completion": "print the shell completion script: eval \"$(gsched completion bash)\" (zsh, fish too)",
}


def terminal_columns() -> int:
    """``shutil.get_terminal_size().columns`` without importing shutil (and with it bz2, lzma and zlib):
    ``$COLUMNS``, else the width of the terminal on stdout, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class Formatter(argparse.HelpFormatter):
    """argparse's own layout.  argparse makes a formatter for every argument it adds (to check its
    metavar), and each asks shutil for the terminal's width: this asks ``terminal_columns``."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, terminal_columns() - 2 if width is None else width)


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``verb``, one that knows that verb alone: building every verb's parser
    is most of the parser's cost (27 parsers and their arguments), and a command parses one verb.
    Every verb when ``verb`` is None: ``gsched --help``, a bad or missing verb, completion."""
    p = argparse.ArgumentParser(prog="gsched", description="Data-locality-aware, fair-share GPU scheduler for DDP training.",
                                formatter_class=Formatter)
    p.add_argument("--version", action="store_true", help="print gsched's version and exit")
    p.add_argument("--server", help="server URL(s), comma-separated (default $GSCHED_SERVER, else the config "
                   "file's, else http://127.0.0.1:8470)")
    p.add_argument("--token", help="API token (default $GSCHED_TOKEN, else the config file's, else "
                   "$GSCHED_HOME/admin.token)")
    p.add_argument("--ca", help="CA bundle to verify an HTTPS server (default $GSCHED_CA, else the config file's; "
                   "`gsched agent` too)")
    p.add_argument("--install-completion", nargs="?", const="install", choices=["install", "print"], default=None,
                   help="bash completion: install it under ~/.local/share/bash-completion (or print it); "
                        "`gsched completion SHELL` for zsh and fish")
    # The same options after the verb (`gsched agent --server URL`); SUPPRESS keeps the top-level value.
    common = argparse.ArgumentParser(add_help=False, formatter_class=Formatter)
    common.add_argument("--server", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--token", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--ca", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    # prog given: argparse would otherwise lay out a usage line to find it, importing shutil (with bz2,
    # lzma and zlib) to ask the terminal's width.
    sub = p.add_subparsers(dest="verb", metavar="VERB", prog="gsched")
    for name, text in VERBS.items():
        if verb is None or name == verb:  # another verb's parser would only serve `gsched --help`
            ARGUMENTS[name](sub.add_parser(name, help=text, description=text, formatter_class=Formatter,
                                           parents=[] if name == "login" else [common]), name)
    return p


def output_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``-o wide|json`` and ``--format`` of ``queue``, ``history`` and ``nodes``."""
    parser.add_argument("-o", "--output", choices=("wide", "json"), default=None,
                        help=f"wide: a plain table with every column; json: the {what} as the server sends them")
    parser.add_argument("--format", default=None, metavar="COL,COL",
                        help="a plain table of these columns, comma-separated (an unknown name lists them)")


def _login(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched login``."""
    p.add_argument("--server", default=argparse.SUPPRESS, help="the server's URL(s), comma-separated (required)")
    p.add_argument("--token-file", default=None,
                    help="a file holding your token, read each time (default: store the token itself, taken "
                         "from --token, $GSCHED_TOKEN or asked for)")
    p.add_argument("--ca", default=argparse.SUPPRESS, help="CA bundle that signed the server's certificate (HTTPS)")
    p.add_argument("--token", default=argparse.SUPPRESS, help="the token to store (default $GSCHED_TOKEN, else asked)")


def _server(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched server``."""
    p.add_argument("--host", default=None, help="address the API listens on (default: the config's, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="API port (default: the config's, 8470)")
    p.add_argument("--db", default=None, help="database URL (default sqlite:///$GSCHED_HOME/gsched.db)")
    p.add_argument("--config", default=None, help="the server's config file (default ./gsched.toml if there is one; "
                   "docs/config.md)")
    p.add_argument("--tls-cert", default=None, help="PEM certificate (chain): serve HTTPS (with --tls-key)")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")


def _agent(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched agent``."""
    p.add_argument("--node", required=True, help="this node's name, as the scheduler and users call it")
    p.add_argument("--rack", default="rack0", help="the rack this node is in: the cost model's distance (default rack0)")
    p.add_argument("--gpus", default="auto", help="N CPU devices, or auto (NVIDIA GPUs via nvidia-smi)")
    p.add_argument("--data-dir", required=True, help="where this node keeps shards, staged copies and checkpoints")
    p.add_argument("--host", default="127.0.0.1", help="address the data server binds and advertises")
    p.add_argument("--port", type=int, default=0, help="data server port (default: any free port)")
    p.add_argument("--heartbeat-s", type=float, default=2.0,
                   help="seconds between reports until the server says otherwise (default 2)")
    p.add_argument("--threads-per-rank", type=int, default=None,
                   help="CPU threads per rank (torch and OMP_NUM_THREADS); default: cores x rank devices / devices")
    p.add_argument("--scrub-interval-s", type=float, default=60.0, help="re-hash every shard this often")
    p.add_argument("--net-iface", default=None, help="network interface ranks use for gloo/NCCL traffic")
    p.add_argument("--rendezvous-ports", default="29500-29999", metavar="FIRST-LAST",
                   help="ports a job's rank 0 on this node may listen on for its rendezvous (MASTER_PORT); "
                        "open them between nodes (default 29500-29999)")
    p.add_argument("--rendezvous-wait-s", type=float, default=30.0,
                   help="how long rank 0 waits for a free rendezvous port before its job is requeued (default 30)")
    p.add_argument("--max-transfers", type=int, default=4,
                   help="shard copies this agent makes at once, staging and replication alike (default 4)")
    p.add_argument("--max-transfer-mbps", type=float, default=0.0,
                   help="megabits a second this agent's copies receive and its data server sends, in all "
                        "(default 0: no limit)")
    p.add_argument("--tls-cert", default=None, metavar="FILE",
                   help="PEM certificate (chain) signed by the cluster's CA: the data server serves HTTPS only "
                        "(with --tls-key); peers verify it with --ca")
    p.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert")
    p.add_argument("--job-retention", default="7d", metavar="DURATION",
                   help="keep a finished job's directory on this node (final checkpoint, metrics, logs) this long "
                        "after the job ended, then remove it; gsched fetch JOB saves them first (default 7d; "
                        "'forever' keeps them)")


def _db(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched db``."""
    d = p.add_subparsers(dest="db_verb", metavar="ACTION")
    up = d.add_parser("upgrade", help="run migrations to the latest revision")
    up.add_argument("--db", default=None, help="database URL (default: the config's, sqlite:///$GSCHED_HOME/gsched.db)")
    up.add_argument("--config", default=None, help="the server's config file (gsched.toml)")


def _user(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched user``."""
    u = p.add_subparsers(dest="user_verb", metavar="ACTION")
    ua = u.add_parser("add", help="create a user and print its token once")
    ua.add_argument("name", help="the new user's name")
    ua.add_argument("--shares", type=float, default=1.0, help="fair-share weight (default 1)")
    ua.add_argument("--admin", action="store_true", help="may act on every job and manage users")
    ua.add_argument("--unix-user", default="", metavar="ACCOUNT",
                    help="the Unix account the user's [run] jobs run as on the nodes")
    ua.add_argument("--account", default=None, help="the user's fair-share account (default: root)")
    u.add_parser("list", help="list users")
    uset = u.add_parser("set", help="change a user's Unix account (--unix-user '' removes it) or shares")
    uset.add_argument("name", help="the user to change")
    uset.add_argument("--unix-user", default=None, metavar="ACCOUNT",
                      help="the Unix account the user's [run] jobs run as ('' removes the mapping)")
    uset.add_argument("--shares", type=float, default=None, help="the new fair-share weight")
    ur = u.add_parser("remove", help="remove a user")
    ur.add_argument("name", help="the user to remove")
    us = u.add_parser("shares", help="change a user's shares")
    us.add_argument("name", help="the user")
    us.add_argument("shares", type=float, help="the new fair-share weight")
    um = u.add_parser("account", help="move a user to another fair-share account")
    um.add_argument("name", help="the user to move")
    um.add_argument("account", help="the account, or root")


def _account(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched account``."""
    from scheduler.cli.sharetree import add_account_parser

    add_account_parser(p)


def _agent_token(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched agent-token``."""
    t = p.add_subparsers(dest="token_verb", metavar="ACTION")
    tc = t.add_parser("create", help="create a token for NODE's agent")
    tc.add_argument("node", help="the node whose agent the token is for (and only that node)")


def _data(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched data``."""
    dd = p.add_subparsers(dest="data_verb", metavar="ACTION")
    dm = dd.add_parser("make", help="build a sharded data set and upload R replicas to agents")
    dm.add_argument("name", help="the data set's name (lower case, digits, _ . -)")
    dm.add_argument("--source", required=True, help="digits | synthetic[:k=v,...] | imagefolder:PATH")
    dm.add_argument("--shards", type=int, default=8, help="shard files to cut it into (default 8)")
    dm.add_argument("--replicas", type=int, default=2, help="copies of each shard kept on the nodes (default 2)")
    dm.add_argument("--span", type=int, default=None,
                    help="nodes its jobs spread over: copies are striped over this many (default: with one "
                         "replica every up node, up to one a shard; with more, 1: every copy whole); once jobs read it, the "
                         "span most of them had")
    dm.add_argument("--seed", type=int, default=0, help="seed of a synthetic source and of the shuffle (default 0)")
    dm.add_argument("--format", choices=("gshard", "wds"), default="gshard",
                    help="shard files: gsched's GSHARD1, or WebDataset tars (KEY.png + KEY.cls)")
    da = dd.add_parser("add", help="register files the nodes already have (under their data dirs) as a data set")
    da.add_argument("name", help="the data set's name")
    da.add_argument("--node", action="append", required=True, help="a node holding files (repeatable)")
    da.add_argument("--path", action="append", required=True,
                    help="the folder (or file) below that node's data dir: one per --node, or one for all")
    da.add_argument("--glob", default="*", help="which files below PATH (fnmatch, * also crosses /); default all")
    da.add_argument("--replicas", type=int, default=2, help="copies of each shard to keep (default 2)")
    da.add_argument("--span", type=int, default=None, help="nodes its jobs spread over (as for data make)")
    da.add_argument("--classes", type=int, default=None,
                    help="classes of the labels (default: from the WebDataset tars' .cls labels, else 1)")
    dl = dd.add_parser("ls", help="list data sets with replication and placement")
    dl.add_argument("--json", action="store_true", help="the data sets as JSON")
    dp = dd.add_parser("place", help="change the replica count of a data set")
    mark(dp.add_argument("name", help="the data set"), "datasets")
    dp.add_argument("--replicas", type=int, required=True, help="the new number of copies of each shard")


def _submit(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched submit``."""
    p.add_argument("file", help="the job.toml (docs/job-toml.md)")
    p.add_argument("--name", help="the job's name, in place of the file's")
    p.add_argument("--ranks", type=int, help="DDP ranks (resources.ranks), in place of the file's")
    p.add_argument("--gpus-per-rank", type=int, help="devices per rank (resources.gpus_per_rank)")
    p.add_argument("--time", help="time limit (limits.time): 90s, 30m, 2h30m, HH:MM:SS, D-HH:MM:SS; a bare number "
                    "is seconds (not minutes as in Slurm)")
    mark(p.add_argument("--dataset", help="the data set (data.dataset), in place of the file's"), "datasets")
    p.add_argument("--dependency", metavar="KIND:ID[:ID],...",
                    help="start only after other jobs end: afterok:ID (completed), afterany:ID (ended at all), "
                         "afternotok:ID (did not complete), comma-separated; a dependency that can never be met "
                         "ends this job FAILED")
    p.add_argument("--array", metavar="0-9[%N]",
                    help="one job per index (0-9, 1,3,5-7), at most N of them running at once with %%N; the "
                         "server sends each rank GSCHED_ARRAY_JOB_ID, GSCHED_ARRAY_INDEX and GSCHED_ARRAY_COUNT")
    p.add_argument("--wait", action="store_true", help="wait for the job to end, print its final state, and exit "
                    "0 if it COMPLETED, 1 if it FAILED, was CANCELLED or hit its TIMEOUT")
    p.add_argument("--request-id", default=None, help="idempotency key (default: a fresh one, reused on retries)")
    p.add_argument("--retry-s", type=float, default=None,
                    help="when the server gives no answer, retry with the same request id for this long, "
                         "saying so on stderr (default $GSCHED_SUBMIT_RETRY_S, else 10; 0: no retry)")


def _queue(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched queue``."""
    p.add_argument("--json", action="store_true", help="the same data as JSON, with each job's elapsed_s, eta_s "
                   "and reason_text (as -o json)")
    output_flags(p, "jobs")
    p.add_argument("--watch", "-w", action="store_true", help="redraw in place every --interval seconds until Ctrl-C")
    p.add_argument("--all", action="store_true", help="include every finished job (--watch shows the last 10 minutes')")
    p.add_argument("--user", help="only this user's jobs")
    p.add_argument("--state", help="only jobs in these states, comma-separated (pending,running)")
    p.add_argument("--name", help="only jobs of this name")
    p.add_argument("--mine", action="store_true", help="only my jobs (the token's user)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes with --watch (default 1)")


def _history(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched history``."""
    p.add_argument("--user", help="only this user's jobs")
    p.add_argument("--state", help="only these final states, comma-separated (completed,failed,cancelled,timeout)")
    p.add_argument("--name", help="only jobs of this name")
    p.add_argument("--since", help="ended at or after: a date (2026-12-04, 2026-12-04T13:00) or a span back (2h, 1-00)")
    p.add_argument("--until", help="ended before: a date or a span back, as --since")
    p.add_argument("--limit", type=int, default=None, help="one page of at most this many jobs (default: every job)")
    p.add_argument("--after", type=int, default=None, metavar="ID", help="only jobs with a greater id (the next page)")
    output_flags(p, "jobs")


def _show(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched show``, ``explain``."""
    mark(p.add_argument("job", type=int, help="the job's id"), "jobs")
    p.add_argument("--json", action="store_true", help="the same as JSON, as the server sends it")


def _cancel(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched cancel``."""
    mark(p.add_argument("jobs", type=int, nargs="*", metavar="ID", help="the jobs to cancel"), "jobs")
    p.add_argument("--user", help="every job of this user not ended (with --state, --name: all must match)")
    p.add_argument("--state", help="every job in these states, comma-separated (pending,running)")
    p.add_argument("--name", help="every job of this name")


def _hold(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched hold``, ``release``, ``requeue``."""
    mark(p.add_argument("jobs", type=int, nargs="+", metavar="ID", help=f"the jobs to {verb}"), "jobs")


def _update(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched update``."""
    mark(p.add_argument("jobs", type=int, nargs="+", metavar="ID", help="the jobs to change"), "jobs")
    p.add_argument("--time", help="the new time limit: 90s, 30m, 2h30m, HH:MM:SS, D-HH:MM:SS; a bare number "
                     "is seconds (not minutes as in Slurm)")
    p.add_argument("--name", help="the new name (pending jobs only)")


def _logs(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched logs``."""
    mark(p.add_argument("job", type=int, help="the job's id"), "jobs")
    p.add_argument("--rank", type=int, default=None, help="only this rank's output (default: every rank, prefixed)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new output until the job ends")


def _fetch(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched fetch``."""
    mark(p.add_argument("job", type=int, help="the job's id (yours, or any as an admin)"), "jobs")
    p.add_argument("--out", default=None, metavar="DIR", help="where to save them (default ./job-JOB)")


def _node(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched node``."""
    nd = p.add_subparsers(dest="node_verb", metavar="ACTION")
    ndd = nd.add_parser("drain", help="take no new ranks or shard copies on NODE; its running ranks finish")
    mark(ndd.add_argument("node", help="the node's name (gsched nodes lists them)"), "nodes")
    ndd.add_argument("--reason", default="", help="why, shown by gsched nodes (default: drained by YOU)")
    ndr = nd.add_parser("resume", help="let NODE take ranks and copies again")
    mark(ndr.add_argument("node", help="the node's name"), "nodes")


def _nodes(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched nodes``."""
    p.add_argument("--json", action="store_true", help="the nodes as JSON (as -o json)")
    output_flags(p, "nodes")


def _share(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched share``."""
    p.add_argument("--json", action="store_true", help="the shares as JSON")


def _events(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched events``."""
    mark(p.add_argument("--job", type=int, default=None, help="only this job's events"), "jobs")
    p.add_argument("--limit", type=int, default=100, help="the newest this many events (default 100)")
    p.add_argument("--json", action="store_true", help="the events as JSON")


def _plot(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched plot``."""
    mark(p.add_argument("job", type=int, nargs="?", help="the job whose loss, accuracy and images/s to draw"), "jobs")
    p.add_argument("--cluster", action="store_true", help="device utilisation and queue length over time instead")
    p.add_argument("--last", default=None, help="with --cluster: only this recent span (90s, 30m, 6h, 2d)")
    p.add_argument("-o", "--output", required=True, help="the PNG file to write")


def _simulate(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched simulate``."""
    p.add_argument("--trace", required=True, help="CSV of job_id,submit_time_s,user,num_gpus,duration_s")
    p.add_argument("--nodes", type=int, default=16, help="simulated nodes (default 16)")
    p.add_argument("--devices-per-node", type=int, default=8, help="devices on each (default 8)")
    p.add_argument("--racks", type=int, default=2, help="racks the nodes are spread over (default 2)")
    p.add_argument("--data", default=None, help="the data model: datasets=40,shards=16,shard_mb=512,zipf=1.1,"
                     "replicas=3 (or none: jobs read nothing)")
    p.add_argument("--policy", default="twostage", help="arbiters to compare, comma-separated (default twostage)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data model and failures (default 0)")
    p.add_argument("--json", action="store_true", help="the results as JSON")
    p.add_argument("--plot", default=None, help="also draw the results to this PNG")
    p.add_argument("--failures", default=None, help="node failures to inject (see scheduler/sim/simulator.py)")
    p.add_argument("--cycle-s", type=float, default=10.0, help="simulated seconds between scheduling cycles")
    p.add_argument("--estimates", choices=("exact", "users"), default="exact",
                   help="jobs' time limits: their true run times (default) or over-estimates rounded as users write them")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N jobs of the trace")
    p.add_argument("--config", default=None, help="a server config file (gsched.toml): its [policy] and [network] "
                   "knobs, e.g. preempt = true, replace the defaults")


def _completion(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched completion``."""
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")


def _demo(p: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of ``gsched demo``."""
    p.add_argument("--keep", action="store_true", help="leave the cluster's files in place")
    p.add_argument("--epochs", type=int, default=3, help="epochs the demo job trains (default 3)")


ARGUMENTS = {
    "login": _login,
    "server": _server,
    "agent": _agent,
    "db": _db,
    "user": _user,
    "account": _account,
    "agent-token": _agent_token,
    "data": _data,
    "submit": _submit,
    "queue": _queue,
    "history": _history,
    "show": _show,
    "explain": _show,
    "cancel": _cancel,
    "hold": _hold,
    "release": _hold,
    "requeue": _hold,
    "update": _update,
    "logs": _logs,
    "fetch": _fetch,
    "node": _node,
    "nodes": _nodes,
    "share": _share,
    "events": _events,
    "plot": _plot,
    "simulate": _simulate,
    "completion": _completion,
    "demo": _demo,
}


TOP_VALUED = ("--server", "--token", "--ca")  # the options before the verb that take a value


def verb_of(argv: list[str]) -> str | None:
    """The verb ``argv`` names, if it names one and asks for no help before it; None otherwise (then the
    whole parser is built: ``gsched --help`` lists every verb, and a bad verb is told the choices)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in TOP_VALUED:
            i += 2
        elif word == "--install-completion" or word in ("-h", "--help") or word == "--":
            return None
        elif word.startswith("-"):
            i += 1
        else:
            return word if word in VERBS else None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    completing = "_ARGCOMPLETE" in os.environ
    parser = build_parser(None if completing else verb_of(argv))
    if completing:
        complete(parser)  # the shell asks for completions: answer and exit
    args = parser.parse_args(argv)
    if args.version:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"gsched {version('gsched')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("gsched (not installed: no version)")
        return 0
    if args.install_completion:
        from scheduler.cli.completion import install_completion

        return install_completion(parser, args.install_completion)
    if not args.verb:
        parser.print_help()
        return 2
    if args.verb not in ("server", "agent"):
        # A shell starts background jobs with SIGINT ignored, and Python then never raises
        # KeyboardInterrupt: `queue --watch`, `logs --follow` and `demo` would not stop on Ctrl-C.
        # _signal is the built-in module signal wraps (loaded at start): importing signal builds its
        # IntEnums from the platform's constants, 1 ms of every command.
        import _signal

        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    try:
        return int(HANDLERS[args.verb](args) or 0)
    except ServerError as e:
        print(f"gsched {args.verb}: {e.message}", file=sys.stderr)
        return exitcodes.for_error(e)
    except UserConfigError as e:
        print(f"gsched {args.verb}: {e}", file=sys.stderr)
        return exitcodes.USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def _json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


# ------------------------------------------------------------------ login


def cmd_login(args: argparse.Namespace) -> int:
    from scheduler.cli.login import login

    return login(args)


# ------------------------------------------------------------------ daemons


def cmd_server(args: argparse.Namespace) -> int:
    import logging

    from scheduler.server.config import ConfigError, load_settings
    from scheduler.server.main import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s server[%(name)s] %(message)s")
    for noisy in ("alembic", "apscheduler"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        settings = load_settings(args.config, host=args.host, port=args.port, db=args.db, tls_cert=args.tls_cert,
                                 tls_key=args.tls_key)
    except ConfigError as e:
        print(f"gsched server: {e}", file=sys.stderr)
        return 2
    serve(settings)
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    from agents.agent import main as agent_main
    from scheduler.core.durations import parse_duration

    if args.job_retention == "forever":
        args.job_retention_s = None
    else:
        try:
            args.job_retention_s = float(parse_duration(args.job_retention))
        except ValueError as e:
            print(f"gsched agent: --job-retention {args.job_retention}: {e}", file=sys.stderr)
            return exitcodes.USAGE

    return agent_main(args)


def cmd_db(args: argparse.Namespace) -> int:
    from scheduler.server.config import ConfigError, load_settings
    from scheduler.store.db import Database

    if args.db_verb != "upgrade":
        print("usage: gsched db upgrade [--db URL]", file=sys.stderr)
        return 2
    try:
        settings = load_settings(args.config, db=args.db)
    except ConfigError as e:
        print(f"gsched db: {e}", file=sys.stderr)
        return exitcodes.USAGE
    settings.home.mkdir(parents=True, exist_ok=True)
    db = Database(settings.db_url)
    db.upgrade()
    print(f"database at revision {db.current_revision()}")
    return 0


# ------------------------------------------------------------------ admin


def cmd_user(args: argparse.Namespace) -> int:
    c = client(args)
    if args.user_verb == "add":
        body = {"name": args.name, "shares": args.shares, "role": "admin" if args.admin else "user",
                "unix_user": args.unix_user}
        if args.account:
            body["account"] = args.account
        out = c.post("/v1/users", body)
        print(f"user {out['name']} created; token (shown once):", file=sys.stderr)
        print(out["token"])
    elif args.user_verb == "list":
        for u in c.get("/v1/users"):
            print(f"{u['name']:<20} shares={u['shares']:g} role={u['role']}"
                  + (f" unix_user={u['unix_user']}" if u.get("unix_user") else ""))
    elif args.user_verb == "remove":
        c.request("DELETE", f"/v1/users/{args.name}")
        print(f"user {args.name} removed")
    elif args.user_verb == "set":
        if args.unix_user is None and args.shares is None:
            print("gsched user set: give --unix-user ACCOUNT and/or --shares N", file=sys.stderr)
            return 2
        if args.unix_user is not None:
            c.request("PUT", f"/v1/users/{args.name}/unix-user", {"unix_user": args.unix_user})
            print(f"user {args.name}: runs [run] jobs as {args.unix_user or '(no account)'}")
        if args.shares is not None:
            c.request("PUT", f"/v1/users/{args.name}/shares", {"shares": args.shares})
            print(f"user {args.name}: shares {args.shares:g}")
    elif args.user_verb == "shares":
        c.request("PUT", f"/v1/users/{args.name}/shares", {"shares": args.shares})
        print(f"user {args.name}: shares {args.shares:g}")
    elif args.user_verb == "account":
        out = c.request("PUT", f"/v1/users/{args.name}/account", {"account": args.account})
        print(f"user {args.name}: account {out['account']}")
    else:
        print("usage: gsched user add|list|set|remove|shares|account", file=sys.stderr)
        return 2
    return 0


def cmd_agent_token(args: argparse.Namespace) -> int:
    if args.token_verb != "create":
        print("usage: gsched agent-token create NODE", file=sys.stderr)
        return 2
    out = client(args).post("/v1/agent-tokens", {"node": args.node})
    print(f"agent token for node {out['node']} (shown once; pass it as GSCHED_AGENT_TOKEN):", file=sys.stderr)
    print(out["token"])
    return 0


# ------------------------------------------------------------------ data


def cmd_data(args: argparse.Namespace) -> int:
    c = client(args)
    if args.data_verb == "make":
        from scheduler.cli.data import make_dataset

        return make_dataset(c, args)
    if args.data_verb == "add":
        from scheduler.cli.data import add_dataset

        return add_dataset(c, args)
    if args.data_verb == "ls":
        rows = c.get("/v1/datasets")
        if args.json:
            _json([{**d, "shards": [{k: sh[k] for k in ("index", "bytes", "sha256", "samples", "replicas", "copies")}
                                    for sh in d["shards"]]} for d in rows])
            return 0
        from scheduler.cli.data import print_datasets

        print_datasets(rows)
        return 0
    if args.data_verb == "place":
        out = c.post(f"/v1/datasets/{args.name}/place", {"replicas": args.replicas})
        print(f"{out['name']}: replicas {out['previous']} -> {out['replicas']}"
              + (f"; dropping {len(out['dropped'])} extra copies" if out["dropped"] else "; copies are scheduled"))
        return 0
    print("usage: gsched data make|ls|place", file=sys.stderr)
    return 2


# ------------------------------------------------------------------ jobs


def cmd_submit(args: argparse.Namespace) -> int:
    from scheduler.cli.submit import cmd_submit as submit

    return submit(client(args), args)


def cmd_queue(args: argparse.Namespace) -> int:
    from scheduler.cli.listings import cmd_queue as queue

    return queue(client(args), args)


def cmd_history(args: argparse.Namespace) -> int:
    from scheduler.cli.listings import cmd_history as history

    return history(client(args), args)


def cmd_show(args: argparse.Namespace) -> int:
    doc = client(args).get(f"/v1/jobs/{args.job}")
    if args.json:
        _json(doc)
        return 0
    from scheduler.cli.render import job_detail

    job_detail(doc)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    doc = client(args).get(f"/v1/jobs/{args.job}/explain")
    if args.json:
        _json(doc)
        return 0
    from scheduler.cli.render import explain

    explain(doc)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from scheduler.cli.jobctl import cmd_act

    return cmd_act(client(args), args)


cmd_hold = cmd_release = cmd_requeue = cmd_cancel


def cmd_update(args: argparse.Namespace) -> int:
    from scheduler.cli.jobctl import cmd_update as update

    return update(client(args), args)


def cmd_logs(args: argparse.Namespace) -> int:
    from scheduler.core.lifecycle import FINAL

    c = client(args)
    after = 0
    while True:
        out = c.get(f"/v1/jobs/{args.job}/logs", rank=args.rank, after=after)
        for chunk in out["chunks"]:
            text = chunk["text"]
            if args.rank is None:
                text = "".join(f"[rank {chunk['rank']}] {line}\n" for line in text.splitlines())
            sys.stdout.write(text)
        sys.stdout.flush()
        after = out["next"]
        if not args.follow or (out["state"] in FINAL and not out["chunks"]):
            return 0
        if not out["chunks"]:
            time.sleep(1.0)


def cmd_fetch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scheduler.cli.fetch import fetch_job

    return fetch_job(client(args), args.job, Path(args.out or f"job-{args.job}"))


def cmd_nodes(args: argparse.Namespace) -> int:
    from scheduler.cli.listings import cmd_nodes as nodes

    return nodes(client(args), args)


def cmd_node(args: argparse.Namespace) -> int:
    if args.node_verb not in ("drain", "resume"):
        print("usage: gsched node drain NODE [--reason R] | gsched node resume NODE", file=sys.stderr)
        return exitcodes.USAGE
    c = client(args)
    if args.node_verb == "drain":
        out = c.post(f"/v1/nodes/{args.node}/drain", {"reason": args.reason})
        print(f"node {out['name']}: drained ({out['drain_reason']})")
    else:
        out = c.post(f"/v1/nodes/{args.node}/resume")
        print(f"node {out['name']}: {out['state']}, taking ranks")
    return exitcodes.OK


def cmd_share(args: argparse.Namespace) -> int:
    from scheduler.cli.sharetree import cmd_share as share

    return share(client(args), args.json)


def cmd_account(args: argparse.Namespace) -> int:
    from scheduler.cli.sharetree import cmd_account as account

    return account(client(args), args)


def cmd_events(args: argparse.Namespace) -> int:
    rows = client(args).get("/v1/events", job=args.job, limit=args.limit)
    if args.json:
        _json(rows)
        return 0
    for e in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"]))
        print(f"{when} {e['actor']:<14} {e['kind']:<18} {('job ' + str(e['job'])) if e['job'] else '':<8} {e['message']}")
    return 0


def _span_s(text: str) -> float:
    from scheduler.core.durations import parse_duration

    try:
        return float(parse_duration(text))
    except ValueError:
        raise ValueError(f"--last {text!r}: give a span like 90s, 30m, 6h or 2d") from None


def cmd_plot(args: argparse.Namespace) -> int:
    if args.cluster == (args.job is not None):
        print("gsched plot: give a JOB or --cluster (one of them)", file=sys.stderr)
        return 2
    c = client(args)
    try:
        since = None
        if args.cluster and args.last:
            since = c.get("/v1/health")["time"] - _span_s(args.last)
        doc = c.get("/v1/cluster/history", since=since) if args.cluster else c.get(f"/v1/jobs/{args.job}")
        from scheduler.cli.plots import plot_cluster, plot_job

        (plot_cluster if args.cluster else plot_job)(doc, args.output)
    except (ValueError, OSError) as e:  # a bad --last, nothing to draw yet, or the PNG cannot be written
        print(f"gsched plot: {e}", file=sys.stderr)
        return exitcodes.USAGE
    print(args.output)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from scheduler.sim.simulator import main as sim_main

    if args.config is not None:  # the server's [policy] and [network], read as the server reads them
        from scheduler.server.config import ConfigError, load_settings

        try:
            args.policy_cfg = load_settings(args.config).policy
        except ConfigError as e:
            print(f"gsched simulate: --config: {e}", file=sys.stderr)
            return 2
    return sim_main(args)


def cmd_completion(args: argparse.Namespace) -> int:
    from scheduler.cli.completion import script

    sys.stdout.write(script(args.shell))
    return exitcodes.OK


def cmd_demo(args: argparse.Namespace) -> int:
    from scheduler.cli.demo import main as demo_main

    return demo_main(args)


HANDLERS = {
    "login": cmd_login, "server": cmd_server, "agent": cmd_agent, "db": cmd_db, "user": cmd_user, "agent-token": cmd_agent_token,
    "data": cmd_data, "submit": cmd_submit, "queue": cmd_queue, "history": cmd_history, "show": cmd_show, "cancel": cmd_cancel,
    "hold": cmd_hold, "release": cmd_release, "requeue": cmd_requeue, "update": cmd_update,
    "logs": cmd_logs, "fetch": cmd_fetch, "nodes": cmd_nodes, "node": cmd_node, "explain": cmd_explain, "share": cmd_share, "account": cmd_account,
    "events": cmd_events,
    "plot": cmd_plot, "simulate": cmd_simulate, "demo": cmd_demo,
    "completion": cmd_completion,
}


if __name__ == "__main__":
    sys.exit(main())
