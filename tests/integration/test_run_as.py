"""Whose process a [run] job is: real Unix accounts (``useradd``; the suite runs as root), a real
server and a root agent on loopback.

alice's jobs run as account A (with a supplementary group), bob's as account B (bob is made with
``gsched user add bob --unix-user B``, the others through the API), carol has none.  The
cluster lives in a directory every account may traverse (as a node's data dir would be).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler.cli.localcluster import LocalCluster, NodeSpec

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                 reason="creates Unix accounts: needs root and useradd (CI runs as root)")]

TAG = f"gs{os.getpid() % 100000}"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class World:
    c: LocalCluster
    root: Path
    a: pwd.struct_passwd  # alice's account
    b: pwd.struct_passwd  # bob's account
    team_gid: int  # A's supplementary group
    tokens: dict[str, str]

    def submit(self, who: str, text: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        path = self.root / f"job-{who}.toml"
        path.write_text(text)
        return self.c.cli("submit", str(path), token=self.tokens[who], check=check)

    def job_id(self, who: str, text: str) -> int:
        return int(self.submit(who, text).stdout.split()[-1])

    def job_dir(self, job_id: int) -> Path:
        return self.c.data_dir("n1") / ".gsched" / "jobs" / str(job_id)


def as_account(account: pwd.struct_passwd, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``account`` (its uid, gid and groups), from a directory it may enter."""
    return subprocess.run(list(argv), user=account.pw_uid, group=account.pw_gid,
                          extra_groups=os.getgrouplist(account.pw_name, account.pw_gid), cwd="/",
                          capture_output=True, text=True, timeout=60)


def job(name: str, command: str, extra: str = "") -> str:
    return f'name = "{name}"\n[run]\ncommand = {command}\n{extra}\n[limits]\ntime = "5m"\n'


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    names = [f"{TAG}a", f"{TAG}b"]
    team = f"{TAG}t"
    subprocess.run(["groupadd", team], check=True)
    for n in names:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", n], check=True)
    subprocess.run(["usermod", "-a", "-G", team, names[0]], check=True)
    root = Path(tempfile.mkdtemp(prefix="gsched-runas-", dir="/tmp"))
    root.chmod(0o755)  # a data dir's path is traversable by the accounts jobs run as
    c = LocalCluster(root / "cluster", [NodeSpec("n1", gpus=2)])
    try:
        c.start()
        # bob is made as an admin makes a user: `gsched user add NAME --unix-user ACCOUNT` (the token on stdout)
        added = c.cli("user", "add", "bob", "--unix-user", names[1])
        listed = c.cli("user", "list").stdout
        assert any(line.startswith("bob") and f"unix_user={names[1]}" in line for line in listed.splitlines()), listed
        tokens = {"alice": c.add_user("alice", unix_user=names[0]), "bob": added.stdout.strip(),
                  "carol": c.add_user("carol")}
        yield World(c, root, pwd.getpwnam(names[0]), pwd.getpwnam(names[1]), grp.getgrnam(team).gr_gid, tokens)
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)
        for n in names:
            subprocess.run(["userdel", n], check=False)
        subprocess.run(["groupdel", team], check=False)


def proc_ids(pid: int) -> tuple[int, int, set[int]]:
    """(real uid, real gid, supplementary groups) of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]), {int(g) for g in fields["Groups"].split()}


def job_pids(c: LocalCluster, job_id: int) -> list[int]:
    return [p for p in c.rank_pids()
            if f"GSCHED_JOB_ID={job_id}".encode() in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]


def test_ranks_run_as_the_mapped_account_with_its_groups_and_own_their_files(world: World) -> None:
    w, c, a, b = world, world.c, world.a, world.b
    job_id = w.job_id("alice", job("whoami", '"echo $(id -u):$(id -g) $HOME $USER > whoami.txt; sleep 120"'))
    c.wait_job(job_id, "RUNNING", timeout=60)
    pids = c.wait_for(lambda: job_pids(c, job_id) or None, 30, "the rank's processes")
    for pid in pids:
        uid, gid, groups = proc_ids(pid)
        assert (uid, gid) == (a.pw_uid, a.pw_gid) and w.team_gid in groups and 0 not in groups
    attempt = w.job_dir(job_id) / "attempt-1"
    mine = c.wait_for(lambda: (attempt / "whoami.txt").is_file() and attempt / "whoami.txt", 30, "whoami.txt")
    assert mine.read_text().split() == [f"{a.pw_uid}:{a.pw_gid}", a.pw_dir, a.pw_name]
    # Its directories and files are the account's, and nobody else's to read.
    for path, mode in ((attempt, 0o700), (w.job_dir(job_id) / "out", 0o700), (attempt / "rank-0.log", 0o600),
                       (attempt / "metrics.jsonl", 0o600), (attempt / "rank-0.shards", 0o600), (mine, None)):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (a.pw_uid, a.pw_gid), path
        if mode is not None:
            assert stat.S_IMODE(st.st_mode) == mode, (path, oct(st.st_mode))
    assert as_account(a, "cat", str(attempt / "rank-0.log")).returncode == 0
    for path in (attempt / "rank-0.log", mine):
        refused = as_account(b, "cat", str(path))
        assert refused.returncode != 0 and "Permission denied" in refused.stderr
    assert as_account(b, "ls", str(attempt)).returncode != 0
    c.cli("cancel", str(job_id), token=w.tokens["alice"])
    c.wait_job(job_id, "CANCELLED", timeout=60)
    c.wait_for(lambda: job_pids(c, job_id) == [], 30, "the rank to stop")


def test_checkpoints_are_taken_from_regular_files_of_the_account_and_kept_from_others(world: World) -> None:
    w, c, a, b = world, world.c, world.a, world.b
    # One real checkpoint, and a symlink to a file only root may read: the agent must not copy that.
    cmd = '"echo weights > $GSCHED_CHECKPOINT_DIR/ckpt-1.pt; ln -s /etc/shadow $GSCHED_CHECKPOINT_DIR/evil.pt"'
    job_id = w.job_id("alice", job("ckpt", cmd))
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=60)
    assert doc["state"] == "COMPLETED", doc["reason"]
    assert [ck["epoch"] for ck in doc["checkpoints"]] == [1] and doc["checkpoints"][0]["bytes"] == len("weights\n")
    store = w.job_dir(job_id) / "checkpoints"
    assert sorted(p.name for p in store.iterdir()) == ["epoch-0001.pt"]
    copy = store / "epoch-0001.pt"
    assert copy.read_text() == "weights\n"
    for path, mode in ((store, 0o750), (copy, 0o640)):  # the agent's; the account's group may read it
        st = path.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, a.pw_gid, mode), (path, st)
    assert as_account(a, "cat", str(copy)).stdout == "weights\n"
    assert as_account(b, "cat", str(copy)).returncode != 0


def test_a_run_job_of_a_user_without_an_account_is_refused_at_submit_with_the_reason(world: World) -> None:
    w = world
    before = [j["id"] for j in w.c.admin().get("/v1/jobs?all=true")["jobs"]]
    out = w.submit("carol", job("nobody", '["true"]'), check=False)
    assert out.returncode != 0
    assert "run: user carol has no Unix account" in out.stderr and "gsched user set carol --unix-user" in out.stderr
    assert [j["id"] for j in w.c.admin().get("/v1/jobs?all=true")["jobs"]] == before


def test_an_admin_maps_and_unmaps_an_account_with_user_set(world: World) -> None:
    w, c, b = world, world.c, world.b
    assert "runs [run] jobs as " + b.pw_name in c.cli("user", "set", "carol", "--unix-user", b.pw_name).stdout
    listed = c.cli("user", "list").stdout
    assert any(line.startswith("carol") and f"unix_user={b.pw_name}" in line for line in listed.splitlines())
    job_id = w.job_id("carol", job("mapped", '"id -u"'))
    doc = c.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=60)
    assert doc["state"] == "COMPLETED", doc["reason"]
    c.wait_for(lambda: str(b.pw_uid) in c.cli("logs", str(job_id)).stdout, 30, "the rank's uid in its log")
    c.cli("user", "set", "carol", "--unix-user", "")
    assert w.submit("carol", job("unmapped", '["true"]'), check=False).returncode != 0
    # Only an admin may map accounts.
    denied = c.cli("user", "set", "carol", "--unix-user", "root", token=w.tokens["bob"], check=False)
    assert denied.returncode != 0 and "only an admin" in denied.stderr


def test_an_account_unknown_on_the_node_fails_the_job_naming_account_and_node(world: World) -> None:
    w, c = world, world.c
    c.cli("user", "set", "carol", "--unix-user", f"{TAG}gone")
    try:
        job_id = w.job_id("carol", job("ghost", '["true"]'))
        doc = c.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=60)
    finally:
        c.cli("user", "set", "carol", "--unix-user", "")
    assert doc["state"] == "FAILED" and f"there is no Unix account '{TAG}gone' on node n1" in doc["reason"], doc["reason"]


def test_an_agent_not_running_as_root_runs_jobs_only_as_its_own_account(world: World) -> None:
    a, b = world.a, world.b
    probe = ("import sys; from agents.runas import AccountError, resolve\n"
             f"me = resolve({a.pw_name!r}, 'n1')\n"
             "print('self', me.uid, me.switch)\n"
             f"try:\n    resolve({b.pw_name!r}, 'n1')\nexcept AccountError as e:\n    print('refused', e)\n")
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable  # one the account may run
    out = subprocess.run([python, "-c", probe], user=a.pw_uid, group=a.pw_gid, cwd="/", capture_output=True,
                         text=True, timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert f"self {a.pw_uid} False" in out.stdout
    assert (f"refused the agent on node n1 runs as {a.pw_name}, not root: it can run jobs only as {a.pw_name}, "
            f"and this one is to run as {b.pw_name}") in out.stdout
