"""A finished job's files on real agents: its owner saves them with ``gsched fetch`` (the checkpoint
verified against its recorded SHA-256), another user may not, and the nodes remove the job's
directories once their ``--job-retention`` has passed since it ended."""

from __future__ import annotations

import hashlib
import json

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration

RETENTION_S = 15


def test_the_owner_fetches_a_finished_job_and_the_nodes_remove_it_after_the_retention(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    nodes = [NodeSpec(n, job_retention=f"{RETENTION_S}s") for n in ("n1", "n2")]
    c = make_cluster(nodes).start()
    alice, bob = c.add_user("alice"), c.add_user("bob")
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "2")
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("keepme", ranks=1, epochs=2))
    job_id = int(c.cli("submit", str(spec), token=alice).stdout.split()[-1])
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    final = max(doc["checkpoints"], key=lambda ck: ck["epoch"])
    holders = set(final["nodes"])
    assert holders and all((c.data_dir(n) / ".gsched" / "jobs" / str(job_id)).is_dir() for n in holders)

    out = tmp_path / "saved"
    done = c.cli("fetch", str(job_id), "--out", str(out), token=alice)
    name = final["path"].rsplit("/", 1)[-1]
    assert hashlib.sha256((out / name).read_bytes()).hexdigest() == final["sha256"]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # a line an epoch at least, all of the job's one attempt
    assert len(lines) >= 2 and {x["attempt"] for x in lines} == {doc["attempt"]} == {1}, lines
    assert (out / "rank-0.log").read_text()
    assert f"checkpoint epoch {final['epoch']}" in done.stdout

    denied = c.cli("fetch", str(job_id), "--out", str(tmp_path / "bob"), token=bob, check=False)
    assert denied.returncode == 5, denied.stderr  # only the owner and admins
    assert not (tmp_path / "bob" / name).exists()

    # The retention passes: every node that held the job's directory removes it.
    c.wait_for(lambda: not any((c.data_dir(n) / ".gsched" / "jobs" / str(job_id)).exists() for n in ("n1", "n2")),
               RETENTION_S + 90, "the nodes to remove the job's directories")
    gone = c.cli("fetch", str(job_id), "--out", str(tmp_path / "late"), token=alice, check=False)
    assert gone.returncode == 1 and "not fetched" in gone.stderr
    assert (tmp_path / "late" / "metrics.jsonl").exists()  # what the server holds is still there
