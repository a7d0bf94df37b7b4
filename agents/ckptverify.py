"""Which recorded checkpoint a resumed rank loads: the newest whose bytes hash to the sha256 the
server recorded when the checkpoint was reported.

The candidates come newest first (the assignment's ``resume`` then ``resume_older``).  For each, the
copy on this node is used if it hashes right; a copy that does not is moved aside (a hidden
``.NAME.corrupt`` beside it, which no checkpoint name matches) and the file is fetched from the nodes
holding it, ``fetch`` checking the bytes against the same sha256 before they are renamed into place.
A checkpoint with no sha256 recorded, or with no good copy anywhere, is skipped for the one before it;
each skip is returned with its reason (the launcher reports it, and the server logs a
``checkpoint.skipped`` event).  Nothing unverified is ever returned.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agents.shardfile import sha256_file
from agents.staging import StagingError
from scheduler.protocol.messages import Resume

log = logging.getLogger(__name__)

# fetch(address, name, dest, sha256): the file from a peer into dest, verified; raises StagingError
Fetch = Callable[[str, str, Path, str], object]


@dataclass
class Choice:
    checkpoint: Resume | None = None  # None: no candidate verified
    path: Path | None = None
    skipped: list[tuple[Resume, str]] = field(default_factory=list)  # (checkpoint, why), newest first


def verified(path: Path, sha256: str) -> bool:
    """Whether ``path`` is a file whose bytes hash to ``sha256`` (never true for an empty sha256)."""
    if not sha256 or not path.is_file() or path.is_symlink():
        return False
    try:
        return sha256_file(path) == sha256
    except OSError:
        return False


def set_aside(path: Path) -> None:
    """Move a copy that failed its check out of the checkpoint names (kept for a look, not loaded)."""
    try:
        os.replace(path, path.with_name(f".{path.name}.corrupt"))
    except OSError as e:
        log.warning("cannot move aside %s: %s", path, e)


def choose(candidates: Sequence[Resume], local_of: Callable[[str], Path], fetch: Fetch, node: str) -> Choice:
    """The newest of ``candidates`` with a verified copy on this node (fetched if need be)."""
    out = Choice()
    for c in candidates:
        name = Path(c.path).name
        if not c.sha256:
            out.skipped.append((c, "no sha256 recorded for it"))
            continue
        local = local_of(name)
        why = []
        if local.exists():
            if verified(local, c.sha256):
                out.checkpoint, out.path = c, local
                return out
            why.append(f"the copy on {node} does not match its sha256")
            set_aside(local)
        for peer, address in zip(c.nodes, c.addresses, strict=False):
            if peer == node or not address:
                continue
            try:
                fetch(address, name, local, c.sha256)
            except StagingError as e:
                why.append(f"from {peer}: {e}")
                continue
            if verified(local, c.sha256):  # fetch checked it; checked again where it now lies
                out.checkpoint, out.path = c, local
                return out
            why.append(f"the copy fetched from {peer} does not match its sha256")
            set_aside(local)
        out.skipped.append((c, "; ".join(why) or "no node holds a copy"))
    return out
