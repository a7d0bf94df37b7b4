"""What stage 1 proposes and stage 2 decides: candidates and decisions (plain frozen data)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from scheduler.core.reasons import Reason


@dataclass(frozen=True, slots=True)
class ShardRead:
    """Rank ``rank`` reads shard ``shard``; it is staged from ``source`` unless ``source == node``."""

    shard: int
    rank: int
    node: str
    source: str
    bytes: int

    @property
    def local(self) -> bool:
        return self.source == self.node


@dataclass(frozen=True, slots=True)
class Candidate:
    """One whole-gang placement of one job.

    ``rank_nodes[r]`` is the node of rank r.  ``transfer_bytes`` is the sum of bytes of the non-local
    reads; ``transfer_cost_ms`` the cost model's estimate of staging them (an integer).
    """

    job_id: int
    rank_nodes: tuple[str, ...]
    devices_per_rank: int
    reads: tuple[ShardRead, ...]
    transfer_bytes: int
    transfer_cost_ms: int
    # (node, devices) pairs in node order, worked out on first use: stage 2 asks for them of the same
    # candidate many times (a quarter of its time at 50,000 pending jobs when rebuilt on every call).
    _by_node: tuple[tuple[str, int], ...] | None = field(default=None, init=False, repr=False, compare=False)

    def device_items(self) -> tuple[tuple[str, int], ...]:
        """``devices_by_node()`` as (node, devices) pairs in node order, without building a dict."""
        items = self._by_node
        if items is None:
            counts = Counter(self.rank_nodes)
            items = tuple((n, c * self.devices_per_rank) for n, c in sorted(counts.items()))
            object.__setattr__(self, "_by_node", items)
        return items

    def for_job(self, job_id: int) -> Candidate:
        """The same placement for another job of the same shape (its worked-out device items kept)."""
        if job_id == self.job_id:
            return self
        c = Candidate(job_id, self.rank_nodes, self.devices_per_rank, self.reads, self.transfer_bytes,
                      self.transfer_cost_ms)
        object.__setattr__(c, "_by_node", self.device_items())
        return c

    def devices_by_node(self) -> dict[str, int]:
        return dict(self.device_items())

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.rank_nodes)))

    @property
    def local_fraction(self) -> float:
        total = sum(r.bytes for r in self.reads)
        if total == 0:
            return 1.0
        return (total - self.transfer_bytes) / total


@dataclass
class Decision:
    """The arbiter's answer for one cycle.

    ``bindings``: job id -> the chosen candidate (devices never over-committed, gangs whole).
    ``reasons``: job id -> a :class:`~scheduler.core.reasons.Reason` (kind, words, the time it names)
    for every pending job left unbound: why the job is still pending, as metrics and the queue read it.
    ``candidate_reasons``: (job id, candidate index) -> a ``Reason`` too, for why that candidate was not
    taken.  It explains one candidate in ``gsched explain``, not the job's state: nothing counts these
    by kind (their kind says what kept the candidate, e.g. ``devices_busy`` on one of its nodes), but
    their times are data like the job's, so the explanation prints "for 25s more" from ``at_s``.
    ``order``: pending job ids in the order the arbiter took them (by priority, highest first;
    ``twostage`` breaks near-ties by transfer cost); ``factors``: job id -> fair-share factor.
    ``reservation``: (job id, node -> devices, start_s) held for the top job that does not fit, if any.
    ``waiting``: job id -> when it began waiting for locality, for the jobs that wait this cycle (the
    caller stores the start of a new wait and hands it back in the next snapshots).
    ``durations_s``: phase name -> seconds (filled by ``scheduler.core.decide.decide``).
    """

    bindings: dict[int, Candidate] = field(default_factory=dict)
    reasons: dict[int, Reason] = field(default_factory=dict)
    candidate_reasons: dict[tuple[int, int], Reason] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    factors: dict[int, float] = field(default_factory=dict)
    priorities: dict[int, float] = field(default_factory=dict)
    reservation: tuple[int, dict[str, int], float] | None = None
    waiting: dict[int, float] = field(default_factory=dict)
    # Phase durations measured by ``scheduler.core.decide`` ("index", "stage1", "stage2"), in seconds.
    # For reports only: no decision ever depends on them.
    durations_s: dict[str, float] = field(default_factory=dict)
