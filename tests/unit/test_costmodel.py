"""The cost model: bandwidth by distance, integer milliseconds rounded up."""

import math

import pytest

from scheduler.core.costmodel import bandwidth_bps, reads_cost_ms, transfer_cost_ms
from scheduler.core.placement import ShardRead
from scheduler.core.policy_config import PolicyConfig
from tests.builders import GB

CFG = PolicyConfig()  # 25 Gb/s = 3.125e9 B/s in a rack, 10 Gb/s = 1.25e9 B/s across racks
RACKS = {"a": "r1", "b": "r1", "c": "r2"}


@pytest.mark.parametrize(
    ("nbytes", "src", "dst", "expected_ms"),
    [
        (GB, "a", "a", 0),  # same node: free
        (GB, "a", "b", 320),  # 1e9 / 3.125e9 s = 0.32 s
        (GB, "a", "c", 800),  # 1e9 / 1.25e9 s = 0.8 s
        (GB, "a", "unknown", 800),  # a node without a rack counts as another rack
        (1, "a", "b", 1),  # 1 B in 0.00032 ms, rounded up to 1 ms
        (0, "a", "c", 0),  # nothing to move
        (3 * GB, "c", "b", 2400),  # 3 x 800
    ],
)
def test_transfer_cost_ms(nbytes: int, src: str, dst: str, expected_ms: int) -> None:
    assert transfer_cost_ms(nbytes, src, dst, RACKS, CFG) == expected_ms


def test_bandwidth_by_distance() -> None:
    assert bandwidth_bps("a", "a", RACKS, CFG) == math.inf
    assert bandwidth_bps("a", "b", RACKS, CFG) == 25e9 / 8
    assert bandwidth_bps("b", "c", RACKS, CFG) == 10e9 / 8


def test_costs_follow_configured_bandwidths() -> None:
    slow = PolicyConfig(same_rack_bps=1e9, cross_rack_bps=1e8)
    assert transfer_cost_ms(GB, "a", "b", RACKS, slow) == 1000  # 1e9 B at 1e9 B/s
    assert transfer_cost_ms(GB, "a", "c", RACKS, slow) == 10000  # 1e9 B at 1e8 B/s


def test_reads_cost_sums_each_rounded_read() -> None:
    reads = [
        ShardRead(shard=0, rank=0, node="a", source="a", bytes=GB),  # local: 0
        ShardRead(shard=1, rank=0, node="a", source="b", bytes=GB),  # same rack: 320
        ShardRead(shard=2, rank=1, node="c", source="a", bytes=1),  # across: 1 B -> 1 ms
    ]
    assert reads_cost_ms(reads, RACKS, CFG) == 321
