"""HTTPS: ``gsched server --tls-cert/--tls-key``; the CLI and agents verify it with ``--ca`` / GSCHED_CA.
The two agents serve their data over HTTPS too (``gsched agent --tls-cert/--tls-key``, the server's
``peer_ca``): uploads, copies between them and nudges go over TLS (tests/security/test_peer_tls.py has
the agents' side alone).

A throw-away CA and a certificate for 127.0.0.1 are made with the ``openssl`` command; the server and
both agents use it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli.localcluster import free_port
from scheduler.protocol.client import Client
from scheduler.protocol.servererror import ServerError
from tests.conftest import TINY_SOURCE, job_toml

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")]


def make_certs(d: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key): a CA, and a certificate it signed for 127.0.0.1."""
    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
        "-subj", "/CN=gsched test CA")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "1", "-extfile", "san.cnf")
    return d / "ca.pem", d / "server.pem", d / "server.key"


def gsched(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scheduler.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_certs(root)
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    env = {**os.environ, "GSCHED_HOME": str(root / "home"), "GSCHED_SERVER": url, "GSCHED_HEARTBEAT_S": "0.5",
           "GSCHED_CYCLE_INTERVAL_S": "1", "GSCHED_PEER_CA": str(ca)}
    for var in ("GSCHED_TOKEN", "GSCHED_CA"):
        env.pop(var, None)
    procs = []
    logs = root / "logs.txt"
    try:
        with open(logs, "ab") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "scheduler.cli", "server", "--port", str(port),
                                           "--tls-cert", str(cert), "--tls-key", str(key)], env=env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
            client = Client(url, token="", ca=str(ca), timeout_s=2)
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.get("/v1/health")
                    break
                except ServerError:
                    assert time.monotonic() < deadline, logs.read_text()
                    time.sleep(0.3)
            for node in ("n1", "n2"):
                procs.append(subprocess.Popen([sys.executable, "-m", "scheduler.cli", "agent", "--node", node,
                                               "--gpus", "1", "--data-dir", str(root / node), "--heartbeat-s", "0.5",
                                               "--ca", str(ca), "--tls-cert", str(cert), "--tls-key", str(key)],
                                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        yield url, ca, env
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def up_nodes(url: str, ca: Path, env: dict[str, str], names: set[str]) -> list[dict[str, Any]]:
    admin = Client(url, token=(Path(env["GSCHED_HOME"]) / "admin.token").read_text().strip(), ca=str(ca))
    deadline = time.monotonic() + 60
    while True:
        nodes = [n for n in admin.get("/v1/nodes") if n["name"] in names and n["state"] == "up"]
        if len(nodes) == len(names):
            return nodes
        assert time.monotonic() < deadline, "the agents never reported over HTTPS"
        time.sleep(0.3)


def test_agent_heartbeats_over_https_with_its_ca(tls_server: tuple[str, Path, dict[str, str]]) -> None:
    url, ca, env = tls_server
    up_nodes(url, ca, env, {"n1"})


def test_agents_with_certificates_are_stored_with_https_addresses(tls_server: tuple[str, Path, dict[str, str]]) -> None:
    url, ca, env = tls_server
    for n in up_nodes(url, ca, env, {"n1", "n2"}):
        assert n["address"].startswith("https://127.0.0.1:"), n


def test_uploads_and_copies_between_tls_agents_go_over_https(tls_server: tuple[str, Path, dict[str, str]]) -> None:
    """``data make`` uploads each shard to one agent over HTTPS (the CLI verifies it with --ca); raising
    the replica count makes the server order copies from that agent to the other, over HTTPS too."""
    url, ca, env = tls_server
    up_nodes(url, ca, env, {"n1", "n2"})
    env = {**env, "GSCHED_CA": str(ca)}
    out = gsched(env, "data", "make", "tiny", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    out = gsched(env, "data", "place", "tiny", "--replicas", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    admin = Client(url, token=(Path(env["GSCHED_HOME"]) / "admin.token").read_text().strip(), ca=str(ca))
    deadline = time.monotonic() + 90
    while True:
        ds = next(d for d in admin.get("/v1/datasets") if d["name"] == "tiny")
        if ds["replicas_healthy_min"] == 2:
            break
        assert time.monotonic() < deadline, f"the copies between the agents never finished: {ds}"
        time.sleep(0.5)


def test_a_job_on_tls_agents_mirrors_its_checkpoint_and_is_fetched_over_https(
        tls_server: tuple[str, Path, dict[str, str]], tmp_path: Path) -> None:
    """The rank's checkpoints are mirrored to the other agent over HTTPS before they are reported, and
    ``gsched fetch`` downloads the final one from an agent over HTTPS, verified with --ca."""
    url, ca, env = tls_server
    up_nodes(url, ca, env, {"n1", "n2"})
    env = {**env, "GSCHED_CA": str(ca)}
    out = gsched(env, "data", "make", "tiny2", "--source", TINY_SOURCE, "--shards", "2", "--replicas", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    spec = tmp_path / "job.toml"
    spec.write_text(job_toml("tls", ranks=1, epochs=2, dataset="tiny2"))
    out = gsched(env, "submit", str(spec))
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = int(out.stdout.split()[-1])
    admin = Client(url, token=(Path(env["GSCHED_HOME"]) / "admin.token").read_text().strip(), ca=str(ca))
    deadline = time.monotonic() + 300
    while (doc := admin.get(f"/v1/jobs/{job_id}"))["state"] not in ("COMPLETED", "FAILED", "CANCELLED"):
        assert time.monotonic() < deadline, doc
        time.sleep(1)
    assert doc["state"] == "COMPLETED", doc["reason"]
    final = max(doc["checkpoints"], key=lambda ck: ck["epoch"])
    assert set(final["nodes"]) == {"n1", "n2"}, final  # its own node and the mirror
    out = gsched(env, "fetch", str(job_id), "--out", str(tmp_path / "saved"))
    assert out.returncode == 0, out.stdout + out.stderr
    name = final["path"].rsplit("/", 1)[-1]
    assert hashlib.sha256((tmp_path / "saved" / name).read_bytes()).hexdigest() == final["sha256"]


def test_cli_verifies_the_server_with_ca(tls_server: tuple[str, Path, dict[str, str]]) -> None:
    _, ca, env = tls_server
    assert gsched(env, "queue", "--ca", str(ca)).returncode == 0
    assert gsched({**env, "GSCHED_CA": str(ca)}, "nodes").returncode == 0


def test_cli_without_the_ca_fails_with_a_certificate_message(tls_server: tuple[str, Path, dict[str, str]]) -> None:
    _, _, env = tls_server
    out = gsched(env, "queue")
    assert out.returncode != 0
    assert "certificate" in out.stderr and "--ca" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_server_needs_both_cert_and_key(tmp_path: Path) -> None:
    env = {**os.environ, "GSCHED_HOME": str(tmp_path)}
    out = gsched(env, "server", "--port", str(free_port()), "--tls-cert", str(tmp_path / "x.pem"))
    assert out.returncode == 2 and "tls_key" in out.stderr, out.stderr
