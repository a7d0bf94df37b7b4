"""One scheduling decision: stage 1 for every pending job, then the configured arbiter (stage 2).

:func:`decide` is THE function both the server's cycle and the simulator call, so they make the same
decisions from the same snapshot.  It is pure apart from measuring its own phase durations with
``time.perf_counter`` (reported in ``Decision.durations_s``; no decision depends on them) and holding
off the cyclic garbage collector while it runs (:func:`_collector_paused`).

Phases:

1. ``index``: build the per-snapshot :class:`~scheduler.core.stage1.Stage1Index` once;
2. ``stage1``: :func:`~scheduler.core.stage1.propose` for every pending job.  Each call is independent of
   all others, so this loop could run in a thread or process pool unchanged.  Jobs with the same
   shape (data set, ranks, devices per rank, preferred nodes) get the same candidates but for the job
   id, so stage 1 runs once per shape and the result is re-labelled: identical to calling it per job;
3. ``stage2``: the arbiter the caller passes in.  The core knows no arbiter by name: the server's cycle
   and the simulator look ``cfg.arbiter`` up in ``policies.registry`` and hand the arbiter to
   :func:`decide` (policies import the core, never the reverse).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

from scheduler.core.placement import Candidate, Decision
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import JobView, Snapshot
from scheduler.core.stage1 import Stage1Index, build_index, propose


class Arbiter(Protocol):
    """Stage 2: one cycle's snapshot and every pending job's stage-1 candidates in, a ``Decision`` out.

    Each job's candidates come best first, in ``scheduler.core.stage1.candidate_order`` (as
    ``propose`` returns them), so the first of them that fits is the best that fits.

    Every pending job it leaves unbound gets a ``scheduler.core.reasons.Reason`` (kind, words, time) in
    ``Decision.reasons``.  The whole contract every arbiter keeps is stated in ``policies.registry``,
    which holds the named ones."""

    name: str

    def arbitrate(
        self,
        snap: Snapshot,
        candidates: Mapping[int, Sequence[Candidate]],
        cfg: PolicyConfig,
        index: Stage1Index | None = None,
    ) -> Decision: ...


def job_shape(job: JobView) -> tuple[str | None, int, int, tuple[str, ...]]:
    """What stage 1's candidates depend on besides the snapshot: jobs of one shape get the same ones."""
    return (job.dataset, job.ranks, job.devices_per_rank, job.prefer_nodes)


def relabel(cands: list[Candidate], job_id: int) -> list[Candidate]:
    """``cands`` (proposed for another job of the same shape) as ``job_id``'s."""
    return [c.for_job(job_id) for c in cands]


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector for one decision.

    A decision allocates hundreds of thousands of small objects (candidates, reads, keys) that live
    until it returns; every 700 allocations the collector would walk them again, and its gen-2 passes
    walk the snapshot too.  Refcounting still frees everything acyclic at once; cycles wait until
    the collector is back.  The synthetic 1,000-node cycle took 0.37 s with it running, 0.31 s
    without (median of six each, alternating)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def decide(snap: Snapshot, cfg: PolicyConfig, arbiter: Arbiter) -> tuple[dict[int, list[Candidate]], Decision]:
    """Stage 1 then stage 2 (``arbiter``) over ``snap``; returns (candidates by job id, the decision).

    ``arbiter`` is the caller's: the cycle and the simulator pass ``policies.registry.get_arbiter(cfg.arbiter)``,
    tests and benchmarks may pass their own.  Deterministic: same snapshot, config and arbiter, same result.
    """
    with _collector_paused():
        t0 = time.perf_counter()
        index = build_index(snap)
        t1 = time.perf_counter()
        by_shape: dict[tuple[str | None, int, int, tuple[str, ...]], list[Candidate]] = {}
        for job in snap.pending:  # independent per job: may run in parallel
            key = job_shape(job)
            if key not in by_shape:
                by_shape[key] = propose(job, snap, cfg, index)
        candidates = {job.id: relabel(by_shape[job_shape(job)], job.id) for job in snap.pending}
        t2 = time.perf_counter()
        decision = arbiter.arbitrate(snap, candidates, cfg, index=index)
        t3 = time.perf_counter()
        # The index and the per-shape lists die with this call: let them go before the collector comes
        # back, so its first (young) pass does not walk them (some 7,000 objects at 1,000 nodes).
        del index, by_shape
    decision.durations_s = {"index": t1 - t0, "stage1": t2 - t1, "stage2": t3 - t2}
    return candidates, decision
