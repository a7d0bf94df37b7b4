"""The job retention (``gsched agent --job-retention 7d``): a finished job's directory on this node,
``DATA_DIR/.gsched/jobs/ID`` (its attempts' logs and metric lines, its checkpoints, mirrored ones
included), is kept that long after the job ended, then removed, so finished jobs do not fill the disk.
``gsched fetch JOB`` downloads what is worth keeping before then.

The node does not decide when a job ended: about once a minute its heartbeat lists the job
directories it holds (``job_dirs``) and the server answers which of those jobs have ended and how long
ago (``ended``, an age, so the clocks need not agree).  A directory is removed only when the server
says its job ended at least the retention ago and no rank of the job runs here; a job the server does
not know, or one not ended, keeps its directory.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Collection, Iterable
from pathlib import Path

from scheduler.protocol.messages import Ended

log = logging.getLogger("gsched.agent")

SWEEP_EVERY_S = 60.0  # how often the job directories are listed to the server (at most)
MAX_LISTED = 100000  # the heartbeat's limit on job_dirs


def jobs_dir(data_dir: Path) -> Path:
    return data_dir / ".gsched" / "jobs"


def job_dir_ids(data_dir: Path) -> list[int]:
    """Ids of the job directories under ``data_dir`` (real directories named by a job id), lowest first."""
    try:
        entries = list(jobs_dir(data_dir).iterdir())
    except OSError:
        return []
    return sorted(int(p.name) for p in entries
                  if p.name.isascii() and p.name.isdigit() and int(p.name) >= 1 and p.is_dir() and not p.is_symlink())


def expired(ended: Iterable[Ended], retention_s: float, live: Collection[int]) -> list[int]:
    """The jobs whose directories may go: ended at least ``retention_s`` ago, no rank of theirs in
    ``live`` (ranks running on this node).  Pure."""
    return sorted(e.job_id for e in ended if e.ago_s >= retention_s and e.job_id not in live)


class JobRetention:
    """One agent's retention.  ``retention_s`` None keeps every directory (nothing is ever listed)."""

    def __init__(self, data_dir: Path, retention_s: float | None, sweep_s: float = SWEEP_EVERY_S) -> None:
        self.data_dir = data_dir
        self.retention_s = retention_s
        # a short retention is swept more often (tests, small disks), never more than once a second
        self.sweep_s = sweep_s if retention_s is None else max(1.0, min(sweep_s, retention_s / 2))
        self._last = time.monotonic()

    def due(self, now: float) -> list[int] | None:
        """The ``job_dirs`` for a heartbeat at ``now`` (monotonic) if a sweep is due, else None."""
        if self.retention_s is None or now - self._last < self.sweep_s:
            return None
        self._last = now
        return job_dir_ids(self.data_dir)[:MAX_LISTED]

    def apply(self, ended: list[Ended] | None, live: Collection[int]) -> list[int]:
        """Remove the directories of the jobs ``ended`` says may go; returns their ids.  Idempotent."""
        if self.retention_s is None or not ended:
            return []
        removed = []
        for job_id in expired(ended, self.retention_s, live):
            path = jobs_dir(self.data_dir) / str(job_id)
            if not path.is_dir() or path.is_symlink():
                continue
            try:
                shutil.rmtree(path)  # symlinks inside are removed, never followed
            except OSError as e:
                log.warning("job %d: could not remove its directory %s: %s", job_id, path, e)
                continue
            log.info("job %d ended more than %.0fs ago: removed its directory %s", job_id, self.retention_s, path)
            removed.append(job_id)
        return removed
