"""``room`` for placing copies (scheduler/core/room.py): free disk less transfers in flight and the
checkpoint reserve of running jobs, with the numbers worked out by hand."""

from __future__ import annotations

from scheduler.core.replicas import place_replicas, reported_room
from scheduler.core.room import Checkpointing, arriving_bytes, checkpoint_reserve, placement_room

GB = 10**9
MB = 10**6


def test_room_is_free_disk_less_bytes_to_arrive_and_the_checkpoint_reserve() -> None:
    # In flight to n1: 3 GB with 1 GB done (2 GB to come) and 500 MB not started: 2.5 GB to arrive.
    arriving = arriving_bytes([("n1", 3 * GB, 1 * GB), ("n1", 500 * MB, 0), ("n3", 100 * MB, 100 * MB)])
    assert arriving == {"n1": 2500 * MB, "n3": 0}
    # Job A keeps 3 checkpoints of 500 MB on rank 0's node n1 and its mirror n2: 1.5 GB on each.
    # Job B keeps every one (keep 0); 4 recorded of 200 MB: the 4 and the next, 5 x 200 MB = 1 GB on n2, n3.
    # Job C has recorded none yet: its size is not known, it reserves nothing.
    reserve = checkpoint_reserve([Checkpointing(keep=3, last_bytes=500 * MB, recorded=2, nodes=("n1", "n2")),
                                  Checkpointing(keep=0, last_bytes=200 * MB, recorded=4, nodes=("n2", "n3", "n2")),
                                  Checkpointing(keep=3, last_bytes=0, recorded=0, nodes=("n4",))])
    assert reserve == {"n1": 1500 * MB, "n2": 2500 * MB, "n3": 1000 * MB, "n4": 0}
    free = [("n1", 10 * GB), ("n2", 2 * GB), ("n3", 5 * GB), ("n4", 0)]
    assert placement_room(free, arriving, reserve) == {
        "n1": 6 * GB,  # 10 - 2.5 - 1.5
        "n2": 0,       # 2 - 2.5: never below 0
        "n3": 4 * GB,  # 5 - 0 - 1
    }                  # n4 reported nothing: not limited, as in reported_room


def test_a_copy_skips_a_node_whose_free_disk_is_promised_to_checkpoints() -> None:
    # n2 and n3 hold nothing (a tie, broken by name: n2).  n2 reports 2 GB free, enough for a 1.5 GB
    # shard, but 2.5 GB of it is reserved for checkpoints: the copy goes to n3 instead.
    nodes = [("n2", "r1"), ("n3", "r1")]
    free = [("n2", 2 * GB), ("n3", 5 * GB)]
    assert place_replicas([(0, 1500 * MB)], nodes, 1, room=reported_room(free)) == {0: ["n2"]}
    room = placement_room(free, {}, {"n2": 2500 * MB, "n3": 1000 * MB})
    assert place_replicas([(0, 1500 * MB)], nodes, 1, room=room) == {0: ["n3"]}
