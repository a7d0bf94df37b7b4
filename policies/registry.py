"""The arbiter extension point (stage 2) and its explicit registry.

An arbiter receives one cycle's snapshot and every pending job's stage-1 candidates and returns a
:class:`~scheduler.core.placement.Decision`.  Its contract:

- pure: no I/O, no clock (time is ``snap.now_s``), no state kept between calls; the same inputs give
  the same decision;
- at most one candidate per job; no device is given twice, and never more than a node's free devices;
  every gang is whole (a binding is a full candidate);
- a bound candidate is either one of the job's stage-1 candidates or one the arbiter re-proposed with
  ``scheduler.core.stage1.propose`` over the devices it had left (same cost model, so costs stay honest);
- ``reasons`` has a plain-words reason for every pending job it leaves unbound, and ``order``,
  ``factors`` and ``priorities`` cover every pending job.

``index`` is the snapshot's :class:`~scheduler.core.stage1.Stage1Index` when the caller has one (it is
built when omitted).  The cycle looks arbiters up by the configured name with :func:`get_arbiter` and
never branches on a name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from policies.fairshare import FairShareArbiter
from policies.fifo import FifoArbiter
from policies.flow import FlowArbiter
from policies.twostage import TwoStageArbiter
from scheduler.core.placement import Candidate, Decision
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.snapshot import Snapshot
from scheduler.core.stage1 import Stage1Index


class Arbiter(Protocol):
    name: str

    def arbitrate(
        self,
        snap: Snapshot,
        candidates: Mapping[int, Sequence[Candidate]],
        cfg: PolicyConfig,
        index: Stage1Index | None = None,
    ) -> Decision: ...


ARBITERS: dict[str, Arbiter] = {
    "twostage": TwoStageArbiter(),
    "flow": FlowArbiter(),
    "fifo": FifoArbiter(),
    "fairshare": FairShareArbiter(),
}


def get_arbiter(name: str) -> Arbiter:
    """The registered arbiter called ``name``; ValueError naming the valid choices otherwise."""
    try:
        return ARBITERS[name]
    except KeyError:
        valid = ", ".join(sorted(ARBITERS))
        raise ValueError(f"unknown arbiter {name!r}: choose one of {valid} (policy.arbiter)") from None
