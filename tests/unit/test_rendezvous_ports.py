"""The agent's rendezvous ports (agents/ports.py): held ports are never handed out twice, ports other
processes listen on are skipped, and the range is walked round rather than from its start."""

from __future__ import annotations

import socket

import pytest

from agents.ports import PortRangeError, RendezvousPorts, bindable, parse_range

FIRST = 31800  # below the ephemeral range, apart from what the cluster tests use


def listening(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))  # a specific address: the wildcard bind of a store would still clash
    s.listen()
    return s


def test_ranges_parse_and_bad_ones_say_what_to_give() -> None:
    assert parse_range("29500-29999") == (29500, 29999)
    assert parse_range(" 29500 ") == (29500, 29500)
    for bad in ("29999-29500", "abc", "1-2-3", "80-90", "29500-70000", ""):
        with pytest.raises(PortRangeError, match="--rendezvous-ports"):
            parse_range(bad)


def test_a_port_someone_listens_on_is_not_bindable_and_a_free_one_is() -> None:
    s = listening(FIRST)
    try:
        assert not bindable(FIRST)
        assert bindable(FIRST + 1)
    finally:
        s.close()
    assert bindable(FIRST)


def test_a_held_port_is_never_handed_out_again_until_released() -> None:
    ports = RendezvousPorts(FIRST, FIRST + 2)
    got = [ports.take(("job", i)) for i in range(3)]
    assert got == [FIRST, FIRST + 1, FIRST + 2]
    assert ports.take(("job", 3)) is None  # all three held by this agent's jobs
    ports.release(FIRST + 1)
    assert ports.take(("job", 4)) == FIRST + 1
    assert ports.held() == {FIRST: ("job", 0), FIRST + 1: ("job", 4), FIRST + 2: ("job", 2)}


def test_ports_other_processes_hold_are_skipped() -> None:
    ports = RendezvousPorts(FIRST, FIRST + 2)
    blocker = listening(FIRST)
    try:
        assert ports.take("a") == FIRST + 1
        assert ports.take("b") == FIRST + 2
        assert ports.take("c") is None  # FIRST is another process's
    finally:
        blocker.close()
    assert ports.take("c") == FIRST


def test_the_range_is_walked_round_so_a_port_just_freed_is_reused_last() -> None:
    ports = RendezvousPorts(FIRST, FIRST + 3, start=2)  # this node starts at the third port
    assert ports.take("a") == FIRST + 2
    ports.release(FIRST + 2)
    assert [ports.take(k) for k in "bcd"] == [FIRST + 3, FIRST, FIRST + 1]
    assert ports.take("e") == FIRST + 2
