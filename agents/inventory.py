"""What a node has: its devices and the shard files under its data dir (with their sha256).

Hashing is cached by (size, mtime_ns) so a heartbeat costs a ``stat`` per shard; a full re-hash of
every file (a scrub) runs every ``scrub_interval_s`` so a byte flipped in place is found even when
the file's times were preserved.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
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


def detect_devices(spec: str) -> list[dict[str, Any]]:
    """``--gpus N`` declares N CPU devices (for tests and CPU nodes).  ``auto`` asks nvidia-smi (NVML),
    else torch.cuda in a child process (the agent itself never imports torch), else one CPU device."""
    if spec != "auto":
        n = int(spec)
        if not 0 <= n <= 1024:
            raise ValueError("--gpus must be between 0 and 1024, or auto")
        return [{"index": i, "kind": "cpu", "model": "cpu", "memory_bytes": 0, "healthy": True} for i in range(n)]
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
            devices = []
            for line in out.strip().splitlines():
                idx, name, mem = [x.strip() for x in line.split(",")]
                devices.append({"index": int(idx), "kind": "cuda", "model": name[:128],
                                "memory_bytes": int(float(mem)) * 2**20, "healthy": True})
            if devices:
                return devices
        except (subprocess.SubprocessError, ValueError, OSError) as e:
            log.warning("nvidia-smi did not list devices (%s); asking torch", e)
    devices = _torch_cuda_devices()
    if devices:
        return devices
    log.warning("--gpus auto found no CUDA device (no nvidia-smi, torch.cuda unavailable): one CPU device")
    return [{"index": 0, "kind": "cpu", "model": "cpu", "memory_bytes": 0, "healthy": True}]


_TORCH_PROBE = (
    "import json, torch\n"
    "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "print(json.dumps([[i, torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory]"
    " for i in range(n)]))\n"
)


def _torch_cuda_devices() -> list[dict[str, Any]]:
    """CUDA devices as torch sees them, asked in a child process (importing torch takes seconds and
    hundreds of MB; the agent stays light).  Empty when torch is missing or sees no device."""
    try:
        out = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=120,
                             check=True).stdout
        rows = json.loads(out.strip().splitlines()[-1]) if out.strip() else []
        return [{"index": int(i), "kind": "cuda", "model": str(name)[:128], "memory_bytes": int(mem), "healthy": True}
                for i, name, mem in rows]
    except (subprocess.SubprocessError, ValueError, OSError, IndexError) as e:
        log.warning("torch could not list CUDA devices: %s", e)
        return []


def free_bytes(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
