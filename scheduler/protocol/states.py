"""The states an agent and the server name to each other (a rank's and a transfer's), and the states
the API names to its clients (a job's and a node's).

These are the wire vocabulary of the heartbeat: an agent reports each rank's ``RankState`` and each
copy's ``TransferState``, and the server stores the same strings.  This is the one definition of each;
``scheduler.core.lifecycle`` imports and re-exports them beside the job, node and replica states, so
server code reads every state from the lifecycle and agents read these from here.  The values are the
strings stored in the database and sent over the API: changing one is a schema and protocol change.

Part of the protocol between the server and the agents: imports nothing else of ``scheduler`` and
nothing heavy (the CLI and the agents load it at start).  The table of job moves is
``scheduler.core.lifecycle``'s.
"""

from __future__ import annotations

from enum import StrEnum


class RankState(StrEnum):
    """One rank of one attempt of a job.

    ``ASSIGNED -> STAGING -> READY -> RUNNING -> EXITED``, and ``KILLING -> KILLED`` from any live
    state.  The server writes ASSIGNED (at bind) and KILLING (when it stops a job); an agent reports
    the others.  The rank's devices are busy in every state but the final ones (``RANK_FINAL``).
    """

    ASSIGNED = "ASSIGNED"
    STAGING = "STAGING"
    READY = "READY"  # staged, waiting for the rendezvous port
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    KILLING = "KILLING"
    KILLED = "KILLED"


RANK_FINAL = frozenset({RankState.EXITED, RankState.KILLED})
REPORTED_RANK = frozenset({RankState.STAGING, RankState.READY, RankState.RUNNING, *RANK_FINAL})  # what agents say


class TransferState(StrEnum):
    """One copy of one shard to one node.

    A re-replication copy is ``PENDING`` when planned, ``RUNNING`` once handed to the destination
    agent, then ``DONE`` or ``FAILED`` as that agent reports.  A job's staging copy is ``JOB`` until all
    its ranks run (then ``DONE``, its bytes counted).  ``DELETE`` is an order to drop a copy, ``DONE``
    once sent.  Agents report only RUNNING, DONE and FAILED.
    """

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    DELETE = "delete"
    JOB = "job"


REPORTED_TRANSFER = frozenset({TransferState.RUNNING, TransferState.DONE, TransferState.FAILED})  # what agents say


class JobState(StrEnum):
    """A job: PENDING in the queue, BOUND to devices, STAGING its data, RUNNING, then one final state."""

    PENDING = "PENDING"
    BOUND = "BOUND"
    STAGING = "STAGING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"


FINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})
ACTIVE = frozenset({JobState.BOUND, JobState.STAGING, JobState.RUNNING})  # holding devices


class NodeState(StrEnum):
    """A node is up while it heartbeats; the cycle declares it down after ``heartbeat_ttl_s`` of silence."""

    UP = "up"
    DOWN = "down"
