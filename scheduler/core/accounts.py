"""The account tree and Slurm's classic fair share computed over it.

Contract: pure functions of the accounts, the users' accounts, their usage and shares (all from a
``Snapshot`` or the database); no I/O, no clock.  The definitions are Slurm's *classic* fair-share
algorithm (``PriorityFlags=NO_FAIR_TREE``), not Fair Tree nor depth-oblivious:

- The tree: ``root`` -> accounts -> sub-accounts -> users.  A user without an account, or whose
  account is unknown, hangs under ``root``; so does an account whose parent is unknown.  Every node
  has raw shares (accounts and users alike); a user absent from the shares table has
  :data:`DEFAULT_SHARE`.
- Normalised shares: ``S = (S_self / S_siblings) * (S_parent / S_parent_siblings) * ...`` up to
  ``root``, where ``S_siblings`` sums the raw shares of every child of the same parent, self included.
- Raw usage of an account is the sum of its users' (decayed) usage; normalised usage
  ``U = raw / raw(root)`` (0 when nobody used anything).
- Effective usage: for a child of ``root``, ``UE = U``; below, Slurm's
  ``UE = U + (UE_parent - U) * S_self / S_siblings``: a node inherits part of its parent's usage in
  proportion to its share of the parent (a user who used nothing in a team that used a lot is not
  treated as idle).
- Factor ``F = 2 ** (-UE / S)``: 1 with no effective usage, 0 with usage but no shares.

With no accounts at all (every user under root), ``UE = U`` and ``S = shares / all shares``: the
flat factor of :mod:`scheduler.core.fairshare`, number for number.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ROOT = "root"
DEFAULT_SHARE = 1.0


@dataclass(frozen=True, slots=True)
class AccountView:
    """An account: its parent (None or unknown: under root) and its raw shares within the parent."""

    name: str
    parent: str | None = None
    shares: float = 1.0


@dataclass(frozen=True, slots=True)
class ShareRow:
    """One line of ``gsched share`` (``sshare -l``): an account (``user`` None) or a user in ``account``."""

    account: str
    user: str | None
    depth: int  # 0 for root, 1 for its children, ...
    raw_shares: float
    norm_shares: float
    raw_usage: float
    norm_usage: float
    effective_usage: float
    factor: float


def _factor(ue: float, s: float) -> float:
    if ue <= 0:
        return 1.0
    if s <= 0:
        return 0.0
    return 2.0 ** (-ue / s)


def _parent_of(acc: AccountView, accounts: Mapping[str, AccountView]) -> str:
    p = acc.parent
    if p is None or p == acc.name or (p != ROOT and p not in accounts):
        return ROOT
    return p


def _tree(accounts: Mapping[str, AccountView], user_account: Mapping[str, str],
          users: Iterable[str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The tree's child accounts and child users of every account (root included), each list by name.
    An account cycle (a -> b -> a) is broken by hanging its first account under root; a user without a
    known account hangs under root."""
    parent: dict[str, str] = {}
    for name in sorted(accounts):
        if name == ROOT:
            continue
        p = _parent_of(accounts[name], accounts)
        # break cycles: walk up; if we come back to ``name``, hang it under root
        seen = {name}
        q = p
        while q != ROOT:
            if q in seen:
                p = ROOT
                break
            seen.add(q)
            q = parent.get(q) or _parent_of(accounts[q], accounts)
        parent[name] = p
    child_accounts: dict[str, list[str]] = {ROOT: []}
    for name in sorted(parent):
        child_accounts.setdefault(parent[name], []).append(name)
        child_accounts.setdefault(name, [])
    child_users: dict[str, list[str]] = {a: [] for a in child_accounts}
    for u in sorted(users):
        a = user_account.get(u) or ROOT
        child_users[a if a in child_users else ROOT].append(u)
    return child_accounts, child_users


def _subtree_sums(child_accounts: Mapping[str, list[str]], child_users: Mapping[str, list[str]],
                  values: Mapping[str, float]) -> dict[str, float]:
    """Each account's sum of ``values`` (negatives as 0) over the users of its subtree, root included."""
    out: dict[str, float] = {}

    def roll_up(a: str) -> float:
        out[a] = (sum(max(0.0, values.get(u, 0.0)) for u in child_users[a])
                  + sum(roll_up(c) for c in child_accounts[a]))
        return out[a]

    roll_up(ROOT)
    return out


def account_sums(accounts: Mapping[str, AccountView], user_account: Mapping[str, str],
                 values: Mapping[str, float]) -> dict[str, float]:
    """Each account's sum of the users' ``values`` over its subtree (``root``: every user), as
    :func:`share_tree` rolls usage up (negatives as 0)."""
    return _subtree_sums(*_tree(accounts, user_account, values), values)


def share_tree(
    accounts: Mapping[str, AccountView],
    user_account: Mapping[str, str],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    users: Iterable[str] = (),
) -> list[ShareRow]:
    """Every node of the tree in ``sshare`` order (root first, then depth first; within a parent,
    accounts before users, each by name).  Users are those in ``shares``, ``usage``, ``user_account``
    and ``users``.  An account cycle (a -> b -> a) is broken by hanging its first account under root."""
    known_users = sorted({*shares, *usage, *user_account, *users})
    child_accounts, child_users = _tree(accounts, user_account, known_users)

    def user_shares(u: str) -> float:
        return max(0.0, float(shares.get(u, DEFAULT_SHARE)))

    def acc_shares(a: str) -> float:
        return max(0.0, float(accounts[a].shares))

    raw_acc = _subtree_sums(child_accounts, child_users, usage)
    total_usage = raw_acc[ROOT]
    rows: list[ShareRow] = []

    def norm_u(raw: float) -> float:
        return raw / total_usage if total_usage > 0 else 0.0

    root_u = norm_u(total_usage)
    rows.append(ShareRow(ROOT, None, 0, 1.0, 1.0, total_usage, root_u, root_u, _factor(root_u, 1.0)))

    def visit(a: str, depth: int, s_norm: float, ue_parent: float) -> None:
        kids: list[tuple[str | None, str, float, float]] = []  # (user, account, raw shares, raw usage)
        kids += [(None, c, acc_shares(c), raw_acc[c]) for c in child_accounts[a]]
        kids += [(u, a, user_shares(u), max(0.0, usage.get(u, 0.0))) for u in child_users[a]]
        siblings = sum(k[2] for k in kids)
        for user, acc, raw_s, raw_u in kids:
            part = raw_s / siblings if siblings > 0 else 0.0
            s = s_norm * part
            u = norm_u(raw_u)
            ue = u if a == ROOT else u + (ue_parent - u) * part
            rows.append(ShareRow(acc, user, depth + 1, raw_s, s, raw_u, u, ue, _factor(ue, s)))
            if user is None:
                visit(acc, depth + 1, s, ue)

    visit(ROOT, 0, 1.0, norm_u(total_usage))
    return rows


def tree_factors(
    accounts: Mapping[str, AccountView],
    user_account: Mapping[str, str],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    users: Iterable[str] = (),
) -> dict[str, float]:
    """The fair-share factor of every user known (see :func:`share_tree`)."""
    return {r.user: r.factor for r in share_tree(accounts, user_account, usage, shares, users) if r.user is not None}


def max_min_split(demand: Mapping[str, float], total: float, weights: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair split of ``total`` (water-filling): each key of ``demand`` gets at most
    its demand, and what the satisfied leave is split among the rest in proportion to ``weights``
    (absent: :data:`DEFAULT_SHARE`).  A key with no demand, or with weight 0, gets nothing."""
    out = dict.fromkeys(demand, 0.0)
    left = total
    keys = sorted((k for k in demand if demand[k] > 0 and weights.get(k, DEFAULT_SHARE) > 0),
                  key=lambda k: (demand[k] / weights.get(k, DEFAULT_SHARE), k))
    weight = sum(weights.get(k, DEFAULT_SHARE) for k in keys)
    for k in keys:
        fair = left * weights.get(k, DEFAULT_SHARE) / weight if weight > 0 else 0.0
        out[k] = min(demand[k], fair)
        left -= out[k]
        weight -= weights.get(k, DEFAULT_SHARE)
    return out


def fair_parts(
    accounts: Mapping[str, AccountView],
    user_account: Mapping[str, str],
    shares: Mapping[str, float],
    demand: Mapping[str, float],
    total: float,
) -> dict[str, float]:
    """Each user's fair part of ``total`` devices now, given what each user asks for (``demand``:
    devices held plus devices of pending jobs): at every level of the tree, from root down, a node's
    part is split among its children that ask (weighted max-min by their raw shares, each capped by
    what its subtree asks), as KAI splits a level's resources among the queues that ask.  Users that
    ask for nothing get 0; an account none of whose users asks takes no part, so it is lent out."""
    child_accounts, child_users = _tree(accounts, user_account, demand)
    asked = _subtree_sums(child_accounts, child_users, demand)
    out: dict[str, float] = {}

    def split(a: str, part: float) -> None:  # children keyed "a\0NAME" (accounts) and "u\0NAME" (users)
        kids = {f"a\0{c}": asked[c] for c in child_accounts[a]}
        kids.update({f"u\0{u}": max(0.0, demand.get(u, 0.0)) for u in child_users[a]})
        weights = {f"a\0{c}": max(0.0, float(accounts[c].shares)) for c in child_accounts[a]}
        weights.update({f"u\0{u}": max(0.0, float(shares.get(u, DEFAULT_SHARE))) for u in child_users[a]})
        for key, got in max_min_split(kids, part, weights).items():
            kind, name = key.split("\0", 1)
            if kind == "u":
                out[name] = got
            else:
                split(name, got)

    split(ROOT, total)
    return out


def would_cycle(accounts: Mapping[str, AccountView], name: str, parent: str | None) -> bool:
    """Whether giving account ``name`` the parent ``parent`` would make a loop in the tree."""
    q = parent
    seen: set[str] = set()
    while q is not None and q != ROOT and q not in seen:
        if q == name:
            return True
        seen.add(q)
        acc = accounts.get(q)
        q = acc.parent if acc is not None else None
    return False
