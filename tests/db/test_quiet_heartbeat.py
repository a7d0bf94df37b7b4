"""The quiet heartbeat (scheduler/server/quiet.py): a node with nothing new to say (idle, or its ranks
still running) is answered with one UPDATE, the same answer and the same writes as the whole path;
anything else about the heartbeat or the node sends it down the whole path, with nothing written.
Both backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import delete, event, select

from scheduler.core.clock import FakeClock
from scheduler.core.lifecycle import NodeState, RankState, TransferState
from scheduler.protocol.messages import Heartbeat
from scheduler.server import service as svc
from scheduler.server.auth import Identity
from scheduler.server.config import Settings
from scheduler.server.cycle import run_cycle
from scheduler.server.heartbeat import process_heartbeat
from scheduler.server.quiet import IDENTITY, PEERS_TTL_S, QUIET, RANKS, Settled, quiet_heartbeat
from scheduler.store.batching import WriteBatcher
from scheduler.store.db import Database
from scheduler.store.models import AgentToken, Node, Rank, Transfer

ADMIN = Identity("admin", "admin")
FLOOR = 10**9


def hb(node: str = "n1", **fields: Any) -> Heartbeat:
    body = {"node": node, "rack": "r0", "address": "127.0.0.1:9001", "incarnation": "a", "free_bytes": 10**12,
            "devices": [{"index": 0}, {"index": 1}], "replicas": None}
    return Heartbeat.model_validate({**body, **fields})


class Cluster:
    """Nodes n1 and n2 that sent one whole heartbeat each, through a real group commit."""

    def __init__(self, db: Database) -> None:
        self.db, self.clock, self.settled = db, FakeClock(1000.0), Settled()
        self.batcher = WriteBatcher(db, self.clock.now, "test")
        with db.session() as s:
            svc.add_user(s, self.clock.now(), None, "admin", 1, role="admin")
            svc.add_user(s, self.clock.now(), None, "alice", 1)
            self.tokens = {n: svc.create_agent_token(s, self.clock.now(), ADMIN, n) for n in ("n1", "n2")}
        for n in ("n1", "n2"):
            self.whole(hb(n))

    def run(self, fn: Callable[[Any, float], Any]) -> Any:
        return self.batcher.submit(fn).result(timeout=30)

    def whole(self, beat: Heartbeat, floor: int = 0) -> dict[str, Any]:
        self.clock.advance(5)
        return self.run(lambda s, now: process_heartbeat(s, now, Identity("agent", beat.node), beat,
                                                         disk_floor_bytes=floor, settled=self.settled))

    def quiet(self, beat: Heartbeat, token: str | None = None, floor: int = 0) -> dict[str, Any] | None:
        self.clock.advance(5)
        return self.run(lambda s, now: quiet_heartbeat(s, now, token or self.tokens[beat.node], beat, self.settled,
                                                       floor))

    def node(self, name: str = "n1") -> tuple[float, int, str]:
        with self.db.read() as s:
            row = s.get(Node, name)
            assert row is not None
            return row.last_seen, row.free_bytes, row.state


@pytest.fixture
def cluster(db: Database) -> Iterator[Cluster]:
    c = Cluster(db)
    yield c
    c.batcher.close()


@pytest.fixture
def writes(db: Database) -> Iterator[list[str]]:
    """Every INSERT, UPDATE and DELETE from now on that changed a row, as its first three words."""
    out: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        words = statement.split()
        if words[0].upper() in ("INSERT", "UPDATE", "DELETE") and cursor.rowcount != 0:
            out.append(" ".join(words[:3]))

    event.listen(db.engine, "after_cursor_execute", seen)
    yield out
    event.remove(db.engine, "after_cursor_execute", seen)


def test_every_field_of_a_heartbeat_is_either_the_nodes_identity_or_must_be_empty_to_be_quiet() -> None:
    assert IDENTITY | set(QUIET) | {RANKS} == set(Heartbeat.model_fields)
    assert not IDENTITY & set(QUIET) and RANKS not in IDENTITY | set(QUIET)
    for name, empty in QUIET.items():  # "empty" is the field's default: what an agent with nothing to say sends
        field = Heartbeat.model_fields[name]
        assert (field.default_factory() if field.default_factory else field.default) == empty  # type: ignore[call-arg]


def test_an_idle_nodes_heartbeat_is_one_update_with_the_whole_paths_answer(cluster: Cluster, writes: list[str]) -> None:
    quick = cluster.quiet(hb(free_bytes=5 * 10**11))
    assert quick is not None
    assert writes == ["UPDATE nodes SET"]
    assert cluster.node() == (cluster.clock.now(), 5 * 10**11, NodeState.UP)
    writes.clear()
    whole = cluster.whole(hb(free_bytes=5 * 10**11))
    assert writes == ["UPDATE nodes SET"]  # the whole path, on the same state, writes the same
    assert quick == whole
    assert quick["assignments"] == quick["kill"] == quick["transfers"] == quick["delete"] == []
    assert quick["peer_key"] and "peers" not in quick


def _down(c: Cluster) -> None:
    with c.db.session() as s:
        s.get(Node, "n1").state = NodeState.DOWN  # type: ignore[union-attr]


def _order(c: Cluster) -> None:
    with c.db.session() as s:
        s.add(Transfer(job_id=None, dataset="d", shard=0, src="n2", dst="n1", bytes=10,
                       state=TransferState.PENDING, created_at=c.clock.now()))


def _token_removed(c: Cluster) -> None:
    with c.db.session() as s:
        s.execute(delete(AgentToken).where(AgentToken.node == "n1"))


def _forget(c: Cluster) -> None:
    c.settled = Settled()  # a server that restarted: it has not seen this node's whole heartbeat


# (why, what to do to the cluster first, the heartbeat, the token's node, the server's disk floor)
NOT_QUIET: list[tuple[str, Callable[[Cluster], None], Heartbeat, str, int]] = [
    ("the server never took this node's whole heartbeat", _forget, hb(), "n1", 0),
    ("a device changed", lambda c: None, hb(devices=[{"index": 0}, {"index": 1, "healthy": False, "health": "XID 79"}]),
     "n1", 0),
    ("the agent restarted", lambda c: None, hb(incarnation="b"), "n1", 0),
    ("the node moved", lambda c: None, hb(address="127.0.0.1:9002"), "n1", 0),
    ("the node was declared down", _down, hb(), "n1", 0),
    ("a copy is ordered to it", _order, hb(), "n1", 0),
    ("the token is another node's", lambda c: None, hb(), "n2", 0),
    ("the token was removed", _token_removed, hb(), "n1", 0),
    ("it falls under the disk floor", lambda c: None, hb(free_bytes=10**6), "n1", FLOOR),
    ("it reports a rank", lambda c: None, hb(ranks=[{"job_id": 1, "attempt": 1, "rank": 0, "state": "RUNNING"}]), "n1", 0),
    ("it reports its whole inventory", lambda c: None, hb(replicas=[]), "n1", 0),
    ("it lists its job directories", lambda c: None, hb(job_dirs=[]), "n1", 0),
]


@pytest.mark.parametrize(("why", "before", "beat", "token_of", "floor"), NOT_QUIET, ids=[c[0] for c in NOT_QUIET])
def test_a_heartbeat_that_is_not_quiet_writes_nothing_and_goes_the_whole_way(
        cluster: Cluster, writes: list[str], why: str, before: Callable[[Cluster], None], beat: Heartbeat,
        token_of: str, floor: int) -> None:
    before(cluster)
    seen_before = cluster.node()
    writes.clear()
    assert cluster.quiet(beat, token=cluster.tokens[token_of], floor=floor) is None, why
    assert writes == [] and cluster.node() == seen_before


def test_a_node_back_over_the_floor_goes_the_whole_way_and_is_quiet_again_after(cluster: Cluster) -> None:
    cluster.whole(hb(free_bytes=10**6), floor=FLOOR)  # under the floor (an event)
    assert cluster.quiet(hb(free_bytes=2 * 10**6), floor=FLOOR) is not None  # still under: quiet
    assert cluster.quiet(hb(free_bytes=10**12), floor=FLOOR) is None  # back over: an event, the whole way
    cluster.whole(hb(free_bytes=10**12), floor=FLOOR)
    assert cluster.quiet(hb(free_bytes=10**12), floor=FLOOR) is not None


def running_job(cluster: Cluster, ranks: int = 1) -> tuple[int, str]:
    """A job of ``ranks`` ranks on one node, bound by a cycle: (its id, the node)."""
    with cluster.db.session() as s:
        job_id, _ = svc.submit_job(s, cluster.clock.now(), Identity("user", "alice"), {
            "name": "j", "resources": {"ranks": ranks, "gpus_per_rank": 1}, "run": {"command": ["true"]},
            "limits": {"time": "1h"}}, None, single_team=True)
    report = run_cycle(cluster.db, Settings(heartbeat_ttl_s=600.0), cluster.clock.advance(1))
    assert report.bound == [job_id]
    with cluster.db.read() as s:
        nodes = set(s.scalars(select(Rank.node).where(Rank.job_id == job_id)))
    assert len(nodes) == 1
    return job_id, nodes.pop()


def ranks_of(job_id: int, n: int, state: str = "RUNNING", **more: Any) -> list[dict[str, Any]]:
    return [{"job_id": job_id, "attempt": 1, "rank": r, "state": state, **more} for r in range(n)]


def test_a_node_whose_ranks_still_run_is_one_update_with_the_whole_paths_answer(
        cluster: Cluster, writes: list[str]) -> None:
    job_id, node = running_job(cluster, 2)
    assert cluster.quiet(hb(node, ranks=ranks_of(job_id, 2))) is None  # the whole path has not seen them RUNNING
    cluster.whole(hb(node, ranks=ranks_of(job_id, 2, log_tail="epoch 1")))
    writes.clear()
    quick = cluster.quiet(hb(node, ranks=ranks_of(job_id, 2, log_tail="epoch 1")))
    assert quick is not None and writes == ["UPDATE nodes SET"]  # the same tails: not written again
    whole = cluster.whole(hb(node, ranks=ranks_of(job_id, 2, log_tail="epoch 1")))
    assert quick == whole and quick["assignments"] == quick["kill"] == []
    assert [p["name"] for p in quick["peers"]] == [n for n in ("n1", "n2") if n != node]
    writes.clear()
    assert cluster.quiet(hb(node, ranks=ranks_of(job_id, 2, log_tail="epoch 2"))) is not None  # new output
    assert writes == ["UPDATE nodes SET", "UPDATE ranks SET"]
    with cluster.db.read() as s:
        assert set(s.scalars(select(Rank.log_tail).where(Rank.job_id == job_id))) == {"epoch 2"}
    writes.clear()
    assert cluster.quiet(hb(node, ranks=ranks_of(job_id, 2, log_tail="epoch 2"))) is not None
    assert writes == ["UPDATE nodes SET"]  # remembered once written


def _cancel(c: Cluster, job_id: int) -> None:
    with c.db.session() as s:
        svc.cancel_job(s, c.clock.now(), Identity("user", "alice"), job_id)


@pytest.mark.parametrize("change", ["a rank ended", "a rank reports an error", "the agent lost a rank",
                                    "the job was cancelled", "another rank was bound to the node"])
def test_a_node_whose_ranks_changed_goes_the_whole_way(cluster: Cluster, writes: list[str], change: str) -> None:
    job_id, node = running_job(cluster, 1)
    cluster.whole(hb(node, ranks=ranks_of(job_id, 1)))
    beat = hb(node, ranks=ranks_of(job_id, 1))
    if change == "a rank ended":
        beat = hb(node, ranks=ranks_of(job_id, 1, state="EXITED", exit_code=0))
    elif change == "a rank reports an error":
        beat = hb(node, ranks=ranks_of(job_id, 1, error="CUDA out of memory"))
    elif change == "the agent lost a rank":
        beat = hb(node)
    elif change == "the job was cancelled":
        _cancel(cluster, job_id)
    else:  # the other node drained: the next job's rank goes to the same node's second device
        with cluster.db.session() as s:
            s.get(Node, "n2" if node == "n1" else "n1").drained_at = cluster.clock.now()  # type: ignore[union-attr]
        assert running_job(cluster, 1)[1] == node
    seen_before = cluster.node(node)
    writes.clear()
    assert cluster.quiet(beat) is None, change
    assert writes == [] and cluster.node(node) == seen_before


def test_a_rank_bound_to_the_node_is_sent_by_the_whole_path_and_a_finished_one_lets_it_be_quiet(
        cluster: Cluster) -> None:
    with cluster.db.session() as s:
        job_id, _ = svc.submit_job(s, cluster.clock.now(), Identity("user", "alice"), {
            "name": "j", "resources": {"ranks": 1, "gpus_per_rank": 2}, "run": {"command": ["true"]},
            "limits": {"time": "1h"}}, None, single_team=True)
    report = run_cycle(cluster.db, Settings(heartbeat_ttl_s=600.0), cluster.clock.advance(1))
    assert report.bound == [job_id]
    with cluster.db.read() as s:
        node = s.scalar(select(Rank.node).where(Rank.job_id == job_id))
    assert node is not None
    assert cluster.quiet(hb(node)) is None  # ASSIGNED: it must be started
    reply = cluster.whole(hb(node))
    assert [a["job_id"] for a in reply["assignments"]] == [job_id]
    done = [{"job_id": job_id, "attempt": 1, "rank": 0, "state": RankState.EXITED, "exit_code": 0}]
    cluster.whole(hb(node, ranks=done))
    assert cluster.quiet(hb(node)) is not None  # nothing unfinished on it any more


def test_a_steady_heartbeats_mirror_peers_are_worked_out_again_every_peers_ttl(cluster: Cluster) -> None:
    job_id, node = running_job(cluster, 1)
    other = "n2" if node == "n1" else "n1"
    beat = hb(node, ranks=ranks_of(job_id, 1))
    cluster.whole(beat)
    assert [p["name"] for p in cluster.quiet(beat)["peers"]] == [other]  # type: ignore[index]
    with cluster.db.session() as s:
        s.get(Node, other).state = NodeState.DOWN  # type: ignore[union-attr]
    # within PEERS_TTL_S the list is kept (the agent would try the down peer, fail, and try the next)
    assert [p["name"] for p in cluster.quiet(beat)["peers"]] == [other]  # type: ignore[index]
    cluster.clock.advance(PEERS_TTL_S)
    assert cluster.quiet(beat)["peers"] == []  # type: ignore[index]
    assert cluster.whole(beat)["peers"] == []  # as the whole path says
