"""The CLI a Slurm user expects, against a real server: ``--version``, ``login`` and its config file,
and exit codes that tell failures apart (scheduler/cli/exitcodes.py, docs/cli.md)."""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path

import pytest

from scheduler.cli.localcluster import NodeSpec
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):  # type: ignore[no-untyped-def]
    from scheduler.cli.localcluster import LocalCluster

    c = LocalCluster(tmp_path_factory.mktemp("habits"), [NodeSpec("n1", gpus=2)]).start()
    c.cli("data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "1")
    c.alice = c.add_user("alice")  # type: ignore[attr-defined]
    yield c
    c.close()


def as_alice_via_config(xdg: Path) -> dict[str, str | None]:
    """An environment with no server, token or home of its own: only the config file under ``xdg``."""
    return {"XDG_CONFIG_HOME": str(xdg), "GSCHED_SERVER": None, "GSCHED_TOKEN": None,
            "GSCHED_HOME": str(xdg / "no-home")}


def test_version_names_the_installed_package(cluster) -> None:  # type: ignore[no-untyped-def]
    from importlib.metadata import version

    out = cluster.cli("--version")
    assert out.stdout.strip() == f"gsched {version('gsched')}"


def test_login_writes_a_private_config_that_every_verb_reads(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = as_alice_via_config(tmp_path)
    out = cluster.cli("login", "--server", cluster.url, check=False, env=env, input=cluster.alice + "\n")
    assert out.returncode == 0, out.stderr
    assert "as alice" in out.stdout
    path = tmp_path / "gsched" / "config.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tomllib.loads(path.read_text()) == {"server": cluster.url, "token": cluster.alice}
    # No GSCHED_SERVER, no GSCHED_TOKEN: the queue comes from the config file's server, as alice.
    job = tmp_path / "job.toml"
    job.write_text(job_toml("from-config", ranks=1, epochs=1))
    job_id = int(cluster.cli("submit", str(job), env=env).stdout.split()[-1])
    assert cluster.job(job_id)["user"] == "alice"
    assert cluster.cli("queue", "--json", env=env).returncode == 0


def test_flags_and_environment_come_before_the_config_file(cluster, tmp_path, refused_url) -> None:  # type: ignore[no-untyped-def]
    env = as_alice_via_config(tmp_path)
    token_file = tmp_path / "alice.token"
    token_file.write_text(cluster.alice + "\n")
    out = cluster.cli("login", "--server", cluster.url, "--token-file", str(token_file), env=env)
    assert tomllib.loads((tmp_path / "gsched" / "config.toml").read_text())["token_file"] == str(token_file)
    admin = cluster.admin_token()
    # The environment's token wins over the config file's: users list is admin-only.
    assert cluster.cli("user", "list", check=False, env=env).returncode == 5
    assert cluster.cli("user", "list", env={**env, "GSCHED_TOKEN": admin}).returncode == 0
    assert cluster.cli("--token", admin, "user", "list", env=env).returncode == 0
    # The flag's server wins over the config file's.
    dead = refused_url()
    out = cluster.cli("--server", dead, "queue", check=False, env=env)
    assert out.returncode == 3 and dead in out.stderr


def test_login_refuses_a_bad_token_and_writes_nothing(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = as_alice_via_config(tmp_path)
    out = cluster.cli("login", "--server", cluster.url, "--token", "gsu_wrong", check=False, env=env)
    assert out.returncode == 5 and "invalid token" in out.stderr
    assert not (tmp_path / "gsched" / "config.toml").exists()


def test_a_config_file_with_an_unknown_key_is_named(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "gsched").mkdir()
    (tmp_path / "gsched" / "config.toml").write_text('server = "http://x"\nsevrer = "y"\n')
    out = cluster.cli("queue", check=False, env=as_alice_via_config(tmp_path))
    assert out.returncode == 2 and "config.toml" in out.stderr and "sevrer" in out.stderr


# ---------------------------------------------------------------- exit codes


def test_exit_codes_tell_failures_apart(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.toml"
    bad.write_text(job_toml("bad", ranks=1).replace("ranks = 1", 'ranks = "one"'))
    cases = [  # (what, args, token, exit status)
        ("a bad flag", ["queue", "--no-such-flag"], None, 2),
        ("a missing job file", ["submit", str(tmp_path / "nope.toml")], None, 2),
        ("a job file the server refuses", ["submit", str(bad)], None, 2),
        ("no such job", ["show", "999999"], None, 4),
        ("no token", ["queue"], "", 5),
        ("a wrong token", ["queue"], "gsu_wrong", 5),
        ("not allowed", ["user", "list"], cluster.alice, 5),
    ]
    for what, args, token, code in cases:
        env: dict[str, str | None] = {"GSCHED_HOME": str(tmp_path / "empty-home")} if token == "" else {}
        out = cluster.cli(*args, token=token or None, check=False, env=env)
        assert out.returncode == code, f"{what}: {out.returncode} {out.stderr}"


def test_an_unreachable_server_is_said_at_once_with_status_3(cluster, refused_url) -> None:  # type: ignore[no-untyped-def]
    dead = refused_url()
    for verb in (["queue"], ["nodes"], ["show", "1"]):
        out = cluster.cli("--server", dead, *verb, check=False)
        assert out.returncode == 3, out.stderr
        assert "cannot reach the gsched server" in out.stderr and "retrying" not in out.stderr


def test_a_server_whose_host_does_not_answer_is_said_unreachable_within_the_connect_bound(cluster) -> None:  # type: ignore[no-untyped-def]
    import socket

    # A listening socket whose accept queue is full: the kernel drops further SYNs, as a host that is
    # down or cut off would (no refusal comes back).  The CLI's read timeout is 30 s; its connect
    # bound (CONNECT_TIMEOUT_S, 2 s) must end the wait long before: the run is given 15 s.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    held = socket.create_connection(srv.getsockname(), timeout=5)  # fills the queue; never accepted
    try:
        silent = f"http://127.0.0.1:{srv.getsockname()[1]}"
        out = cluster.cli("--server", silent, "queue", check=False, timeout=15)
        assert out.returncode == 3, out.stderr
        assert "cannot reach the gsched server" in out.stderr and "timed out" in out.stderr, out.stderr
    finally:
        held.close()
        srv.close()


def test_submit_to_a_down_server_retries_with_its_request_id_saying_so(cluster, tmp_path, refused_url) -> None:  # type: ignore[no-untyped-def]
    job = tmp_path / "job.toml"
    job.write_text(job_toml("retry", ranks=1))
    dead = refused_url()
    out = cluster.cli("--server", dead, "submit", str(job), "--request-id", "r-123", "--retry-s", "1", check=False)
    assert out.returncode == 3
    assert "retrying with request id r-123 for up to 1 s" in out.stderr
    assert "cannot reach the gsched server" in out.stderr
    out = cluster.cli("--server", dead, "submit", str(job), "--retry-s", "0", check=False)
    assert out.returncode == 3 and "retrying" not in out.stderr


def test_a_retried_submit_with_the_same_request_id_makes_one_job(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    job = tmp_path / "job.toml"
    job.write_text(job_toml("once", ranks=1, epochs=1))
    first = cluster.cli("submit", str(job), "--request-id", "same-id-1").stdout.split()[-1]
    second = cluster.cli("submit", str(job), "--request-id", "same-id-1").stdout.split()[-1]
    assert first == second


# ---------------------------------------------------------------- completion


def completions(cluster, line: str, tmp_path: Path, token: str | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    """What argcomplete's protocol answers for the words typed so far (as the shell's script asks)."""
    out_file = tmp_path / "completions.txt"
    env = {"_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": "\n", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(out_file), "_ARGCOMPLETE_SHELL": "bash"}
    # The line is what the user typed (`gsched ...`), whatever runs it: argcomplete reads COMP_LINE only.
    cluster.cli(*line.split()[1:], token=token, env=env, check=False)
    return sorted(w.strip() for w in out_file.read_text().splitlines() if w.strip())


def test_completion_scripts_for_bash_zsh_and_fish(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    for shell in ("bash", "zsh", "fish"):
        text = cluster.cli("completion", shell).stdout
        assert "_ARGCOMPLETE" in text and "gsched" in text, shell
    bash = tmp_path / "gsched.bash"
    bash.write_text(cluster.cli("completion", "bash").stdout)
    subprocess.run(["bash", "-n", str(bash)], check=True)  # valid bash
    assert cluster.cli("completion", "tcsh", check=False).returncode == 2


def test_completion_completes_verbs_options_and_names_from_the_server(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert {"queue", "history"} <= set(completions(cluster, "gsched q", tmp_path) + completions(cluster, "gsched h", tmp_path))
    assert "--watch" in completions(cluster, "gsched queue --wa", tmp_path)
    assert completions(cluster, "gsched submit x.toml --data", tmp_path) == ["--dataset"]
    assert completions(cluster, "gsched submit x.toml --dataset ", tmp_path, token=cluster.alice) == ["tiny"]
    assert "n1" in completions(cluster, "gsched node drain ", tmp_path)
    job = tmp_path / "job.toml"
    job.write_text(job_toml("complete-me", ranks=1, epochs=1))
    job_id = cluster.cli("submit", str(job), token=cluster.alice).stdout.split()[0]
    assert job_id in completions(cluster, f"gsched show {job_id[0]}", tmp_path, token=cluster.alice)


def test_a_bad_server_config_stops_the_server_at_start_naming_the_key(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "gsched.toml"
    bad.write_text('port = "abc"\n[policy]\nlocality_wiat_s = 3\n')
    for verb in (["server", "--config", str(bad)], ["db", "upgrade", "--config", str(bad)]):
        out = cluster.cli(*verb, check=False, timeout=60)
        assert out.returncode == 2, out.stderr
        assert f"{bad}: port: Input should be a valid integer" in out.stderr
        assert "policy.locality_wiat_s: unknown key" in out.stderr
