"""Fair share: decayed usage against normalized shares, Slurm's classic factor, and queue priority.

The cycle's factors come from :func:`snapshot_factors`: Slurm's classic fair share over the account
tree (:mod:`scheduler.core.accounts`); with no accounts that is the flat definition below.

Contract: pure functions; the only time they see is ``Snapshot.now_s`` (or an explicit argument).

Normalisation (as Slurm's classic fair-share, flat: one level of users, no accounts):

- ``S_norm(u) = shares(u) / sum of shares of every known user``, where the known users are those in
  the shares table, those with usage, and the user asked about; a user without a shares entry has the
  default share :data:`DEFAULT_SHARE` (1).
- ``U_norm(u) = usage(u) / sum of usage of all users`` (0 when nobody has used anything).
- ``F(u) = 2 ** (-U_norm / S_norm)``: 1.0 for a user with no usage, 0.5 for a user whose usage is
  exactly their share, towards 0 for heavy users.  A user with zero shares and some usage gets 0.

Priority of a pending job = ``fairshare_weight * F(user) + age_weight * min(1, age / age_max_s)``
with ``age = now_s - pending_since_s``.  Queue order: priority descending, then ``submit_s``
ascending, then job id ascending (:func:`order_key`); for ``twostage`` (``[policy] shortest_first``)
each user's jobs are then moved among that user's places, smallest first (:func:`shortest_first`).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Iterable, Mapping
from operator import attrgetter

from scheduler.core.accounts import share_tree, tree_factors
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import JobView, Snapshot

DEFAULT_SHARE = 1.0


def decay(usage: float, elapsed_s: float, half_life_s: float) -> float:
    """Usage after ``elapsed_s`` seconds of exponential decay with the given half-life."""
    if elapsed_s <= 0:
        return usage
    if half_life_s <= 0:
        return 0.0
    return usage * 2.0 ** (-elapsed_s / half_life_s)


def accrue(usage: float, devices_held: int, elapsed_s: float, half_life_s: float) -> float:
    """A user's usage ``elapsed_s`` later: decayed (:func:`decay`), plus the device-seconds of the
    ``devices_held`` meanwhile.  What the server's cycle (``update_usage``) and the simulator charge."""
    if elapsed_s <= 0:
        return usage
    return decay(usage, elapsed_s, half_life_s) + devices_held * elapsed_s


def decay_all(usage: Mapping[str, float], elapsed_s: float, half_life_s: float) -> dict[str, float]:
    """:func:`decay` applied to every user's usage."""
    return {user: decay(u, elapsed_s, half_life_s) for user, u in usage.items()}


def _share_table(shares: Mapping[str, float], users: Iterable[str]) -> dict[str, float]:
    table = {u: float(s) for u, s in shares.items()}
    for u in users:
        table.setdefault(u, DEFAULT_SHARE)
    return table


def normalized_shares(shares: Mapping[str, float], users: Iterable[str] = ()) -> dict[str, float]:
    """Each user's fraction of all shares; ``users`` not in ``shares`` get the default share first.

    All zero (or no users) gives an empty or all-zero table, never a division by zero.
    """
    table = _share_table(shares, users)
    total = sum(table.values())
    if total <= 0:
        return {u: 0.0 for u in table}
    return {u: s / total for u, s in table.items()}


def _factor(u_norm: float, s_norm: float) -> float:
    if u_norm <= 0:
        return 1.0
    if s_norm <= 0:
        return 0.0
    return 2.0 ** (-u_norm / s_norm)


def factor(user: str, usage: Mapping[str, float], shares: Mapping[str, float]) -> float:
    """Slurm's classic fair-share factor ``2 ** (-U_norm / S_norm)`` of one user (see module doc)."""
    return user_factors(usage, shares, (user,))[user]


def user_factors(
    usage: Mapping[str, float], shares: Mapping[str, float], users: Iterable[str] = ()
) -> dict[str, float]:
    """The factor of every user known from ``usage``, ``shares`` and ``users`` (one pass)."""
    s_norm = normalized_shares(shares, [*usage, *users])
    total_usage = sum(max(0.0, u) for u in usage.values())
    return {
        u: _factor(max(0.0, usage.get(u, 0.0)) / total_usage if total_usage > 0 else 0.0, s)
        for u, s in s_norm.items()
    }


def snapshot_factors(snapshot: Snapshot, users: Iterable[str] = ()) -> dict[str, float]:
    """The factor of every user of the snapshot (and of ``users``) over its account tree."""
    if not snapshot.accounts and not snapshot.user_account:
        return user_factors(snapshot.usage, snapshot.shares, users)
    return tree_factors(snapshot.accounts, snapshot.user_account, snapshot.usage, snapshot.shares, users)


def competing_tree(snapshot: Snapshot, users: Iterable[str]) -> tuple[dict[str, float], dict[str, float]]:
    """Each of ``users``' fair-share factor and normalised share among ``users`` only: the account tree
    of the snapshot pruned to them and the accounts above them (usage, shares and accounts of everyone
    else left out), then Slurm's classic definitions as :func:`snapshot_factors` computes them.

    Preemption compares the users that compete for devices now (those with jobs running or pending).
    Over the whole tree a user with shares and no jobs keeps a part of the normalised shares and little
    or no usage, so when some users are idle every user with jobs can be over their share (factor
    below 0.5) however unevenly they hold the cluster, and the 0.5 line no longer tells who is owed
    devices.  Pruned, an idle account's part goes to the accounts that compete, as unused quota is lent
    within a Kueue cohort and as KAI splits a level's resources among the queues that ask.
    """
    active = set(users)
    usage = {u: v for u, v in snapshot.usage.items() if u in active}
    shares = {u: v for u, v in snapshot.shares.items() if u in active}
    # one path for both cases: with no accounts share_tree is the flat definition, number for number
    # (tests/unit/test_accounts.py), and gives factors and shares in one pass
    user_account = {u: a for u, a in snapshot.user_account.items() if u in active}
    keep: set[str] = set()
    for a in user_account.values():
        while a in snapshot.accounts and a not in keep:  # up to root (or to an account already kept)
            keep.add(a)
            a = snapshot.accounts[a].parent or ""
    accounts = {a: v for a, v in snapshot.accounts.items() if a in keep}
    factors: dict[str, float] = {}
    norm: dict[str, float] = {}
    for r in share_tree(accounts, user_account, usage, shares, active):
        if r.user is not None:
            factors[r.user], norm[r.user] = r.factor, r.norm_shares
    return factors, norm


def age_factor(pending_since_s: float, now_s: float, age_max_s: float) -> float:
    """``min(1, age / age_max_s)`` for ``age = now_s - pending_since_s``, never negative."""
    age = max(0.0, now_s - pending_since_s)
    if age_max_s <= 0:
        return 1.0
    return min(1.0, age / age_max_s)


def _priority(f: float, pending_since_s: float, now_s: float, cfg: PolicyConfig) -> float:
    """:func:`priority` of a job whose user's factor is ``f``: the one formula, for a caller's loop too."""
    return cfg.fairshare_weight * f + cfg.age_weight * age_factor(pending_since_s, now_s, cfg.age_max_s)


def priority(
    job: JobView, snapshot: Snapshot, cfg: PolicyConfig, factors: Mapping[str, float] | None = None
) -> float:
    """The job's priority (higher goes first).

    ``factors`` (from :func:`user_factors` of the same snapshot) may be passed to avoid recomputing
    them for every job; without it they are computed from the snapshot.
    """
    if factors is None or job.user not in factors:
        f = snapshot_factors(snapshot, (job.user,))[job.user]
    else:
        f = factors[job.user]
    return _priority(f, job.pending_since_s, snapshot.now_s, cfg)


def order_key(job: JobView, prio: float) -> tuple[float, float, int]:
    """The explicit tie-break: priority descending, submit time ascending, job id ascending."""
    return (-prio, job.submit_s, job.id)


Order = tuple[list[JobView], dict[int, float], dict[int, float]]
# The last order worked out for each live snapshot, by id(snapshot): (config, shortest, the order).
# The arbiter and the preemption plan both ask for it on the same snapshot (the server plans after
# deciding, the simulator before); at 50,000 pending jobs it was a third of the plan's time.  An entry
# goes with its snapshot (weakref.finalize), so nothing outlives the cycle that built it.
_orders: dict[int, tuple[PolicyConfig, bool, Order]] = {}


def queue_order(snapshot: Snapshot, cfg: PolicyConfig, shortest: bool = False) -> Order:
    """Pending jobs in fair-share order, with each job's priority and fair-share factor by job id.
    Jobs that others were preempted for (``JobView.preempting``) come first, in that order among them:
    the devices freed for them are theirs.  ``shortest``: each user's jobs then go shortest first in
    the places that order gives the user (:func:`shortest_first`).

    Worked out once per snapshot and config (a snapshot is not changed once built); each call gets its
    own lists and dicts, which it may change."""
    key = id(snapshot)
    known = _orders.get(key)
    if known is None or known[1] != shortest or known[0] != cfg:
        fresh = _queue_order(snapshot, cfg, shortest)
        if known is None:
            weakref.finalize(snapshot, _orders.pop, key, None)
        known = _orders[key] = (cfg, shortest, fresh)
    ordered, prios, factors = known[2]
    return list(ordered), dict(prios), dict(factors)


def _queue_order(snapshot: Snapshot, cfg: PolicyConfig, shortest: bool) -> Order:
    factors = snapshot_factors(snapshot, (j.user for j in snapshot.pending))
    # _priority, not priority(), per pending job: the same formula without its factor look-up and
    # second call (priority() per job was a tenth of the twostage arbiter's time at 5,000 jobs).
    now = snapshot.now_s
    prios = {j.id: _priority(factors[j.user], j.pending_since_s, now, cfg) for j in snapshot.pending}
    # By (not preempting, -priority, submit, id): stable sorts by each key, the last one first, give
    # that order (priorities are finite numbers), and a sort by one number compares faster than by a
    # tuple (at 50,000 jobs 35-40 ms instead of 50-70).
    ordered = sorted(snapshot.pending, key=attrgetter("id"))
    ordered.sort(key=attrgetter("submit_s"))
    ordered.sort(key=lambda j: -prios[j.id])
    if shortest:
        ordered, prios = shortest_first(ordered, prios)
    if any(j.preempting for j in ordered):
        ordered.sort(key=lambda j: not j.preempting)
    return ordered, prios, {j.id: factors[j.user] for j in snapshot.pending}


_id = attrgetter("id")


def job_size(job: JobView) -> float:
    """What a job asks for, to put the smaller first: device-seconds by its time limit (devices x
    ``time_limit_s``)."""
    return job.devices * job.time_limit_s


def shortest_first(ordered: list[JobView], prios: Mapping[int, float]) -> tuple[list[JobView], dict[int, float]]:
    """``ordered`` (priority descending) with each user's jobs moved among the places that user holds in
    it, smallest first by device-seconds asked (devices x time limit; equals keep their order, the
    oldest first), and each job given the priority of the place it takes.

    Which user's turn each place is stays as fair share and age made it, so no user gains or loses
    places and the order stays by priority; only a user's own jobs swap (shortest first within a user
    lowers that user's mean wait, most for a user with a deep backlog).  Jobs that others were
    preempted for keep their places.  A job passed over this way still gets the starvation bound
    (``max_wait_s``, applied to the result by the arbiter)."""
    mine: dict[str, list[JobView]] = defaultdict(list)
    for job in ordered:
        if not job.preempting:
            mine[job.user].append(job)
    turn = {user: iter(sorted(jobs, key=job_size)) for user, jobs in mine.items()}  # stable: equals keep order
    out = [job if job.preempting else next(turn[job.user]) for job in ordered]
    return out, dict(zip(map(_id, out), map(prios.__getitem__, map(_id, ordered)), strict=True))  # C loops: 50,000 jobs
