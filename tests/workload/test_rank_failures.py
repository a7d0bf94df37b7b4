"""Which rank failures are the node's, not the job's (agents/rankfail.py), read from what real
torch.distributed processes print when their rendezvous fails."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agents.rankfail import rendezvous_failure
from scheduler.cli.localcluster import free_port  # from a range no outgoing connection draws
from tests.conftest import refused_port

SCRIPT = """
import datetime, sys
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(sys.argv[1])))
dist.destroy_process_group()
"""




def run_rank(tmp_path: Path, port: int, rank: int, world: int, timeout_s: float = 3.0) -> str:
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
           "WORLD_SIZE": str(world)}
    out = subprocess.run([sys.executable, str(script), str(timeout_s)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def test_a_store_port_taken_by_another_process_is_a_rendezvous_failure(tmp_path: Path) -> None:
    with socket.socket() as squatter:  # bound first, then its port handed to the rank: no window
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        text = run_rank(tmp_path, squatter.getsockname()[1], rank=0, world=1)
    sign = rendezvous_failure(text)
    assert sign is not None and "EADDRINUSE" in sign, text[-2000:]


def test_peers_that_never_join_and_a_store_that_cannot_be_reached_are_rendezvous_failures(tmp_path: Path) -> None:
    alone = run_rank(tmp_path, free_port(), rank=0, world=2)
    lonely = rendezvous_failure(alone)
    assert lonely is not None and "waiting for clients" in lonely, alone[-2000:]
    # refused_port, not free_port: a port merely checked free can be taken meanwhile by another test's
    # server, and the rank then fails some other way (it did so once, on a fresh clone).
    with refused_port() as port:
        text = run_rank(tmp_path, port, rank=1, world=2)
    unreachable = rendezvous_failure(text)
    assert unreachable is not None and "trying to connect to" in unreachable, text[-2000:]


@pytest.mark.parametrize("tail", [
    # the job's own bug
    'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    raise ValueError("bad lr: 10")\n'
    "ValueError: bad lr: 10\n",
    # a rendezvous error once, then the job failed on its own later: the last error is what counts
    "torch.distributed.DistStoreError: Timed out after 5 seconds waiting for clients. 1/2 clients joined.\n"
    "retrying by hand...\nTraceback (most recent call last):\nRuntimeError: CUDA out of memory\n",
    "",
    "Killed\n",
])
def test_other_failures_are_the_jobs_own(tail: str) -> None:
    assert rendezvous_failure(tail) is None
