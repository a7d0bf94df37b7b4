"""Replica placement: distinct nodes, rack-aware, balanced by bytes, keeps existing copies."""

from scheduler.replicas import place_replicas

GB = 1_000_000_000
TWO_RACKS = [("a", "r1"), ("b", "r1"), ("c", "r1"), ("d", "r2")]


def test_copies_on_distinct_nodes_and_never_all_in_one_rack() -> None:
    shards = [(i, GB) for i in range(8)]
    placed = place_replicas(shards, TWO_RACKS, replicas=2)
    rack = dict(TWO_RACKS)
    for copies in placed.values():
        assert len(copies) == 2 and len(set(copies)) == 2
        assert len({rack[n] for n in copies}) == 2  # r2 has only d: every shard has a copy on d
    # 16 copies: d takes 8 (one of each shard), a, b, c share the other 8 (3, 3, 2 by name order)
    load = {n: sum(n in c for c in placed.values()) for n, _ in TWO_RACKS}
    assert load == {"a": 3, "b": 3, "c": 2, "d": 8}


def test_balanced_by_bytes_with_ties_broken_by_name() -> None:
    # one copy each, largest first, to the least-loaded node (ties by name):
    # shard 1 (3 GB) -> a; shard 2 (2 GB) -> b; shard 0 (1 GB) -> c; shard 3: a=3, b=2, c=1 GB -> c
    placed = place_replicas(
        [(0, GB), (1, 3 * GB), (2, 2 * GB), (3, GB)], [("c", "r"), ("b", "r"), ("a", "r")], 1
    )
    assert placed == {1: ["a"], 2: ["b"], 0: ["c"], 3: ["c"]}


def test_keeps_existing_copies_and_adds_only_missing_ones() -> None:
    nodes = [("a", "r1"), ("b", "r1"), ("c", "r2")]
    # shard 0 lost its copy on a dead node; b still holds one: add one more, in r2 (b is in r1)
    assert place_replicas([(0, GB)], nodes, replicas=2, existing={0: ["b"]}) == {0: ["b", "c"]}
    # already enough copies: unchanged
    assert place_replicas([(0, GB)], nodes, replicas=2, existing={0: ["a", "c"]}) == {0: ["a", "c"]}


def test_existing_load_steers_new_copies() -> None:
    nodes = [("a", "r1"), ("b", "r1")]
    assert place_replicas([(0, GB)], nodes, 1, node_bytes={"a": 0, "b": 5 * GB}) == {0: ["a"]}
    assert place_replicas([(0, GB)], nodes, 1, node_bytes={"a": 5 * GB, "b": 0}) == {0: ["b"]}


def test_fewer_nodes_than_replicas_places_as_many_as_possible() -> None:
    assert place_replicas([(0, GB)], [("a", "r1"), ("b", "r2")], replicas=3) == {0: ["a", "b"]}
    assert place_replicas([(0, GB)], [], replicas=3) == {0: []}


def test_deterministic() -> None:
    shards = [(i, (i % 3 + 1) * GB) for i in range(20)]
    nodes = [(f"n{i}", f"r{i % 3}") for i in range(7)]
    assert place_replicas(shards, nodes, 3) == place_replicas(shards, nodes, 3)
