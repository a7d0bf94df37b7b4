"""Copy a shard (or a checkpoint) from a peer agent, streaming, resuming after a break (HTTP Range),
verifying the sha256 before it counts."""

from __future__ import annotations

import fcntl
import hashlib
import http.client
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from agents.throttle import UNLIMITED, Throttle
from scheduler.protocol.http import open_url
from scheduler.protocol.peers import PEER_CA_HINT, peer_url, untrusted
from scheduler.protocol.servererror import ServerError
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


RESUME_TRIES = 5  # connections one fetch opens in all: the first, then resumes after breaks


def _partial(dest: Path) -> Path:
    """Where a copy of ``dest`` grows: kept after a break, so the next try (or the next fetch of the same
    file from another replica) asks only for the rest."""
    return dest.with_name(dest.name + ".partial")


def fetch(address: str, resource: str, ticket_parts: tuple[object, ...], dest: Path, sha256: str | None,
          peer_key: str, progress: Callable[[int, int, float], None] | None = None, timeout_s: float = 60,
          throttle: Throttle = UNLIMITED, context: ssl.SSLContext | None = None) -> int:
    """GET ``resource`` from the data server at ``address`` (``peer_url``: an ``https://`` one verified
    with ``context``, the cluster's CA) into ``dest`` atomically; returns the bytes of the file.

    A broken transfer resumes where it stopped: the bytes so far stay in ``dest.partial``, and the next
    connection asks for the rest (HTTP ``Range``); up to ``RESUME_TRIES`` connections, and a later fetch
    of the same ``dest`` (from any replica: the bytes are the same) resumes it too.  One fetch of a
    ``dest`` at a time on a node (a lock on the partial file).  ``throttle`` bounds this agent's copies
    in flight and its bandwidth.  ``progress(done, total, rate_bps)`` is called about every 0.5 s.
    Raises ``StagingError`` when the peer refuses, its certificate does not verify (at once, naming the
    CA to give), every try breaks, or the bytes do not hash to
    ``sha256``; ``dest`` is then untouched (a partial left by breaks is kept for a resume, one with
    the wrong bytes is removed).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = _partial(dest)
    with throttle.transfer(), open(part, "ab+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            return _fetch_locked(address, resource, ticket_parts, dest, part, f, sha256, peer_key, progress,
                                 timeout_s, throttle, context)
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _fetch_locked(address: str, resource: str, ticket_parts: tuple[object, ...], dest: Path, part: Path,
                  f: BinaryIO, sha256: str | None, peer_key: str, progress: Callable[[int, int, float], None] | None,
                  timeout_s: float, throttle: Throttle, context: ssl.SSLContext | None) -> int:
    try:
        same = os.stat(part).st_ino == os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
        same = False
    if not same:  # another fetch finished (renamed the partial) while this one waited: never write to it
        if dest.is_file() and (not sha256 or _sha(dest) == sha256):
            return dest.stat().st_size
        raise StagingError(f"{resource}: the partial copy vanished; fetch again")
    digest = hashlib.sha256()
    f.seek(0)
    while block := f.read(CHUNK):  # what an earlier try left: hashed again, not fetched again
        digest.update(block)
    done = f.tell()
    resumed_from = done
    total = 0
    t0 = last = time.monotonic()
    error: Exception | None = None
    for _ in range(RESUME_TRIES):
        headers = ticket_headers(peer_key, *ticket_parts)
        if done:
            headers["Range"] = f"bytes={done}-"
        try:
            with open_url(peer_url(address, resource), headers=headers, timeout_s=timeout_s,
                          context=context) as resp:
                length = int(resp.headers.get("Content-Length", "0"))
                if done and resp.status != 206:  # the peer sent the whole file: start over
                    f.seek(0)
                    f.truncate()
                    digest, done = hashlib.sha256(), 0
                total = done + length
                while block := resp.read(CHUNK):
                    throttle.take(len(block))
                    f.write(block)
                    digest.update(block)
                    done += len(block)
                    now = time.monotonic()
                    if progress and now - last >= 0.5:
                        progress(done, total, (done - resumed_from) / max(now - t0, 1e-6))
                        last = now
            if done >= total:
                error = None
                break
            error = StagingError(f"fetching {resource} from {address}: the connection closed at {done} of {total} bytes")
        except ServerError as e:
            if e.status == 416:  # asked for more than the file has: the partial is not of this file
                f.seek(0)
                f.truncate()
                digest, done = hashlib.sha256(), 0
                error = StagingError(f"fetching {resource} from {address}: a partial copy did not match; restarted")
                continue
            raise StagingError(f"fetching {resource} from {address}: HTTP {e.status} {e.message}") from e
        except (OSError, http.client.HTTPException) as e:
            if untrusted(e):  # no retry mends it
                raise StagingError(f"fetching {resource} from {address}: {PEER_CA_HINT} "
                                   f"({getattr(e, 'reason', e)})") from e
            error = StagingError(f"fetching {resource} from {address}: {e} (at {done} bytes; resuming)")
        f.flush()
    f.flush()
    if error is not None:
        raise error  # the partial stays: the next fetch of this file resumes it
    if progress:
        progress(done, total, (done - resumed_from) / max(time.monotonic() - t0, 1e-6))
    if sha256 and digest.hexdigest() != sha256:
        part.unlink(missing_ok=True)
        raise StagingError(f"{resource} from {address}: sha256 mismatch ({digest.hexdigest()[:12]} != {sha256[:12]})")
    os.fsync(f.fileno())
    os.replace(part, dest)
    return done


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as g:
        while block := g.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()
