"""The disk floor: a node whose agent reports less free disk than the floor takes no new ranks and no
new shard copies (``disk_floor_gb`` in the server config, docs/config.md).

Why: a rank writes checkpoints, metrics and logs under the node's data dir, and a copy fills it
further; a node that runs its disk full fails the ranks already there and can damage what it holds.
Held back, the node keeps every rank and copy it has (running ranks finish; nothing stored is
removed), and its copies are still read by ranks on other nodes (reads write nothing there; unlike a
drained node's, whose copies are not read).  It takes work again once its agent reports free disk at
or above the floor.

Read by the snapshot (ranks), by replication and ``gsched data make`` (copies), and by ``gsched
nodes`` and ``gsched explain`` (the words).  Pure.
"""

from __future__ import annotations

GB = 1_000_000_000  # decimal, as disks are sold and as ``gsched nodes`` prints bytes


def floor_bytes(disk_floor_gb: float) -> int:
    """The floor in bytes for a ``disk_floor_gb`` setting (0: no floor)."""
    return max(0, int(disk_floor_gb * GB))


def under_floor(free_bytes: int | None, floor: int) -> bool:
    """True when the node's reported free bytes are under ``floor`` bytes.

    0 or None is "not reported" (``scheduler.core.replicas.reported_room`` reads it so too), and such a
    node is not held back; an agent whose disk is truly full reports 1 byte (agents/inventory.py)."""
    return floor > 0 and bool(free_bytes) and 0 < (free_bytes or 0) < floor


def floor_reason(free_bytes: int | None, floor: int) -> str:
    """The words ``gsched nodes`` and ``gsched explain`` show for a node under the floor, "" otherwise:
    ``low disk: 12.0 MB free, under the 30.0 MB floor (disk_floor_gb)``."""
    if not under_floor(free_bytes, floor):
        return ""
    return f"low disk: {_mb_or_gb(free_bytes or 0)} free, under the {_mb_or_gb(floor)} floor (disk_floor_gb)"


def _mb_or_gb(n: int) -> str:
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / 1e6:.1f} MB"
