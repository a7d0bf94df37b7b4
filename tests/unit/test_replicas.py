"""Replica placement: distinct nodes, rack-aware, each copy of a data set kept whole on one node where it
fits, balanced by bytes across data sets, keeps existing copies, re-makes a lost node's shards together."""

from scheduler.core.replicas import place_replicas

GB = 1_000_000_000
TWO_RACKS = [("a", "r1"), ("b", "r1"), ("c", "r1"), ("d", "r2")]


def test_copies_on_distinct_nodes_and_never_all_in_one_rack() -> None:
    shards = [(i, GB) for i in range(8)]
    placed = place_replicas(shards, TWO_RACKS, replicas=2)
    rack = dict(TWO_RACKS)
    for copies in placed.values():
        assert len(copies) == 2 and len(set(copies)) == 2
        assert len({rack[n] for n in copies}) == 2  # r2 has only d: every shard has a copy on d


def test_each_copy_of_a_data_set_is_whole_on_one_node() -> None:
    # 8 shards x 2 copies: the first copy on the least-loaded node (a, by name), the second in the
    # other rack (d); every later shard joins them, so a and d each hold the whole set
    placed = place_replicas([(i, GB) for i in range(8)], TWO_RACKS, replicas=2)
    assert placed == {i: ["a", "d"] for i in range(8)}


def test_data_sets_are_balanced_by_bytes_with_ties_broken_by_name() -> None:
    nodes = [("c", "r"), ("b", "r"), ("a", "r")]
    load = dict.fromkeys("abc", 0)
    homes = []
    # three data sets of one copy: 3 GB, 2 GB, 1 GB -> a, b, c (least loaded, ties by name); a fourth
    # of 1 GB goes to c (a=3, b=2, c=1 GB)
    for size in (3, 2, 1, 1):
        placed = place_replicas([(0, size * GB)], nodes, 1, node_bytes=load)
        (home,) = {n for copies in placed.values() for n in copies}
        load[home] += size * GB
        homes.append(home)
    assert homes == ["a", "b", "c", "c"]


def test_a_copy_that_does_not_fit_spills_over_to_the_next_least_loaded_node() -> None:
    nodes = [("a", "r"), ("b", "r"), ("c", "r")]
    # a has room for 2 of the 4 one-GB shards: the rest continue together on b (next least loaded)
    placed = place_replicas([(i, GB) for i in range(4)], nodes, 1, room={"a": 2 * GB},
                            node_bytes={"a": 0, "b": 1, "c": 2})
    assert placed == {0: ["a"], 1: ["a"], 2: ["b"], 3: ["b"]}
    # nobody has room: best effort on the least-loaded node rather than no copy
    assert place_replicas([(0, GB)], nodes, 1, room={"a": 0, "b": 0, "c": 0}) == {0: ["a"]}


def test_a_lost_nodes_shards_are_made_again_together_on_one_node() -> None:
    nodes = [("a", "r1"), ("b", "r1"), ("c", "r2"), ("d", "r2")]
    # data set of 4 shards held whole on a and c; c died.  Shard by shard (as re-replication asks),
    # with the data set's bytes per node passed as group_bytes, all four land on one node (d: the other
    # rack, since a is in r1), not scattered over b and d.
    group = {"a": 4 * GB}
    load = {"a": 4 * GB, "b": 0, "d": 0}
    out = []
    for i in range(4):
        plan = place_replicas([(i, GB)], nodes[:2] + nodes[3:], 2, existing={i: ["a"]}, node_bytes=load,
                              group_bytes=group)
        (new,) = [n for n in plan[i] if n != "a"]
        group[new] = group.get(new, 0) + GB
        load[new] += GB
        out.append(new)
    assert out == ["d", "d", "d", "d"]


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
