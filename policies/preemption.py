"""Preemption: which running jobs give their devices to a job that has waited too long for them.

Contract: :func:`plan_preemptions` is a pure function of (snapshot, config): no I/O, no clock.  It
returns, in queue order, one :class:`Preemption` per pending job that may preempt this cycle; the
server (or the simulator) acts on it: each victim gets SIGTERM and its grace, goes back to PENDING
with the reason :func:`victim_reason`, keeping its age, and resumes from its checkpoint.  Off unless
``[policy] preempt`` is true.

Who may preempt whom.  Two measures of a user's share, both among the users that compete now (those
with jobs running or pending; idle users' shares are lent to them, as unused quota within a Kueue
cohort and as KAI splits a level among the queues that ask):

- ``F``, the fair-share factor over the account tree pruned to those users
  (:func:`scheduler.core.fairshare.competing_tree`): Slurm's classic factor, from usage decayed over
  ``usage_half_life_s`` (a week by default), so it remembers who used the cluster in the past days;
- the fair part, what each user should hold now (:func:`snapshot_parts`): the devices split among the
  users that ask, level by level of the account tree by shares, each capped by what it asks (held plus
  pending devices): the weighted max-min split KAI's reclaim works to, with no memory.

The preemptor: pending at least ``preempt_after_s`` (from ``pending_since_s``), not fitting in the free
devices now (counting as free the devices of stopping jobs, ``RunningView.stopping``: earlier victims
whose ranks have not exited yet, so a preemptor takes victims once, not every cycle until they are
gone), and its user either under their share (``F > 0.5``) or asking, with this job, for no more than
their fair part (``H(p) + the job's devices <= part(p)``, ``H`` the devices a user's active jobs hold).

A victim: active, running at least ``min_runtime_s`` since it last started (times
``min_runtime_backoff`` for each time it was preempted before: :func:`min_runtime`), ``preemptible``,
preempted fewer than ``preempt_max_per_hour`` times in the last hour, of another user, and either

- by the part: the preemptor's user is within their part and the victim's user still holds at least
  their part once the victims are gone (KAI's reclaim: a queue under its fair share takes from queues
  over theirs, down to their fair share and no further); or
- by the factor: the preemptor's user is under their share, the victim's over it (``F < 0.5``), and the
  held-share rule allows it (Kueue's two fair-sharing strategies): with ``S`` the normalised shares over
  the same pruned tree, ``P = (H(p) + the job's devices) / S(p)`` is at most ``(H(v) - the victims'
  devices) / S(v)`` (after the preemption the preemptor's user holds no more for their share than the
  victim's: LessThanOrEqualToFinalShare) or less than ``H(v) / S(v)`` (LessThanInitialShare).

A *wide* job (more devices than its user's part) whose devices x time limit fit that part over
``preempt_wide_window_s`` (:func:`wide_within_window`) is not taken by the factor rule: its user would
hold nothing again, and a wide gang's restart costs the most (such a job takes ``twostage``'s
reservation at once once its user holds nothing: ``policies.twostage.WideAtOnce``).

The factor alone kept a user who had used much in the past days from taking their part now, however
little they held (``itp_5000``: Jain 0.943, the first days below 0.93); the part alone ignores history
and cost ``philly_5000`` 18 % of mean JCT (benchmarks/RESULTS.md).  Either way, what the preemptor's
user holds afterwards is bounded: by their part, or by the victim's share of what it holds.

Victims are taken in the order: least work lost since their last checkpoint first (in steps of
``[policy] preempt_equal_loss_s``), then among equals those whose nodes hold most of the preemptor's
data, then job id; only until the preemptor fits, and none that turns out unneeded.  For its first
``[policy] preempt_data_wait_s`` of preempting (from ``preempt_after_s`` on) a job reading a data set
takes victims only among the jobs on nodes holding a copy of it (:func:`near_data`): delay scheduling
for the victims, as the locality wait is for free devices; past it, any.  A job that would not fit
even with every eligible victim preempts nobody (:class:`Plan` says why, for ``explain``).

No ping-pong: within a cycle no job is both preemptor and victim, and a victim's user by the part stays
at or above their part, by the factor holds at least as much for their share as the preemptor's; across
cycles a victim has run ``min_runtime_s`` since it last started, doubled (``min_runtime_backoff``) for
each time it was preempted before, and is preempted at most ``preempt_max_per_hour`` times an hour
(tests/unit/test_preemption.py checks these over random clusters and queues); so at 2 a job whose
attempts run R seconds in all is preempted at most log2(1 + R / ``min_runtime_s``) times.  A job can
later preempt the job that preempted it once holdings have changed (jobs ended, others arrived): in
2,000 random runs that happened in 3 % of them, never sooner than ``min_runtime_s`` after, with the
factor alone as with both measures.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from scheduler.core.accounts import fair_parts
from scheduler.core.fairshare import competing_tree, queue_order
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import JobView, RunningView, Snapshot


@dataclass(frozen=True)
class Preemption:
    """``job`` preempts ``victims`` (in the order chosen), losing ``lost_work_s`` device-seconds of
    work in all (each victim's devices times the seconds since its last checkpoint)."""

    job: int
    victims: tuple[int, ...]
    lost_work_s: float
    why: str


def victim_reason(preemptor: int) -> str:
    """The reason a victim is back in the queue with."""
    return f"preempted for job {preemptor}"


class _Free:
    """Free devices per node, with the rank slots of each width (devices per rank) counted once and
    kept up to date, and the nodes by most free devices (a heap, entries dropped once stale): the plan
    asks whether a job fits once per victim it tries and starts jobs most-free-node first, and a pass
    over every node each time made it cost nodes x jobs (14 s at 1,000 nodes and 5,000 jobs)."""

    def __init__(self, free: Mapping[str, int]) -> None:
        self.free = dict(free)
        self._slots: dict[int, int] = {}
        self._heap: list[tuple[int, str]] | None = None  # (-free, node), built on the first take

    def slots(self, dpr: int) -> int:
        """Ranks of ``dpr`` devices that fit (each on one node)."""
        n = self._slots.get(dpr)
        if n is None:
            n = self._slots[dpr] = sum(f // dpr for f in self.free.values() if f > 0)
        return n

    def fits(self, job: JobView) -> bool:
        return self.slots(max(1, job.devices_per_rank)) >= job.ranks

    def add(self, node: str, d: int) -> None:
        """``d`` more devices free on ``node`` (negative: fewer)."""
        old = self.free[node]
        new = self.free[node] = old + d
        for dpr in self._slots:
            self._slots[dpr] += max(0, new) // dpr - max(0, old) // dpr
        if self._heap is not None:
            heapq.heappush(self._heap, (-new, node))

    def take(self, job: JobView) -> None:
        """Take ``job``'s ranks, most free nodes first, ties by name (what it will hold once started).
        A node it takes from gives all the ranks it can hold, or the last ones: it is not met again."""
        if self._heap is None:
            self._heap = [(-f, n) for n, f in self.free.items()]
            heapq.heapify(self._heap)
        dpr = max(1, job.devices_per_rank)
        left = job.ranks
        heap, free = self._heap, self.free
        while left and heap:
            f, node = heap[0]
            if -f != free[node]:
                heapq.heappop(heap)  # stale: the node's free count changed since
                continue
            if -f < dpr:
                break  # the most free node holds no rank: none does
            heapq.heappop(heap)
            k = min(left, -f // dpr)
            self.add(node, -k * dpr)  # pushes the node back with what is left
            left -= k


class _Trial:
    """Devices a preemptor's victims would free, over a :class:`_Free` left as it is, with the rank
    slots of the preemptor's width kept up to date as victims are added and dropped."""

    def __init__(self, base: _Free, job: JobView) -> None:
        self.base, self.dpr, self.ranks = base, max(1, job.devices_per_rank), job.ranks
        self.extra: dict[str, int] = defaultdict(int)
        self.have = base.slots(self.dpr)

    def fits(self) -> bool:
        return self.have >= self.ranks

    def delta(self, r: RunningView, sign: int) -> int:
        """How the slots change if ``r``'s devices are added (``sign`` 1) or taken back (-1)."""
        out = 0
        for n, dn in r.devices_by_node:
            if n in self.base.free:
                old = self.base.free[n] + self.extra[n]
                out += max(0, old + sign * dn) // self.dpr - max(0, old) // self.dpr
        return out

    def move(self, r: RunningView, sign: int) -> None:
        self.have += self.delta(r, sign)
        for n, dn in r.devices_by_node:
            if n in self.base.free:
                self.extra[n] += sign * dn


def lost_work_s(r: RunningView, now_s: float) -> float:
    """Seconds of work ``r`` would lose: since its last checkpoint, or since it started."""
    since = r.checkpoint_s if r.checkpoint_s is not None else r.started_s
    return max(0.0, now_s - since)


def devices(r: RunningView) -> int:
    """The devices ``r`` holds, over all its nodes."""
    return sum(d for _, d in r.devices_by_node)


def wide_within_window(devices: int, time_limit_s: float, part: float, cfg: PolicyConfig) -> bool:
    """Whether a job of ``devices`` for ``time_limit_s`` is *wide* (more devices than ``part``, its user's
    fair part now: the part rule can never start it) and fits that part over
    ``preempt_wide_window_s`` (devices x time limit at most part x window); with preemption on only."""
    window = cfg.preempt_wide_window_s
    return (cfg.preempt and window > 0 and devices > part + EPS
            and devices * time_limit_s <= part * window + EPS)


def _data_nodes(snap: Snapshot) -> dict[str, set[str]]:
    """The nodes holding any shard of each data set."""
    out: dict[str, set[str]] = defaultdict(set)
    for (ds, _), nodes in snap.replicas.items():
        out[ds].update(nodes)
    return out


def near_data(job: JobView, now_s: float, cfg: PolicyConfig, data_nodes: Mapping[str, set[str]]) -> bool:
    """Whether ``job`` may take victims this cycle only on the nodes holding a copy of (a shard of) its
    data set: while it is within ``preempt_data_wait_s`` of the time it may first preempt (pending
    ``preempt_after_s``); not past that, with the wait 0, or for a job without a data set or whose data
    set no node holds.  A victim there frees devices where the job reads locally; a victim elsewhere
    makes it stage, as a job taking free devices elsewhere would (the locality wait,
    ``policies.twostage``)."""
    if cfg.preempt_data_wait_s <= 0 or job.dataset is None or not data_nodes.get(job.dataset):
        return False
    return now_s - job.pending_since_s < cfg.preempt_after_s + cfg.preempt_data_wait_s


class _VictimOrder:
    """The pool of jobs that may be preempted this cycle, in the order victims are taken for a job
    reading a data set: least work lost first (in steps of ``step``: equals within one), then most
    devices on the nodes holding the data, then job id.  Ordered once per data set and split per user."""

    def __init__(self, pool: list[RunningView], snap: Snapshot, step: float) -> None:
        self.pool = pool
        self.loss = {r.id: lost_work_s(r, snap.now_s) // step if step > 0 else lost_work_s(r, snap.now_s)
                     for r in pool}
        self.on_node: dict[str, list[tuple[int, int]]] = defaultdict(list)  # node -> (pool job, its devices there)
        for r in pool:
            for n, d in r.devices_by_node:
                self.on_node[n].append((r.id, d))
        self.data_nodes = _data_nodes(snap)
        self._on_data: dict[str | None, dict[int, int]] = {}
        self.by_user: dict[str | None, dict[str, list[tuple[int, RunningView]]]] = {}

    def on_data(self, dataset: str | None) -> dict[int, int]:
        """The pool's jobs with devices on the nodes holding ``dataset``, and how many there (worked
        out once per data set)."""
        out = self._on_data.get(dataset)
        if out is None:
            out = self._on_data[dataset] = defaultdict(int)
            for n in self.data_nodes.get(dataset, ()) if dataset is not None else ():
                for job_id, d in self.on_node.get(n, ()):
                    out[job_id] += d
        return out

    def of(self, dataset: str | None, users: list[str]) -> Iterator[RunningView]:
        """The jobs of ``users`` in the order for ``dataset``."""
        if not users:
            return iter(())
        if dataset not in self.by_user:
            on_data = self.on_data(dataset)
            ordered = sorted(self.pool, key=lambda r: (self.loss[r.id], -on_data.get(r.id, 0), r.id))
            split: dict[str, list[tuple[int, RunningView]]] = defaultdict(list)
            for i, r in enumerate(ordered):
                split[r.user].append((i, r))
            self.by_user[dataset] = split
        lists = self.by_user[dataset]
        return (r for _, r in heapq.merge(*(lists.get(u, []) for u in users)))


# Why a running job may not be preempted this cycle, in the order the rules are checked (the words
# ``explain`` gives, counted, for a job that waited and preempts nobody).
STOPPING = "stopping already"
NOT_PREEMPTIBLE = "not preemptible"
TOO_YOUNG = "ran less than min_runtime_s"
TOO_OFTEN = "preempted preempt_max_per_hour times in the last hour"
_WHY_NOT_ORDER = (STOPPING, NOT_PREEMPTIBLE, TOO_YOUNG, TOO_OFTEN)
# ... and, for a given preemptor, why a job of another user that may be preempted is not taken for it
NOT_OVER = "of users neither over their share nor above their fair part"
WIDE = "wider than their users' fair part and within preempt_wide_window_s"
UNFAIR = "would leave their users holding less for their share than {user} would"
NOT_ENOUGH = "may be preempted, but not enough"
TAKEN = "taken for jobs ahead of it this cycle"
FAR = ("on nodes not holding {dataset} (within preempt_data_wait_s it preempts only jobs on the nodes that "
       "hold its data)")
EPS = 1e-9


def min_runtime(r: RunningView, cfg: PolicyConfig) -> float:
    """How long ``r`` must have run since it last started to be a victim: ``min_runtime_s``, times
    ``min_runtime_backoff`` for each time it was preempted before."""
    return cfg.min_runtime_s * cfg.min_runtime_backoff ** r.preemptions


def why_not_victim(r: RunningView, snap: Snapshot, cfg: PolicyConfig) -> str | None:
    """Why running job ``r`` may not be preempted this cycle whoever waits (one of the constants above),
    or None when it may if its user is over their share or above their fair part (see the module doc)."""
    if r.stopping:
        return STOPPING
    if not r.preemptible:
        return NOT_PREEMPTIBLE
    if snap.now_s - r.started_s < min_runtime(r, cfg):
        return TOO_YOUNG
    if r.preemptions_last_hour >= cfg.preempt_max_per_hour:
        return TOO_OFTEN
    return None


def held_devices(snap: Snapshot) -> dict[str, int]:
    """Devices each user's active (not stopping) running jobs hold."""
    held: dict[str, int] = defaultdict(int)
    for r in snap.running:
        if not r.stopping:
            held[r.user] += devices(r)
    return held


def _held_share(devices: float, share: float) -> float:
    if devices <= 0:
        return 0.0
    return devices / share if share > 0 else math.inf


def _fair(mine: float, victims: list[RunningView], held: Mapping[str, int], shares: Mapping[str, float]) -> bool:
    """Whether, with ``victims`` preempted, each victim's user still holds at least ``mine`` (what the
    preemptor's user would hold for their share) for theirs, or held more than ``mine`` before."""
    taken_from: dict[str, int] = defaultdict(int)
    for r in victims:
        taken_from[r.user] += devices(r)
    return all(_fair_to(mine, u, d, held, shares) for u, d in taken_from.items())


def _fair_to(mine: float, user: str, taken: int, held: Mapping[str, int], shares: Mapping[str, float]) -> bool:
    """:func:`_fair` for one victims' user, from whom ``taken`` devices would be preempted."""
    share = shares.get(user, 0.0)
    return mine <= _held_share(held[user] - taken, share) or mine < _held_share(held[user], share)


# How the plan may take a job of another user (the rules in the module doc), for :func:`_take_or_keep`
BY_PART = "by the part"
BY_FACTOR = "by the factor"


def _take_or_keep(user: str, d: int, shielded: bool, left: float, part: float, by_part: bool, over: bool,
                  mine: float, held: Mapping[str, int], shares: Mapping[str, float]) -> str:
    """Whether a running job of ``user`` of ``d`` devices may be taken for a preemptor, and by which
    rule (:data:`BY_PART`, :data:`BY_FACTOR`), or why it is kept (:data:`NOT_OVER`, :data:`WIDE`,
    :data:`UNFAIR`).  ``left``: what ``user`` holds with the victims chosen so far preempted; ``over``:
    the preemptor may take by the factor and ``user`` is over their share; ``shielded``: the job is
    wide within the window (:func:`wide_within_window`); ``mine``: what the preemptor's user would
    hold for their share.  The walk over the victims and :func:`_nobody_usable` both ask it."""
    if by_part and left - d >= part - EPS:
        return BY_PART
    if not over:
        return NOT_OVER
    if shielded:
        return WIDE  # preempting it would leave its user nothing again
    # even alone, taking it may leave its user holding less for their share than the preemptor's
    return BY_FACTOR if _fair_to(mine, user, d, held, shares) else UNFAIR


def _nobody_usable(may_lose: list[str], sizes_left: Mapping[str, Counter[tuple[int, bool]]],
                   held: Mapping[str, int], parts: Mapping[str, float], over_share: set[str], by_part: bool,
                   by_share: bool, mine: float, shares: Mapping[str, float]) -> Counter[str] | None:
    """Whether no job of ``may_lose`` (their jobs in the pool not taken yet, counted in ``sizes_left``
    by size and whether the factor rule may not take them, :func:`wide_within_window`) could be taken
    for a preemptor, each alone with nothing taken before it: then none is taken in any order (what a
    user holds only falls as their jobs are taken), and the walk over the victims would only count
    them.  Returns those counts by why each is kept (:func:`_take_or_keep`), or None when some job
    could be taken and the walk must run.  The same answer as the walk at a cost of users x job sizes,
    not victims: at 10,000 nodes with every pending job past ``preempt_after_s``, 3,234 walks of ~500
    victims each were 2.7 s of 3.1 s."""
    kept: Counter[str] = Counter()
    for u in may_lose:
        part, over = parts.get(u, 0.0), by_share and u in over_share
        for (d, shielded), n in sizes_left[u].items():
            if n > 0:
                why = _take_or_keep(u, d, shielded, held[u], part, by_part, over, mine, held, shares)
                if why in (BY_PART, BY_FACTOR):
                    return None
                kept[why] += n
    return kept


@dataclass(frozen=True)
class Plan:
    """This cycle's preemptions, in queue order, and ``nobody``: for each pending job that has waited
    ``preempt_after_s``, does not fit in the free devices and preempts nobody, why (the words
    ``gsched explain`` shows after "preempts nobody:")."""

    preemptions: list[Preemption]
    nobody: dict[int, str]


def plan_preemptions(snap: Snapshot, cfg: PolicyConfig) -> list[Preemption]:
    """The preemptions of this cycle (see the module doc); empty when ``cfg.preempt`` is off."""
    return preemption_plan(snap, cfg, explain=False).preemptions


def _count_words(counts: Mapping[str, int]) -> str:
    return "; ".join(f"{why}: {n}" for why, n in counts.items() if n > 0)


def snapshot_demand(snap: Snapshot, held: Mapping[str, int] | None = None) -> dict[str, float]:
    """What each user asks for now: the devices their active jobs hold (``held``, as :func:`held_devices`
    gives it; computed when None) plus those of their pending jobs."""
    demand: dict[str, float] = defaultdict(float)
    for u, d in (held_devices(snap) if held is None else held).items():
        demand[u] += d
    for j in snap.pending:
        demand[j.user] += j.devices
    return demand


def snapshot_parts(snap: Snapshot, held: Mapping[str, int] | None = None,
                   demand: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each user's fair part of the snapshot's devices now (:func:`scheduler.core.accounts.fair_parts`
    over the account tree), from what each asks for (``demand``, as :func:`snapshot_demand` gives it
    from ``held``; computed when None)."""
    return fair_parts(snap.accounts, snap.user_account, snap.shares,
                      snapshot_demand(snap, held) if demand is None else demand,
                      float(sum(n.devices for n in snap.nodes.values())))


def preemption_plan(snap: Snapshot, cfg: PolicyConfig, explain: bool = True) -> Plan:
    """:func:`plan_preemptions`, with why each job that waited long enough preempts nobody (``nobody``
    left empty unless ``explain``: the simulator, which plans at every event, does not read it)."""
    if not cfg.preempt or not any(snap.now_s - j.pending_since_s >= cfg.preempt_after_s for j in snap.pending):
        return Plan([], {})  # nobody has waited long enough to preempt (the loop below would skip them all)
    users = [j.user for j in snap.pending] + [r.user for r in snap.running]
    factors, shares = competing_tree(snap, users)
    held = held_devices(snap)
    parts = snapshot_parts(snap, held)
    running_by_user = Counter(r.user for r in snap.running)
    ordered, _, _ = queue_order(snap, cfg, shortest=cfg.shortest_first)
    start = {n: v.free for n, v in snap.nodes.items()}
    for r in snap.running:  # devices of stopping jobs (earlier victims among them) are free once they exit
        if r.stopping:
            for n, d in r.devices_by_node:
                if n in start:
                    start[n] += d
    free = _Free(start)
    pool: list[RunningView] = []
    refused: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # user -> why not -> jobs
    for r in snap.running:
        why_not = why_not_victim(r, snap, cfg)
        if why_not is None:
            pool.append(r)
        else:
            refused[r.user][why_not] += 1
    order = _VictimOrder(pool, snap, cfg.preempt_equal_loss_s)
    taken: set[int] = set()  # victims of earlier preemptors this cycle
    size = {r.id: devices(r) for r in pool}
    left_in_pool = Counter(r.user for r in pool)  # each user's jobs in the pool not taken yet
    # running wide jobs within preempt_wide_window_s: the factor rule does not take them
    shielded = {r.id for r in pool
                if wide_within_window(size[r.id], r.end_by_s - r.started_s, parts.get(r.user, 0.0), cfg)}
    sizes_left: dict[str, Counter[tuple[int, bool]]] = defaultdict(Counter)  # ... and their sizes
    for r in pool:
        sizes_left[r.user][(size[r.id], r.id in shielded)] += 1
    smallest: dict[str, int] = {}  # each user's smallest job in the pool, in devices
    over_share = {u for u, f in factors.items() if f < 0.5}  # users a job under its share may take from
    for r in pool:
        smallest[r.user] = min(size[r.id], smallest.get(r.user, size[r.id]))
    # Jobs of one user and shape that found no victims, and why: the same answer for the next such job
    # until a job preempts (holdings and the pool change).  A job that starts in free devices leaves
    # fewer free: one that would not fit even with every victim it may take still would not (the
    # victims it may take do not depend on the free devices), but one that fit with victims the
    # held-share rule refused might now not fit at all, so those answers go.  (The shape: user, ranks,
    # devices per rank, data set, and whether it takes victims only on its data's nodes yet.)
    failed: dict[tuple[str, int, int, str | None, bool], str] = {}
    refused_shapes: set[tuple[str, int, int, str | None, bool]] = set()
    out: list[Preemption] = []
    nobody: dict[int, str] = {}
    for job in ordered:
        if snap.now_s - job.pending_since_s < cfg.preempt_after_s:
            continue
        factor = factors.get(job.user, 1.0)
        part = parts.get(job.user, 0.0)
        by_share = factor > 0.5
        by_part = held[job.user] + job.devices <= part + EPS
        if not (by_share or by_part):
            if explain and not free.fits(job):
                nobody[job.id] = (f"{job.user} is not under their share among users with jobs (factor {factor:.2f}; "
                                  f"a job preempts only above 0.50) and would hold more than their fair part of "
                                  f"the devices now ({held[job.user]} + {job.devices} > {part:.1f})")
            continue
        if free.fits(job):
            free.take(job)  # it starts without anyone's devices: they are not free for the next
            for shape in refused_shapes:
                failed.pop(shape, None)
            refused_shapes.clear()
            continue
        near = near_data(job, snap.now_s, cfg, order.data_nodes)
        shape = (job.user, job.ranks, job.devices_per_rank, job.dataset, near)
        if shape in failed:
            if explain:
                nobody[job.id] = failed[shape]
            continue
        counts = dict.fromkeys((NOT_OVER, UNFAIR, WIDE), 0)
        # Users who may lose a job to this one: over their share by the factor (when it preempts by the
        # factor), or holding enough that their smallest job leaves them at their part (by the part; what
        # they hold only falls as victims are chosen).  The others' jobs are never taken: they are
        # counted for explain without being looked at one by one.
        may_lose = [u for u in left_in_pool if u != job.user and (
            (by_share and u in over_share)
            or (by_part and held[u] - smallest[u] >= parts.get(u, 0.0) - EPS))]
        counts[NOT_OVER] = sum(n for u, n in left_in_pool.items() if u != job.user and u not in may_lose)
        mine = _held_share(held[job.user] + job.devices, shares.get(job.user, 0.0))
        chosen: list[RunningView] = []
        none = _nobody_usable(may_lose, sizes_left, held, parts, over_share, by_part, by_share, mine, shares)
        if none is not None:  # no victim could be taken: the walk would only count them, so it is skipped
            for why, kept in none.items():
                counts[why] += kept
            may_lose = []
        candidates: Iterator[RunningView] = (r for r in order.of(job.dataset, may_lose) if r.id not in taken)
        far = [0]  # jobs passed over for running away from the data's nodes (counted for explain)
        if near:
            candidates = _among(order.on_data(job.dataset), candidates, far)
        trial = _Trial(free, job)
        left = dict(held)  # what each user would hold with the victims chosen so far preempted
        via_part: set[int] = set()  # victims taken by the part (the others by the factor)
        for r in candidates:
            if trial.fits():
                break
            d = size[r.id]
            why = _take_or_keep(r.user, d, r.id in shielded, left[r.user], parts.get(r.user, 0.0), by_part,
                                by_share and r.user in over_share, mine, held, shares)
            if why not in (BY_PART, BY_FACTOR):
                counts[why] += 1
                continue
            if why == BY_PART:
                via_part.add(r.id)
            chosen.append(r)
            left[r.user] -= d
            trial.move(r, 1)
        if not trial.fits():
            counts[FAR] = far[0]
            failed[shape] = _short_of_victims(job, len(snap.running) - running_by_user[job.user], refused, counts,
                                              len(chosen)) if explain else ""
            if explain:
                nobody[job.id] = failed[shape]
            continue
        for r in reversed(list(chosen)):  # drop any victim the later ones made unneeded
            if trial.have + trial.delta(r, -1) >= trial.ranks:
                chosen.remove(r)
                trial.move(r, -1)
        # the victims taken by the part left their users at or above it (dropping others only adds to
        # that); the rest must pass the held-share rule all together
        if not _fair(mine, [r for r in chosen if r.id not in via_part], held, shares):
            failed[shape] = (f"the jobs it would preempt would leave their users holding less for their share "
                             f"than {job.user} would")
            refused_shapes.add(shape)
            if explain:
                nobody[job.id] = failed[shape]
            continue
        whys = ([f"under their share among users with jobs (factor {factor:.2f})"] if by_share else []) + (
            [f"within their fair part of the devices now ({held[job.user]} + {job.devices} <= {part:.1f})"]
            if by_part else [])
        for n, e in trial.extra.items():
            if e:
                free.add(n, e)
        free.take(job)
        held[job.user] += job.devices
        for r in chosen:
            held[r.user] -= size[r.id]
        taken.update(r.id for r in chosen)
        left_in_pool.subtract(r.user for r in chosen)
        for r in chosen:
            sizes_left[r.user][(size[r.id], r.id in shielded)] -= 1
        failed.clear()
        refused_shapes.clear()
        lost = sum(lost_work_s(r, snap.now_s) * size[r.id] for r in chosen)
        who = ", ".join(f"job {r.id} ({r.user}, loses {lost_work_s(r, snap.now_s):.0f} s)" for r in chosen)
        out.append(Preemption(job.id, tuple(r.id for r in chosen), lost,
                              f"{job.user} is {' and '.join(whys)} and waited "
                              f"{snap.now_s - job.pending_since_s:.0f} s: would preempt {who}"))
    return Plan(out, nobody)


def _among(jobs: Mapping[int, int], rs: Iterator[RunningView], far: list[int]) -> Iterator[RunningView]:
    """The jobs of ``rs`` in ``jobs`` (:meth:`_VictimOrder.on_data`); ``far[0]`` counts the others
    passed over."""
    for r in rs:
        if r.id in jobs:
            yield r
        else:
            far[0] += 1


def _short_of_victims(job: JobView, others: int, refused: Mapping[str, Mapping[str, int]],
                      counts: Mapping[str, int], usable: int) -> str:
    """Why ``job`` would not fit even with every job it may preempt: the ``others`` running jobs of
    other users counted by the rule that keeps each (``refused``: by user, as the cycle began;
    ``counts``: kept for this job by its users' shares or, within ``preempt_data_wait_s``, for running
    away from its data's nodes; ``usable``: those it could take)."""
    words = {why: sum(whys.get(why, 0) for user, whys in refused.items() if user != job.user)
             for why in _WHY_NOT_ORDER}
    words[NOT_OVER] = counts[NOT_OVER]
    words[UNFAIR.format(user=job.user)] = counts[UNFAIR]
    words[WIDE] = counts[WIDE]
    words[FAR.format(dataset=job.dataset)] = counts.get(FAR, 0)
    words[NOT_ENOUGH] = usable
    words[TAKEN] = others - sum(words.values())
    if others == 0:
        return "no job of another user is running: it waits for devices of its own user's jobs or for free ones"
    return (f"it would not fit even with every job it may preempt; the {others} running job(s) of other users: "
            f"{_count_words(words)}")
