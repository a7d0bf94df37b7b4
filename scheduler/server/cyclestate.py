"""What one cycle reports (``CycleReport``) and what the cycle process remembers from one cycle to the
next (``CycleMemory``).

``CycleMemory`` holds the caches that spare the cycle work it did last time: the jobs' shapes (the
snapshot reader), what each pending job's stored explanation says (the report) and when the history
was last thinned.  None of them changes a decision: a fresh ``CycleMemory`` gives the same cycle, only
slower, with every explanation rewritten and the history thinned at once.  One belongs to one database;
the cycle process makes its own (``cycleproc._serve``) and passes it to every ``run_cycle``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.store.snapshot_reader import JobShapes


@dataclass
class CycleReport:
    """``durations_s``: each phase's seconds, by name; ``counts``: what each phase did; ``bound``: the jobs
    bound, in the decision's order; ``refused``: the chosen jobs whose bind failed its re-check, and why;
    ``preemptions``: by preemptor, the victims preempted for it this cycle (``scheduler.server.preempt``);
    ``preempts_nobody``: pending jobs that waited ``preempt_after_s`` and preempt nobody, and why
    (``policies.preemption.Plan.nobody``)."""

    time: float
    durations_s: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    bound: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    preemptions: dict[int, dict[str, Any]] = field(default_factory=dict)
    preempts_nobody: dict[int, str] = field(default_factory=dict)


@dataclass
class CycleMemory:
    """``shapes``: jobs' shapes by (id, submitted_at); ``explained``: pending job id -> (what its stored
    explanation says, when it was written); ``last_thinned``: when the history was last thinned."""

    shapes: JobShapes = field(default_factory=JobShapes)
    explained: dict[int, tuple[str, float]] = field(default_factory=dict)
    last_thinned: float = float("-inf")
