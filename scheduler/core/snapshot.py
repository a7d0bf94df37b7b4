"""The frozen view of the cluster that one scheduling cycle decides over.

Contract: the server (``scheduler.server.cycle``) and the simulator (``scheduler.sim.simulator``) both build a
``Snapshot`` and hand it to the same pure functions (``scheduler.core.stage1.propose`` and an arbiter from
``policies``).  Nothing in a snapshot is mutated after it is built; stages and policies never do I/O
and never read a clock: ``Snapshot.now_s`` is the only time they see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.core.accounts import AccountView


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the cycle sees it: only nodes that are up and healthy appear in a snapshot."""

    name: str
    rack: str
    devices: int  # healthy devices on the node
    free: int  # devices not bound to any rank


@dataclass(frozen=True, slots=True)
class ShardView:
    dataset: str
    index: int
    bytes: int
    samples: int


@dataclass(frozen=True, slots=True)
class JobView:
    """A pending job.

    ``pending_since_s`` is when the job last became pending (submit, or requeue after a node loss):
    the age factor counts from it.  ``waiting_since_s`` is when it first waited for locality since
    then (None: not yet): the locality wait counts from it.  ``submit_s`` keeps the original order.
    ``prefer_nodes`` are nodes that hold the job's last checkpoint (resume is cheaper there).
    ``preempting``: jobs were preempted for it since it became pending (``policies.preemption``); it
    goes first in the queue (``fairshare.queue_order``) and does not wait for locality, so the devices
    taken for it are not given to another job.
    """

    id: int
    user: str
    ranks: int
    devices_per_rank: int
    dataset: str | None
    submit_s: float
    pending_since_s: float
    time_limit_s: float
    prefer_nodes: tuple[str, ...] = ()
    waiting_since_s: float | None = None
    preempting: bool = False

    @property
    def devices(self) -> int:
        return self.ranks * self.devices_per_rank


@dataclass(frozen=True, slots=True)
class RunningView:
    """A job holding devices; ``end_by_s`` is its start plus its time limit (used for reservations).

    For preemption (``policies.preemption``): ``started_s`` is when it last started, ``checkpoint_s``
    when its newest checkpoint was written since (None: none yet, all work since ``started_s`` would
    be lost), ``preemptible`` its ``[limits] preemptible``, ``preemptions_last_hour`` how often it was
    preempted in the hour before ``Snapshot.now_s``, ``preemptions`` how often it was preempted before
    in all.  ``stopping``: the job is no longer active (requeued, preempted, cancelled or ended) but its
    ranks hold their devices until they exit."""

    id: int
    user: str
    devices_by_node: tuple[tuple[str, int], ...]
    end_by_s: float
    started_s: float = 0.0
    checkpoint_s: float | None = None
    preemptible: bool = True
    preemptions_last_hour: int = 0
    stopping: bool = False
    preemptions: int = 0


@dataclass(frozen=True)
class Snapshot:
    now_s: float
    nodes: Mapping[str, NodeView]
    shards: Mapping[str, tuple[ShardView, ...]]  # dataset -> shards ordered by index
    replicas: Mapping[tuple[str, int], tuple[str, ...]]  # (dataset, shard) -> nodes with a healthy copy
    pending: tuple[JobView, ...]
    running: tuple[RunningView, ...] = ()
    usage: Mapping[str, float] = field(default_factory=dict)  # decayed device-seconds per user
    shares: Mapping[str, float] = field(default_factory=dict)  # raw shares per user (not normalized)
    # the account tree (scheduler.core.accounts): accounts by name, and each user's account (none: root)
    accounts: Mapping[str, AccountView] = field(default_factory=dict)
    user_account: Mapping[str, str] = field(default_factory=dict)
