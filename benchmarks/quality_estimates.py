"""Does what the quality grid measured with exact time limits hold with the limits users write?

    python -m benchmarks.quality_estimates
    python -m benchmarks.quality_estimates --cells "philly_5000|itp_500 load 2.5" --out /tmp/users.json

The grid's time limits are the jobs' true run times (the simulator's ``--estimates exact``), which
flatters whatever reads them: the reservation, ``backfill``, ``[policy] shortest_first`` (each
user's jobs smallest first by devices x time limit) and ``[policy] tie_shortest_first`` (tied jobs
that read locally, smallest first).  This replays the contended cells of the grid
(offered load 1.5 and 2.5, seed 0, no node cache, and the two 5,000-job slices) with ``--estimates
users`` (each limit the run time times 1-8, rounded up to the values users write:
``scheduler.sim.simulator.user_limit``) for six rows: ``twostage`` (the default), ``twostage`` with
``shortest_first`` off (each user's jobs by age), ``twostage`` with ``tie_shortest_first`` off (ties
by transfer cost alone), ``twostage+preempt``, ``backfill`` and ``fairshare``.  It prints each cell's
mean JCT, p95 JCT and Jain per row, then what ``shortest_first`` and ``tie_shortest_first`` change
(mean JCT against each turned off) and what preemption changes (against the default without it:
issue 22's measure).  About twelve minutes on two workers.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.quality import Cell, Metrics, grid, run_grid, save_cells
from scheduler.core.policy_config import PolicyConfig

ROWS: tuple[tuple[str, str, PolicyConfig], ...] = (
    ("twostage", "twostage", PolicyConfig()),
    ("twostage, age order", "twostage", PolicyConfig(shortest_first=False)),
    ("twostage, ties by cost", "twostage", PolicyConfig(tie_shortest_first=False)),
    ("twostage+preempt", "twostage+preempt", PolicyConfig()),
    ("backfill", "backfill", PolicyConfig()),
    ("fairshare", "fairshare", PolicyConfig()),
)


def cells(wanted: list[str]) -> list[Cell]:
    """The grid's contended cells (load >= 1.5) of seed 0 and no cache, with users' time limits."""
    out = [replace(c, estimates="users") for c in grid(False)
           if c.load >= 1.5 and c.seed == 0 and c.cache_gb == 0]
    return [c for c in out if not wanted or any(t in c.name for t in wanted)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality_estimates", description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default="", help="only cells whose name contains one of these |-separated texts")
    p.add_argument("--out", default=None, help="also write every figure here (JSON, rows by label)")
    args = p.parse_args(argv)
    todo = cells([t for t in args.cells.split("|") if t])
    if not todo:
        p.error(f"no contended cell matches {args.cells!r}")
    res: dict[tuple[Cell, str], Metrics] = {}
    for cfg in dict.fromkeys(cfg for _, _, cfg in ROWS):  # one run of the grid per set of knobs
        rows = {policy: label for label, policy, c in ROWS if c == cfg}

        def progress(cell: Cell, policy: str, m: Metrics, rows: dict[str, str] = rows) -> None:
            print(f"  {cell.name}, {rows[policy]}: mean JCT {m.mean_jct_s / 3600:.2f} h ({m.wall_s:.0f} s)",
                  file=sys.stderr, flush=True)

        for (cell, policy), m in run_grid(todo, tuple(rows), cfg, progress=progress).items():
            res[(cell, rows[policy])] = m
    if args.out:
        save_cells(res, Path(args.out))
    print("cell | " + " | ".join(f"{label}: mean / p95 h, Jain" for label, _, _ in ROWS))
    for c in todo:
        print(c.name + " | " + " | ".join(
            f"{res[(c, label)].mean_jct_s / 3600:.2f} / {res[(c, label)].p95_jct_s / 3600:.1f}, {res[(c, label)].jain:.3f}"
            for label, _, _ in ROWS))
    print()
    for c in todo:
        on, age, cost, pre = (res[(c, label)] for label in ("twostage", "twostage, age order", "twostage, ties by cost",
                                                             "twostage+preempt"))
        lost = pre.preempted_device_s / pre.busy_device_s if pre.busy_device_s else 0.0
        print(f"{c.name}: shortest_first mean JCT {100 * (on.mean_jct_s / age.mean_jct_s - 1):+.1f} % against age order; "
              f"tie_shortest_first {100 * (on.mean_jct_s / cost.mean_jct_s - 1):+.1f} % against ties by cost; "
              f"preemption mean JCT {100 * (pre.mean_jct_s / on.mean_jct_s - 1):+.1f} %, Jain {pre.jain:.3f}, "
              f"{100 * lost:.2f} % of device time lost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
