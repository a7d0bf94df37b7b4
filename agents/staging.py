"""Copy a shard (or a checkpoint) from a peer agent, streaming, verifying the sha256 before it counts."""

from __future__ import annotations

import hashlib
import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from scheduler.auth import ticket_headers

CHUNK = 1 << 20


class StagingError(RuntimeError):
    pass


def fetch(address: str, resource: str, ticket_parts: tuple[object, ...], dest: Path, sha256: str | None,
          peer_key: str, progress: Callable[[int, int, float], None] | None = None, timeout_s: float = 60) -> int:
    """GET ``http://address/resource`` into ``dest`` atomically; returns bytes copied.

    ``progress(done, total, rate_bps)`` is called about every 0.5 s.  Raises ``StagingError`` when the
    peer refuses, the connection breaks, or the bytes do not hash to ``sha256``; ``dest`` is then
    untouched.
    """
    req = urllib.request.Request(f"http://{address}/{resource}", headers=ticket_headers(peer_key, *ticket_parts))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".fetch{os.getpid()}")
    digest = hashlib.sha256()
    done = 0
    t0 = last = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp, open(tmp, "wb") as f:
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
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StagingError(f"fetching {resource} from {address}: {e}") from e
    if sha256 and digest.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise StagingError(f"{resource} from {address}: sha256 mismatch ({digest.hexdigest()[:12]} != {sha256[:12]})")
    os.replace(tmp, dest)
    return done
