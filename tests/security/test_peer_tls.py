"""Agent-to-agent transfers over HTTPS: ``gsched agent --tls-cert F --tls-key F --ca CA``.

Real agents' data servers on loopback with a throw-away CA (``make_certs``, the openssl command): the
agents report ``https://host:port``, and a shard staged from one to the other, a checkpoint mirrored,
a nudge and a ``gsched fetch`` go over HTTPS, verified with the CA.  A plain-HTTP request to such a data
server gets no answer, and a process without the CA is told to give it.
"""

from __future__ import annotations

import hashlib
import http.client
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.agent import Agent
from agents.dataserver import DataServer, checkpoint_dir
from agents.shardfile import MAGIC, shard_path
from agents.staging import StagingError, fetch
from scheduler.cli.fetch import download
from scheduler.protocol.messages import Heartbeat
from scheduler.protocol.peers import PEER_CA_HINT, peer_context, peer_host, peer_url, why
from scheduler.protocol.tickets import ticket
from scheduler.server.nudge import _nudge
from tests.security.test_tls import make_certs

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")]

KEY = "k" * 64
SHARD = MAGIC + b"shard bytes " * 1000
SHARD_SHA = hashlib.sha256(SHARD).hexdigest()


@dataclass
class Certs:
    ca: str
    cert: str
    key: str


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    ca, cert, key = make_certs(tmp_path_factory.mktemp("ca"))
    return Certs(str(ca), str(cert), str(key))


def agent(root: Path, name: str, certs: Certs | None, ca: str | None) -> Agent:
    """An agent that talks to no server: its data server runs, its peer key is set by hand."""
    tls = {"tls_cert": certs.cert, "tls_key": certs.key} if certs else {}
    a = Agent(["http://127.0.0.1:9"], name, "r1", "1", root / name, token="gsa_test", ca=ca, **tls)  # type: ignore[arg-type]
    a.peer_key = KEY
    a.data.start()
    return a


@pytest.fixture
def pair(tmp_path: Path, certs: Certs) -> Iterator[tuple[Agent, Agent]]:
    """Two agents with certificates and the CA."""
    a, b = agent(tmp_path, "n1", certs, certs.ca), agent(tmp_path, "n2", certs, certs.ca)
    yield a, b
    a.data.stop()
    b.data.stop()


def test_an_agent_with_a_certificate_reports_an_https_address_the_heartbeat_takes(pair: tuple[Agent, Agent]) -> None:
    a, _ = pair
    assert a.address == f"https://127.0.0.1:{a.data.port}"
    Heartbeat.model_validate({"node": "n1", "rack": "r1", "address": a.address, "incarnation": "x", "devices": []})
    assert peer_host(a.address) == "127.0.0.1"  # the rendezvous host the server derives from it
    assert peer_url(a.address, "health") == f"https://127.0.0.1:{a.data.port}/health"
    assert peer_url("10.0.0.1:7000", "health") == "http://10.0.0.1:7000/health"  # no certificate: as before



@pytest.mark.parametrize("address", ["http://10.0.0.1:7000", "https://", "ftp://10.0.0.1:7000",
                                     "https://10.0.0.1:7000/x"])
def test_the_heartbeat_takes_host_port_or_https_host_port_only(address: str) -> None:
    with pytest.raises(ValueError, match="address"):
        Heartbeat.model_validate({"node": "n1", "rack": "r1", "address": address, "incarnation": "x", "devices": []})


def test_a_shard_is_staged_between_two_tls_agents(pair: tuple[Agent, Agent]) -> None:
    a, b = pair
    src = shard_path(a.data_dir, "ds", 0)
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(SHARD)
    dest = shard_path(b.data_dir, "ds", 0)
    # what the launcher and the agent's replication call: over a's https:// address, with b's CA
    n = fetch(a.address, "shards/ds/0", ("get", "ds", 0), dest, SHARD_SHA, KEY, context=b.peer_tls)
    assert n == len(SHARD) and dest.read_bytes() == SHARD
    assert a.data.wait_idle(30) and a.data.bytes_served == len(SHARD)


def test_a_checkpoint_is_mirrored_to_a_tls_peer(pair: tuple[Agent, Agent], tmp_path: Path) -> None:
    a, b = pair
    ck = tmp_path / "epoch-0001.pt"
    ck.write_bytes(b"weights" * 100)
    sha = hashlib.sha256(ck.read_bytes()).hexdigest()
    a.peers = {"n2": b.address}
    assert a.mirror_checkpoint(7, ck, keep=3, sha256=sha) == ["n2"]
    assert (checkpoint_dir(b.data_dir, 7) / "epoch-0001.pt").read_bytes() == ck.read_bytes()


def test_a_plain_http_request_to_a_tls_data_server_gets_no_answer(pair: tuple[Agent, Agent]) -> None:
    a, _ = pair
    conn = http.client.HTTPConnection("127.0.0.1", a.data.port, timeout=10)
    with pytest.raises((OSError, http.client.HTTPException)):
        conn.request("GET", "/health")
        conn.getresponse().read()
    conn.close()
    # and an agent without a certificate reports plain host:port, as every other test runs


def test_an_agent_without_the_ca_cannot_fetch_from_a_tls_peer(pair: tuple[Agent, Agent], tmp_path: Path) -> None:
    a, _ = pair
    src = shard_path(a.data_dir, "ds", 1)
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(SHARD)
    plain = agent(tmp_path, "n3", None, None)
    try:
        assert plain.address == f"127.0.0.1:{plain.data.port}"
        dest = shard_path(plain.data_dir, "ds", 1)
        with pytest.raises(StagingError) as e:
            fetch(a.address, "shards/ds/1", ("get", "ds", 1), dest, SHARD_SHA, KEY, context=plain.peer_tls)
        assert PEER_CA_HINT in str(e.value) and "--ca" in str(e.value)
        assert not dest.exists()
        ck = tmp_path / "epoch-0002.pt"
        ck.write_bytes(b"w")
        plain.peers = {"n1": a.address}
        assert plain.mirror_checkpoint(8, ck) == []  # not mirrored: logged with the same hint
    finally:
        plain.data.stop()


def test_the_servers_nudge_goes_over_https_with_the_peer_ca(pair: tuple[Agent, Agent], certs: Certs) -> None:
    a, _ = pair
    a._wake.clear()
    _nudge("n1", a.address, KEY, peer_context(certs.ca))
    assert a._wake.is_set()


def test_gsched_fetch_downloads_from_a_tls_agent_and_names_the_ca_without_it(pair: tuple[Agent, Agent],
                                                                             tmp_path: Path) -> None:
    a, _ = pair
    d = checkpoint_dir(a.data_dir, 9)
    d.mkdir(parents=True)
    (d / "epoch-0003.pt").write_bytes(b"final")
    sha = hashlib.sha256(b"final").hexdigest()
    ts = int(__import__("time").time())
    src = {"node": "n1", "address": a.address, "time": ts, "ticket": ticket(KEY, "fetch", 9, "epoch-0003.pt", ts)}
    out = tmp_path / "out"
    out.mkdir()
    assert download(src, 9, "epoch-0003.pt", sha, out, peer_context(a.servers.ca)).read_bytes() == b"final"
    with pytest.raises(OSError) as e:
        download(src, 9, "epoch-0003.pt", sha, tmp_path, peer_context(None))
    assert PEER_CA_HINT in why(e.value)


def test_a_certificate_needs_its_key_and_must_load(tmp_path: Path, certs: Certs) -> None:
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        Agent(["http://127.0.0.1:9"], "n4", "r1", "1", tmp_path / "n4", token="gsa_test", tls_cert=certs.cert)
    with pytest.raises(ValueError, match="cannot load the data server's TLS certificate"):
        DataServer("127.0.0.1", 0, tmp_path, "n5", lambda: KEY, lambda *a: None, tls=(certs.cert, certs.ca))


def test_gsched_agent_says_what_is_wrong_with_its_tls_flags(tmp_path: Path, certs: Certs) -> None:
    import subprocess
    import sys

    def agent_cli(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "scheduler.cli", "agent", "--node", "n6", "--gpus", "1",
                               "--data-dir", str(tmp_path / "n6"), "--token", "gsa_test", *flags],
                              capture_output=True, text=True, timeout=60)

    out = agent_cli("--tls-cert", certs.cert)
    assert out.returncode == 2 and "--tls-cert and --tls-key go together" in out.stderr, out.stderr
    out = agent_cli("--tls-cert", certs.cert, "--tls-key", str(tmp_path / "missing.key"))
    assert out.returncode == 2 and "missing.key" in out.stderr and "Traceback" not in out.stderr, out.stderr
