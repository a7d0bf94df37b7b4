"""The disk floor on a real small filesystem: node n1's data dir is a 64 MB tmpfs, filled to under the
server's floor (``GSCHED_DISK_FLOOR_GB=0.032``, 32 MB).  Nothing n1 stores is lost, new ranks and new
copies go to n2, and ``gsched nodes`` and ``gsched explain`` name the reason; once n1 has room again it
is no longer held back.

Root only (``mount -t tmpfs``); skipped with the reason elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agents.shardfile import sha256_file, shard_path
from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration

MB = 1_000_000


def _mount_tmpfs(where: Path, size_mb: int) -> None:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")


def _nodes(c) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return {n["name"]: n for n in c.admin().get("/v1/nodes")}


def test_a_node_filled_to_the_floor_keeps_what_it_holds_and_new_work_goes_to_the_other(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = make_cluster([NodeSpec("n1"), NodeSpec("n2")], extra_env={"GSCHED_DISK_FLOOR_GB": "0.032"})
    small = c.data_dir("n1")
    _mount_tmpfs(small, 64)
    try:
        c.start()
        c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "2")
        (ds,) = c.admin().get("/v1/datasets")
        assert all(sorted(r["node"] for r in sh["replicas"]) == ["n1", "n2"] for sh in ds["shards"])
        sha = {sh["index"]: sh["sha256"] for sh in ds["shards"]}
        assert {i: sha256_file(shard_path(small, "tiny", i)) for i in sha} == sha

        # Fill n1's 64 MB to 16 MB free: under the 32 MB floor.
        filler = small / "filler"
        with open(filler, "wb") as f:
            f.write(b"\1" * (shutil.disk_usage(small).free - 16 * MB))
        c.wait_for(lambda: _nodes(c)["n1"]["low_disk"], 30, "n1 to report its disk under the floor")
        assert _nodes(c)["n1"]["low_disk"].startswith("low disk: 16.")
        assert _nodes(c)["n2"]["low_disk"] == ""

        # Two one-rank jobs, one device per node: the first (long) runs on n2, the second waits for it.
        long_spec, spec = tmp_path / "long.toml", tmp_path / "job.toml"
        long_spec.write_text(job_toml("long", ranks=1, epochs=1000))
        spec.write_text(job_toml("short", ranks=1, epochs=1))
        first = int(c.cli("submit", str(long_spec)).stdout.split()[-1])
        c.wait_job(first, "RUNNING", timeout=120)
        assert [r["node"] for r in c.job(first)["ranks"]] == ["n2"]
        second = int(c.cli("submit", str(spec)).stdout.split()[-1])
        doc = c.admin().get(f"/v1/jobs/{second}/explain")
        assert doc["state"] == "PENDING"
        assert [o["node"] for o in doc["left_out"]] == ["n1"] and "low disk" in doc["left_out"][0]["reason"]
        words = " ".join(c.cli("explain", str(second), env={"COLUMNS": "200"}).stdout.split())
        assert "nodes left out (no new ranks): n1 (low disk: 16." in words
        words = " ".join(c.cli("nodes", env={"COLUMNS": "200"}).stdout.split())
        assert "low disk: 16." in words and "under the 32.0 MB floor" in words

        # A new data set of two copies: its copies land on n2 only, not on the full n1.
        c.cli("data", "make", "tiny2", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "2")
        (ds2,) = [d for d in c.admin().get("/v1/datasets") if d["name"] == "tiny2"]
        assert {r["node"] for sh in ds2["shards"] for r in sh["replicas"]} == {"n2"}

        # Once the first job is gone the second runs on n2 too, though n1's device is free.
        c.cli("cancel", str(first))
        doc = c.wait_job(second, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        assert doc["state"] == "COMPLETED", doc["reason"]
        assert [r["node"] for r in doc["ranks"]] == ["n2"]

        # Nothing n1 stored was lost or damaged.
        assert {i: sha256_file(shard_path(small, "tiny", i)) for i in sha} == sha
        assert {sh["index"]: sorted(r["node"] for r in sh["replicas"] if r["state"] == "healthy")
                for sh in c.admin().get("/v1/datasets")[0]["shards"]} == {0: ["n1", "n2"], 1: ["n1", "n2"]}

        # Room again: n1 is no longer held back.
        filler.unlink()
        c.wait_for(lambda: not _nodes(c)["n1"]["low_disk"], 30, "n1 to report room again")
        events = [e["kind"] for e in c.admin().get("/v1/events", limit=1000)
                  if e.get("node") == "n1" and "disk" in e["kind"]]
        assert events == ["node.low_disk", "node.disk_ok"]
    finally:
        c.close()
        subprocess.run(["umount", "-l", str(small)], check=False)
