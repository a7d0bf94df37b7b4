"""Builders that make tests read as sentences.

    snap = (
        cluster()
        .node("a", rack="r1", devices=4).holds("digits", shards=[0, 1])
        .node("b", rack="r2", devices=4, free=2)
        .dataset("digits", shards=2, shard_bytes=GB)
        .pending(job(1, user="alice", ranks=2, dataset="digits"))
        .at(100)
        .build()
    )

Defaults: a node's devices are all free; a shard is 1 GB (``GB``); a job has one device per rank,
was submitted and became pending at t=0, and may run one hour.  With the default bandwidths 1 GB costs
320 ms inside a rack (25 Gb/s) and 800 ms across racks (10 Gb/s).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.core.accounts import AccountView
from scheduler.core.snapshot import JobView, NodeView, RunningView, ShardView, Snapshot

GB = 1_000_000_000
SAME_RACK_MS_PER_GB = 320  # 1e9 B / (25e9/8 B/s) = 0.32 s
CROSS_RACK_MS_PER_GB = 800  # 1e9 B / (10e9/8 B/s) = 0.8 s


def job(
    id: int,
    user: str = "alice",
    ranks: int = 1,
    dataset: str | None = None,
    devices_per_rank: int = 1,
    submit_s: float = 0.0,
    pending_since_s: float | None = None,
    time_limit_s: float = 3600.0,
    prefer_nodes: tuple[str, ...] = (),
    waiting_since_s: float | None = None,
) -> JobView:
    return JobView(
        id=id,
        user=user,
        ranks=ranks,
        devices_per_rank=devices_per_rank,
        dataset=dataset,
        submit_s=submit_s,
        pending_since_s=submit_s if pending_since_s is None else pending_since_s,
        time_limit_s=time_limit_s,
        prefer_nodes=prefer_nodes,
        waiting_since_s=waiting_since_s,
    )


@dataclass
class ClusterBuilder:
    _nodes: dict[str, NodeView] = field(default_factory=dict)
    _last: str | None = None
    _holds: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    _datasets: dict[str, dict[int, int]] = field(default_factory=dict)  # dataset -> index -> bytes
    _pending: list[JobView] = field(default_factory=list)
    _running: list[RunningView] = field(default_factory=list)
    _usage: dict[str, float] = field(default_factory=dict)
    _shares: dict[str, float] = field(default_factory=dict)
    _now: float = 0.0
    _accounts: dict[str, AccountView] = field(default_factory=dict)
    _user_account: dict[str, str] = field(default_factory=dict)

    def node(self, name: str, rack: str = "r1", devices: int = 4, free: int | None = None) -> ClusterBuilder:
        self._nodes[name] = NodeView(name, rack, devices, devices if free is None else free)
        self._last = name
        return self

    def nodes(
        self, *names: str, rack: str = "r1", devices: int = 4, free: int | None = None
    ) -> ClusterBuilder:
        for n in names:
            self.node(n, rack=rack, devices=devices, free=free)
        return self

    def holds(self, dataset: str, shards: list[int], shard_bytes: int = GB) -> ClusterBuilder:
        """The last node added holds these shards (shards not declared yet get ``shard_bytes``)."""
        assert self._last is not None, "holds() follows node()"
        for i in shards:
            self._datasets.setdefault(dataset, {}).setdefault(i, shard_bytes)
            self._holds.setdefault((dataset, i), []).append(self._last)
        return self

    def dataset(self, name: str, shards: int, shard_bytes: int = GB) -> ClusterBuilder:
        table = self._datasets.setdefault(name, {})
        for i in range(shards):
            table[i] = shard_bytes
        return self

    def pending(self, *jobs: JobView) -> ClusterBuilder:
        self._pending.extend(jobs)
        return self

    def running(self, id: int, user: str, devices_by_node: dict[str, int], end_by_s: float,
                **preemption: Any) -> ClusterBuilder:
        """A running job; it does NOT change nodes' free counts (declare ``free`` on the node).
        ``preemption``: ``started_s``, ``checkpoint_s``, ``preemptible``, ``preemptions_last_hour``,
        ``preemptions``."""
        self._running.append(RunningView(id, user, tuple(sorted(devices_by_node.items())), end_by_s, **preemption))
        return self

    def usage(self, **by_user: float) -> ClusterBuilder:
        self._usage.update(by_user)
        return self

    def shares(self, **by_user: float) -> ClusterBuilder:
        self._shares.update(by_user)
        return self

    def account(self, name: str, parent: str | None = None, shares: float = 1.0, users: tuple[str, ...] = ()) -> ClusterBuilder:
        """An account under ``parent`` (None: root) with ``users`` in it."""
        self._accounts[name] = AccountView(name, parent, shares)
        self._user_account.update(dict.fromkeys(users, name))
        return self

    def at(self, now_s: float) -> ClusterBuilder:
        self._now = now_s
        return self

    def build(self) -> Snapshot:
        shards = {
            d: tuple(ShardView(d, i, b, 100) for i, b in sorted(table.items()))
            for d, table in self._datasets.items()
        }
        return Snapshot(
            now_s=self._now,
            nodes=dict(self._nodes),
            shards=shards,
            replicas={k: tuple(v) for k, v in self._holds.items()},
            pending=tuple(self._pending),
            running=tuple(self._running),
            usage=dict(self._usage),
            shares=dict(self._shares),
            accounts=dict(self._accounts),
            user_account=dict(self._user_account),
        )


def cluster() -> ClusterBuilder:
    return ClusterBuilder()
