"""Job states and the one table of legal transitions.

``transition(job, new_state, reason)`` is the only way a job's state changes: it raises
``IllegalTransition`` for a move the table does not allow, so a bug shows up as an error rather than a
job in an impossible state.
"""

from __future__ import annotations

from typing import Protocol

PENDING = "PENDING"
BOUND = "BOUND"
STAGING = "STAGING"
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"

FINAL = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT})
ACTIVE = frozenset({BOUND, STAGING, RUNNING})

TRANSITIONS: dict[str, frozenset[str]] = {
    PENDING: frozenset({BOUND, CANCELLED, FAILED}),
    BOUND: frozenset({STAGING, RUNNING, PENDING, FAILED, CANCELLED, TIMEOUT}),
    STAGING: frozenset({RUNNING, PENDING, FAILED, CANCELLED, TIMEOUT}),
    RUNNING: frozenset({COMPLETED, FAILED, CANCELLED, PENDING, TIMEOUT}),
    COMPLETED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
    TIMEOUT: frozenset(),
}

# Rank states.  Devices of a rank are busy in every state but the final ones.
R_ASSIGNED = "ASSIGNED"
R_STAGING = "STAGING"
R_READY = "READY"  # staged, waiting for the rendezvous port
R_RUNNING = "RUNNING"
R_EXITED = "EXITED"
R_KILLING = "KILLING"
R_KILLED = "KILLED"
RANK_FINAL = frozenset({R_EXITED, R_KILLED})


class IllegalTransition(RuntimeError):
    pass


class HasState(Protocol):
    id: int
    state: str
    reason: str


def can_transition(old: str, new: str) -> bool:
    return new in TRANSITIONS.get(old, frozenset())


def transition(job: HasState, new: str, reason: str = "") -> None:
    if not can_transition(job.state, new):
        raise IllegalTransition(f"job {job.id}: {job.state} -> {new} is not allowed")
    job.state = new
    job.reason = reason
