"""``gsched plot``: a job's training curves, or the cluster's use over time, as a PNG.

Who calls: ``cli.cmd_plot`` with the API's documents (``/v1/jobs/{id}``, ``/v1/cluster/history``).
matplotlib is imported here only, with the Agg backend (no display needed).  Figures have a fixed
size (``FIGSIZE_IN`` at ``DPI``), so the PNG is always ``WIDTH_PX`` x ``HEIGHT_PX``.  A document with
nothing to draw raises ``ValueError`` with a message for the user; no file is written then.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any

FIGSIZE_IN = (10.0, 6.0)
DPI = 100
WIDTH_PX, HEIGHT_PX = int(FIGSIZE_IN[0] * DPI), int(FIGSIZE_IN[1] * DPI)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), dpi=DPI, format="png")  # no bbox_inches="tight": the size stays fixed
    _pyplot().close(fig)


def _num(x: Any) -> float:
    return float(x) if isinstance(x, int | float) and math.isfinite(float(x)) else math.nan


def plot_job(job: dict[str, Any], path: str | Path) -> None:
    """Top: training loss and held-out accuracy per epoch; bottom: images/s per epoch (all ranks)."""
    metrics = job.get("metrics") or []
    if not metrics:
        raise ValueError(f"job {job.get('id')} has no epoch metrics yet (state {job.get('state')}); "
                         "plot it after its first epoch")
    plt = _pyplot()
    epochs = [int(m["epoch"]) for m in metrics]
    loss = [_num(m.get("loss")) for m in metrics]
    acc = [100 * _num(m.get("accuracy")) if m.get("accuracy") is not None else math.nan for m in metrics]
    ips = [_num(m.get("images_per_s")) for m in metrics]
    wait = [100 * _num(m.get("data_wait_fraction")) for m in metrics]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=FIGSIZE_IN, sharex=True, height_ratios=(3, 2))
    fig.suptitle(f"job {job.get('id')} {job.get('name', '')} ({job.get('user', '')}): {job.get('state', '')}, "
                 f"{len(job.get('nodes') or [])} node(s)")
    top.plot(epochs, loss, "o-", color="tab:blue", label="training loss")
    top.set_ylabel("loss", color="tab:blue")
    top.grid(alpha=0.3)
    right = top.twinx()
    if any(not math.isnan(a) for a in acc):
        pts = [(e, a) for e, a in zip(epochs, acc, strict=True) if not math.isnan(a)]
        right.plot([e for e, _ in pts], [a for _, a in pts], "s--", color="tab:green", label="held-out accuracy")
    right.set_ylabel("accuracy (%)", color="tab:green")
    right.set_ylim(0, 100)
    handles = top.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    top.legend(handles=handles, loc="center right")
    for ck in job.get("checkpoints") or []:
        top.axvline(ck["epoch"], color="grey", alpha=0.15, linewidth=3)

    bottom.bar(epochs, ips, color="tab:orange", label="images/s (all ranks)")
    bottom.set_ylabel("images/s")
    bottom.set_xlabel("epoch")
    bottom.grid(alpha=0.3, axis="y")
    share = bottom.twinx()
    share.plot(epochs, wait, "k.:", label="time waiting for data (%)")
    share.set_ylabel("data wait (%)")
    share.set_ylim(0, 100)
    bottom.set_ylim(0, max([x for x in ips if not math.isnan(x)] + [1.0]) * 1.35)  # room for the legend
    bottom.legend(handles=bottom.get_legend_handles_labels()[0] + share.get_legend_handles_labels()[0],
                  loc="upper left", ncols=2)
    bottom.set_xticks(epochs if len(epochs) <= 20 else epochs[:: max(1, len(epochs) // 20)])
    fig.tight_layout()
    _save(fig, path)


def plot_cluster(history: list[dict[str, Any]], path: str | Path) -> None:
    """Top: devices busy (and the total, which drops while a node is down); bottom: jobs pending and running."""
    if not history:
        raise ValueError("the server has no cluster history yet: it records one sample per scheduling cycle")
    plt = _pyplot()
    from matplotlib.dates import DateFormatter
    from matplotlib.ticker import MaxNLocator

    times = [datetime.fromtimestamp(float(h["time"])) for h in history]
    busy = [int(h["devices_busy"]) for h in history]
    total = [int(h["devices_total"]) for h in history]
    util = [100 * b / t if t else 0.0 for b, t in zip(busy, total, strict=True)]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=FIGSIZE_IN, sharex=True)
    mean = sum(util) / len(util)
    fig.suptitle(f"cluster: {len(history)} cycles, mean device utilisation {mean:.0f}%")
    top.fill_between(times, busy, step="post", alpha=0.4, color="tab:green", label="devices busy")
    top.step(times, total, where="post", color="black", linewidth=1, label="devices on nodes that are up")
    top.set_ylabel("devices")
    top.set_ylim(0, max(total + busy + [1]) * 1.3)  # room for the legend
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    top.grid(alpha=0.3)
    top.legend(loc="upper left", ncols=2)

    bottom.step(times, [int(h["pending"]) for h in history], where="post", color="tab:red", label="pending (queue)")
    bottom.step(times, [int(h["running"]) for h in history], where="post", color="tab:blue", label="running")
    bottom.set_ylabel("jobs")
    queue_max = max([int(h["pending"]) for h in history] + [int(h["running"]) for h in history] + [1])
    bottom.set_ylim(0, queue_max * 1.3)
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper left", ncols=2)
    span_s = float(history[-1]["time"]) - float(history[0]["time"])
    bottom.xaxis.set_major_formatter(DateFormatter("%H:%M" if span_s < 86400 else "%m-%d %H:%M"))
    bottom.set_xlabel("time (this machine's clock)")
    fig.autofmt_xdate()
    fig.tight_layout()
    _save(fig, path)
