"""The arbiter extension point (stage 2) and its explicit registry.

An arbiter receives one cycle's snapshot and every pending job's stage-1 candidates and returns a
:class:`~scheduler.core.placement.Decision`.  Its contract:

- pure: no I/O, no clock (time is ``snap.now_s``), no state kept between calls; the same inputs give
  the same decision;
- at most one candidate per job; no device is given twice, and never more than a node's free devices;
  every gang is whole (a binding is a full candidate);
- a bound candidate is either one of the job's stage-1 candidates or one the arbiter re-proposed with
  ``scheduler.core.stage1.propose`` over the devices it had left (same cost model, so costs stay honest);
- ``reasons`` has a :class:`~scheduler.core.reasons.Reason` for every pending job it leaves unbound:
  a kind (``ReasonKind``: what metrics and the queue read), plain words without a time, and the
  scheduler time the words name, if any (``text()`` is the sentence stored in ``Job.reason``); its
  ``candidate_reasons`` are ``Reason`` values too; ``order``, ``factors`` and ``priorities`` cover
  every pending job.

``index`` is the snapshot's :class:`~scheduler.core.stage1.Stage1Index` when the caller has one (it is
built when omitted).  The interface is ``scheduler.core.decide.Arbiter`` (re-exported here); the core
never imports this module.  The server's cycle and the simulator look the configured name up with
:func:`get_arbiter` and pass the arbiter to ``decide()``; nothing branches on a name.
"""

from __future__ import annotations

from policies.backfill import BackfillArbiter
from policies.fairshare import FairShareArbiter
from policies.fifo import FifoArbiter
from policies.flow import FlowArbiter
from policies.twostage import TwoStageArbiter
from scheduler.core.decide import Arbiter

__all__ = ["ARBITERS", "Arbiter", "get_arbiter"]

ARBITERS: dict[str, Arbiter] = {
    "twostage": TwoStageArbiter(),
    "flow": FlowArbiter(),
    "fifo": FifoArbiter(),
    "fairshare": FairShareArbiter(),
    "backfill": BackfillArbiter(),
}


def get_arbiter(name: str) -> Arbiter:
    """The registered arbiter called ``name``; ValueError naming the valid choices otherwise."""
    try:
        return ARBITERS[name]
    except KeyError:
        valid = ", ".join(sorted(ARBITERS))
        raise ValueError(f"unknown arbiter {name!r}: choose one of {valid} (policy.arbiter)") from None
