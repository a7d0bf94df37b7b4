"""The data store across real agents: staging from peers, corruption found and repaired, re-replication."""

from __future__ import annotations

import json
import signal
import time

import pytest

from agents.shardfile import sha256_file, shard_path
from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration


def datasets(c) -> dict:  # type: ignore[no-untyped-def]
    return {d["name"]: d for d in json.loads(c.cli("data", "ls", "--json").stdout)}


def healthy_copies(c, name: str) -> dict[int, list[str]]:  # type: ignore[no-untyped-def]
    return {sh["index"]: sorted(r["node"] for r in sh["replicas"] if r["state"] == "healthy")
            for sh in datasets(c)[name]["shards"]}


def test_job_on_a_node_without_its_data_stages_every_shard_and_completes(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    # n3 in the copies' rack and one-rank blockers: the data set's layout (two whole copies, one rack)
    # is then already what its jobs call for, so the background re-balance copies nothing to n3.  The
    # copies the job stages there are surplus to that layout once it is over: without a node cache the
    # re-balance drops them, sooner or later after the job (on a loaded machine before the checks
    # below: they failed so); with one they stay (node_cache_gb, scheduler/server/replication.py).
    c = make_cluster([NodeSpec("n1", "r1"), NodeSpec("n2", "r1"), NodeSpec("n3", "r1")],
                     extra_env={"GSCHED_LOCALITY_WAIT_S": "0", "GSCHED_NODE_CACHE_GB": "1"})
    c.start_server()
    c.start_agent("n1")
    c.start_agent("n2")
    c.wait_for(lambda: len(c.admin().get("/v1/nodes")) == 2, 30, "two agents")
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "4", "--replicas", "2")
    c.start_agent("n3")
    c.wait_for(lambda: len(c.admin().get("/v1/nodes")) == 3, 30, "the third agent")
    assert all(nodes == ["n1", "n2"] for nodes in healthy_copies(c, "tiny").values())

    # Occupy n1 and n2 so that n3, which holds nothing, is the only free node.
    blocker = tmp_path / "blocker.toml"
    blocker.write_text(job_toml("blocker", ranks=1, epochs=500))
    blockers = [int(c.cli("submit", str(blocker)).stdout.split()[-1]) for _ in range(2)]
    assert sorted(c.wait_job(b, "RUNNING", timeout=120)["ranks"][0]["node"] for b in blockers) == ["n1", "n2"]
    spec = tmp_path / "remote.toml"
    spec.write_text(job_toml("remote", ranks=1, epochs=1))
    job_id = int(c.cli("submit", str(spec)).stdout.split()[-1])

    doc = c.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=240)
    assert doc["state"] == "COMPLETED", doc["reason"]
    assert [r["node"] for r in doc["ranks"]] == ["n3"]
    assert all(not s["local"] and s["source"] in ("n1", "n2") for s in doc["shards"])
    manifest = {sh["index"]: sh for sh in datasets(c)["tiny"]["shards"]}
    # Every staged shard is on n3's disk with the manifest's checksum ...
    for s in doc["shards"]:
        path = shard_path(c.data_dir("n3"), "tiny", s["shard"])
        assert sha256_file(path) == manifest[s["shard"]]["sha256"]
    # ... and the job's recorded transfer is exactly their total.
    assert doc["transfer_bytes"] == sum(manifest[s["shard"]]["bytes"] for s in doc["shards"])
    assert doc["local_fraction"] == 0.0
    n3 = next(n for n in c.admin().get("/v1/nodes") if n["name"] == "n3")
    assert n3["staged_bytes"] == doc["transfer_bytes"]
    pairs = c.admin().get("/v1/transfers")
    assert sum(p["bytes"] for p in pairs if p["dst"] == "n3" and p["kind"] == "staging") == doc["transfer_bytes"]
    # The node cache keeps them: cycles later, n3 still holds every staged shard, a healthy copy.
    time.sleep(3)
    assert all("n3" in healthy_copies(c, "tiny")[s["shard"]] for s in doc["shards"])
    assert all(shard_path(c.data_dir("n3"), "tiny", s["shard"]).is_file() for s in doc["shards"])
    for b in blockers:
        c.cli("cancel", str(b))


def test_corrupt_replica_is_detected_never_read_locally_and_repaired(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = make_cluster([NodeSpec("n1"), NodeSpec("n2")], scrub_interval_s=1.0).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "2")
    # `data make` returns once each shard has one healthy copy: corrupt a settled one.
    c.wait_for(lambda: healthy_copies(c, "tiny") == {0: ["n1", "n2"], 1: ["n1", "n2"]}, 60,
               "both copies of each shard")
    path = shard_path(c.data_dir("n1"), "tiny", 0)
    good = sha256_file(path)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # flip one byte of a sample, keep size and times close
    path.write_bytes(bytes(data))

    def state_on_n1() -> str:
        sh = next(s for s in datasets(c)["tiny"]["shards"] if s["index"] == 0)
        return next(r["state"] for r in sh["replicas"] if r["node"] == "n1")

    # The event, not the replica's state: "corrupt" lasts only until the repair from n2 lands (a
    # cycle and one copy later), and a poll on a loaded machine once missed it (CI: n1's log showed
    # "replica tiny/0 copied from n2", the repair, and the wait for "corrupt" timed out).
    def reported() -> bool:
        return any("replica.corrupt" in line and "tiny/0 on n1" in line for line in c.cli("events").stdout.splitlines())

    c.wait_for(reported, 30, "the corrupt copy to be reported")
    c.wait_for(lambda: state_on_n1() == "healthy", 60, "the copy to be repaired from n2")
    assert sha256_file(path) == good
    assert healthy_copies(c, "tiny") == {0: ["n1", "n2"], 1: ["n1", "n2"]}


def test_lost_node_leads_to_r_healthy_replicas_on_the_survivors(make_cluster):  # type: ignore[no-untyped-def]
    c = make_cluster([NodeSpec("n1", "r1"), NodeSpec("n2", "r1"), NodeSpec("n3", "r2")], ttl_s=3.0).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "6", "--replicas", "2")
    before = healthy_copies(c, "tiny")
    assert all(len(v) == 2 for v in before.values())
    victim = max(("n1", "n2", "n3"), key=lambda n: sum(n in v for v in before.values()))
    c.kill(f"agent-{victim}", signal.SIGKILL)
    c.wait_for(lambda: next(n for n in c.admin().get("/v1/nodes") if n["name"] == victim)["state"] == "down",
               30, f"{victim} to be marked down")

    def repaired() -> bool:
        copies = healthy_copies(c, "tiny")
        return all(len([n for n in v if n != victim]) >= 2 for v in copies.values())

    c.wait_for(repaired, 90, "every shard to have 2 healthy copies on the survivors")
    survivors = sorted({"n1", "n2", "n3"} - {victim})
    for idx, nodes in healthy_copies(c, "tiny").items():
        assert sorted(n for n in nodes if n != victim) == survivors, idx
