"""Replica placement: distinct nodes, rack-aware, each copy of a data set kept whole on one node where it
fits, balanced by bytes across data sets, keeps existing copies, re-makes a lost node's shards together."""

from scheduler.core.replicas import default_span, lay_out, observed_span, place_replicas, seen_spans

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


# lay_out: a new data set shaped for jobs spanning ``span`` nodes.  Each stripe of a copy is its shards
# dealt round-robin by index; the nodes are the least loaded allowed ones (ties by name).


def test_one_copy_striped_over_the_two_nodes_of_the_seed_case() -> None:
    # 4 shards, R = 1, two one-device nodes, span 2: stripes {0, 2} and {1, 3}; a (first by name) takes
    # the first stripe, b (now the least loaded) the second.  A 2-rank gang on a and b reads all 4 locally.
    two = [("a", "r"), ("b", "r")]
    assert lay_out([(i, GB) for i in range(4)], two, 1, span=2) == {0: ["a"], 1: ["b"], 2: ["a"], 3: ["b"]}


def test_span_one_is_every_copy_whole_as_before() -> None:
    shards = [(i, GB) for i in range(8)]
    assert lay_out(shards, TWO_RACKS, 2, span=1) == place_replicas(shards, TWO_RACKS, 2)
    assert lay_out(shards, TWO_RACKS, 2, span=1) == {i: ["a", "d"] for i in range(8)}


def test_one_whole_copy_and_the_others_striped_over_other_nodes_and_racks() -> None:
    nodes = [("a", "r1"), ("b", "r1"), ("c", "r1"), ("d", "r2"), ("e", "r2")]
    placed = lay_out([(i, GB) for i in range(8)], nodes, 3, span=4)
    # copy 0 whole on a (least loaded, first by name).  Copy 1 in 4 stripes {0,4} {1,5} {2,6} {3,7}: the
    # rack rule sends the first two to r2 (d, then e: d now holds 2 GB); r2 is then taken by this copy,
    # so the other two go to b and c (b first by name) in r1 next to a: the rule is best effort there.
    # Copy 2: {0,4} sit on a (r1) and d (r2) already, so any rack will do:
    # the least loaded not holding them is b (2 GB, by name before c); then c for {1,5} (on a, e);
    # {2,6} are on a and b: d (2 GB) before e; {3,7} on a and c: e.
    assert placed == {0: ["a", "d", "b"], 1: ["a", "e", "c"], 2: ["a", "b", "d"], 3: ["a", "c", "e"],
                      4: ["a", "d", "b"], 5: ["a", "e", "c"], 6: ["a", "b", "d"], 7: ["a", "c", "e"]}
    for copies in placed.values():
        assert len(set(copies)) == 3  # distinct nodes
    # copy 0 whole on one node; copies 1 and 2 each over 4 distinct nodes
    assert {c[0] for c in placed.values()} == {"a"}
    assert len({c[1] for c in placed.values()}) == 4 and len({c[2] for c in placed.values()}) == 4


def test_more_stripes_than_nodes_share_nodes_never_with_another_copy() -> None:
    # span 4 over 3 nodes: the width is 3 (stripes {0,3} {1,4} {2,5}), one node each
    nodes = [("a", "r1"), ("b", "r1"), ("c", "r2")]
    assert lay_out([(i, GB) for i in range(6)], nodes, 1, span=4) == {
        0: ["a"], 1: ["b"], 2: ["c"], 3: ["a"], 4: ["b"], 5: ["c"]}
    # R = 2 over 2 nodes, span 2: copy 0 whole on a; copy 1's two stripes both need a node other than a,
    # so both land on b: each shard still has two distinct holders
    two = [("a", "r"), ("b", "r")]
    assert lay_out([(i, GB) for i in range(4)], two, 2, span=2) == {i: ["a", "b"] for i in range(4)}


def test_stripes_respect_room_and_existing_load() -> None:
    # b already stores 10 GB, c 0, a 5: stripes of one copy go to c then a (least loaded); b is passed over
    nodes = [("a", "r"), ("b", "r"), ("c", "r")]
    placed = lay_out([(i, GB) for i in range(4)], nodes, 1, span=2, node_bytes={"a": 5 * GB, "b": 10 * GB, "c": 0})
    assert placed == {0: ["c"], 1: ["a"], 2: ["c"], 3: ["a"]}
    # c has room for one shard only: stripe {0, 2} puts 0 on c and spills 2 over to a (next least loaded
    # with room); stripe {1, 3} avoids both nodes of its copy and goes to b
    placed = lay_out([(i, GB) for i in range(4)], nodes, 1, span=2, node_bytes={"a": 5 * GB, "b": 10 * GB, "c": 0},
                     room={"c": GB})
    assert placed == {0: ["c"], 1: ["b"], 2: ["a"], 3: ["b"]}


def test_default_span() -> None:
    assert default_span(1, nodes=2, shards=4) == 2  # the seed case: one-device nodes, striped over both
    assert default_span(1, nodes=8, shards=4) == 4  # at most one stripe per shard
    assert default_span(2, nodes=8, shards=4) == 1  # two or more copies: whole, each node of a gang may hold one
    assert default_span(1, nodes=16, shards=16, devices_per_node=8) == 1  # most jobs fit on one 8-device node


# Re-balancing: lay_out(..., held=current) is the target a data set's layout moves toward once its jobs
# are seen.  A layout that has the shape already is its own target; otherwise only what it lacks moves.


def test_observed_span_is_the_most_common_of_the_latest_jobs_ties_to_the_larger() -> None:
    assert observed_span([]) is None  # no job yet: keep the span given at creation
    assert observed_span([2, 1, 2]) == 2
    assert observed_span([1, 1, 2]) == 1
    assert observed_span([1, 2]) == 2  # one of each: striped (a gang reads all, a one-node job half)
    spans: list[int] = []
    for n in [1] * 20 + [2] * 9:
        spans = seen_spans(spans, n)
    assert len(spans) == 16 and spans.count(2) == 9 and observed_span(spans) == 2  # only the latest 16 count
    assert seen_spans([], 0) == [1]


def test_a_whole_copy_moves_half_its_shards_when_its_jobs_span_two_nodes() -> None:
    # R = 1, 4 shards of 1 GB whole on a; jobs span 2 nodes.  Stripes {0, 2} and {1, 3}: a holds all of
    # {0, 2} (2 GB) so it keeps them; {1, 3} may not share a with its copy's other stripe and goes to the
    # least loaded of b (3 GB stored) and c (1 GB): c.  So 2 copies move (1 and 3 to c), not 4.
    nodes = [("a", "r"), ("b", "r"), ("c", "r")]
    held = {i: ["a"] for i in range(4)}
    load = {"a": 4 * GB, "b": 3 * GB, "c": GB}
    target = lay_out([(i, GB) for i in range(4)], nodes, 1, span=2, node_bytes=load, held=held)
    assert target == {0: ["a"], 1: ["c"], 2: ["a"], 3: ["c"]}
    # once 1 and 3 sit on c (a still holding them until they are healthy) the target stays where it is
    moved = {0: ["a"], 1: ["a", "c"], 2: ["a"], 3: ["a", "c"]}
    assert lay_out([(i, GB) for i in range(4)], nodes, 1, span=2, node_bytes=load, held=moved) == target
    # and without held the from-scratch layout would have put stripe {0, 2} on c and {1, 3} on b:
    # all four shards would move
    assert lay_out([(i, GB) for i in range(4)], nodes, 1, span=2, node_bytes=load) == {
        0: ["c"], 1: ["b"], 2: ["c"], 3: ["b"]}


def test_a_striped_copy_is_made_whole_again_where_most_of_it_is_when_jobs_span_one_node() -> None:
    # R = 1 striped over a {0, 2} and b {1, 3}; jobs now span 1 node.  a and b hold 2 GB each: the tie
    # goes to the less loaded (a: 2 GB, b: 5 GB with another data set), so 1 and 3 move to a.
    nodes = [("a", "r"), ("b", "r")]
    held = {0: ["a"], 1: ["b"], 2: ["a"], 3: ["b"]}
    target = lay_out([(i, GB) for i in range(4)], nodes, 1, span=1, node_bytes={"a": 2 * GB, "b": 5 * GB}, held=held)
    assert target == {i: ["a"] for i in range(4)}


def test_a_lost_stripe_is_made_again_as_a_stripe_not_next_to_its_sibling() -> None:
    # R = 2, span 2, 4 shards: copy 0 whole on a, copy 1 striped {0, 2} on b and {1, 3} on c; c is lost.
    # Held now: a everything, b {0, 2}.  Copy 0: a (holds all 4 GB).  Copy 1, stripe {0, 2}: b holds it.
    # Stripe {1, 3}: a holds them (copy 0), b holds this copy's other stripe, so d, the only other node.
    # (place_replicas' together rule alone would have put 1 and 3 on b, making copy 1 whole again.)
    nodes = [("a", "r1"), ("b", "r2"), ("d", "r2")]
    held = {0: ["a", "b"], 1: ["a"], 2: ["a", "b"], 3: ["a"]}
    load = {"a": 4 * GB, "b": 2 * GB, "d": 0}
    target = lay_out([(i, GB) for i in range(4)], nodes, 2, span=2, node_bytes=load, held=held)
    assert target == {0: ["a", "b"], 1: ["a", "d"], 2: ["a", "b"], 3: ["a", "d"]}


def test_a_node_full_with_the_data_sets_own_copies_keeps_them() -> None:
    # a reports 0 bytes free because it holds the data set: its own 2 GB count as room it has, so the
    # stripe it holds stays on it
    nodes = [("a", "r"), ("b", "r")]
    held = {0: ["a"], 1: ["a"]}
    target = lay_out([(0, GB), (1, GB)], nodes, 1, span=2, node_bytes={"a": 2 * GB}, room={"a": 0}, held=held)
    assert target == {0: ["a"], 1: ["b"]}
