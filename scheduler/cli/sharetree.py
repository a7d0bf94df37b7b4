"""``gsched share`` and ``gsched account``: the fair-share tree as ``sshare -l`` shows it, and the
account verbs.  Columns of the table and of ``--json`` are the same (:data:`COLUMNS`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from scheduler.protocol.client import Client

COLUMNS = ("account", "user", "raw_shares", "norm_shares", "raw_usage", "norm_usage", "effective_usage", "factor",
           "held_devices", "asked_devices", "fair_part")
HEADERS = ("Account", "User", "RawShares", "NormShares", "RawUsage", "NormUsage", "EffectvUsage", "FairShare",
           "Held", "Asked", "FairPart")


def share_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The tree as text, one line per account or user, accounts indented by depth (as sshare does);
    then the devices held and asked for now and the fair part of the devices now (what preemption
    reads; docs/concepts.md)."""
    lines = [f"{HEADERS[0]:<20} {HEADERS[1]:<12} {HEADERS[2]:>9} {HEADERS[3]:>10} {HEADERS[4]:>11} "
             f"{HEADERS[5]:>9} {HEADERS[6]:>12} {HEADERS[7]:>9} {HEADERS[8]:>6} {HEADERS[9]:>6} {HEADERS[10]:>8}",
             "-" * 122]
    for r in rows:
        indent = " " * max(0, r["depth"] - (1 if r["user"] else 0))
        lines.append(f"{(indent + r['account'])[:20]:<20} {(r['user'] or '')[:12]:<12} {r['raw_shares']:>9g} "
                     f"{r['norm_shares']:>10.6f} {r['raw_usage']:>11.0f} {r['norm_usage']:>9.6f} "
                     f"{r['effective_usage']:>12.6f} {r['factor']:>9.6f} {r['held_devices']:>6g} "
                     f"{r['asked_devices']:>6g} {r['fair_part']:>8.1f}")
    return lines


def cmd_share(c: Client, as_json: bool) -> int:
    rows = c.get("/v1/share/tree")
    if as_json:
        print(json.dumps([{k: r[k] for k in COLUMNS} for r in rows], indent=2))
        return 0
    print("\n".join(share_lines(rows)))
    return 0


def add_account_parser(sub: argparse.ArgumentParser) -> None:
    a = sub.add_subparsers(dest="account_verb", metavar="ACTION")
    aa = a.add_parser("add", help="add an account under root or under --parent")
    aa.add_argument("name", help="the new account's name")
    aa.add_argument("--parent", default=None, help="parent account (default: root)")
    aa.add_argument("--shares", type=float, default=1.0, help="shares within the parent (default 1)")
    a.add_parser("list", help="list accounts with their parents and shares")
    am = a.add_parser("move", help="move an account (and all under it) under another parent")
    am.add_argument("name", help="the account to move")
    am.add_argument("parent", help="the new parent account, or root")


def cmd_account(c: Client, args: argparse.Namespace) -> int:
    if args.account_verb == "add":
        out = c.post("/v1/accounts", {"name": args.name, "parent": args.parent, "shares": args.shares})
        print(f"account {out['name']} under {out['parent']}, shares {out['shares']:g}")
    elif args.account_verb == "list":
        for a in c.get("/v1/accounts"):
            print(f"{a['name']:<20} parent={a['parent']:<20} shares={a['shares']:g}")
    elif args.account_verb == "move":
        out = c.request("PUT", f"/v1/accounts/{args.name}/parent", {"parent": args.parent})
        print(f"account {out['name']} now under {out['parent']}")
    else:
        print("usage: gsched account add|list|move", file=__import__("sys").stderr)
        return 2
    return 0
