"""The default arbiter: fair-share order, the best fitting candidate, bounded locality wait, and one
reservation with backfill so big gangs do not starve.

For each pending job in fair-share order (:func:`scheduler.core.fairshare.queue_order`), ties broken by
transfer cost (:func:`break_ties_by_cost`: among jobs whose priorities differ by no more than the age
term adds in ``tie_window_s`` plus what ``tie_fairshare`` of the fair-share factor is worth, the ones
that can read their data locally go first, smallest first, then the others cheapest first; a job
that can only start by staging is ordered as though its user's factor were ``stage_penalty`` lower):

0. **Starvation bound**: the job pending longest, once it has been pending ``max_wait_s``, is taken
   first (:func:`starving_first`), ahead of that order.
1. A job that can never run, or whose data has no live copy, is skipped with that reason.
2. Its candidates that fit the devices still free are kept (after a reservation exists, jobs that would
   still run at its start must also leave the reserved devices alone).  If none fits but enough
   devices are free, stage 1 is asked again over what is left (candidates of jobs placed earlier in
   the cycle may have taken this job's nodes).
3. **Locality wait** (delay scheduling): if the best fitting candidate (by
   :func:`scheduler.core.stage1.candidate_order`: the cheapest if any is within the threshold, else the
   least contended) costs more than ``locality_threshold_ms`` and a placement within the threshold
   exists on the data's holders if they were idle, the job stays pending ("waiting for locality
   until T"), for at most the locality wait (``PolicyConfig.locality_wait``: ``locality_wait_s``, or
   ``preempt_locality_wait_s`` with preemption on) from the first cycle it waited (``waiting_since_s``;
   the decision's ``waiting`` gives the start of a new wait to the caller, who keeps it until the
   job binds or is requeued).  From then on it takes the costlier candidate.  The wait counts from
   the first time the job could have run elsewhere, not from its submission: in a backlog a job
   reaches the head of the queue long after it was submitted, and a wait counted from submission
   would be over before it began (the Philly replay: local reads 0.945 -> 0.952, bytes moved
   2.25 -> 1.98 TB).  Waiting holds nothing, so others (lower in the queue, whose data is there)
   may use those devices meanwhile.  A job others were preempted for (``JobView.preempting``) does
   not wait: it is first in the order and takes the devices freed for it.  The longer wait of
   preemption holds past ``locality_wait_s`` only in a contended cycle (one in which some job found
   no devices): in any other, the jobs in it take, at the end of the pass, the best of their
   candidates that still fits (:func:`take_idle`), since nobody else asked for those devices.
4. Otherwise it binds the best fitting candidate (whole gang, devices taken from the ledger).
5. **Reservation**: the first job in that order that fits nowhere and has been pending at least
   ``reserve_min_wait_s`` (Slurm's ``bf_min_age_reserve``; or ``max_wait_s``) gets a reservation: the
   earliest time ``T`` at which, as running jobs (and jobs bound this cycle) end by their time limits,
   stage 1 finds a placement for it, and that placement's devices.  Later jobs may backfill if they end
   (``now_s + time_limit_s``) by ``T``, or if they leave enough devices on the reserved nodes for the
   reservation at ``T``.  Only one reservation is held; no devices are ever held for a partial gang.
   With preemption on, a wide job (more devices than its user's fair part now) whose devices x time
   limit fit that part over ``preempt_wide_window_s`` may take it before ``reserve_min_wait_s``, once
   its user holds nothing and it has waited ``preempt_after_s`` (:class:`WideAtOnce`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

from policies.common import (
    FreeLedger,
    Reasons,
    busy_reason,
    devices_busy,
    holds_reservation,
    not_taken,
    reserved_for,
)
from policies.preemption import held_devices, snapshot_parts, wide_within_window
from policies.reservation import Reservation, plan_reservation
from scheduler.core.decide import job_shape
from scheduler.core.fairshare import job_size, queue_order
from scheduler.core.placement import Candidate, Decision
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.reasons import Reason
from scheduler.core.snapshot import JobView, Snapshot
from scheduler.core.stage1 import (
    Stage1Index,
    build_index,
    dataset_of,
    infeasible_reason,
    missing_data_reason,
    propose,
)


def locality_possible(job: JobView, snap: Snapshot, cfg: PolicyConfig, index: Stage1Index) -> bool:
    """Would a placement within ``locality_threshold_ms`` exist on the data's holders if they were idle?"""
    ds = dataset_of(job, snap, index)
    if ds is None or not ds.holders:
        return False
    idle = {h: index.devices[h] for h in ds.holders}
    if sum(idle.values()) < job.devices:
        return False  # the holders cannot hold the gang: nothing on them to find
    whole = len(ds.shards)
    if any(ds.local_shards.get(h, 0) == whole and d >= job.devices for h, d in idle.items()):
        return True  # one holder has every shard and room for every rank: all reads local there
    cands = propose(job, snap, cfg, index, free=idle)
    return bool(cands) and cands[0].transfer_cost_ms <= cfg.locality_threshold_ms


def break_ties_by_cost(
    ordered: Sequence[JobView],
    prios: Mapping[int, float],
    candidates: Mapping[int, Sequence[Candidate]],
    cfg: PolicyConfig,
) -> list[JobView]:
    """The queue order with ties broken by where jobs read and what they ask for.

    First, with ``stage_penalty``, a job whose every stage-1 candidate costs more than
    ``locality_threshold_ms`` (it can only start by staging data) is ordered as though its priority
    were ``fairshare_weight * stage_penalty`` lower (as though its user's fair-share factor were that
    much lower); jobs without candidates are not moved.  Its priority itself is untouched.  Then:
    Jobs tie when their priorities differ by at most ``tol = age_weight * tie_window_s / age_max_s +
    fairshare_weight * tie_fairshare`` (what the age term adds in ``tie_window_s``, and what a
    difference of ``tie_fairshare`` in the fair-share factor is worth): the priority order is cut into groups, each starting
    at the first job not yet grouped and holding the jobs within ``tol`` below it.  Inside a group the
    jobs without any stage-1 candidate (nothing fits them now: a gang that may need the reservation)
    go first; then, with ``tie_shortest_first``, the jobs with a candidate within
    ``locality_threshold_ms`` (they read locally), smallest first by devices x time limit
    (:func:`scheduler.core.fairshare.job_size`); then the others by the cheapest transfer cost among
    their candidates.  Without ``tie_shortest_first`` every job with a candidate goes by that cost.
    Equal keys keep the priority order.  Among jobs that each cost nothing to place, the smallest
    first lowers the mean wait (the shortest-job-first rule, bounded here by the tie); a job that
    must stage goes by cost, so the devices it takes are where it stages least.  So a job can only
    be passed by jobs at most ``tol`` below it (``tol + fairshare_weight * stage_penalty`` when it must
    stage and they need not): the same
    user's jobs that became pending at most ``tie_window_s`` after it (and, with ``tie_fairshare``,
    older ones), or jobs of users whose fair-share factor is at most ``tol / fairshare_weight`` below.
    Jobs others were preempted for (``JobView.preempting``, first in the queue order) stay first and
    out of the groups.  The starvation bound (:func:`starving_first`) is applied after this order, so nobody waits past
    ``max_wait_s``; the usage a passing job adds lowers its user's factor, so the passing corrects
    itself over the next cycles.
    """
    tol = (cfg.age_weight * cfg.tie_window_s / cfg.age_max_s if cfg.age_max_s > 0 else 0.0) + (
        cfg.fairshare_weight * max(0.0, cfg.tie_fairshare))
    penalty = cfg.fairshare_weight * max(0.0, cfg.stage_penalty)
    first = [j for j in ordered if j.preempting]  # queue_order put them first: nobody passes them
    if first:
        return first + break_ties_by_cost([j for j in ordered if not j.preempting], prios, candidates, cfg)
    if (tol <= 0 and penalty <= 0) or len(ordered) < 2:
        return list(ordered)

    local_ms = cfg.locality_threshold_ms
    smallest = cfg.tie_shortest_first
    cheapest: dict[int, float] = {}  # job -> its cheapest candidate's cost; absent: no candidate
    for job in ordered:
        cs = candidates.get(job.id)
        if cs:
            cheapest[job.id] = min(map(_transfer_cost, cs))
    if penalty > 0:
        prios = {job.id: prios[job.id] - penalty if cheapest.get(job.id, 0.0) > local_ms else prios[job.id]
                 for job in ordered}
        ordered = sorted(ordered, key=lambda job: -prios[job.id])  # stable: the given order among equals
    if tol <= 0:
        return list(ordered)

    def key(job: JobView) -> tuple[int, float]:
        cost = cheapest.get(job.id)
        if cost is None:
            return (0, 0.0)  # fits nowhere now: keeps its place at the head of its group
        if smallest and cost <= local_ms:
            return (1, job_size(job))
        return (2, cost)

    out: list[JobView] = []
    prio = [prios[job.id] for job in ordered]
    i, n = 0, len(ordered)
    while i < n:
        floor = prio[i] - tol
        j = i + 1
        while j < n and prio[j] >= floor:
            j += 1
        if j - i > 1:
            group = list(ordered[i:j])
            group.sort(key=key)  # stable: priority order among equal keys
            out.extend(group)
        else:
            out.append(ordered[i])
        i = j
    return out


_transfer_cost = attrgetter("transfer_cost_ms")


def starving_first(ordered: Sequence[JobView], now_s: float, cfg: PolicyConfig) -> list[JobView]:
    """The starvation bound: the job pending longest, if it has been pending at least ``max_wait_s``,
    goes first (it starts now, or takes the reservation); everyone else keeps ``ordered``'s order.
    One job per cycle is moved, so fair share still orders all the others.  ``max_wait_s`` <= 0: off."""
    if cfg.max_wait_s <= 0 or not ordered:
        return list(ordered)
    head = min(ordered, key=lambda j: j.pending_since_s)  # first of equal waits in the given order
    if now_s - head.pending_since_s < cfg.max_wait_s:
        return list(ordered)
    return [head] + [j for j in ordered if j is not head]


def may_reserve(job: JobView, now_s: float, cfg: PolicyConfig) -> bool:
    """May ``job`` take the reservation?  Once it has been pending ``reserve_min_wait_s`` (Slurm's
    ``bf_min_age_reserve``), or ``max_wait_s`` when that bound is on (it is then first in the order)."""
    waited = now_s - job.pending_since_s
    if cfg.max_wait_s > 0 and waited >= cfg.max_wait_s:
        return True
    return waited >= cfg.reserve_min_wait_s


# The words of a wide job's reservation taken before reserve_min_wait_s (explain and the queue)
WIDE_AT_ONCE = "wider than its user's fair part, within preempt_wide_window_s, reserved at once"


class WideAtOnce:
    """With preemption on: may ``job`` take the reservation at once, before ``reserve_min_wait_s``?  When
    it is wide and fits its user's fair part over ``preempt_wide_window_s``
    (:func:`policies.preemption.wide_within_window`), its user holds no devices, and it has waited
    ``preempt_after_s``.  Such a job can never start by the part rule, and while it waits its user gets
    nothing; started, its user holds more than their part for its run, which the window bounds.  What
    users hold and their parts are worked out on the first job asked about, once per cycle."""

    def __init__(self, snap: Snapshot, cfg: PolicyConfig) -> None:
        self.snap, self.cfg = snap, cfg
        self.on = cfg.preempt and cfg.preempt_wide_window_s > 0
        self.held: Mapping[str, int] = {}
        self.parts: Mapping[str, float] | None = None

    def __call__(self, job: JobView) -> bool:
        if not self.on or self.snap.now_s - job.pending_since_s < self.cfg.preempt_after_s:
            return False
        if self.parts is None:
            self.held = held_devices(self.snap)
            self.parts = snapshot_parts(self.snap, self.held)
        return self.held.get(job.user, 0) == 0 and wide_within_window(
            job.devices, job.time_limit_s, self.parts.get(job.user, 0.0), self.cfg)


class TwoStageArbiter:
    """The default arbiter (see the module docstring)."""

    name = "twostage"

    def arbitrate(
        self,
        snap: Snapshot,
        candidates: Mapping[int, Sequence[Candidate]],
        cfg: PolicyConfig,
        index: Stage1Index | None = None,
    ) -> Decision:
        index = index if index is not None else build_index(snap)
        ordered, prios, factors = queue_order(snap, cfg, shortest=cfg.shortest_first)
        ordered = break_ties_by_cost(ordered, prios, candidates, cfg)
        ordered = starving_first(ordered, snap.now_s, cfg)
        d = Decision(order=[j.id for j in ordered], factors=factors, priorities=prios)
        ledger = FreeLedger(index)
        said = Reasons()
        bound_ends: list[tuple[float, dict[str, int]]] = []
        res: Reservation | None = None
        possible: dict[tuple[str | None, int, int], bool] = {}
        reproposed: dict[tuple[Any, ...], list[Candidate]] = {}
        now = snap.now_s

        # Whether a job can ever run, and whether its data can be read, depend on its shape alone:
        # checked once per (ranks, devices per rank, data set), the same Reason shared.
        never: dict[tuple[int, int, str | None], Reason | None] = {}
        threshold = cfg.locality_threshold_ms
        job_reasons, cand_reasons = d.reasons, d.candidate_reasons
        busy_on, waiting = said.busy_on, said.waiting
        # Jobs in the longer locality wait (past locality_wait_s), with the candidates that fit, best
        # first; and whether some job of this cycle found no devices (the cycle is contended)
        beyond: list[tuple[JobView, Candidate, list[int]]] = []
        contended = False
        wide_at_once = WideAtOnce(snap, cfg)

        for job in ordered:
            job_id = job.id
            check = (job.ranks, job.devices_per_rank, job.dataset)
            if check in never:
                why = never[check]
            else:
                why = never[check] = infeasible_reason(job, index) or missing_data_reason(job, snap, index)
            if why is not None:
                job_reasons[job_id] = why
                continue
            long_job = res is not None and now + job.time_limit_s > res.start_s
            if res is not None and long_job:
                avail, avail_total = ledger.avail, ledger.avail_total
            else:
                avail, avail_total = ledger.free, ledger.total

            # The first candidate that fits is the best that fits (candidates come best first); every
            # one that does not gets its reason (``fits``: the positions of those that do, which get
            # theirs below).  Read through the ledger's plain dicts (``counts``).
            cands = candidates.get(job_id, ())
            best: Candidate | None = None
            fits: list[int] = []
            free_now = avail.counts
            for i, c in enumerate(cands):
                busy = None
                for n, need in c.device_items():  # said.busy(c, free_now), without a call per candidate
                    have = free_now.get(n, 0)
                    if have < need:
                        busy = busy_on(n, need, have)
                        break
                if busy is None:
                    if best is None:
                        best = c
                    fits.append(i)
                elif res is not None and long_job and said.busy(c, ledger.free.counts) is None:
                    cand_reasons[(job_id, i)] = reserved_for(res.job_id, res.start_s)
                else:
                    cand_reasons[(job_id, i)] = busy
            if best is None and avail_total >= job.devices and ledger.may_fit(job.ranks, job.devices_per_rank):
                # Jobs of one shape share stage 1's candidates, so once the first takes them the rest
                # re-propose against what is left.  The spare placements of the last re-proposal for
                # this shape are tried first; only when none still fits is stage 1 asked again.
                shape = (*job_shape(job), avail is ledger.free)
                spare = [c for c in reproposed.get(shape, ()) if busy_reason(c, free_now) is None]
                if not spare:
                    spare = propose(job, snap, cfg, index, free=avail, quick=True)
                    reproposed[shape] = spare
                if spare:
                    best = spare[0].for_job(job_id)

            if best is None:
                contended = True
                if (
                    res is not None
                    and long_job
                    and ledger.total >= job.devices
                    and (
                        any(busy_reason(c, ledger.free.counts) is None for c in cands)
                        or propose(job, snap, cfg, index, free=ledger.free, quick=True)
                    )
                ):
                    d.reasons[job_id] = reserved_for(res.job_id, res.start_s)
                    continue
                reason = devices_busy(job.devices, ledger.total)
                wide = False
                if res is None and (may_reserve(job, now, cfg) or (wide := wide_at_once(job))):
                    res = plan_reservation(job, snap, cfg, index, ledger.free, bound_ends)
                    if res is not None:
                        ledger.hold(res.held)
                        d.reservation = (res.job_id, dict(res.need), res.start_s)
                        reason = holds_reservation(reason, res.start_s, WIDE_AT_ONCE if wide else "")
                d.reasons[job_id] = reason
                continue

            if best.transfer_cost_ms > threshold and not job.preempting:
                since = job.waiting_since_s if job.waiting_since_s is not None else now
                until = since + cfg.locality_wait
                if now < until:
                    key = (job.dataset, job.ranks, job.devices_per_rank)
                    if key not in possible:
                        possible[key] = locality_possible(job, snap, cfg, index)
                    if possible[key]:
                        d.waiting[job_id] = since
                        job_reasons[job_id] = waiting(until)
                        for i in fits:
                            cand_reasons[(job_id, i)] = waiting(until, cands[i].transfer_cost_ms, threshold)
                        if now >= since + cfg.locality_wait_s:  # in the longer wait: unless contended
                            beyond.append((job, best, fits))
                        continue

            bind(d, ledger, job_id, best, cands, fits)
            bound_ends.append((now + job.time_limit_s, best.devices_by_node()))
        if beyond and not contended:  # (a reservation is only made by a job that found no devices)
            take_idle(d, ledger, beyond, candidates)
        return d


def bind(d: Decision, ledger: FreeLedger, job_id: int, pick: Candidate, cands: Sequence[Candidate],
         fits: Sequence[int]) -> None:
    """Give ``pick``'s devices to the job; each other candidate at ``fits`` (those that fit) gets the reason
    it was passed over, and ``pick`` none."""
    ledger.take(pick)
    d.bindings[job_id] = pick
    passed_over: Reason | None = None
    for i in fits:
        if cands[i] is pick:
            d.candidate_reasons.pop((job_id, i), None)
        else:
            if passed_over is None:
                passed_over = not_taken(f"another candidate was chosen ({pick.transfer_cost_ms} ms, "
                                        f"nodes {', '.join(pick.nodes)})")
            d.candidate_reasons[(job_id, i)] = passed_over


def take_idle(d: Decision, ledger: FreeLedger, beyond: Sequence[tuple[JobView, Candidate, list[int]]],
              candidates: Mapping[int, Sequence[Candidate]]) -> None:
    """A cycle in which every job that could fit got devices (so no reservation was made either): the
    jobs in their longer locality wait (``preempt_locality_wait_s``, past ``locality_wait_s``) take, in
    queue order, the best of their candidates that still fits (those at ``fits``, best first, or the
    re-proposed ``best`` when none of stage 1's fitted) rather than leave devices idle that nobody else
    asked for."""
    free = ledger.free.counts
    for job, best, fits in beyond:
        cands = candidates.get(job.id, ())
        options = [cands[i] for i in fits] or [best]
        pick = next((c for c in options if busy_reason(c, free) is None), None)
        if pick is not None:
            del d.waiting[job.id]
            del d.reasons[job.id]
            bind(d, ledger, job.id, pick, cands, fits)
