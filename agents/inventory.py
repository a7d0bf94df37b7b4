"""What a node has on disk: the shard files under its data dir (with their sha256), and free bytes.

Its devices are agents/devices.py's.

Hashing is cached by (size, mtime_ns) so a heartbeat costs a ``stat`` per shard; a full re-hash of
every file (a scrub) runs every ``scrub_interval_s`` so a byte flipped in place is found even when
the file's times were preserved.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.shardfile import SHARD_SUFFIX, sha256_file, valid_name

log = logging.getLogger("gsched.agent.inventory")


@dataclass
class _Entry:
    size: int
    mtime_ns: int
    sha256: str


class ShardInventory:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._cache: dict[tuple[str, int], _Entry] = {}
        self.last_report: list[dict[str, Any]] | None = None

    def scan(self, rehash: bool = False) -> list[dict[str, Any]]:
        """Every well-named shard file under the data dir: ``dataset``, ``shard``, ``bytes``, ``sha256``."""
        out: list[dict[str, Any]] = []
        seen = set()
        if not self.data_dir.is_dir():
            return out
        for ds_dir in sorted(self.data_dir.iterdir()):
            if not ds_dir.is_dir() or ds_dir.is_symlink() or not valid_name(ds_dir.name):
                continue
            for f in sorted(ds_dir.iterdir()):
                if f.suffix != SHARD_SUFFIX or f.is_symlink() or not f.stem.isdigit():
                    continue
                key = (ds_dir.name, int(f.stem))
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                entry = self._cache.get(key)
                if rehash or entry is None or entry.size != st.st_size or entry.mtime_ns != st.st_mtime_ns:
                    try:
                        entry = _Entry(st.st_size, st.st_mtime_ns, sha256_file(f))
                    except OSError:
                        continue
                    self._cache[key] = entry
                seen.add(key)
                out.append({"dataset": key[0], "shard": key[1], "bytes": entry.size, "sha256": entry.sha256})
        for key in list(self._cache):
            if key not in seen:
                del self._cache[key]
        return out

    def note(self, dataset: str, shard: int, path: Path, sha256: str) -> None:
        """Record a file this agent just wrote and verified, so it is not hashed again."""
        st = path.stat()
        self._cache[(dataset, shard)] = _Entry(st.st_size, st.st_mtime_ns, sha256)

    def sha(self, dataset: str, shard: int) -> str | None:
        e = self._cache.get((dataset, shard))
        return e.sha256 if e else None


def free_bytes(path: Path) -> int:
    """Free bytes on the disk of ``path``, as the heartbeat reports them: 0 when unknown (the disk
    cannot be read), at least 1 when known, so a full disk (0 free) is told apart from an unknown one
    and held back by the server's disk floor (scheduler/core/diskfloor.py)."""
    try:
        return max(1, shutil.disk_usage(path).free)
    except OSError:
        return 0


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
