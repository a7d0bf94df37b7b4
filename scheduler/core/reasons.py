"""Why a job waits, as data: a kind from a small fixed set, plain words, and the time the words name.

As kube-scheduler's filters return a status code with their message, stage 1 and the arbiters return a
:class:`Reason` for every pending job they leave unbound (``Decision.reasons``) and for every candidate
they did not take (``Decision.candidate_reasons``); the submit and requeue moves give the job one too.
Readers use the ``kind`` and ``at_s`` and never parse the words: the metrics count pending jobs by kind,
the queue and ``gsched explain`` turn ``at_s`` into "for 25s more" or "in 25s".

- ``kind``: a :class:`ReasonKind`.  The kinds that ``gsched_jobs_pending_by_reason`` counts are its
  label values (``scheduler.server.metrics.PENDING_KINDS``).
- ``message``: plain words with no time in them ("waiting for locality").
- ``at_s``: the scheduler time (seconds on its clock) the reason names, or None when it names none.
- ``at_word``: how the words name it: ``"until"`` (the reason holds until then: "waiting for
  locality until t=1030s") or ``"from"`` (something begins then: "devices reserved for it from
  t=1030s").

``text()`` is the one sentence people read and the ``Job.reason`` column stores: the message, then,
with a time, the word and the time as :func:`fmt_t` prints it.  ``as_dict()`` is the reason as stored
in a job's explanation (``explain["why"]``) and sent by the API (``why``): ``{"kind", "message",
"at_s", "at_word"}``, JSON types only; :meth:`Reason.from_dict` reads it back.

Pure and small; the CLI's start-up path does not import it (it reads the ``why`` documents as plain
dicts), so ``dataclasses`` costs ``gsched queue`` nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

__all__ = ["FROM", "UNTIL", "AtWord", "Reason", "ReasonKind", "fmt_t"]


class ReasonKind(StrEnum):
    """What kind of reason it is; the values are the strings stored and sent."""

    NEW = "new"  # submitted, or not yet decided by a cycle
    DEVICES_BUSY = "devices_busy"  # not enough free devices now (anywhere, or on a candidate's nodes)
    LOCALITY_WAIT = "locality_wait"  # waits for its data's holders (delay scheduling), until at_s
    RESERVED = "reserved"  # held back by a reservation: another job's until at_s, or its own from at_s
    TOO_LARGE = "too_large"  # can never run on the nodes that are up
    DATA_MISSING = "data_missing"  # a shard of its data set has no live copy
    QUEUE_ORDER = "queue_order"  # waits behind another job (the fifo baseline)
    REQUEUED = "requeued"  # back in the queue after losing a node, its rendezvous, or a failed rank
    PREEMPTED = "preempted"  # back in the queue: its devices went to a job of a user under their share
    BIND_FAILED = "bind_failed"  # the arbiter chose it, but the bind's re-check refused
    HELD = "held"  # held by its owner or an admin (`gsched hold`): not scheduled until released
    DEPENDENCY = "dependency"  # waits for the jobs its --dependency names to end
    OTHER = "other"  # anything else


UNTIL: Literal["until"] = "until"
FROM: Literal["from"] = "from"
AtWord = Literal["until", "from"]


def fmt_t(t_s: float) -> str:
    """How reasons print a time: ``t=1030s`` (seconds on the scheduler's clock, rounded)."""
    return f"t={t_s:.0f}s"


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason: ``kind``, ``message`` (no time in it) and the time ``at_s`` it names, if any (see the
    module docstring).  Equal reasons have equal fields; ``text()`` is its sentence."""

    kind: ReasonKind
    message: str
    at_s: float | None = None
    at_word: AtWord = UNTIL

    def __post_init__(self) -> None:
        if self.at_word not in (UNTIL, FROM):
            raise ValueError(f"at_word must be {UNTIL!r} or {FROM!r}, not {self.at_word!r}")

    def text(self) -> str:
        """The sentence: ``message``, or ``message`` + " until t=1030s" (or " from t=1030s")."""
        if self.at_s is None:
            return self.message
        return f"{self.message} {self.at_word} {fmt_t(self.at_s)}"

    def as_dict(self) -> dict[str, Any]:
        """The reason as JSON data: ``{"kind", "message", "at_s", "at_word"}``."""
        return {"kind": self.kind.value, "message": self.message, "at_s": self.at_s, "at_word": self.at_word}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Reason:
        """The reason ``as_dict`` wrote (a kind this version does not know reads as ``OTHER``)."""
        try:
            kind = ReasonKind(str(doc.get("kind")))
        except ValueError:
            kind = ReasonKind.OTHER
        at_s = doc.get("at_s")
        return cls(kind, str(doc.get("message") or ""), None if at_s is None else float(at_s),
                   FROM if doc.get("at_word") == FROM else UNTIL)
