"""Slurm's everyday verbs against a real server and agent: drain and resume a node, hold and release,
update, requeue, cancel by id and by filter, history and the queue filtered on the server, with the
exit status of each (docs/cli.md).  The built-in training job, on one node of two CPU devices."""

from __future__ import annotations

import json

import pytest

from scheduler.cli.localcluster import LocalCluster, NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):  # type: ignore[no-untyped-def]
    c = LocalCluster(tmp_path_factory.mktemp("jobctl"), [NodeSpec("n1", gpus=2)], cycle_s=0.5).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "1")
    c.alice = c.add_user("alice")  # type: ignore[attr-defined]
    c.bob = c.add_user("bob")  # type: ignore[attr-defined]
    yield c
    c.close()


def samples(c: LocalCluster) -> int:
    return len(c.admin().get("/v1/cluster/history"))


def cycles_pass(c: LocalCluster, n: int = 2) -> None:
    """Wait until ``n`` more scheduling cycles have run (each leaves a cluster sample)."""
    start = samples(c)
    c.wait_for(lambda: samples(c) >= start + n, 60, f"{n} more cycles")


def submit(c: LocalCluster, tmp_path, token: str, *flags: str, name: str = "j", epochs: int = 200) -> int:  # type: ignore[no-untyped-def]
    path = tmp_path / f"{name}.toml"
    path.write_text(job_toml(name, ranks=1, epochs=epochs))
    return int(c.cli("submit", str(path), *flags, token=token).stdout.split()[0])  # the id comes first


def test_drain_hold_release_update_requeue(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    out = c.cli("node", "drain", "n1", "--reason", "disk swap")
    assert "drained (disk swap)" in out.stdout
    nodes = json.loads(c.cli("nodes", "-o", "json").stdout)
    assert [(n["name"], n["drained"], n["drain_reason"]) for n in nodes] == [("n1", True, "disk swap")]
    lines = c.cli("nodes", "--format", "name,state,reason").stdout.splitlines()
    assert lines[0].split() == ["NODE", "STATE", "REASON"] and lines[1].split() == ["n1", "drained", "disk", "swap"]
    assert c.cli("node", "drain", "n1", token=c.alice, check=False).returncode == 5  # admins only
    assert c.cli("node", "drain", "n9", check=False).returncode == 4
    made = c.cli("data", "make", "other", "--source", TINY_SOURCE, "--shards", "1", "--replicas", "1", check=False)
    assert made.returncode == 2 and "drained" in made.stderr  # no new copies on a drained node

    job = submit(c, tmp_path, c.alice, "--name", "ctl", "--time", "2h")
    cycles_pass(c)
    assert c.job(job)["state"] == "PENDING"  # the only node is drained: nothing lands on it

    out = c.cli("hold", str(job), token=c.alice)
    assert f"job {job}: PENDING (held by alice)" in out.stdout
    assert c.cli("hold", str(job), token=c.bob, check=False).returncode == 5  # not bob's job
    wide = c.cli("queue", "-o", "wide", token=c.alice).stdout.splitlines()
    assert "PENDING(held)" in next(line for line in wide if line.startswith(str(job)))
    c.cli("node", "resume", "n1")
    cycles_pass(c)
    assert c.job(job)["state"] == "PENDING"  # held: the free node does not take it
    assert c.job(job)["reason"].startswith("held by alice")

    # A pending job: rename it and give it more time.
    out = c.cli("update", str(job), "--name", "ctl2", "--time", "3:00:00", token=c.alice)
    assert f"job {job}: name ctl2, time limit 10800 s" in out.stdout

    c.cli("release", str(job), token=c.alice)
    c.wait_job(job, "RUNNING", timeout=120)
    # Draining the node under a running job: it keeps running (only new ranks are kept off).
    c.cli("node", "drain", "n1", "--reason", "after this job")
    cycles_pass(c)
    assert c.job(job)["state"] == "RUNNING"
    c.cli("node", "resume", "n1")
    # Running: the time limit only goes down, and the name stays.
    up = c.cli("update", str(job), "--time", "4h", token=c.alice, check=False)
    assert up.returncode == 2 and "may only go down" in up.stderr
    assert c.cli("update", str(job), "--name", "x", token=c.alice, check=False).returncode == 2
    assert "time limit 3600 s" in c.cli("update", str(job), "--time", "1h", token=c.alice).stdout
    assert (c.job(job)["time_limit_s"], c.job(job)["name"]) == (3600, "ctl2")

    restarts = c.job(job)["restarts"]
    out = c.cli("requeue", str(job), token=c.alice)
    assert f"job {job}: PENDING" in out.stdout
    c.wait_for(lambda: c.job(job)["restarts"] == restarts + 1 and c.job(job)["state"] == "RUNNING", 120,
               "the requeued job to run again")
    out = c.cli("cancel", str(job), token=c.alice)
    assert f"job {job}: CANCELLED" in out.stdout
    assert c.cli("requeue", str(job), token=c.alice, check=False).returncode == 2  # ended: 409


def test_cancel_by_ids_and_by_filter_with_the_worst_status(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    c.cli("node", "drain", "n1")
    try:
        batch = [submit(c, tmp_path, c.alice, "--name", "batch") for _ in range(3)]
        other = submit(c, tmp_path, c.alice, "--name", "keep")
        bobs = submit(c, tmp_path, c.bob, "--name", "batch")
        out = c.cli("cancel", "--name", "batch", "--user", "alice", token=c.alice)
        assert sorted(out.stdout.splitlines()) == sorted(f"job {j}: CANCELLED" for j in batch)
        assert c.job(other)["state"] == "PENDING" and c.job(bobs)["state"] == "PENDING"
        # Several ids: each is tried; the status is the worst (4: no such job; 5: bob's job).
        out = c.cli("cancel", str(other), "999999", token=c.alice, check=False)
        assert out.returncode == 4 and f"job {other}: CANCELLED" in out.stdout and "no job 999999" in out.stderr
        out = c.cli("cancel", str(bobs), "999999", token=c.alice, check=False)
        assert out.returncode == 5 and c.job(bobs)["state"] == "PENDING"
        assert c.cli("cancel", token=c.alice, check=False).returncode == 2  # nothing named
        assert c.cli("cancel", "--user", "bob", token=c.bob).stdout.strip() == f"job {bobs}: CANCELLED"
    finally:
        c.cli("node", "resume", "n1")


def test_history_is_filtered_and_paged_on_the_server(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    done = submit(c, tmp_path, c.alice, "--name", "short", "--wait", epochs=1)
    c.wait_job(done, "COMPLETED", timeout=300)
    rows = json.loads(c.cli("history", "--name", "short", "-o", "json", token=c.alice).stdout)["jobs"]
    assert [(r["id"], r["state"]) for r in rows] == [(done, "COMPLETED")]
    cancelled = json.loads(c.cli("history", "--state", "cancelled", "--user", "alice", "-o", "json").stdout)["jobs"]
    assert cancelled and {r["state"] for r in cancelled} == {"CANCELLED"} and {r["user"] for r in cancelled} == {"alice"}
    everything = json.loads(c.cli("history", "-o", "json").stdout)["jobs"]
    assert {r["state"] for r in everything} <= {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}
    # One page of two, then the next from where it ended: the pages make up the whole.
    first = json.loads(c.cli("history", "--limit", "2", "-o", "json").stdout)
    rest = json.loads(c.cli("history", "--after", str(first["next"]), "-o", "json").stdout)
    assert [r["id"] for r in first["jobs"] + rest["jobs"]] == [r["id"] for r in everything]
    assert json.loads(c.cli("history", "--since", "2099-01-01", "-o", "json").stdout)["jobs"] == []
    assert done in [r["id"] for r in json.loads(c.cli("history", "--since", "1h", "-o", "json").stdout)["jobs"]]
    table = c.cli("history", "--format", "id,state,elapsed", "--name", "short").stdout.splitlines()
    assert table[0].split() == ["JOBID", "STATE", "ELAPSED"] and table[1].split()[:2] == [str(done), "COMPLETED"]
    bad = c.cli("history", "--format", "id,colour", check=False)
    assert bad.returncode == 2 and "colour" in bad.stderr and "known:" in bad.stderr
    assert c.cli("history", "--state", "running", check=False).returncode == 2


def test_submit_wait_exits_with_the_jobs_result(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    path = tmp_path / "fails.toml"
    path.write_text(job_toml("fails", ranks=1, epochs=1))
    # A time limit of one second: the job cannot finish, it ends TIMEOUT, and --wait says so with 1.
    out = c.cli("submit", str(path), "--time", "1", "--wait", token=c.alice, check=False)
    job = int(out.stdout.split()[0])
    assert out.returncode == 1 and f"job {job}: TIMEOUT" in out.stdout
    assert (c.job(job)["state"], c.job(job)["time_limit_s"]) == ("TIMEOUT", 1)


def test_queue_has_no_cap_and_filters_on_the_server(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    c.cli("node", "drain", "n1")
    try:
        bob = c.client(c.bob)
        spec = {"name": "many", "resources": {"ranks": 1}, "data": {"dataset": "tiny"}}
        ids = [bob.post("/v1/jobs", {"spec": spec})["id"] for _ in range(520)]
        view = json.loads(c.cli("queue", "--user", "bob", "--state", "pending", "-o", "json", token=c.alice).stdout)
        assert [j["id"] for j in view["jobs"]] == ids  # all 520, more than the old cap of 500
        page = c.admin().get("/v1/jobs", user="bob", limit=500)
        assert len(page["jobs"]) == 500 and page["next"] == ids[499]
        mine = json.loads(c.cli("queue", "--mine", "-o", "json", token=c.alice).stdout)["jobs"]
        assert all(j["user"] == "alice" for j in mine)
        lines = c.cli("queue", "--user", "bob", "--format", "id,user,state").stdout.splitlines()
        assert len(lines) == 521 and lines[1].split() == [str(ids[0]), "bob", "PENDING"]
        out = c.cli("cancel", "--user", "bob", "--state", "pending", token=c.bob)
        assert len(out.stdout.splitlines()) == 520
    finally:
        c.cli("node", "resume", "n1")


def test_dependencies_start_after_their_jobs_or_fail_saying_why(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    first = submit(c, tmp_path, c.alice, "--name", "first", epochs=1)
    after_ok = submit(c, tmp_path, c.alice, "--name", "after-ok", "--dependency", f"afterok:{first}", epochs=1)
    after_not_ok = submit(c, tmp_path, c.alice, "--name", "after-not-ok", "--dependency", f"afternotok:{first}")
    assert c.job(after_ok)["reason"] == f"waiting for dependency afterok:{first}"
    assert c.job(after_ok)["dependency"] == f"afterok:{first}"
    c.wait_job(first, "COMPLETED", timeout=300)
    c.wait_job(after_ok, "COMPLETED", timeout=300)  # it ran once the first completed
    c.wait_job(after_not_ok, "FAILED", timeout=60)
    assert c.job(after_not_ok)["reason"] == (f"dependency afternotok:{first} can never be satisfied: "
                                             f"job {first} ended COMPLETED")
    assert c.job(after_not_ok)["started_at"] is None  # it never ran
    # A dependency on a job that does not exist, or written wrong, is refused at submit (exit 2).
    path = tmp_path / "dep.toml"
    path.write_text(job_toml("dep", ranks=1))
    for bad, words in (("afterok:999999", "no job 999999"), ("after:1", "kind must be one of")):
        out = c.cli("submit", str(path), "--dependency", bad, token=c.alice, check=False)
        assert out.returncode == 2 and words in out.stderr, out.stderr


def test_submit_flags_override_the_file(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    path = tmp_path / "base.toml"
    path.write_text(job_toml("base", ranks=1, dataset="nope", limits='time = "10m"'))
    c.cli("node", "drain", "n1")
    try:
        out = c.cli("submit", str(path), "--name", "over", "--ranks", "2", "--gpus-per-rank", "1", "--dataset", "tiny",
                    "--time", "1-00:00:00", token=c.alice)
        job = c.job(int(out.stdout.split()[0]))
        spec = job["spec"]  # as stored: the flags' values, not the file's
        assert (spec["name"], spec["resources"], spec["data"]["dataset"], spec["limits"]["time"]) == \
            ("over", {"ranks": 2, "gpus_per_rank": 1}, "tiny", 86400)
        c.cli("cancel", str(job["id"]), token=c.alice)
        bad = c.cli("submit", str(path), "--dataset", "tiny", "--ranks", "0", token=c.alice, check=False)
        assert bad.returncode == 2 and "resources.ranks" in bad.stderr
        bad = c.cli("submit", str(path), "--dataset", "tiny", "--time", "forever", token=c.alice, check=False)
        assert bad.returncode == 2 and "--time" in bad.stderr
    finally:
        c.cli("node", "resume", "n1")


def test_an_array_runs_one_job_per_index_at_most_its_cap_at_once(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = cluster
    path = tmp_path / "arr.toml"
    path.write_text(job_toml("arr", ranks=1, epochs=1))
    out = c.cli("submit", str(path), "--array", "0-2%1", "--wait", token=c.alice, check=False)
    assert out.returncode == 0, out.stderr
    first = int(out.stdout.split()[0])
    ids = [int(line.split()[1].rstrip(":")) for line in out.stdout.splitlines()[1:]]
    assert ids[0] == first and len(ids) == 3 and out.stdout.count("COMPLETED") == 3
    jobs = [c.job(i) for i in ids]
    assert [(j["array_job_id"], j["array_index"], j["array_count"]) for j in jobs] == \
        [(first, 0, 3), (first, 1, 3), (first, 2, 3)]
    # %1 on a node with room for two: each started only after the one before it ended.
    for before, after in zip(jobs, jobs[1:], strict=False):
        assert after["started_at"] >= before["ended_at"], (before, after)
    lines = c.cli("history", "--format", "id,array,state", "--name", "arr").stdout.splitlines()
    assert [line.split() for line in lines[1:]] == [[str(i), f"{first}_{k}", "COMPLETED"] for k, i in enumerate(ids)]
    bad = c.cli("submit", str(path), "--array", "5-1", token=c.alice, check=False)
    assert bad.returncode == 2 and "array" in bad.stderr
