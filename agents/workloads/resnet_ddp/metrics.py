"""The metric lines: rank 0 appends one JSON object per line to ``metrics_path``; the agent reads them.

::

    {"type": "progress", "job_id", "epoch", "step", "steps", "time"}        # at most every 2 s
    {"type": "epoch", "job_id", "epoch" (1-based), "loss" (mean training loss over all ranks),
     "accuracy" (held-out, all ranks; null when not evaluated this epoch), "eval_samples",
     "images_per_s" (all ranks), "images_per_s_rank" (mean per rank), "data_wait_fraction"
     (mean over ranks of time blocked on input / epoch time), "data_wait_s", "step_time_s"
     (mean per optimizer step), "steps", "lr" (after the epoch), "epoch_time_s", "world_size",
     "backend" ("nccl" | "gloo"), "device" ("cuda" | "cpu"), "bf16", "channels_last", "time"}
    {"type": "checkpoint", "job_id", "epoch", "path", "bytes", "time"}
    {"type": "done", "job_id", "epoch", "stopped", "time"}   # training finished or stopped (SIGTERM)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

PROGRESS_EVERY_S = 2.0


class MetricsWriter:
    """Rank 0's JSON-lines writer; other ranks get one that writes nothing."""

    def __init__(self, path: str | None, job_id: int) -> None:
        self.path = Path(path) if path else None
        self.job_id = job_id
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, kind: str, **values: Any) -> None:
        """Append ``{"type": kind, "job_id", **values, "time"}`` as one line."""
        if not self.path:
            return
        line = json.dumps({"type": kind, "job_id": self.job_id, **values, "time": time.time()})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
