"""``gsched``: the command line.  One verb per line of ``--help``; heavy modules load only when used."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

from scheduler.core.lifecycle import FINAL
from scheduler.protocol.http import Client, ServerError

VERBS = {
    "server": "run the central scheduler (API + scheduling cycles)",
    "agent": "run the node daemon: report devices and shards, run ranks",
    "db": "database maintenance (upgrade to the latest schema)",
    "user": "add, list, remove users or change their shares (admin)",
    "agent-token": "create an agent token bound to one node (admin)",
    "data": "make, list and re-replicate sharded data sets",
    "submit": "submit a job.toml; prints the job id on its last line",
    "queue": "show jobs, fair share and nodes (--watch for a live view)",
    "show": "one job in detail: placement, shard map, epochs, checkpoints, events",
    "cancel": "cancel a job (kills all its ranks, frees its devices)",
    "logs": "a job's rank logs (--follow to stream)",
    "nodes": "list nodes with their devices and shards",
    "explain": "why a job is pending, or why it landed where it did",
    "share": "the fair-share tree like sshare -l: shares, usage, effective usage, factor",
    "account": "add, list or move fair-share accounts (admin)",
    "events": "the audit log: who did what, when",
    "plot": "draw a job's training curves or the cluster's history to PNG",
    "simulate": "replay a cluster trace through the scheduling policies",
    "demo": "run the embedded demo cluster on this machine",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gsched", description="Data-locality-aware, fair-share GPU scheduler for DDP training.")
    p.add_argument("--server", help="server URL(s), comma-separated (default $GSCHED_SERVER or http://127.0.0.1:8470)")
    p.add_argument("--token", help="API token (default $GSCHED_TOKEN, else $GSCHED_HOME/admin.token)")
    p.add_argument("--ca", help="CA bundle to verify an HTTPS server (default $GSCHED_CA; `gsched agent` too)")
    p.add_argument("--install-completion", nargs="?", const="install", choices=["install", "print"], default=None,
                   help="bash completion: install it under ~/.local/share/bash-completion (or print it)")
    # The same options after the verb (`gsched agent --server URL`); SUPPRESS keeps the top-level value.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--token", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--ca", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="verb", metavar="VERB")
    sp = {name: sub.add_parser(name, help=text, description=text, parents=[common]) for name, text in VERBS.items()}

    s = sp["server"]
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--db", default=None, help="database URL (default sqlite:///$GSCHED_HOME/gsched.db)")
    s.add_argument("--config", default=None, help="gsched.toml")
    s.add_argument("--tls-cert", default=None, help="PEM certificate (chain): serve HTTPS (with --tls-key)")
    s.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")

    a = sp["agent"]
    a.add_argument("--node", required=True)
    a.add_argument("--rack", default="rack0")
    a.add_argument("--gpus", default="auto", help="N CPU devices, or auto (NVIDIA GPUs via nvidia-smi)")
    a.add_argument("--data-dir", required=True)
    a.add_argument("--host", default="127.0.0.1", help="address the data server binds and advertises")
    a.add_argument("--port", type=int, default=0, help="data server port (default: any free port)")
    a.add_argument("--heartbeat-s", type=float, default=2.0)
    a.add_argument("--threads-per-rank", type=int, default=None,
                   help="CPU threads per rank (torch and OMP_NUM_THREADS); default: cores x rank devices / devices")
    a.add_argument("--scrub-interval-s", type=float, default=60.0, help="re-hash every shard this often")
    a.add_argument("--net-iface", default=None, help="network interface ranks use for gloo/NCCL traffic")
    a.add_argument("--rendezvous-ports", default="29500-29999", metavar="FIRST-LAST",
                   help="ports a job's rank 0 on this node may listen on for its rendezvous (MASTER_PORT); "
                        "open them between nodes (default 29500-29999)")
    a.add_argument("--rendezvous-wait-s", type=float, default=30.0,
                   help="how long rank 0 waits for a free rendezvous port before its job is requeued (default 30)")
    a.add_argument("--max-transfers", type=int, default=4,
                   help="shard copies this agent makes at once, staging and replication alike (default 4)")
    a.add_argument("--max-transfer-mbps", type=float, default=0.0,
                   help="megabits a second this agent's copies receive and its data server sends, in all "
                        "(default 0: no limit)")

    d = sp["db"].add_subparsers(dest="db_verb", metavar="ACTION")
    up = d.add_parser("upgrade", help="run migrations to the latest revision")
    up.add_argument("--db", default=None)
    up.add_argument("--config", default=None)

    u = sp["user"].add_subparsers(dest="user_verb", metavar="ACTION")
    ua = u.add_parser("add", help="create a user and print its token once")
    ua.add_argument("name")
    ua.add_argument("--shares", type=float, default=1.0)
    ua.add_argument("--admin", action="store_true")
    ua.add_argument("--account", default=None, help="the user's fair-share account (default: root)")
    u.add_parser("list", help="list users")
    ur = u.add_parser("remove", help="remove a user")
    ur.add_argument("name")
    us = u.add_parser("shares", help="change a user's shares")
    us.add_argument("name")
    us.add_argument("shares", type=float)
    um = u.add_parser("account", help="move a user to another fair-share account")
    um.add_argument("name")
    um.add_argument("account", help="the account, or root")
    from scheduler.cli.sharetree import add_account_parser

    add_account_parser(sp["account"])

    t = sp["agent-token"].add_subparsers(dest="token_verb", metavar="ACTION")
    tc = t.add_parser("create", help="create a token for NODE's agent")
    tc.add_argument("node")

    dd = sp["data"].add_subparsers(dest="data_verb", metavar="ACTION")
    dm = dd.add_parser("make", help="build a sharded data set and upload R replicas to agents")
    dm.add_argument("name")
    dm.add_argument("--source", required=True, help="digits | synthetic[:k=v,...] | imagefolder:PATH")
    dm.add_argument("--shards", type=int, default=8)
    dm.add_argument("--replicas", type=int, default=2)
    dm.add_argument("--span", type=int, default=None,
                    help="nodes its jobs spread over: copies are striped over this many (default: with one "
                         "replica every up node, up to one a shard; with more, 1: every copy whole)")
    dm.add_argument("--seed", type=int, default=0)
    dm.add_argument("--format", choices=("gshard", "wds"), default="gshard",
                    help="shard files: gsched's GSHARD1, or WebDataset tars (KEY.png + KEY.cls)")
    da = dd.add_parser("add", help="register files the nodes already have (under their data dirs) as a data set")
    da.add_argument("name")
    da.add_argument("--node", action="append", required=True, help="a node holding files (repeatable)")
    da.add_argument("--path", action="append", required=True,
                    help="the folder (or file) below that node's data dir: one per --node, or one for all")
    da.add_argument("--glob", default="*", help="which files below PATH (fnmatch, * also crosses /); default all")
    da.add_argument("--replicas", type=int, default=2)
    da.add_argument("--span", type=int, default=None, help="nodes its jobs spread over (as for data make)")
    da.add_argument("--classes", type=int, default=None,
                    help="classes of the labels (default: from the WebDataset tars' .cls labels, else 1)")
    dl = dd.add_parser("ls", help="list data sets with replication and placement")
    dl.add_argument("--json", action="store_true")
    dp = dd.add_parser("place", help="change the replica count of a data set")
    dp.add_argument("name")
    dp.add_argument("--replicas", type=int, required=True)

    sb = sp["submit"]
    sb.add_argument("file")
    sb.add_argument("--request-id", default=None, help="idempotency key (default: a fresh one, reused on retries)")

    q = sp["queue"]
    q.add_argument("--json", action="store_true", help="the same data as JSON, with each job's elapsed_s, eta_s "
                   "and reason_text")
    q.add_argument("--watch", "-w", action="store_true", help="redraw in place every --interval seconds until Ctrl-C")
    q.add_argument("--all", action="store_true", help="include every finished job (--watch shows the last 10 minutes')")
    q.add_argument("--user", help="only this user's jobs")
    q.add_argument("--state", help="only jobs in these states, comma-separated (pending,running)")
    q.add_argument("--mine", action="store_true", help="only my jobs (the token's user)")
    q.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes with --watch (default 1)")

    for verb in ("show", "explain"):
        sp[verb].add_argument("job", type=int)
        sp[verb].add_argument("--json", action="store_true")
    sp["cancel"].add_argument("job", type=int)
    lg = sp["logs"]
    lg.add_argument("job", type=int)
    lg.add_argument("--rank", type=int, default=None)
    lg.add_argument("--follow", "-f", action="store_true")
    for verb in ("nodes", "share"):
        sp[verb].add_argument("--json", action="store_true")
    ev = sp["events"]
    ev.add_argument("--job", type=int, default=None)
    ev.add_argument("--limit", type=int, default=100)
    ev.add_argument("--json", action="store_true")

    pl = sp["plot"]
    pl.add_argument("job", type=int, nargs="?", help="the job whose loss, accuracy and images/s to draw")
    pl.add_argument("--cluster", action="store_true", help="device utilisation and queue length over time instead")
    pl.add_argument("--last", default=None, help="with --cluster: only this recent span (90s, 30m, 6h, 2d)")
    pl.add_argument("-o", "--output", required=True, help="the PNG file to write")

    sim = sp["simulate"]
    sim.add_argument("--trace", required=True)
    sim.add_argument("--nodes", type=int, default=16)
    sim.add_argument("--devices-per-node", type=int, default=8)
    sim.add_argument("--racks", type=int, default=2)
    sim.add_argument("--data", default=None)
    sim.add_argument("--policy", default="twostage")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--json", action="store_true")
    sim.add_argument("--plot", default=None)
    sim.add_argument("--failures", default=None)
    sim.add_argument("--cycle-s", type=float, default=10.0, help="simulated seconds between scheduling cycles")
    sim.add_argument("--limit", type=int, default=None, help="replay only the first N jobs of the trace")

    dm2 = sp["demo"]
    dm2.add_argument("--keep", action="store_true", help="leave the cluster's files in place")
    dm2.add_argument("--epochs", type=int, default=3)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.install_completion:
        from scheduler.cli.completion import install_completion

        return install_completion(parser, args.install_completion)
    if not args.verb:
        parser.print_help()
        return 2
    if args.verb not in ("server", "agent"):
        # A shell starts background jobs with SIGINT ignored, and Python then never raises
        # KeyboardInterrupt: `queue --watch`, `logs --follow` and `demo` would not stop on Ctrl-C.
        import signal

        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return int(HANDLERS[args.verb](args) or 0)
    except ServerError as e:
        print(f"gsched {args.verb}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def client(args: argparse.Namespace) -> Client:
    return Client(args.server, args.token, args.ca)


def _json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


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

    return agent_main(args)


def cmd_db(args: argparse.Namespace) -> int:
    from scheduler.server.config import load_settings
    from scheduler.store.db import Database

    if args.db_verb != "upgrade":
        print("usage: gsched db upgrade [--db URL]", file=sys.stderr)
        return 2
    settings = load_settings(args.config, db=args.db)
    settings.home.mkdir(parents=True, exist_ok=True)
    db = Database(settings.db_url)
    db.upgrade()
    print(f"database at revision {db.current_revision()}")
    return 0


# ------------------------------------------------------------------ admin


def cmd_user(args: argparse.Namespace) -> int:
    c = client(args)
    if args.user_verb == "add":
        body = {"name": args.name, "shares": args.shares, "role": "admin" if args.admin else "user"}
        if args.account:
            body["account"] = args.account
        out = c.post("/v1/users", body)
        print(f"user {out['name']} created; token (shown once):", file=sys.stderr)
        print(out["token"])
    elif args.user_verb == "list":
        for u in c.get("/v1/users"):
            print(f"{u['name']:<20} shares={u['shares']:g} role={u['role']}")
    elif args.user_verb == "remove":
        c.request("DELETE", f"/v1/users/{args.name}")
        print(f"user {args.name} removed")
    elif args.user_verb == "shares":
        c.request("PUT", f"/v1/users/{args.name}/shares", {"shares": args.shares})
        print(f"user {args.name}: shares {args.shares:g}")
    elif args.user_verb == "account":
        out = c.request("PUT", f"/v1/users/{args.name}/account", {"account": args.account})
        print(f"user {args.name}: account {out['account']}")
    else:
        print("usage: gsched user add|list|remove|shares|account", file=sys.stderr)
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
    from scheduler.cli.jobfile import JobFileError, read_job_file

    try:
        spec = read_job_file(args.file)
    except JobFileError as e:
        print(f"gsched submit: {e}", file=sys.stderr)
        return 2
    request_id = args.request_id or uuid.uuid4().hex
    c = client(args)
    deadline = time.monotonic() + float(os.environ.get("GSCHED_SUBMIT_RETRY_S", "60"))
    attempt = 0
    while True:  # retry lost responses with the same request id: never two jobs
        try:
            out = c.request("POST", "/v1/jobs", {"spec": spec, "client_request_id": request_id})
            break
        except ServerError as e:
            if e.status != 0 and e.status < 500:
                print(f"gsched submit: {args.file}: {e.message}", file=sys.stderr)
                return 1
            last = e
            if time.monotonic() > deadline:
                raise last from None
            time.sleep(min(1.0, 0.1 * 2**attempt))
            attempt += 1
    print(out["id"])
    return 0


def _filter(view: dict[str, Any], args: argparse.Namespace, me: str | None) -> dict[str, Any]:
    jobs = view["jobs"]
    if args.user:
        jobs = [j for j in jobs if j["user"] == args.user]
    if args.state:
        wanted = {s.strip().upper() for s in args.state.split(",")}
        jobs = [j for j in jobs if j["state"] in wanted]
    if args.mine and me:
        jobs = [j for j in jobs if j["user"] == me]
    return {**view, "jobs": jobs}


RECENT_S = 600.0  # --watch keeps finished jobs on screen this long


def _filter_note(args: argparse.Namespace, me: str | None) -> str:
    parts = [f"user={args.user}"] * bool(args.user) + [f"state={args.state}"] * bool(args.state)
    return ("filter: " + " ".join(parts + [f"mine ({me})"] * bool(args.mine and me))) if (parts or args.mine) else ""


def cmd_queue(args: argparse.Namespace) -> int:
    c = client(args)
    me = c.get("/v1/whoami")["name"] if args.mine else None
    if args.watch:
        from scheduler.cli.watch import watch

        def select(view: dict[str, Any]) -> dict[str, Any]:
            view = _filter(view, args, me)
            if args.all or args.state:
                return view
            recent = view["time"] - RECENT_S
            return {**view, "jobs": [j for j in view["jobs"]
                                     if j["state"] not in FINAL or (j.get("ended_at") or 0) >= recent]}

        return watch(c, select, args.interval, include_done=True, note=_filter_note(args, me))
    view = _filter(c.get("/v1/jobs", all="true" if args.all or args.state else None), args, me)
    if args.json:
        from scheduler.cli.queuefacts import job_facts

        _json({**view, "jobs": [{**j, **job_facts(j, view["time"])} for j in view["jobs"]]})
        return 0
    from scheduler.cli.render import print_queue

    print_queue(view, note=_filter_note(args, me))
    return 0


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
    out = client(args).post(f"/v1/jobs/{args.job}/cancel")
    print(f"job {out['id']}: {out['state']}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
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


def cmd_nodes(args: argparse.Namespace) -> int:
    rows = client(args).get("/v1/nodes")
    if args.json:
        _json(rows)
        return 0
    from rich.console import Console

    from scheduler.cli.render import nodes_table

    Console().print(nodes_table(rows))
    return 0


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
    except (ValueError, OSError) as e:
        print(f"gsched plot: {e}", file=sys.stderr)
        return 1
    print(args.output)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from scheduler.sim.simulator import main as sim_main

    return sim_main(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from scheduler.cli.demo import main as demo_main

    return demo_main(args)


HANDLERS = {
    "server": cmd_server, "agent": cmd_agent, "db": cmd_db, "user": cmd_user, "agent-token": cmd_agent_token,
    "data": cmd_data, "submit": cmd_submit, "queue": cmd_queue, "show": cmd_show, "cancel": cmd_cancel,
    "logs": cmd_logs, "nodes": cmd_nodes, "explain": cmd_explain, "share": cmd_share, "account": cmd_account,
    "events": cmd_events,
    "plot": cmd_plot, "simulate": cmd_simulate, "demo": cmd_demo,
}


if __name__ == "__main__":
    sys.exit(main())
