"""The fair-share account tree in the database: add accounts, list them, put a user in one, and the
``sshare -l`` view of the whole tree.  Admins manage; anyone reads the share view.

Contract: each function runs in the caller's session and transaction; bad input raises ``Unprocessable``
naming the field, an unknown name ``NotFound``, a duplicate ``Conflict``; nothing is written then.
Every change is recorded in the audit log (``account.add``, ``user.account``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from policies.preemption import held_devices, snapshot_demand, snapshot_parts
from scheduler.core.accounts import ROOT, AccountView, account_sums, share_tree, would_cycle
from scheduler.core.errors import Conflict, NotFound, Unprocessable
from scheduler.core.fairshare import decay
from scheduler.core.policy_config import PolicyConfig
from scheduler.server.auth import Identity
from scheduler.server.service import require_admin
from scheduler.store.effects import record
from scheduler.store.models import Account, Usage, User
from scheduler.store.snapshot_reader import build_snapshot

ACCOUNT_NAME_RE = r"^[a-z_][a-z0-9_-]{0,63}$"


def account_views(s: Session) -> dict[str, AccountView]:
    """Every account as the snapshot and the share view see it."""
    return {a.name: AccountView(a.name, a.parent, a.shares) for a in s.scalars(select(Account))}


def user_accounts(s: Session) -> dict[str, str]:
    """Each user's account, for users that have one (the others hang under root)."""
    rows = s.execute(select(User.name, User.account).where(User.account.is_not(None)))
    return {name: acc for name, acc in rows if acc is not None}


def add_account(s: Session, now: float, who: Identity, name: str, parent: str | None, shares: float) -> None:
    """Create account ``name`` under ``parent`` (None or ``root``: under root) with ``shares``."""
    require_admin(who)
    if not re.fullmatch(ACCOUNT_NAME_RE, name) or name == ROOT:
        raise Unprocessable(f"name: {name!r} is not a valid account name (lowercase letters, digits, _ and -; "
                            f"not {ROOT!r})", "name")
    if not (0 < shares <= 1e6):
        raise Unprocessable("shares: must be a number greater than 0", "shares")
    parent = None if parent in (None, ROOT) else parent
    if parent is not None and s.get(Account, parent) is None:
        raise Unprocessable(f"parent: no account {parent!r} (add it first: gsched account add {parent})", "parent")
    if s.get(Account, name) is not None:
        raise Conflict(f"account {name!r} already exists")
    s.add(Account(name=name, parent=parent, shares=float(shares), created_at=now))
    record(s, now, who.actor, "account.add", f"{name} parent={parent or ROOT} shares={shares:g}")


def set_account_parent(s: Session, now: float, who: Identity, name: str, parent: str | None) -> None:
    """Move account ``name`` (with everything under it) under ``parent``; refuses a loop."""
    require_admin(who)
    acc = s.get(Account, name)
    if acc is None:
        raise NotFound(f"no account {name!r}")
    parent = None if parent in (None, ROOT) else parent
    if parent is not None and s.get(Account, parent) is None:
        raise Unprocessable(f"parent: no account {parent!r}", "parent")
    if would_cycle(account_views(s), name, parent):
        raise Unprocessable(f"parent: {parent!r} is under {name!r}; that would make a loop", "parent")
    acc.parent = parent
    record(s, now, who.actor, "account.parent", f"{name} parent={parent or ROOT}")


def set_user_account(s: Session, now: float, who: Identity, user: str, account: str | None) -> None:
    """Put ``user`` in ``account`` (None or ``root``: directly under root).  Their past usage moves with
    them: usage is kept per user and rolled up when the tree is computed."""
    require_admin(who)
    row = s.get(User, user)
    if row is None:
        raise NotFound(f"no user {user!r}")
    account = None if account in (None, ROOT) else account
    if account is not None and s.get(Account, account) is None:
        raise Unprocessable(f"account: no account {account!r} (add it first: gsched account add {account})",
                            "account")
    before = row.account or ROOT
    row.account = account
    record(s, now, who.actor, "user.account", f"{user} {before} -> {account or ROOT}")


def list_accounts(s: Session) -> list[dict[str, Any]]:
    return [{"name": a.name, "parent": a.parent or ROOT, "shares": a.shares}
            for a in s.scalars(select(Account).order_by(Account.name))]


def decayed_usage(s: Session, now: float, half_life_s: float) -> dict[str, float]:
    """Each user's usage decayed to ``now`` (device-seconds)."""
    return {u.user: decay(u.device_seconds, max(0.0, now - u.updated_at), half_life_s) for u in s.scalars(select(Usage))}


def share_tree_rows(s: Session, now: float, policy: PolicyConfig, devices: bool = False,
                    disk_floor_bytes: int = 0) -> list[dict[str, Any]]:
    """``gsched share`` (like ``sshare -l``): every account and user of the tree, root first, with raw
    and normalised shares, raw usage (device-seconds, decayed to now), normalised and effective usage
    and the fair-share factor (Slurm's classic definitions, scheduler/core/accounts.py).

    ``devices``: also what each holds and asks for now and its fair part of the devices now, as
    preemption reads them (:func:`device_columns`); the queue view, which reads the users' factors on
    every call, leaves them out (they read the whole cluster)."""
    users = dict(s.execute(select(User.name, User.shares)).all())
    usage = {u: x for u, x in decayed_usage(s, now, policy.usage_half_life_s).items()}
    views, user_account = account_views(s), user_accounts(s)
    rows = share_tree(views, user_account, usage, users, users)
    by_user, by_account = device_columns(s, now, views, user_account, disk_floor_bytes) if devices else ({}, {})
    out = []
    for r in rows:
        row: dict[str, Any] = {
            "account": r.account, "user": r.user, "depth": r.depth, "raw_shares": r.raw_shares,
            "norm_shares": round(r.norm_shares, 6), "raw_usage": round(r.raw_usage, 3),
            "norm_usage": round(r.norm_usage, 6), "effective_usage": round(r.effective_usage, 6),
            "factor": round(r.factor, 6)}
        if devices:
            values = by_user[r.user] if r.user is not None else by_account[r.account]
            row.update({col: round(values.get(col, 0.0), 3) for col in DEVICE_COLUMNS})
        out.append(row)
    return out


DEVICE_COLUMNS = ("held_devices", "asked_devices", "fair_part")


def device_columns(s: Session, now: float, views: dict[str, AccountView], user_account: dict[str, str],
                   disk_floor_bytes: int = 0) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """The columns of :data:`DEVICE_COLUMNS` by user and by account (a user or account absent: all 0):
    the devices held by active running jobs, those plus the devices of pending jobs the cycle would
    schedule (what a user asks for now), and the fair part of the devices now
    (``policies.preemption.snapshot_parts``: the weighted max-min split of the devices the cycle may
    place on among those who ask, level by level of the tree; KAI's fair share).  An account's figure
    is the sum over the users of its subtree."""
    snap = build_snapshot(s, now, disk_floor_bytes=disk_floor_bytes, preemption=False)
    held = held_devices(snap)
    asked = snapshot_demand(snap, held)
    columns = dict(zip(DEVICE_COLUMNS, ({u: float(d) for u, d in held.items()}, asked,
                                        snapshot_parts(snap, held, asked)), strict=True))
    by_user: dict[str, dict[str, float]] = defaultdict(dict)
    by_account: dict[str, dict[str, float]] = defaultdict(dict)
    for col, values in columns.items():
        for u, v in values.items():
            by_user[u][col] = v
        for a, v in account_sums(views, user_account, values).items():
            by_account[a][col] = v
    return by_user, by_account
