"""free_port(): a port one process took is not handed to another gsched process on the machine until
the first gives it up (release_port) or ends; two test workers walking the same range one step apart
could otherwise both take a port checked free before either server binds it."""

from __future__ import annotations

import subprocess
import sys

from scheduler.cli import localcluster
from scheduler.cli.localcluster import free_port, release_port

HOLD = """
import sys
from scheduler.cli.localcluster import free_port
print(free_port(), flush=True)
sys.stdin.readline()  # hold the claim until told to end
"""


def test_a_port_another_process_took_is_skipped_until_that_process_ends() -> None:
    other = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None
        theirs = int(other.stdout.readline())
        assert not localcluster._claim(theirs)  # bindable (no server there yet), but claimed
        mine = [free_port() for _ in range(3)]
        assert theirs not in mine and len(set(mine)) == 3
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait(10)
    assert localcluster._claim(theirs)  # the claim ended with its process
    release_port(theirs)
    for port in mine:
        release_port(port)


def test_a_released_port_can_be_claimed_by_another_process() -> None:
    port = free_port()
    probe = f"from scheduler.cli import localcluster; print(localcluster._claim({port}))"
    held = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert held.stdout.strip() == "False"
    release_port(port)
    freed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert freed.stdout.strip() == "True"


HOLD_BLOCK = """
import sys
from scheduler.cli import localcluster
localcluster._next_block = 0
print(localcluster.rendezvous_block(), flush=True)
sys.stdin.readline()
"""


def test_two_processes_starting_at_the_same_rendezvous_block_get_different_ones() -> None:
    other = subprocess.Popen([sys.executable, "-c", HOLD_BLOCK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    saved = localcluster._next_block
    try:
        assert other.stdout is not None
        theirs = other.stdout.readline().strip()
        localcluster._next_block = 0
        mine = localcluster.rendezvous_block()
        # both walk the blocks from block 0: without claims both would get block 0's range
        assert theirs and mine != theirs
        release_port(mine)
    finally:
        localcluster._next_block = saved
        assert other.stdin is not None
        other.stdin.close()
        other.wait(10)
