"""Several hosts for real: the server and each node in its own network namespace, linked by veth
pairs and a bridge on a private subnet. A 2-rank DDP job trains across two hosts over those links,
stages shards through a link shaped with ``tc``, and survives the loss of one host's cable.

Root only (``ip netns``); skipped with the reason elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import job_toml
from tests.integration.netlab import NetLab, NetLabUnavailable

pytestmark = pytest.mark.integration

MBIT = 2  # the shaped link's rate, and the cost model's cross-rack bandwidth
# 1200 16x16 images in 4 shards (about 230 kB each): half of them cross the shaped link in ~2 s.
SOURCE = "synthetic:classes=4,samples=1200,size=16,seed=9"


@pytest.fixture
def lab() -> Iterator[NetLab]:
    try:
        net = NetLab(["srv", "h1", "h2", "h3"])
    except NetLabUnavailable as e:
        pytest.skip(str(e))
    yield net
    net.close()
    assert net.leftovers() == [], "namespaces left behind"


def _netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def test_ddp_across_hosts_stages_through_a_shaped_link_and_survives_a_cut_cable(lab, make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    config = tmp_path / "gsched.toml"
    config.write_text(f"[policy]\nlocality_wait_s = 0\n[network]\nsame_rack_gbps = {MBIT / 1000}\n"
                      f"cross_rack_gbps = {MBIT / 1000}\n")
    racks = {"h1": "rack-a", "h2": "rack-b", "h3": "rack-b"}
    nodes = [NodeSpec(h, racks[h], gpus=1, host=lab.address(h), netns=lab.ns(h), iface="eth0") for h in racks]
    c = make_cluster(nodes, ttl_s=4.0, config=str(config), server_host=lab.address("srv"),
                     server_netns=lab.ns("srv"))
    c.start_server()
    # Only h1 is up when the data set is made: every shard lives on h1 alone.
    c.start_agent("h1")
    c.wait_for(lambda: any(n["state"] == "up" for n in c.admin().get("/v1/nodes")), 60, "h1 to report")
    c.cli("data", "make", "wide", "--source", SOURCE, "--shards", "4", "--replicas", "1")
    h1_port = int(next(n for n in c.admin().get("/v1/nodes") if n["name"] == "h1")["address"].rsplit(":", 1)[1])
    for h in ("h2", "h3"):
        lab.limit(h, MBIT, from_port=h1_port)  # what h1's data server sends to h2 or h3 is shaped
        c.start_agent(h)
    c.wait_for(lambda: sum(n["state"] == "up" for n in c.admin().get("/v1/nodes")) == 3, 60, "h2 and h3 to report")
    assert {n["address"].rsplit(":", 1)[0] for n in c.admin().get("/v1/nodes")} == {lab.address(h) for h in racks}

    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("across", ranks=2, epochs=4, dataset="wide", limits='time = "20m"', extra="seed = 4"))
    job_id = int(c.cli("submit", str(spec)).stdout.split()[-1])
    doc = c.wait_for(lambda: (d := c.job(job_id))["state"] == "RUNNING" and d, 240, "the job to run")

    # One rank on h1 (local reads), one on h2 or h3 (its shards staged across racks).
    placed = {r["rank"]: r["node"] for r in doc["ranks"]}
    assert "h1" in placed.values() and len(set(placed.values())) == 2, placed
    other = next(n for n in placed.values() if n != "h1")
    remote_rank = next(k for k, n in placed.items() if n == other)

    # The two rank processes really run in the two hosts' namespaces (gloo talks over the veth links).
    pids = c.wait_for(lambda: (p := c.rank_pids()) and len(p) == 2 and p, 30, "two rank processes")
    rank_netns = {_netns_inode(f"/proc/{p}/ns/net") for p in pids}
    assert rank_netns == {_netns_inode(f"/run/netns/{lab.ns(h)}") for h in ("h1", other)}

    # The cost model's estimate (bytes / configured bandwidth) is within 2x of the measured staging time.
    doc = c.wait_for(lambda: (d := c.job(job_id))["progress"].get("staged_ranks") and d, 30, "staging figures")
    staged = doc["progress"]["staged_ranks"][str(remote_rank)]
    assert staged["bytes"] == doc["transfer_bytes"] > 0
    estimate_s = doc["transfer_cost_ms"] / 1000
    assert estimate_s > 1.0  # slow enough that the link, not process start-up, dominates
    assert estimate_s / 2 <= staged["seconds"] <= estimate_s * 2, (staged, estimate_s)
    assert all(not s["local"] for s in doc["shards"] if s["rank"] == remote_rank)

    # Cut the cable of the host that staged (after lifting the shaping: the checkpoint may follow that path).
    c.wait_for(lambda: c.job(job_id)["checkpoints"], 240, "a first checkpoint")
    lab.unlimit("h2")
    lab.unlimit("h3")
    lab.cut(other)
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    assert doc["restarts"] == 1
    assert f"node {other} is down" in next(e["message"] for e in doc["events"] if e["kind"] == "job.requeue")
    assert other not in {r["node"] for r in doc["ranks"]}
    assert sorted(r["node"] for r in doc["ranks"]) == sorted({"h1", "h2", "h3"} - {other})
    assert [m["epoch"] for m in doc["metrics"]] == [1, 2, 3, 4]
    assert Path(f"/run/netns/{lab.ns(other)}").exists()  # removed by the fixture, checked there
