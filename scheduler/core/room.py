"""How many bytes a node may still take when new shard copies are placed (``place_replicas``' ``room``).

A node's reported free disk is not all there is to give: bytes already on their way to it (staging and
re-replication transfers in flight) will land whatever is placed now, and each running job whose
checkpoints go there keeps writing them.  So the room is::

    room = free - (bytes still to arrive by transfers in flight) - (checkpoint reserve), at least 0

where a running job reserves ``keep x`` its last recorded checkpoint's size on each node that holds its
checkpoints (rank 0's node and its mirror): ``keep`` is its ``keep_checkpoints``, or for ``0`` (keep
every one) the checkpoints recorded so far plus the next.  A job with no checkpoint recorded yet
reserves nothing (its size is not known).

Pure; ``scheduler.store.room_reader`` reads the facts from the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.core.replicas import reported_room


@dataclass(frozen=True)
class Checkpointing:
    """A running job's checkpoints: ``keep`` (``keep_checkpoints``; 0 keeps all), the size of its last
    recorded one, how many are recorded, and the nodes that hold them (rank 0's node and its mirror)."""

    keep: int
    last_bytes: int
    recorded: int
    nodes: tuple[str, ...]


def checkpoint_reserve(jobs: Iterable[Checkpointing]) -> dict[str, int]:
    """Bytes to keep free per node for the checkpoints running jobs will still write there."""
    out: dict[str, int] = {}
    for j in jobs:
        copies = j.keep if j.keep > 0 else j.recorded + 1
        for n in dict.fromkeys(j.nodes):
            out[n] = out.get(n, 0) + copies * max(0, j.last_bytes)
    return out


def arriving_bytes(transfers: Iterable[tuple[str, int, int]]) -> dict[str, int]:
    """Bytes still to arrive per node from (destination, bytes, bytes done so far) of transfers in flight."""
    out: dict[str, int] = {}
    for dst, total, done in transfers:
        out[dst] = out.get(dst, 0) + max(0, total - max(0, done))
    return out


def placement_room(free_bytes: Iterable[tuple[str, int | None]], arriving: Mapping[str, int],
                   reserve: Mapping[str, int]) -> dict[str, int]:
    """``place_replicas``' ``room``: each node that reported its free bytes, less what is arriving and
    its reserve (never below 0).  A node that has not reported is left out (not limited), as in
    ``reported_room``."""
    return {n: max(0, free - arriving.get(n, 0) - reserve.get(n, 0)) for n, free in reported_room(free_bytes).items()}
