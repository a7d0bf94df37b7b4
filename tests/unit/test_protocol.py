"""The wire protocol between the server and the agents (scheduler/protocol/messages.py) and the rank
spec file an agent writes from an assignment (agents/launcher.py): what each end accepts, and the
exact JSON the server sends.  No sockets, no processes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from agents.launcher import workload_spec
from scheduler.protocol.messages import Assignment, Heartbeat, HeartbeatReply, Kill, Peer
from scheduler.protocol.rankspec import RankSpec, TrainKnobs

HEARTBEAT = {"node": "n1", "address": "127.0.0.1:9000", "incarnation": "i1"}
ASSIGNMENT = {
    "job_id": 7, "attempt": 1, "rank": 1, "local_rank": 0, "world_size": 2, "local_world_size": 1, "devices": [0],
    "master_addr": "10.0.0.1", "master_port": None, "train": {"epochs": 2, "channels_last": "on"},
    "num_classes": 4,
    "shards": [{"dataset": "tiny", "index": 0, "sha256": "ab" * 32, "bytes": 100, "source": "n2",
                "source_address": "10.0.0.2:9000", "alternates": []}],
    "resume": None,
}


def test_the_server_refuses_a_heartbeat_field_it_does_not_know() -> None:
    Heartbeat.model_validate(HEARTBEAT)
    with pytest.raises(ValidationError, match="extra"):
        Heartbeat.model_validate({**HEARTBEAT, "root": True})
    with pytest.raises(ValidationError, match="extra"):
        Heartbeat.model_validate({**HEARTBEAT, "ranks": [{"job_id": 1, "attempt": 1, "rank": 0, "state": "RUNNING",
                                                           "root": True}]})


def test_the_agent_ignores_the_fields_a_newer_server_adds() -> None:
    shard = {**ASSIGNMENT["shards"][0], "zone": "z1"}  # type: ignore[index]
    reply = HeartbeatReply.model_validate({
        "assignments": [{**ASSIGNMENT, "priority": 3, "shards": [shard]}], "kill": [], "transfers": [], "delete": [],
        "peer_key": "k" * 64, "quota": {"gpus": 4}})
    assert reply.assignments[0].key == (7, 1, 1)
    assert reply.assignments[0].shards[0].source_address == "10.0.0.2:9000"
    assert reply.peers is None and reply.heartbeat_s is None  # not sent: the agent keeps what it has


def test_the_reply_sends_peers_only_when_there_are_some_to_send() -> None:
    quiet = HeartbeatReply(peer_key="k")
    assert quiet.wire() == {"assignments": [], "kill": [], "transfers": [], "delete": [], "peer_key": "k"}
    busy = HeartbeatReply(kill=[Kill(job_id=3, attempt=2, rank=1)], peer_key="k",
                          peers=[Peer(name="n2", address="10.0.0.2:9000")])
    assert busy.wire() == {"assignments": [], "kill": [{"job_id": 3, "attempt": 2, "rank": 1}], "transfers": [],
                           "delete": [], "peer_key": "k", "peers": [{"name": "n2", "address": "10.0.0.2:9000"}]}
    assert HeartbeatReply.model_validate(busy.wire()) == busy  # what the agent reads is what the server built


def test_an_assignment_reads_the_stored_train_table_with_the_knobs_defaults() -> None:
    a = Assignment.model_validate(ASSIGNMENT)
    knobs = a.knobs()
    assert (knobs.epochs, knobs.channels_last) == (2, "on")  # as stored
    assert (knobs.keep_checkpoints, knobs.lr_scaling) == (TrainKnobs().keep_checkpoints, TrainKnobs().lr_scaling)


def test_a_train_knob_this_agent_does_not_know_fails_the_rank_not_the_reply() -> None:
    reply = HeartbeatReply.model_validate({"assignments": [{**ASSIGNMENT, "train": {"epochs": 2, "ema": 0.99}}]})
    with pytest.raises(ValueError, match=r"(?s)job 7: its \[train\] table does not fit this agent: .*ema"):
        reply.assignments[0].knobs()


def test_the_rank_spec_file_carries_the_knobs_as_the_job_file_says_them() -> None:
    spec = RankSpec(job_id=7, shards=["/d/tiny/00000.shard"], num_classes=4, checkpoint_dir="/c", metrics_path="/m",
                    train=TrainKnobs(channels_last="on", hflip="off"))
    doc = workload_spec(spec)
    assert (doc["train"]["channels_last"], doc["train"]["hflip"]) == ("on", "off")
    assert RankSpec.model_validate(doc) == spec
    assert workload_spec(RankSpec(**{**spec.model_dump(), "train": TrainKnobs()}))["train"]["hflip"] == "auto"
    assert set(doc) == {"job_id", "shards", "num_classes", "checkpoint_dir", "metrics_path", "resume_from",
                        "stop_after_epochs", "train"}
    assert set(doc["train"]) == set(TrainKnobs.model_fields)


def test_the_http_client_loads_neither_pydantic_nor_the_messages() -> None:
    """The agents import it: it must stay light (see its docstring)."""
    out = subprocess.run([sys.executable, "-c", "import sys, scheduler.protocol.http, scheduler.protocol.tickets; "
                          "print(sorted(m for m in ('pydantic', 'scheduler.protocol.messages') if m in sys.modules))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_clis_client_loads_no_http_client_urllib_ssl_or_pydantic() -> None:
    """``gsched queue`` imports it on every start: what it leaves out is most of its start-up (see
    scheduler/protocol/http1.py)."""
    heavy = ("pydantic", "scheduler.protocol.messages", "http.client", "urllib.request", "email.parser", "ssl",
             "typing", "socket")
    out = subprocess.run([sys.executable, "-c", "import sys, scheduler.protocol.client; "
                          f"print(sorted(m for m in {heavy!r} if m in sys.modules))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
