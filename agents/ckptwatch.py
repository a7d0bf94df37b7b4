"""Checkpoints of a command job: whatever rank 0 writes into ``GSCHED_CHECKPOINT_DIR``.

The user's script knows nothing of gsched: it saves files into its checkpoint directory as it likes
(``torch.save(state, f"{dir}/ckpt-{epoch}.pt")``, or one ``latest.pt`` overwritten each epoch).  The
agent scans the directory at each heartbeat; a file (or a new version of one) whose size and mtime
did not change between two scans, or that is there when the rank has ended, is a checkpoint.  The
agent copies it into the job's mirrored store as ``epoch-NNNN.pt`` (numbered on from the checkpoint
the attempt resumed from), mirrors it to another node as the built-in's checkpoints are, and a
requeued job resumes with ``GSCHED_RESUME_FROM`` naming that copy.

The directory belongs to the job's account; the agent (perhaps root) reads it with care: regular
files only, never through a symlink, and only files owned by the job's account.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

IGNORED_SUFFIXES = (".tmp", ".part", ".partial", ".swp")
MAX_FILES = 10000


@dataclass
class CheckpointWatch:
    """Scans ``directory`` for new checkpoint files.  ``owner``: the uid the files must have (None:
    any).  ``next_epoch``: the number the next checkpoint gets."""

    directory: Path
    owner: int | None
    next_epoch: int
    _taken: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (size, mtime_ns) taken
    _last: dict[str, tuple[int, int]] = field(default_factory=dict)  # as the previous scan saw it

    def prime(self) -> None:
        """Take what is there before the rank starts as already taken (an earlier attempt's files)."""
        self._taken = dict(self._files())
        self._last = dict(self._taken)

    def scan(self, final: bool = False) -> list[tuple[str, int]]:
        """(file name, checkpoint number) of the files that became checkpoints since the last scan, oldest
        first: unchanged since the previous scan, or any new version once the rank has ended (``final``)."""
        now = self._files()
        ready = [(name, st) for name, st in now.items()
                 if self._taken.get(name) != st and (final or self._last.get(name) == st)]
        self._last = now
        out = []
        for name, st in sorted(ready, key=lambda kv: (kv[1][1], kv[0])):
            self._taken[name] = st
            out.append((name, self.next_epoch))
            self.next_epoch += 1
        return out

    def pending(self) -> bool:
        """Whether a file there has not been taken yet (a rank that ended is drained only once it is)."""
        return any(self._taken.get(name) != st for name, st in self._files().items())

    def _files(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        try:
            entries = os.scandir(self.directory)
        except OSError:
            return out
        with entries:
            for e in entries:
                if len(out) >= MAX_FILES or e.name.startswith(".") or e.name.endswith(IGNORED_SUFFIXES):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and (self.owner is None or st.st_uid == self.owner):
                    out[e.name] = (st.st_size, st.st_mtime_ns)
        return out


def copy_checkpoint(source: Path, dest: Path, owner: int | None) -> int | None:
    """Copy ``source`` (a file in a job's checkpoint directory) to ``dest`` without following a symlink;
    returns its bytes, or None when it is not a regular file of ``owner`` or changed while copied."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    part = dest.with_name(dest.name + ".copying")
    with os.fdopen(fd, "rb") as src:
        before = os.fstat(src.fileno())
        if not stat.S_ISREG(before.st_mode) or (owner is not None and before.st_uid != owner):
            return None
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(part, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        after = os.fstat(src.fileno())
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        part.unlink(missing_ok=True)
        return None
    os.replace(part, dest)
    return after.st_size
