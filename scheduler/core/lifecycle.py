"""The lifecycle: every state a job, rank, node, replica or transfer can be in, and the one table of job moves.

States are ``StrEnum``s whose values are the strings stored in the database and sent over the API, so
a member compares (and hashes) equal to the plain string read back from a row or a document.
``RankState`` and ``TransferState`` are the wire vocabulary of the heartbeat, ``JobState`` and
``NodeState`` (with ``FINAL`` and ``ACTIVE``) the API's: they are defined in ``scheduler.protocol.states``
(agents import only the protocol; the CLI's listings read it without this module's start-up cost) and
re-exported here, so there is one definition of each and server code reads every state from this module.

A job moves only along ``TABLE``, one ``(from, to)`` entry per legal move, in the manner of
dask.distributed's worker state machine: ``plan(job, to, reason, now, **context)`` looks the move up
and returns the effects that carry it out (set these fields, stop the ranks, record an event, count
the staged bytes) without doing any of them; ``scheduler.store.effects`` applies them to a session.
A move the table does not hold raises ``IllegalTransition`` before any effect is made, so a bug shows
up as an error rather than a job in an impossible state.  ``derive(job, ranks, ...)`` reads the
move a job's ranks call for (fail, retry, complete, run, stage) from plain rank facts.

Everything here is pure (no session, no clock, no I/O) and light.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, Protocol

from scheduler.protocol.states import ACTIVE, FINAL, RANK_FINAL, JobState, NodeState, RankState, TransferState

__all__ = [
    "ACTIVE", "FINAL", "PREEMPT_EVENT", "PREEMPTING_EVENT", "RANK_FINAL", "RANK_LIVE", "TABLE", "TRANSITIONS", "CloseStaging", "Effect",
    "IllegalTransition", "JobFacts", "JobState", "Move", "NodeState", "RankFacts", "RankState", "Record",
    "ReplicaState", "SetFields", "StopRanks", "TransferState", "can_transition", "derive", "exit_words",
    "gives_up", "plan",
]


class ReplicaState(StrEnum):
    """One node's copy of one shard: as its agent last reported it (``STAGING`` while an upload lands)."""

    HEALTHY = "healthy"
    CORRUPT = "corrupt"
    MISSING = "missing"
    STAGING = "staging"


# A copy the server expects on a node (an upload of `data make`, a file `data add` links, state STAGING)
# counts as on its way for this long; one not reported by then is made again elsewhere
# (scheduler/server/replication.py), and no longer takes room on its node (scheduler/store/room_reader.py).
STAGING_GRACE_S = 120.0


PREEMPT_EVENT = "job.preempt"  # the event of each preemption (policies.preemption), one per victim
PREEMPTING_EVENT = "job.preempting"  # the preemptor's event: the victims taken for it, and why
RANK_LIVE = frozenset({RankState.ASSIGNED, RankState.STAGING, RankState.READY, RankState.RUNNING})

class IllegalTransition(RuntimeError):
    pass


# ---------------------------------------------------------------- facts and effects


class JobFacts(Protocol):
    """What the table reads of a job (a ``Job`` row has all of it; tests pass a small dataclass)."""

    @property
    def id(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def restarts(self) -> int: ...
    @property
    def failures(self) -> int: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def progress(self) -> Any: ...
    @property
    def explain(self) -> Any: ...  # the last cycle's explanation (a dict, or None)


class RankFacts(Protocol):
    """What ``derive`` reads of a rank of the job's current attempt (a ``Rank`` row has all of it)."""

    @property
    def rank(self) -> int: ...
    @property
    def node(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def ended_at(self) -> float | None: ...
    @property
    def log_tail(self) -> str: ...


class _Value:
    """A small value: equal to another of its own class with equal slots.  (Not a dataclass: the
    CLI imports this module at start, and dataclasses would bring inspect and ast with it.)"""

    __slots__: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"


class SetFields(_Value):
    """Set these columns of the job (``state`` and ``reason`` among them for every move)."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields


class StopRanks(_Value):
    """Mark every live rank of the job KILLING: its agent is told to kill it and reports it KILLED,
    and its devices are free from then on."""

    __slots__ = ()


class Record(_Value):
    """Add an event about the job to the audit log."""

    __slots__ = ("kind", "message", "actor")

    def __init__(self, kind: str, message: str = "", actor: str = "server") -> None:
        self.kind, self.message, self.actor = kind, message, actor


class CloseStaging(_Value):
    """Every rank runs, so the job's staged shards have arrived: mark its staging transfers done and
    count their bytes on each destination node."""

    __slots__ = ()


Effect = SetFields | StopRanks | Record | CloseStaging


# ---------------------------------------------------------------- the table


def _bind(job: JobFacts, to: JobState, reason: str, now: float, *, nodes: Sequence[str], transfer_bytes: int,
          transfer_cost_ms: int, local_fraction: float) -> list[Effect]:
    """PENDING -> BOUND: a new attempt on ``nodes``; the binder adds its ranks, reads and transfers."""
    attempt = job.attempt + 1
    return [SetFields({"state": to, "reason": reason, "attempt": attempt, "locality_wait_since": None,
                       "master_port": None, "transfer_bytes": transfer_bytes, "transfer_cost_ms": transfer_cost_ms,
                       "local_fraction": local_fraction, "progress": {}}),
            Record("job.bind", f"attempt {attempt} on {', '.join(nodes)}; {transfer_bytes} bytes to stage "
                               f"(~{transfer_cost_ms} ms)")]


def _stage(job: JobFacts, to: JobState, reason: str, now: float) -> list[Effect]:
    """BOUND -> STAGING: a rank reported it is getting ready."""
    return [SetFields({"state": to, "reason": reason})]


def _run(job: JobFacts, to: JobState, reason: str, now: float, *, nodes: Sequence[str]) -> list[Effect]:
    """BOUND or STAGING -> RUNNING: every rank runs (on ``nodes``).  ``started_at`` is the first start
    of any attempt; the staging progress is dropped and ``staged`` set."""
    progress = {k: v for k, v in (job.progress or {}).items() if k != "staging"} | {"staged": True}
    return [SetFields({"state": to, "reason": reason, "started_at": job.started_at or now, "progress": progress}),
            CloseStaging(),
            Record("job.running", f"on {', '.join(sorted(nodes))}")]


def _finish(job: JobFacts, to: JobState, reason: str, now: float) -> list[Effect]:
    """-> COMPLETED, FAILED or TIMEOUT: the job ends now and its live ranks are stopped."""
    return [SetFields({"state": to, "reason": reason, "ended_at": now}), StopRanks(),
            Record(f"job.{to.lower()}", reason)]


def _finish_unseen(job: JobFacts, to: JobState, reason: str, now: float) -> list[Effect]:
    """BOUND or STAGING -> COMPLETED: every rank ran and exited 0 between two heartbeats (a command
    such as ``true``), so the job was never seen RUNNING; it started and ended now."""
    progress = {k: v for k, v in (job.progress or {}).items() if k != "staging"} | {"staged": True}
    return [SetFields({"started_at": job.started_at or now, "progress": progress}), CloseStaging(),
            *_finish(job, to, reason, now)]


def _cancel(job: JobFacts, to: JobState, reason: str, now: float, *, actor: str) -> list[Effect]:
    """-> CANCELLED by ``actor``: as a finish, the event in the actor's name."""
    return [SetFields({"state": to, "reason": reason, "ended_at": now}), StopRanks(), Record("job.cancel", "", actor)]


def gives_up(restarts: int, max_restarts: int) -> bool:
    """Whether a requeue fails the job instead: it has been requeued ``max_restarts`` times already."""
    return restarts >= max_restarts


def _requeue(job: JobFacts, to: JobState, reason: str, now: float, *, max_restarts: int,
             earlier: Sequence[str] = (), retry: bool = False, preempted_for: int | None = None) -> list[Effect]:
    """An active job -> PENDING after losing a node or its rendezvous (``reason`` says which); its
    ranks are stopped, and it waits from ``now`` for a new placement and a new rendezvous port.  Its
    reason, "requeued: " and ``reason``, is a ``requeued`` one: the words go to ``reason`` and the data
    to the explanation's ``why`` (the rest of the explanation is kept until the next cycle's report).

    Past ``max_restarts`` the move is to FAILED instead, its reason naming the ``earlier`` requeues'
    messages (oldest first).  ``retry``: the requeue is a retry after a rank failed (``derive``), counted
    in ``failures``, not in ``restarts``; as before the lifecycle was one table, its requeue event still
    names the restart it would have been, and a retry that gives up lowers ``restarts`` by one.

    ``preempted_for``: the job's devices go to that job (``policies.preemption``).  A preemption is no
    restart and never fails the job: ``restarts`` and ``max_restarts`` are untouched, the job keeps its
    age (``pending_since`` stays as it was), its reason is a ``preempted`` one naming the preemptor,
    and the event is ``job.preempt`` with ``reason`` (who, and the work lost) as its words.
    """
    if preempted_for is not None:
        from scheduler.core.reasons import Reason, ReasonKind

        why = Reason(ReasonKind.PREEMPTED, f"preempted for job {preempted_for}")
        return [StopRanks(), SetFields({"state": to, "reason": why.text(), "locality_wait_since": None,
                                        "master_port": None, "explain": {**(job.explain or {}), "why": why.as_dict()}}),
                Record(PREEMPT_EVENT, reason)]
    if gives_up(job.restarts, max_restarts):
        history = "".join(f"\n  earlier: {m}" for m in earlier)
        effects = plan(job, JobState.FAILED, f"{reason}; gave up after {job.restarts} restarts "
                                             f"(max_restarts={max_restarts}){history}", now)
        if retry:
            effects.append(SetFields({"failures": job.failures + 1, "restarts": job.restarts - 1}))
        return effects
    # Imported here, not at the top: the CLI imports this module at start, and the reasons' dataclass
    # would bring dataclasses (inspect, ast) with it.
    from scheduler.core.reasons import Reason, ReasonKind

    restart = job.restarts + 1
    why = Reason(ReasonKind.REQUEUED, f"requeued: {reason}")
    fields = {"state": to, "reason": why.text(), "restarts": restart, "pending_since": now,
              "locality_wait_since": None, "master_port": None,
              "explain": {**(job.explain or {}), "why": why.as_dict()}}
    if retry:
        fields |= {"failures": job.failures + 1, "restarts": job.restarts}
    return [StopRanks(), SetFields(fields), Record("job.requeue", f"{reason} (restart {restart})")]


Handler = Callable[..., list[Effect]]

_J = JobState
TABLE: dict[tuple[JobState, JobState], Handler] = {
    (_J.PENDING, _J.BOUND): _bind,
    (_J.PENDING, _J.CANCELLED): _cancel,
    (_J.PENDING, _J.FAILED): _finish,
    (_J.BOUND, _J.STAGING): _stage,
    (_J.BOUND, _J.RUNNING): _run,
    (_J.BOUND, _J.PENDING): _requeue,
    (_J.BOUND, _J.FAILED): _finish,
    (_J.BOUND, _J.CANCELLED): _cancel,
    (_J.BOUND, _J.TIMEOUT): _finish,
    (_J.BOUND, _J.COMPLETED): _finish_unseen,
    (_J.STAGING, _J.RUNNING): _run,
    (_J.STAGING, _J.PENDING): _requeue,
    (_J.STAGING, _J.FAILED): _finish,
    (_J.STAGING, _J.CANCELLED): _cancel,
    (_J.STAGING, _J.TIMEOUT): _finish,
    (_J.STAGING, _J.COMPLETED): _finish_unseen,
    (_J.RUNNING, _J.COMPLETED): _finish,
    (_J.RUNNING, _J.FAILED): _finish,
    (_J.RUNNING, _J.CANCELLED): _cancel,
    (_J.RUNNING, _J.PENDING): _requeue,
    (_J.RUNNING, _J.TIMEOUT): _finish,
}
"""Every legal job move and its handler ``(job, to, reason, now, **context) -> effects``.  The final
states have no way out."""

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    old: frozenset(new for (frm, new) in TABLE if frm == old) for old in JobState}
"""``TABLE`` read as: from each state, the states a job may move to."""


def can_transition(old: str, new: str) -> bool:
    return (old, new) in TABLE


def plan(job: JobFacts, to: JobState, reason: str, now: float, **context: Any) -> list[Effect]:
    """The effects that move ``job`` to ``to`` at ``now``, in the order they are to be applied.

    Raises ``IllegalTransition`` when the table has no such move.  ``context`` is what the move's
    handler needs besides the job (``TABLE``'s handlers name it: ``nodes`` and the transfer figures for
    a bind, ``nodes`` for RUNNING, ``actor`` for a cancel, ``max_restarts`` (and ``earlier``, ``retry``,
    ``preempted_for``) for a requeue); a missing or unknown key is a ``TypeError``.  Reads ``job``,
    changes nothing.
    """
    try:
        handler = TABLE[(JobState(job.state), JobState(to))]
    except (KeyError, ValueError):
        raise IllegalTransition(f"job {job.id}: {job.state} -> {to} is not allowed") from None
    return handler(job, JobState(to), reason, now, **context)


# ---------------------------------------------------------------- a job's state from its ranks


class Move(_Value):
    """A move ``derive`` calls for: ``plan(job, to, reason, now, **context)`` (a move ``to`` PENDING is
    a retry: the caller adds the requeue's ``max_restarts`` and ``earlier``)."""

    __slots__ = ("to", "reason", "context")

    def __init__(self, to: JobState, reason: str, context: dict[str, Any] | None = None) -> None:
        self.to, self.reason, self.context = to, reason, dict(context or {})


def exit_words(r: RankFacts) -> str:
    """``rank 1 on n2 exited with code -9 (SIGKILL)``: the rank, its node and how it ended."""
    code = r.exit_code
    words = f"rank {r.rank} on {r.node} exited with code {code}"
    if code is not None and code < 0:
        try:
            words += f" ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return words


def derive(job: JobFacts, ranks: Sequence[RankFacts], now: float, failure_grace_s: float = 0.0,
           retries: int = 0) -> Move | None:
    """The move an active job's ranks (those of its current attempt) call for at ``now``, or None.

    * A rank that exited non-zero (or with no code) fails the job, but only ``failure_grace_s`` after
      the first such exit: when a node dies, its peers' ranks fail at once on the broken connection,
      and the grace (the heartbeat TTL) lets the node's loss be noticed first, so the job is requeued
      and resumed rather than failed.  The first failure is named as the cause (a rank killed by a
      signal before one that exited with an error at the same time, then by rank), the others after
      it; with ``retries`` (the spec's ``retry_on_failure``) left over ``job.failures``, the move is a
      retry to PENDING, else to FAILED with the cause's last ten log lines.
    * Every rank exited 0: COMPLETED.
    * A rank was killed: None (a requeue or cancel is tearing the attempt down).
    * Every rank runs or exited 0, and one runs: RUNNING (None when it already is).
    * A rank is staging, ready or running and the job is BOUND: STAGING.

    Asking again with the same facts gives the same answer, and a job that already made the move
    gets None, so callers may derive as often as they like (each heartbeat and each cycle do).
    """
    if job.state not in ACTIVE or not ranks:
        return None
    failed = [r for r in ranks if r.state == RankState.EXITED and r.exit_code != 0]
    if failed:
        if now - min(r.ended_at or now for r in failed) < failure_grace_s:
            return None
        failed.sort(key=lambda r: (r.ended_at or now, 0 if (r.exit_code or 0) < 0 else 1, r.rank))
        cause = failed[0]
        why = exit_words(cause)
        if len(failed) > 1:
            why += "; then " + ", ".join(exit_words(x) for x in failed[1:])
        if job.failures < retries:
            return Move(JobState.PENDING, f"{why}; retry {job.failures + 1} of {retries}", {"retry": True})
        tail = "\n".join((cause.log_tail or "").strip().splitlines()[-10:])
        return Move(JobState.FAILED, f"{why}\n{tail}".strip())
    if all(r.state == RankState.EXITED and r.exit_code == 0 for r in ranks):
        return Move(JobState.COMPLETED, "all ranks exited 0")
    if any(r.state == RankState.KILLED for r in ranks):
        return None
    states = {r.state for r in ranks}
    if RankState.RUNNING in states and states <= {RankState.RUNNING, RankState.EXITED}:
        if job.state == JobState.RUNNING:
            return None
        return Move(JobState.RUNNING, "running", {"nodes": tuple(sorted({r.node for r in ranks}))})
    if states & {RankState.STAGING, RankState.READY, RankState.RUNNING} and job.state == JobState.BOUND:
        return Move(JobState.STAGING, "staging data and starting ranks")
    return None
