"""[run] jobs, end to end: a real server and agents on loopback run the user's own command.

The cluster runs in single-team mode (``run_as_agent_user``): the ranks run as the agents' account, so
any interpreter this suite uses can start them (tests/integration/test_run_as.py switches accounts).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli.localcluster import LocalCluster, NodeSpec
from tests.conftest import TINY_SOURCE

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"
SINGLE_TEAM = {"GSCHED_RUN_AS_AGENT_USER": "1"}


def run_toml(name: str, command: str, *, ranks: int = 1, workdir: str = "", data: str = "",
             extra: str = "", limits: str = 'time = "5m"') -> str:
    """A [run] job.toml; ``command`` is TOML (a list or a string)."""
    return (f'name = "{name}"\n[resources]\nranks = {ranks}\n'
            + (f'[data]\ndataset = "{data}"\n' if data else "")
            + f"[run]\ncommand = {command}\n" + (f'workdir = "{workdir}"\n' if workdir else "")
            + f"{extra}\n[limits]\n{limits}\n")


def submit(c: LocalCluster, path: Path, text: str) -> int:
    path.write_text(text)
    return int(c.cli("submit", str(path)).stdout.split()[-1])


def as_json(c: LocalCluster, *args: str) -> Any:
    """``gsched ARGS --json``, parsed."""
    return json.loads(c.cli(*args, "--json").stdout)


def env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k] = v
    return out


def group_of(c: LocalCluster, job_id: int) -> list[int]:
    return [p for p in c.rank_pids() if f"GSCHED_JOB_ID={job_id}".encode() in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]


@pytest.fixture
def two_nodes(make_cluster: Any) -> LocalCluster:
    c: LocalCluster = make_cluster([NodeSpec("n1", "r1", gpus=1), NodeSpec("n2", "r2", gpus=1)],
                                   extra_env=SINGLE_TEAM).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "4", "--replicas", "2")
    return c


def test_a_plain_ddp_script_runs_on_two_ranks_with_torchruns_environment_and_local_shards(
        two_nodes: LocalCluster, tmp_path: Path) -> None:
    c = two_nodes
    work = tmp_path / "proj"
    work.mkdir()
    # Each rank saves its environment, then runs the example (no gsched import) as it is.
    cmd = f'"env > env-$RANK-$GSCHED_ATTEMPT.txt && exec {sys.executable} {EXAMPLE} --epochs 2"'
    job_id = submit(c, tmp_path / "job.toml", run_toml("ddp", cmd, ranks=2, workdir=str(work), data="tiny"))
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    ranks = {r["rank"]: r for r in doc["ranks"]}
    assert sorted(r["node"] for r in ranks.values()) == ["n1", "n2"] and all(r["exit_code"] == 0 for r in ranks.values())

    envs = {r: env_file(work / f"env-{r}-1.txt") for r in (0, 1)}
    # single-team mode: the ranks ran as the agents' own account, with no mapping for the admin
    assert all((work / f"env-{r}-1.txt").stat().st_uid == os.geteuid() for r in (0, 1))
    shards_by_rank = {r: [s for s in doc["shards"] if s["rank"] == r] for r in (0, 1)}
    for r, env in envs.items():
        node = ranks[r]["node"]
        # torchrun's environment
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(r), "2", "0", "1")
        assert (env["ROLE_RANK"], env["ROLE_WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == (str(r), "2", "2")
        assert env["GROUP_RANK"] == str(r)  # one rank per node: the node's index is the rank's
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == envs[0]["MASTER_PORT"]
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_RUN_ID"] == f"gsched-{job_id}"
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["OMP_NUM_THREADS"] == "1"
        # gsched's: local shard files, in assignment order, as a list and as a file
        assert (env["GSCHED_JOB_ID"], env["GSCHED_ATTEMPT"], env["GSCHED_DATASET"]) == (str(job_id), "1", "tiny")
        paths = env["GSCHED_SHARDS"].split(os.pathsep)
        assert Path(env["GSCHED_SHARD_LIST"]).read_text().splitlines() == paths
        expected = [str(c.data_dir(node) / "tiny" / f"{s['shard']:05d}.shard") for s in sorted(shards_by_rank[r], key=lambda s: s["shard"])]
        assert paths == expected and all(Path(p).is_file() for p in paths)
        assert env["GSCHED_RESUME_FROM"] == "" and Path(env["GSCHED_CHECKPOINT_DIR"]).is_dir()
        assert not any(k.startswith("GSCHED_") and k not in RANK_VARS for k in env), sorted(env)
        # the script read exactly those files (its first line says which)
        log = c.cli("logs", str(job_id), "--rank", str(r)).stdout
        assert f"rank {r}/2: " in log and f"from {len(paths)} shards: {', '.join(paths)}" in log
    # Every shard of the data set was read by one rank, from its own node's disk.
    assert sorted(s["shard"] for s in doc["shards"]) == [0, 1, 2, 3] and all(s["local"] for s in doc["shards"])
    # The epochs the script wrote to GSCHED_METRICS_FILE, and its checkpoint files, mirrored.
    assert [m["epoch"] for m in doc["metrics"]] == [1, 2]
    assert [ck["epoch"] for ck in doc["checkpoints"]] == [1, 2]
    assert all(len(ck["nodes"]) == 2 for ck in doc["checkpoints"])

    # What the built-in shows, a [run] job shows too: `gsched show` (command, placement, ranks, shard map),
    # `gsched explain` (where it went, its local fraction), and the device-seconds it used in fair share.
    # As words: the table wraps long lines; wide, so that no path is folded in the middle (a longer temp
    # dir, as under two xdist workers, made the 150-column table cut the command's path in two).
    shown = " ".join(c.cli("show", str(job_id), env={"COLUMNS": "400"}).stdout.split())
    assert f"job {job_id} ddp COMPLETED user {doc['user']}" in shown
    assert f"exec {sys.executable} {EXAMPLE} --epochs 2 (in {work})" in shown
    assert "n1, n2; 100% of bytes read locally, 0 B to stage" in shown
    assert all(f"{r} {ranks[r]['node']} 0 EXITED 0" in shown for r in (0, 1))
    assert "shard map" in shown and "checkpoints epochs 1, 2; latest (epoch 2)" in shown
    assert as_json(c, "show", str(job_id))["local_fraction"] == 1.0
    assert "placed with 100% local reads" in c.cli("explain", str(job_id)).stdout
    why = as_json(c, "explain", str(job_id))
    assert (why["state"], why["local_fraction"], why["transfer_bytes"]) == ("COMPLETED", 1.0, 0)
    usage = {r["user"]: r["raw_usage"] for r in as_json(c, "share") if r["user"]}
    assert usage[doc["user"]] > 0, usage


RANK_VARS = {"GSCHED_JOB_ID", "GSCHED_ATTEMPT", "GSCHED_DATASET", "GSCHED_SHARDS", "GSCHED_SHARD_LIST",
             "GSCHED_CHECKPOINT_DIR", "GSCHED_RESUME_FROM", "GSCHED_METRICS_FILE", "GSCHED_DEVICES",
             "GSCHED_THREADS"}


def test_cancel_stops_the_whole_process_group_with_sigterm(two_nodes: LocalCluster, tmp_path: Path) -> None:
    c = two_nodes
    # The shell starts a child (sleep) and says when SIGTERM reaches it; the child is in its group.
    cmd = "\"trap 'echo got SIGTERM; kill $child; exit 0' TERM; sleep 600 & child=$!; echo started; wait\""
    job_id = submit(c, tmp_path / "job.toml", run_toml("cancel-me", cmd, ranks=2))
    c.wait_job(job_id, "RUNNING", timeout=60)
    c.wait_for(lambda: len(group_of(c, job_id)) >= 4, 30, "both shells and their sleeps")
    c.cli("cancel", str(job_id))
    doc = c.wait_job(job_id, {"CANCELLED"}, timeout=60)
    c.wait_for(lambda: group_of(c, job_id) == [], 30, "every process of the job to exit")
    c.wait_for(lambda: "got SIGTERM" in c.cli("logs", str(job_id), "--rank", "1").stdout, 30, "rank 1's log")
    assert doc["reason"].startswith("cancelled by")


def test_a_job_past_its_time_limit_gets_sigterm_then_sigkill_after_grace_and_ends_timeout(
        two_nodes: LocalCluster, tmp_path: Path) -> None:
    c = two_nodes
    cmd = "\"trap 'echo ignoring SIGTERM' TERM; echo started; while true; do sleep 0.2; done\""
    job_id = submit(c, tmp_path / "job.toml", run_toml("stubborn", cmd, extra="grace_s = 2", limits='time = "3s"'))
    doc = c.wait_job(job_id, {"TIMEOUT", "FAILED", "COMPLETED"}, timeout=60)
    assert doc["state"] == "TIMEOUT" and "time limit of 3s" in doc["reason"], doc["reason"]
    c.wait_for(lambda: group_of(c, job_id) == [], 30, "SIGKILL after the grace")
    c.wait_for(lambda: "ignoring SIGTERM" in c.cli("logs", str(job_id)).stdout, 30, "the log")
    assert doc["ranks"][0]["node"] in ("n1", "n2")


def test_a_requeued_job_resumes_from_its_newest_mirrored_checkpoint(two_nodes: LocalCluster, tmp_path: Path) -> None:
    c = two_nodes
    work = tmp_path / "proj"
    work.mkdir()
    cmd = (f'"env > env-$GSCHED_ATTEMPT.txt && exec {sys.executable} {EXAMPLE} --epochs 12 --epoch-sleep-s 1.5"')
    job_id = submit(c, tmp_path / "job.toml", run_toml("resume", cmd, workdir=str(work), data="tiny"))
    doc = c.wait_for(lambda: (d := c.job(job_id))["checkpoints"] and len(d["checkpoints"][-1]["nodes"]) == 2 and d,
                     180, "a mirrored checkpoint")
    node = doc["ranks"][0]["node"]
    c.kill_node(node)
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=300)
    assert doc["state"] == "COMPLETED", doc["reason"]
    assert doc["restarts"] == 1 and doc["ranks"][0]["node"] != node
    second = env_file(work / "env-2.txt")
    assert second["TORCHELASTIC_RESTART_COUNT"] == "1" and second["GSCHED_ATTEMPT"] == "2"
    resumed = Path(second["GSCHED_RESUME_FROM"])
    other = doc["ranks"][0]["node"]  # the mirror it was fetched from, or this node's own copy
    assert resumed.parent == c.data_dir(other) / ".gsched" / "jobs" / str(job_id) / "checkpoints"
    assert resumed.name.startswith("epoch-")  # (pruned since: the job keeps the newest 3)
    log = c.cli("logs", str(job_id)).stdout
    assert f"resumed from {resumed}" in log
    # It went on from there: the epochs of the second attempt start after the one it resumed from.
    after = int(log.split(f"resumed from {resumed} after epoch ")[1].split()[0])
    assert 1 <= after < 12 and f"epoch {after + 1}: loss" in log.split("resumed from")[1]
    assert max(m["epoch"] for m in doc["metrics"]) == 12


def test_a_missing_workdir_fails_the_job_naming_node_and_path(two_nodes: LocalCluster, tmp_path: Path) -> None:
    c = two_nodes
    missing = tmp_path / "no-such-dir"
    job_id = submit(c, tmp_path / "job.toml", run_toml("nowhere", '["true"]', workdir=str(missing)))
    doc = c.wait_job(job_id, {"FAILED", "COMPLETED"}, timeout=60)
    assert doc["state"] == "FAILED"
    node = doc["ranks"][0]["node"]
    assert f"run.workdir {missing} does not exist on node {node}" in doc["reason"], doc["reason"]
    assert f"does not exist on node {node}" in c.cli("logs", str(job_id)).stdout


def test_a_missing_program_fails_the_job_naming_it(two_nodes: LocalCluster, tmp_path: Path) -> None:
    c = two_nodes
    job_id = submit(c, tmp_path / "job.toml", run_toml("typo", '["pyhton3", "train.py"]'))
    doc = c.wait_job(job_id, {"FAILED", "COMPLETED"}, timeout=60)
    assert doc["state"] == "FAILED" and "could not start 'pyhton3'" in doc["reason"], doc["reason"]
    assert doc["ranks"][0]["exit_code"] == 127


def test_a_failing_command_is_retried_then_fails_with_its_exit_code_and_log_tail(
        two_nodes: LocalCluster, tmp_path: Path) -> None:
    c = two_nodes
    work = tmp_path / "proj"
    work.mkdir()
    cmd = '"echo attempt $GSCHED_ATTEMPT >> attempts.txt; echo out of memory in step 7 >&2; exit 3"'
    job_id = submit(c, tmp_path / "job.toml", run_toml("flaky", cmd, workdir=str(work),
                                                       limits='time = "5m"\nretry_on_failure = 1'))
    doc = c.wait_job(job_id, {"FAILED", "COMPLETED"}, timeout=120)
    # one retry (retry_on_failure = 1), then FAILED naming the rank, its exit code and its last words
    assert (work / "attempts.txt").read_text().split() == ["attempt", "1", "attempt", "2"]
    assert doc["state"] == "FAILED" and doc["attempt"] == 2, doc["reason"]
    assert "rank 0 on" in doc["reason"] and "code 3" in doc["reason"], doc["reason"]
    assert "out of memory in step 7" in doc["reason"], doc["reason"]
    assert "out of memory in step 7" in c.cli("logs", str(job_id)).stdout
    requeue = [e["message"] for e in doc["events"] if e["kind"] == "job.requeue"]
    assert len(requeue) == 1 and "retry 1 of 1" in requeue[0]


def test_a_true_job_completes_at_once(two_nodes: LocalCluster, tmp_path: Path) -> None:
    c = two_nodes
    job_id = submit(c, tmp_path / "job.toml", run_toml("nothing", '["true"]'))
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=60)
    assert doc["state"] == "COMPLETED" and doc["started_at"] is not None and doc["ranks"][0]["exit_code"] == 0


@pytest.mark.parametrize(("text", "words"), [
    (run_toml("x", "[]"), ["run.command: must not be empty"]),
    (run_toml("x", '["true"]', workdir="relative/dir"), ["run.workdir: must be an absolute path"]),
    (run_toml("x", '["true"]', extra='env = { WORLD_SIZE = "8" }'), ["run.env: WORLD_SIZE is set by gsched"]),
    (run_toml("x", '["true"]', data="tiny") + "[train]\nepochs = 1\n", ["train:", "never both"]),
    (run_toml("x", '["true"]', data="nope"), ["data.dataset: no data set 'nope'"]),
])
def test_bad_run_jobs_are_refused_naming_the_field_and_nothing_is_stored(
        two_nodes: LocalCluster, tmp_path: Path, text: str, words: list[str]) -> None:
    c = two_nodes
    before = [j["id"] for j in c.admin().get("/v1/jobs?all=true")["jobs"]]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = c.cli("submit", str(path), check=False)
    assert out.returncode != 0
    for w in words:
        assert w in out.stderr, out.stderr
    assert [j["id"] for j in c.admin().get("/v1/jobs?all=true")["jobs"]] == before


def test_each_job_of_an_array_sees_its_index(two_nodes: LocalCluster, tmp_path: Path) -> None:
    c = two_nodes
    work = tmp_path / "arr"
    work.mkdir()
    (tmp_path / "arr.toml").write_text(run_toml(
        "arr", '"echo $GSCHED_ARRAY_JOB_ID $GSCHED_ARRAY_INDEX $GSCHED_ARRAY_COUNT > index-$GSCHED_JOB_ID.txt"',
        workdir=str(work)))
    out = c.cli("submit", str(tmp_path / "arr.toml"), "--array", "0-2", "--wait", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    first = int(out.stdout.split()[0])
    ids = [int(line.split()[1].rstrip(":")) for line in out.stdout.splitlines()[1:]]
    assert len(ids) == 3 and ids[0] == first
    # each job of the array wrote the array's id, its own index and the count, from its environment
    assert [(work / f"index-{i}.txt").read_text().split() for i in ids] == [[str(first), str(k), "3"] for k in range(3)]


def test_run_jobs_wait_for_their_dependencies_and_one_that_cannot_be_met_fails(
        two_nodes: LocalCluster, tmp_path: Path) -> None:
    c = two_nodes
    work = tmp_path / "dep"
    work.mkdir()

    def submit_run(name: str, command: str, *flags: str) -> int:
        path = tmp_path / f"{name}.toml"
        path.write_text(run_toml(name, command, workdir=str(work)))
        return int(c.cli("submit", str(path), *flags).stdout.split()[-1])

    failing = submit_run("fails", '"sleep 1; exit 4"')
    after_any = submit_run("after-any", '"echo ran >> after-any.txt"', "--dependency", f"afterany:{failing}")
    after_ok = submit_run("after-ok", '"echo ran >> after-ok.txt"', "--dependency", f"afterok:{failing}")
    after_not_ok = submit_run("after-not-ok", '"echo ran >> after-not-ok.txt"', "--dependency", f"afternotok:{failing}")
    assert c.wait_job(failing, {"FAILED", "COMPLETED"}, timeout=120)["state"] == "FAILED"
    assert c.wait_job(after_any, {"COMPLETED", "FAILED"}, timeout=120)["state"] == "COMPLETED"
    assert c.wait_job(after_not_ok, {"COMPLETED", "FAILED"}, timeout=120)["state"] == "COMPLETED"
    doc = c.wait_job(after_ok, {"COMPLETED", "FAILED"}, timeout=120)
    # afterok on a job that FAILED can never be met: it ends FAILED saying so, and never ran
    assert doc["state"] == "FAILED" and f"afterok:{failing} can never be satisfied" in doc["reason"], doc["reason"]
    assert doc["started_at"] is None and not (work / "after-ok.txt").exists()
    assert (work / "after-any.txt").read_text() == "ran\n" and (work / "after-not-ok.txt").read_text() == "ran\n"
