"""The agent keeps a rank it reported RUNNING until it has reported how the rank ended.

The server sends no assignment back for a rank the heartbeat reported RUNNING (it has nothing new to
tell it).  A rank that exits while its last log text is still unsent is reported RUNNING once more
(its text goes out first); the agent must not take the missing assignment for "forget it", or the
exit is never reported and the server requeues the job as lost.  The server's side is a stand-in
here that answers as ``process_heartbeat`` does for a running rank: no assignments, no kills.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.agent import Agent
from agents.launcher import RankRunner
from scheduler.protocol.messages import Assignment


def _stand_in_server(agent: Agent) -> list[dict[str, Any]]:
    """Answer the agent's heartbeats as ``process_heartbeat`` does with nothing to tell it; returns the
    list the bodies it sent are appended to."""
    sent: list[dict[str, Any]] = []

    def server(path: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
        sent.append(body)
        return {"assignments": [], "kill": [], "transfers": [], "delete": [], "peer_key": "k" * 64}

    agent._post = server  # type: ignore[method-assign]
    return sent


def test_an_exited_rank_with_unsent_log_text_is_reported_exited_before_it_is_forgotten(tmp_path: Path) -> None:
    agent = Agent(["http://127.0.0.1:9"], "n1", "r1", "1", tmp_path / "node", token="gsa_stand_in")
    sent = _stand_in_server(agent)
    runner = RankRunner(agent, Assignment(job_id=4, attempt=1, rank=0, local_rank=0, world_size=1, local_world_size=1,
                                          devices=[0], shards=[]))
    agent.ranks[runner.key] = runner
    runner._state, runner.exit_code = "EXITED", 0
    runner.log_path.write_text("epoch 3/3: loss 0.1\n")  # the rank's last words, not yet sent

    agent.heartbeat()
    assert [r["state"] for r in sent[0]["ranks"]] == ["RUNNING"]  # its log text goes out first
    assert [c["text"] for c in sent[0]["logs"]] == ["epoch 3/3: loss 0.1\n"]
    assert runner.key in agent.ranks  # no assignment came back, and it is kept

    agent.heartbeat()
    assert [(r["state"], r["exit_code"]) for r in sent[1]["ranks"]] == [("EXITED", 0)]
    assert runner.key not in agent.ranks  # reported over and not assigned: forgotten

    agent.heartbeat()
    assert sent[2]["ranks"] == []


def test_a_shard_noted_while_a_heartbeat_scans_is_reported_by_the_next_heartbeat(tmp_path: Path) -> None:
    # A copy lands (the data server's thread calls note_shard) while a full heartbeat is scanning the data
    # dir: the scan missed it, and the next heartbeat (which note_shard woke) must be a full one again.
    agent = Agent(["http://127.0.0.1:9"], "n1", "r1", "1", tmp_path / "node", token="gsa_stand_in")
    sent = _stand_in_server(agent)
    agent.heartbeat()  # the first report is full (nothing there yet)
    shard = tmp_path / "node" / "d" / "00000.shard"
    scan = agent.inventory.scan

    def scan_while_a_copy_lands(rehash: bool = False) -> list[dict[str, Any]]:
        out = scan(rehash)
        shard.parent.mkdir(parents=True, exist_ok=True)
        shard.write_bytes(b"x" * 10)
        agent.note_shard("d", 0, shard, "a" * 64)
        return out

    agent._last_full = 0.0  # a full report is due
    agent.inventory.scan = scan_while_a_copy_lands  # type: ignore[method-assign]
    agent.heartbeat()
    assert sent[1]["replicas"] == []  # the scan ran before the copy landed
    agent.inventory.scan = scan  # type: ignore[method-assign]
    agent.heartbeat()
    assert [(r["dataset"], r["shard"]) for r in sent[2].get("replicas") or []] == [("d", 0)]
