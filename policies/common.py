"""Small helpers shared by the arbiters: free-device ledgers, fit checks and the reasons they give.

Contract: everything here works on plain data handed in by one ``arbitrate`` call; a
:class:`FreeLedger` belongs to that call alone and is thrown away with it.  The reason helpers return
:class:`~scheduler.core.reasons.Reason` values (kind, words, time), so the words of each kind are
written in one place.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.core.placement import Candidate
from scheduler.core.reasons import FROM, Reason, ReasonKind
from scheduler.core.reasons import fmt_t as fmt_t  # how reasons print a time; kept here for the arbiters
from scheduler.core.stage1 import FreeDevices, Stage1Index


class FreeLedger:
    """Free devices left in this cycle, node -> count; only nodes with some free devices are kept."""

    def __init__(self, index: Stage1Index):
        self._racks = index.racks
        self.free = FreeDevices({n: index.free[n] for n in index.free_desc}, index.racks)
        self.held: dict[str, int] = {}
        self.avail: FreeDevices = self.free  # free devices minus held ones (see hold())
        self.avail_total = 0
        self.total = sum(self.free.values())
        self.version = 0  # bumped by every take(), so callers can cache views of the ledger
        # rank_cap[k]: how many ranks of k devices the free devices could hold (k = 1..largest node)
        self._max_k = max(index.max_node_devices, 1)
        self.rank_cap = [0] * (self._max_k + 1)
        for f in self.free.values():
            self._count(f, 1)

    def _count(self, free: int, sign: int) -> None:
        for k in range(1, self._max_k + 1):
            self.rank_cap[k] += sign * (free // k)

    def hold(self, held: Mapping[str, int]) -> None:
        """Set devices aside (a reservation): :attr:`avail` is then what is free beyond them."""
        self.held = dict(held)
        self.avail = FreeDevices({n: f - self.held.get(n, 0) for n, f in self.free.items()}, self._racks)
        self.avail_total = sum(self.avail.values())

    def may_fit(self, ranks: int, devices_per_rank: int) -> bool:
        """False when the free devices cannot hold the gang however it is placed (O(1))."""
        if devices_per_rank > self._max_k or devices_per_rank <= 0:
            return False
        return self.rank_cap[devices_per_rank] >= ranks

    def get(self, node: str) -> int:
        return self.free.get(node, 0)

    def fits(self, c: Candidate) -> bool:
        return all(self.free.get(n, 0) >= d for n, d in c.device_items())

    def take(self, c: Candidate) -> None:
        """Give the candidate's devices away; raises if any is not free (a bug in the arbiter)."""
        self.version += 1
        for n, d in c.device_items():
            had = self.free.get(n, 0)
            left = had - d
            if left < 0:
                raise AssertionError(f"job {c.job_id}: node {n} would be over-committed")
            self._count(had, -1)
            self._count(left, 1)
            self.free.set(n, left)
            if self.avail is not self.free:
                before = self.avail.get(n)
                after = max(0, left - self.held.get(n, 0))
                self.avail.set(n, after)
                self.avail_total += after - before
            self.total -= d


def busy_reason(c: Candidate, free: Mapping[str, int]) -> Reason | None:
    """Why ``c`` does not fit ``free`` ("devices busy on n2: needs 4, 2 free"), or None if it fits."""
    for n, d in c.device_items():
        have = free.get(n, 0)
        if have < d:
            return Reason(ReasonKind.DEVICES_BUSY, f"devices busy on {n}: needs {d}, {have} free")
    return None


class Reasons:
    """The reason helpers above, each equal reason made once per ``arbitrate`` call and shared (a
    ``Reason`` is immutable): at 50,000 pending jobs one cycle gave out some 370,000 candidate
    reasons, nearly all equal to others, and making each anew was a third of stage 2's time."""

    def __init__(self) -> None:
        self._busy: dict[tuple[str, int, int], Reason] = {}
        self._wait: dict[tuple[float, int, int], Reason] = {}

    def busy(self, c: Candidate, free: Mapping[str, int]) -> Reason | None:
        """:func:`busy_reason`."""
        for n, d in c.device_items():
            have = free.get(n, 0)
            if have < d:
                return self.busy_on(n, d, have)
        return None

    def busy_on(self, node: str, needs: int, have: int) -> Reason:
        """The reason of a candidate that needs ``needs`` devices on ``node``, where ``have`` are free."""
        key = (node, needs, have)
        r = self._busy.get(key)
        if r is None:
            r = self._busy[key] = Reason(ReasonKind.DEVICES_BUSY, f"devices busy on {node}: needs {needs}, {have} free")
        return r

    def waiting(self, until_s: float, cost_ms: int = -1, limit_ms: int = 0) -> Reason:
        """:func:`waiting_for_locality`; with ``cost_ms`` >= 0, a candidate's ("costs 800 ms > 500 ms: ...")."""
        key = (until_s, cost_ms, limit_ms)
        r = self._wait.get(key)
        if r is None:
            prefix = f"costs {cost_ms} ms > {limit_ms} ms: " if cost_ms >= 0 else ""
            r = self._wait[key] = waiting_for_locality(until_s, prefix)
        return r


def devices_busy(needed: int, free_total: int) -> Reason:
    """The job-level reason when no placement fits: "devices busy: needs 4, 2 free"."""
    if free_total >= needed:
        return Reason(ReasonKind.DEVICES_BUSY,
                      f"devices busy: needs {needed}, {free_total} free but not enough on single nodes")
    return Reason(ReasonKind.DEVICES_BUSY, f"devices busy: needs {needed}, {free_total} free")


def reserved_for(job_id: int, start_s: float) -> Reason:
    """Held back by job ``job_id``'s reservation: "reserved for job 12 until t=1030s"."""
    return Reason(ReasonKind.RESERVED, f"reserved for job {job_id}", start_s)


def holds_reservation(busy: Reason, start_s: float, why: str = "") -> Reason:
    """A job that fits nowhere now and got the reservation: ``busy``'s words, then "; devices reserved
    for it from t=1030s" (after ``why`` and a colon when given: why it got it before
    ``reserve_min_wait_s``).  Its kind is ``reserved`` (it waits on a reservation, as the jobs it holds
    back do)."""
    return Reason(ReasonKind.RESERVED, f"{busy.message}; {why + ': ' if why else ''}devices reserved for it",
                  start_s, FROM)


def waiting_for_locality(until_s: float, prefix: str = "") -> Reason:
    """Delay scheduling: "waiting for locality until t=1030s", after ``prefix`` when given (a
    candidate's "costs 800 ms > 500 ms: ")."""
    return Reason(ReasonKind.LOCALITY_WAIT, f"{prefix}waiting for locality", until_s)


def not_taken(words: str) -> Reason:
    """A candidate passed over for another of the same job's ("an earlier candidate fit first")."""
    return Reason(ReasonKind.OTHER, words)
