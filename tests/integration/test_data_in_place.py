"""Data sets from files the nodes already have (``gsched data add``), on real agents over loopback.

WebDataset tars (written once with ``data make``'s own writer) are put under two agents' data dirs, as a
team's files would be; ``data add`` has the agents hash them and link them as shards, the cycle copies
them peer to peer up to R, and a ``[train]`` job of the built-in ResNet-18 on them completes reading
locally.  Bad input is refused naming the node and the file, with nothing stored touched.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from agents.datasets import make_shards
from agents.shardfile import shard_path
from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cluster(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = make_cluster([NodeSpec("n1", "r1", gpus=1), NodeSpec("n2", "r2", gpus=1)]).start()
    made = make_shards(TINY_SOURCE, tmp_path / "built", "x", 4, seed=3, fmt="wds")
    tars = [shard_path(tmp_path / "built", "x", i) for i in range(4)]
    # n1 holds train-000..001, n2 train-001..003: train-001 is on both (one shard, two copies)
    for node, which in (("n1", (0, 1)), ("n2", (1, 2, 3))):
        folder = c.data_dir(node) / "team-files"
        folder.mkdir(parents=True)
        for i in which:
            shutil.copyfile(tars[i], folder / f"train-{i:03d}.tar")
        (folder / "README").write_text("not a shard")
    c.manifest = made  # type: ignore[attr-defined]
    return c


def test_tars_registered_in_place_are_replicated_and_train_reading_locally(cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = cluster
    out = c.cli("data", "add", "team", "--node", "n1", "--node", "n2", "--path", "team-files", "--glob", "*.tar",
                "--replicas", "2")
    assert out.stdout.strip().splitlines()[-1] == "team"
    assert "hashing on n" in out.stderr  # progress per node
    (ds,) = c.admin().get("/v1/datasets")
    assert ds["classes"] == 4 and ds["samples"] == 480  # from the tars' .cls labels
    assert [sh["sha256"] for sh in ds["shards"]] == [s["sha256"] for s in c.manifest["shards"]]
    # the files became shards where they lie: hard links, no copy
    for node, i in (("n1", 0), ("n1", 1), ("n2", 1), ("n2", 3)):
        assert shard_path(c.data_dir(node), "team", i).samefile(c.data_dir(node) / "team-files" / f"train-{i:03d}.tar")
    # the cycle makes the missing copies by peer copy: 2 healthy per shard, one on each node
    c.wait_for(lambda: c.admin().get("/v1/datasets")[0]["replicas_healthy_min"] == 2, 60, "2 healthy copies")
    (ds,) = c.admin().get("/v1/datasets")
    assert all(sorted(r["node"] for r in sh["replicas"]) == ["n1", "n2"] for sh in ds["shards"])
    copied = shard_path(c.data_dir("n1"), "team", 2)
    assert _sha(copied) == c.manifest["shards"][2]["sha256"]

    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("wds", ranks=2, epochs=2, dataset="team"))
    job_id = int(c.cli("submit", str(spec)).stdout.split()[-1])
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    assert doc["local_fraction"] == 1.0 and doc["transfer_bytes"] == 0
    assert [m["epoch"] for m in doc["metrics"]] == [1, 2]


def test_bad_input_is_refused_naming_node_and_file_and_nothing_stored_is_touched(cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = cluster
    c.cli("data", "add", "team", "--node", "n1", "--path", "team-files", "--glob", "*.tar", "--replicas", "1")
    before = {p: _sha(p) for p in (c.data_dir("n1") / "team").iterdir()}
    outside = tmp_path / "outside.tar"
    outside.write_bytes(b"x")
    (c.data_dir("n2") / "team-files" / "escape.tar").symlink_to(outside)

    def refused(*args: str) -> str:
        out = c.cli("data", "add", *args, check=False)
        assert out.returncode != 0, out.stdout
        return out.stderr

    assert "data set 'team' already exists" in refused("team", "--node", "n2", "--path", "team-files")
    assert "node n2 has no only-on-n1" in refused("other", "--node", "n2", "--path", "only-on-n1")
    assert "node n1: no file under team-files matches '*.parquet'" in refused(
        "other", "--node", "n1", "--path", "team-files", "--glob", "*.parquet")
    assert "node n1: ../../etc is outside its data dir" in refused("other", "--node", "n1", "--path", "../../etc")
    assert "team-files/escape.tar is a symlink out of its data dir" in refused(
        "other", "--node", "n2", "--path", "team-files", "--glob", "*.tar")
    assert "node 'n9' is not known" in refused("other", "--node", "n9", "--path", "team-files")
    # nothing was registered, and the stored data set and its files are as they were
    assert [d["name"] for d in c.admin().get("/v1/datasets")] == ["team"]
    assert {p: _sha(p) for p in (c.data_dir("n1") / "team").iterdir()} == before
    assert not (c.data_dir("n2") / "other").exists()


def test_data_ls_shows_each_copy_under_way_with_its_progress(make_cluster):  # type: ignore[no-untyped-def]
    # n2's agent takes at most 4 Mbit/s (0.5 MB/s): copying 2 shards of about 3 MB to it takes seconds,
    # long enough for its heartbeats to report the bytes so far
    c = make_cluster([NodeSpec("n1", "r1"), NodeSpec("n2", "r1", max_transfer_mbps=4.0)])
    c.start_server()
    c.start_agent("n1")
    c.wait_for(lambda: len(c.admin().get("/v1/nodes")) == 1, 30, "agent n1")
    c.cli("data", "make", "big", "--source", "synthetic:samples=2000,size=32", "--shards", "2", "--replicas", "1")
    c.start_agent("n2")
    c.wait_for(lambda: len(c.admin().get("/v1/nodes")) == 2, 30, "agent n2")
    c.cli("data", "place", "big", "--replicas", "2")

    def under_way() -> list[dict]:
        (ds,) = c.admin().get("/v1/datasets")
        return [cp for sh in ds["shards"] for cp in sh["copies"] if 0 < cp["done_bytes"] < cp["bytes"]]

    (first, *_) = c.wait_for(under_way, 60, "a copy reported part-way")
    assert first["src"] == "n1" and first["dst"] == "n2" and first["state"] == "running"
    shown = c.cli("data", "ls").stdout
    assert "n1->n2:running" in shown and "%" in shown
    c.wait_for(lambda: c.admin().get("/v1/datasets")[0]["replicas_healthy_min"] == 2, 120, "both copies")
    (ds,) = c.admin().get("/v1/datasets")
    assert all(sh["copies"] == [] for sh in ds["shards"])


def test_a_file_changed_before_its_link_rolls_the_registration_back(cluster, monkeypatch, capsys):  # type: ignore[no-untyped-def]
    """train-001.tar changes after n1's agent hashed it: its link is refused naming the file, the server
    forgets the data set (the name is free, the link already made for shard 0 is removed, the files stay)
    and the same command then registers the files as they are now."""
    import argparse

    from scheduler.cli import data

    c = cluster
    folder = c.data_dir("n1") / "team-files"
    scan = data._scan

    def scan_then_change(*args, **kw):  # type: ignore[no-untyped-def]
        found = scan(*args, **kw)
        (folder / "train-001.tar").write_bytes((folder / "train-000.tar").read_bytes() + b"changed")
        return found

    monkeypatch.setattr(data, "_scan", scan_then_change)
    args = argparse.Namespace(name="team", node=["n1"], path=["team-files"], glob="*.tar", replicas=1, span=None,
                              classes=None)
    assert data.add_dataset(c.admin(), args) == 2
    err = capsys.readouterr().err
    assert "node n1: team-files/train-001.tar no longer has the bytes registered" in err
    assert "the registration of 'team' was rolled back (shard 1 has no copy) and the name is free again" in err
    assert c.admin().get("/v1/datasets") == []
    c.wait_for(lambda: not shard_path(c.data_dir("n1"), "team", 0).exists(), 30, "shard 0's link removed")
    assert (folder / "train-000.tar").exists() and (folder / "train-001.tar").exists()
    monkeypatch.setattr(data, "_scan", scan)
    c.cli("data", "add", "team", "--node", "n1", "--path", "team-files", "--glob", "*.tar", "--replicas", "1")
    (ds,) = c.admin().get("/v1/datasets")
    assert ds["name"] == "team" and len(ds["shards"]) == 2
