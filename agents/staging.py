"""Copy a shard (or a checkpoint) from a peer agent, streaming, verifying the sha256 before it counts."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from scheduler.protocol.http import ServerError, open_url
from scheduler.protocol.tickets import ticket_headers

CHUNK = 1 << 20


class StagingError(RuntimeError):
    pass


class _Flight:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0  # ranks holding or waiting for the lock


class ShardFlights:
    """One transfer per shard per node: ranks that need the same missing shard at the same time (jobs
    of one data set placed on this node in one cycle) take turns, and whoever comes second finds the
    shard on disk and reads it from there.  One per agent; ``hold`` blocks while another rank of this
    node stages that shard."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._flights: dict[tuple[str, int], _Flight] = {}

    @contextmanager
    def hold(self, dataset: str, index: int) -> Iterator[None]:
        key = (dataset, index)
        with self._guard:
            flight = self._flights.setdefault(key, _Flight())
            flight.users += 1
        try:
            with flight.lock:
                yield
        finally:
            with self._guard:
                flight.users -= 1
                if flight.users == 0:
                    del self._flights[key]

    def waiting(self, dataset: str, index: int) -> int:
        """How many ranks hold or wait for this shard's turn now."""
        with self._guard:
            flight = self._flights.get((dataset, index))
            return flight.users if flight is not None else 0

    def busy(self) -> int:
        """How many shards are being staged or waited for now."""
        with self._guard:
            return len(self._flights)


def fetch(address: str, resource: str, ticket_parts: tuple[object, ...], dest: Path, sha256: str | None,
          peer_key: str, progress: Callable[[int, int, float], None] | None = None, timeout_s: float = 60) -> int:
    """GET ``http://address/resource`` into ``dest`` atomically; returns bytes copied.

    ``progress(done, total, rate_bps)`` is called about every 0.5 s.  Raises ``StagingError`` when the
    peer refuses, the connection breaks, or the bytes do not hash to ``sha256``; ``dest`` is then
    untouched.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".fetch{os.getpid()}-{threading.get_ident()}")
    digest = hashlib.sha256()
    done = 0
    t0 = last = time.monotonic()
    try:
        with open_url(f"http://{address}/{resource}", headers=ticket_headers(peer_key, *ticket_parts),
                      timeout_s=timeout_s) as resp, open(tmp, "wb") as f:
            total = int(resp.headers.get("Content-Length", "0"))
            while block := resp.read(CHUNK):
                f.write(block)
                digest.update(block)
                done += len(block)
                now = time.monotonic()
                if progress and now - last >= 0.5:
                    progress(done, total, done / max(now - t0, 1e-6))
                    last = now
        if progress:
            progress(done, total, done / max(time.monotonic() - t0, 1e-6))
    except ServerError as e:
        tmp.unlink(missing_ok=True)
        raise StagingError(f"fetching {resource} from {address}: HTTP {e.status} {e.message}") from e
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StagingError(f"fetching {resource} from {address}: {e}") from e
    if sha256 and digest.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise StagingError(f"{resource} from {address}: sha256 mismatch ({digest.hexdigest()[:12]} != {sha256[:12]})")
    os.replace(tmp, dest)
    return done
