"""Preemption: which running jobs give their devices to a job that has waited too long for them.

Contract: :func:`plan_preemptions` is a pure function of (snapshot, config): no I/O, no clock.  It
returns, in queue order, one :class:`Preemption` per pending job that may preempt this cycle; the
server (or the simulator) acts on it: each victim gets SIGTERM and its grace, goes back to PENDING
with the reason :func:`victim_reason`, keeping its age, and resumes from its checkpoint.  Off unless
``[policy] preempt`` is true.

Who may preempt whom, with ``F`` each user's fair-share factor among the users that compete now (those
with jobs running or pending: :func:`scheduler.core.fairshare.competing_tree`, the account tree pruned
to them; Slurm's classic factor over everyone would count the shares of idle users, and with some users
idle every user with jobs can be over their share, so nobody could preempt however unevenly the
cluster is held):

- the preemptor: pending at least ``preempt_after_s`` (from ``pending_since_s``), its user under
  their share (``F > 0.5``, i.e. effective usage below normalised shares), and it does not fit in the
  free devices now, counting as free the devices of jobs that are stopping (``RunningView.stopping``:
  earlier victims whose ranks have not exited yet), so a preemptor takes victims once, not every cycle
  until they are gone;
- a victim: active (not stopping), running at least ``min_runtime_s`` since it last started, ``preemptible``, preempted
  fewer than ``preempt_max_per_hour`` times in the last hour, its user over their share (``F < 0.5``).

Held shares (Kueue's two fair-sharing preemption strategies): with ``H(u)`` the devices ``u``'s active
jobs hold and ``S(u)`` ``u``'s normalised share, victims of user ``v`` may be taken for a job of user
``p`` only if ``P = (H(p) + the job's devices) / S(p)`` (``S`` over the same pruned tree) is at most
``(H(v) - the victims' devices) / S(v)`` (after the preemption the preemptor's user holds no more for their share than the victim's:
Kueue's LessThanOrEqualToFinalShare) or less than ``H(v) / S(v)`` (than the victim's user held before:
LessThanInitialShare).  The factor looks at decayed past usage; this looks at what is held now, so a
user who already holds as much for their share preempts nobody, and the victim's user can never preempt
straight back: that would need ``H(v) / S(v) <= P`` or ``< P``, which either condition rules out.

Victims are taken in the order: least work lost since their last checkpoint first (in steps of
``[policy] preempt_equal_loss_s``), then among equals those whose nodes hold most of the preemptor's
data, then job id; only until the preemptor fits, and none that turns out unneeded.  A job that would not fit even
with every eligible victim preempts nobody.

No ping-pong: within a cycle preemptors' users are under share and victims' users over it, so no
two jobs (nor any loop of jobs) preempt each other; across cycles a victim has run ``min_runtime_s``
since it last started and is preempted at most ``preempt_max_per_hour`` times an hour
(tests/unit/test_preemption.py checks both over random clusters and queues).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

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


def fits(job: JobView, free: Mapping[str, int]) -> bool:
    """Whether ``job``'s ranks fit in ``free`` devices per node (each rank on one node)."""
    dpr = max(1, job.devices_per_rank)
    return sum(f // dpr for f in free.values() if f > 0) >= job.ranks


def _take(job: JobView, free: dict[str, int]) -> None:
    """Take ``job``'s ranks out of ``free``, most free nodes first (what it will hold once started)."""
    dpr = max(1, job.devices_per_rank)
    left = job.ranks
    for node in sorted(free, key=lambda n: (-free[n], n)):
        while left and free[node] >= dpr:
            free[node] -= dpr
            left -= 1


def lost_work_s(r: RunningView, now_s: float) -> float:
    """Seconds of work ``r`` would lose: since its last checkpoint, or since it started."""
    since = r.checkpoint_s if r.checkpoint_s is not None else r.started_s
    return max(0.0, now_s - since)


def devices(r: RunningView) -> int:
    """The devices ``r`` holds, over all its nodes."""
    return sum(d for _, d in r.devices_by_node)


def _data_nodes(job: JobView, snap: Snapshot) -> set[str]:
    if job.dataset is None:
        return set()
    return {n for (ds, _), nodes in snap.replicas.items() if ds == job.dataset for n in nodes}


# Why a running job may not be preempted this cycle, in the order the rules are checked (the words
# ``explain`` gives, counted, for a job that waited and preempts nobody).
NOT_OVER_SHARE = "of users not over their share"
TOO_YOUNG = "ran less than min_runtime_s"
NOT_PREEMPTIBLE = "not preemptible"
TOO_OFTEN = "preempted preempt_max_per_hour times in the last hour"
STOPPING = "stopping already"
_WHY_NOT_ORDER = (STOPPING, NOT_PREEMPTIBLE, NOT_OVER_SHARE, TOO_YOUNG, TOO_OFTEN)


def why_not_victim(r: RunningView, snap: Snapshot, cfg: PolicyConfig, factors: Mapping[str, float]) -> str | None:
    """Why running job ``r`` may not be preempted at all this cycle (one of the constants above), or
    None when it may (see the module doc)."""
    if r.stopping:
        return STOPPING
    if not r.preemptible:
        return NOT_PREEMPTIBLE
    if factors.get(r.user, 1.0) >= 0.5:
        return NOT_OVER_SHARE
    if snap.now_s - r.started_s < cfg.min_runtime_s:
        return TOO_YOUNG
    if r.preemptions_last_hour >= cfg.preempt_max_per_hour:
        return TOO_OFTEN
    return None


def eligible_victims(snap: Snapshot, cfg: PolicyConfig, factors: Mapping[str, float]) -> list[RunningView]:
    """Running jobs that may be preempted at all this cycle (see the module doc), by job id."""
    return [r for r in snap.running if why_not_victim(r, snap, cfg, factors) is None]


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
    return all(mine <= _held_share(held[u] - d, shares.get(u, 0.0)) or mine < _held_share(held[u], shares.get(u, 0.0))
               for u, d in taken_from.items())


@dataclass(frozen=True)
class Plan:
    """This cycle's preemptions, in queue order, and ``nobody``: for each pending job that has waited
    ``preempt_after_s``, does not fit in the free devices and preempts nobody, why (the words
    ``gsched explain`` shows under "preemption")."""

    preemptions: list[Preemption]
    nobody: dict[int, str]


def plan_preemptions(snap: Snapshot, cfg: PolicyConfig) -> list[Preemption]:
    """The preemptions of this cycle (see the module doc); empty when ``cfg.preempt`` is off."""
    return preemption_plan(snap, cfg, explain=False).preemptions


def _count_words(counts: Mapping[str, int]) -> str:
    return "; ".join(f"{why}: {n}" for why, n in counts.items() if n > 0)


def preemption_plan(snap: Snapshot, cfg: PolicyConfig, explain: bool = True) -> Plan:
    """:func:`plan_preemptions`, with why each job that waited long enough preempts nobody (``nobody``
    left empty unless ``explain``: the simulator, which plans at every event, does not read it)."""
    if not cfg.preempt:
        return Plan([], {})
    users = [j.user for j in snap.pending] + [r.user for r in snap.running]
    factors, shares = competing_tree(snap, users)
    held = held_devices(snap)
    ordered, _, _ = queue_order(snap, cfg)
    free = {n: v.free for n, v in snap.nodes.items()}
    for r in snap.running:  # devices of stopping jobs (earlier victims among them) are free once they exit
        if r.stopping:
            for n, d in r.devices_by_node:
                if n in free:
                    free[n] += d
    pool: list[RunningView] = []
    refused: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # user -> why not -> jobs
    for r in snap.running:
        why_not = why_not_victim(r, snap, cfg, factors)
        if why_not is None:
            pool.append(r)
        else:
            refused[r.user][why_not] += 1
    step = cfg.preempt_equal_loss_s  # victims whose lost work falls in one step of this are equals
    out: list[Preemption] = []
    nobody: dict[int, str] = {}
    for job in ordered:
        if snap.now_s - job.pending_since_s < cfg.preempt_after_s:
            continue
        factor = factors.get(job.user, 1.0)
        if factor <= 0.5:
            if explain and not fits(job, free):
                nobody[job.id] = (f"{job.user} is not under their share among users with jobs (factor "
                                  f"{factor:.2f}; a job preempts only when its user's is above 0.50)")
            continue
        if fits(job, free):
            _take(job, free)  # it starts without anyone's devices: they are not free for the next
            continue
        holders = _data_nodes(job, snap)
        candidates = sorted(
            (r for r in pool if r.user != job.user),
            key=lambda r: (lost_work_s(r, snap.now_s) // step if step > 0 else lost_work_s(r, snap.now_s),
                           -sum(d for n, d in r.devices_by_node if n in holders), r.id))
        chosen: list[RunningView] = []
        trial = dict(free)
        mine = _held_share(held[job.user] + job.devices, shares.get(job.user, 0.0))
        unfair = 0
        for r in candidates:
            if fits(job, trial):
                break
            if not _fair(mine, [r], held, shares):
                unfair += 1
                continue  # even alone, taking r would leave r's user holding less for their share
            chosen.append(r)
            for n, d in r.devices_by_node:
                if n in trial:
                    trial[n] += d
        if not fits(job, trial):
            if explain:
                nobody[job.id] = _short_of_victims(job, snap, refused, unfair, len(chosen))
            continue
        for r in reversed(list(chosen)):  # drop any victim the later ones made unneeded
            without = dict(trial)
            for n, d in r.devices_by_node:
                if n in without:
                    without[n] -= d
            if fits(job, without):
                chosen.remove(r)
                trial = without
        if not _fair(mine, chosen, held, shares):
            nobody[job.id] = (f"the jobs it would preempt would leave their users holding less for their share "
                              f"than {job.user} would")
            continue  # all the victims it needs would leave their users below the preemptor's
        _take(job, trial)
        free = trial
        held[job.user] += job.devices
        for r in chosen:
            held[r.user] -= devices(r)
        taken = {r.id for r in chosen}
        pool = [r for r in pool if r.id not in taken]
        lost = sum(lost_work_s(r, snap.now_s) * devices(r) for r in chosen)
        who = ", ".join(f"job {r.id} ({r.user}, loses {lost_work_s(r, snap.now_s):.0f} s)" for r in chosen)
        out.append(Preemption(job.id, tuple(r.id for r in chosen), lost,
                              f"{job.user} is under their share among users with jobs (factor "
                              f"{factor:.2f}) and "
                              f"waited {snap.now_s - job.pending_since_s:.0f} s: would preempt {who}"))
    return Plan(out, nobody)


def _short_of_victims(job: JobView, snap: Snapshot, refused: Mapping[str, Mapping[str, int]], unfair: int,
                      usable: int) -> str:
    """Why ``job`` would not fit even with every job it may preempt: the running jobs of other users
    counted by the rule that keeps each (``refused``: by user, as the cycle began; ``unfair``: held by
    the held-share rule; ``usable``: those it could take)."""
    counts = {why: sum(whys.get(why, 0) for user, whys in refused.items() if user != job.user)
              for why in _WHY_NOT_ORDER}
    counts[f"would leave their users holding less for their share than {job.user} would"] = unfair
    counts["may be preempted, but not enough"] = usable
    others = sum(1 for r in snap.running if r.user != job.user)
    counts["taken for jobs ahead of it this cycle"] = others - sum(counts.values())
    words = _count_words(counts)
    if others == 0:
        return "no job of another user is running: it waits for devices of its own user's jobs or for free ones"
    return f"it would not fit even with every job it may preempt; the {others} running job(s) of other users: {words}"
