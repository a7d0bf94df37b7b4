"""The seed's own case on real agents: two one-device nodes, a data set of one copy, a 2-rank job.

With one copy striped over the two nodes (``scheduler.core.replicas.lay_out``), each rank reads its half
from its own disk; with the copy kept whole on one node the second rank staged half the data set.
"""

from __future__ import annotations

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration


def test_two_rank_job_over_two_nodes_reads_a_one_copy_data_set_all_locally(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = make_cluster([NodeSpec("n1", "r1", gpus=1), NodeSpec("n2", "r1", gpus=1)]).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "4", "--replicas", "1")
    (ds,) = c.admin().get("/v1/datasets")
    holders = {sh["index"]: [r["node"] for r in sh["replicas"]] for sh in ds["shards"]}
    assert ds["span"] == 2
    assert holders == {0: ["n1"], 1: ["n2"], 2: ["n1"], 3: ["n2"]}  # striped: {0, 2} and {1, 3}
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("gang", ranks=2, epochs=1))
    job_id = int(c.cli("submit", str(spec)).stdout.split()[-1])
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    assert sorted(r["node"] for r in doc["ranks"]) == ["n1", "n2"]
    assert doc["local_fraction"] == 1.0 and doc["transfer_bytes"] == 0
    assert all(s["local"] for s in doc["shards"])


def test_a_whole_copy_is_restriped_for_the_two_node_jobs_that_read_it(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    """Nodes of two devices: one copy starts whole (most jobs fit on one node).  Its jobs take 2 ranks x 2
    devices, so each spans both nodes; the first reads half locally.  The cycle notes the span, moves
    stripe {1, 3} to the other node in the background and drops the first copies once the job is over;
    the next job reads everything locally."""
    import time

    c = make_cluster([NodeSpec("n1", "r1", gpus=2), NodeSpec("n2", "r1", gpus=2)]).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "4", "--replicas", "1")
    (ds,) = c.admin().get("/v1/datasets")
    assert ds["span"] == 1
    (whole,) = {r["node"] for sh in ds["shards"] for r in sh["replicas"]}  # all four shards on one node
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("gang", ranks=2, gpus=2, epochs=1))
    first = int(c.cli("submit", str(spec)).stdout.split()[-1])
    doc = c.wait_job(first, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    assert sorted(r["node"] for r in doc["ranks"]) == ["n1", "n2"] and doc["local_fraction"] == 0.5
    other = "n2" if whole == "n1" else "n1"
    want = {0: [whole], 1: [other], 2: [whole], 3: [other]}  # stripe {0, 2} stays, {1, 3} moves
    deadline = time.time() + 120
    while True:
        (ds,) = c.admin().get("/v1/datasets")
        holders = {sh["index"]: sorted(r["node"] for r in sh["replicas"] if r["state"] == "healthy")
                   for sh in ds["shards"]}
        assert all(holders[i] for i in range(4))  # never without a healthy copy
        if holders == want or time.time() > deadline:
            break
        time.sleep(0.5)
    assert (ds["span"], holders) == (2, want)
    second = int(c.cli("submit", str(spec)).stdout.split()[-1])
    doc = c.wait_job(second, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    assert doc["local_fraction"] == 1.0 and doc["transfer_bytes"] == 0
