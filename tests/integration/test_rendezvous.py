"""Rendezvous ports on a real cluster: a port another process holds is never handed out, and a job
whose rank 0 cannot get a port goes back to the queue instead of failing (agents/ports.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration

# Below Linux's ephemeral range and apart from the blocks LocalCluster gives its agents (29500-30399).
FIRST = 31700


@contextmanager
def holding(port: int) -> Iterator[socket.socket]:
    """Another process's server on ``port``: bound on the wildcard address and listening."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen()
    try:
        yield s
    finally:
        s.close()


def one_node(make_cluster, ports: str, wait_s: float | None = None):  # type: ignore[no-untyped-def]
    c = make_cluster([NodeSpec("n1", gpus=2, rendezvous_ports=ports, rendezvous_wait_s=wait_s)]).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "1")
    return c


def submit(c, tmp_path, limits: str = 'time = "10m"') -> int:  # type: ignore[no-untyped-def]
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("rdv", ranks=2, epochs=1, extra="checkpoint = false", limits=limits))
    return int(c.cli("submit", str(spec)).stdout.split()[-1])


def test_a_port_another_process_listens_on_is_skipped_and_the_job_completes(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = one_node(make_cluster, f"{FIRST}-{FIRST + 1}")
    # The agent starts n1 at its own place in the range; hold both ports' first user away from it by
    # holding each in turn: whichever it would try first, the job must get the other one.
    for held in (FIRST, FIRST + 1):
        with holding(held):
            job = submit(c, tmp_path)
            doc = c.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        assert doc["state"] == "COMPLETED", doc["reason"]
        assert doc["master_port"] == (FIRST + 1 if held == FIRST else FIRST)
        assert doc["restarts"] == 0  # the held port was never tried


def test_no_free_rendezvous_port_requeues_the_job_without_using_a_retry(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = one_node(make_cluster, str(FIRST + 2), wait_s=1.0)
    with holding(FIRST + 2):
        # retry_on_failure = 0: were the rendezvous failure counted as the job's, it would end FAILED.
        job = submit(c, tmp_path, limits='time = "10m"\nmax_restarts = 20\nretry_on_failure = 0')
        requeued = c.wait_for(lambda: [e for e in c.admin().get("/v1/events", job=job)
                                       if e["kind"] == "job.requeue"], 120, "a rendezvous requeue")
    assert "no free rendezvous port" in requeued[0]["message"] and str(FIRST + 2) in requeued[0]["message"]
    doc = c.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    assert doc["restarts"] >= 1 and doc["master_port"] == FIRST + 2
    events = c.cli("events", "--job", str(job)).stdout
    assert "job.requeue" in events and "rendezvous" in events


def test_many_two_rank_jobs_starting_at_once_on_one_node_all_complete(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    """Six 2-rank jobs bound in one cycle to one 12-device node: six rank 0s take ports at once, and
    their siblings' gloo connections draw ephemeral ports meanwhile; none may meet another's port."""
    c = make_cluster([NodeSpec("n1", gpus=12)], threads_per_rank=1).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "1")
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("burst", ranks=2, epochs=1, extra="checkpoint = false"))
    jobs = [int(c.cli("submit", str(spec)).stdout.split()[-1]) for _ in range(6)]
    docs = [c.wait_job(j, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=600) for j in jobs]
    assert [d["state"] for d in docs] == ["COMPLETED"] * 6, [d["reason"] for d in docs]
    ports = [d["master_port"] for d in docs]
    first, last = (int(p) for p in c.rendezvous_ports("n1").split("-"))
    assert len(set(ports)) == 6 and all(first <= p <= last for p in ports), ports
