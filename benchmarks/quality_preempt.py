"""Preemption on and off over a few cells of the quality grid (``benchmarks.quality``), side by side.

``python -m benchmarks.quality_preempt [SLICE:LOAD[:SEED[:CACHE_GB]] ...]`` (default
``philly_500.csv:2.5``) replays each cell with ``twostage`` with ``[policy] preempt`` off and on, and
prints mean JCT, Jain, preemptions and the share of held device time lost to preemption, with the
issue's targets for cells at offered load >= 1.5: Jain >= 0.95, at most 3 % of device time lost,
mean JCT at most 5 % worse than without preemption.  Beside Jain it prints how much of the used device
time fell in *gang-bound* windows (``scheduler.sim.simulator.gang_bound``: a user under their part
waits for, or over it holds, a job wider than the part) and Jain over the other windows, which tells
a policy's unfairness from the one the trace's gang widths force.  It does not run the whole grid (40+
minutes).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from benchmarks.quality import PREEMPT, Cell, Metrics, run_grid


def parse_cell(text: str) -> Cell:
    """``SLICE:LOAD[:SEED[:CACHE_GB]]``; a malformed one raises ``argparse.ArgumentTypeError`` naming it."""
    parts = text.split(":")
    if not parts[0] or "_" not in parts[0] or len(parts) > 4:
        raise argparse.ArgumentTypeError(f"{text!r}: not SLICE:LOAD[:SEED[:CACHE_GB]] (e.g. itp_500:2.5:0:200)")
    slice_ = parts[0] if parts[0].endswith(".csv") else parts[0] + ".csv"
    try:
        load = float(parts[1]) if len(parts) > 1 else 2.5
        seed = int(parts[2]) if len(parts) > 2 else 0
        cache = float(parts[3]) if len(parts) > 3 else 0.0
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return Cell(slice_, load, seed, cache)


def compare(cells: Sequence[Cell], workers: int = 2) -> list[tuple[Cell, Metrics, Metrics]]:
    """(cell, off, on) for each cell, twostage only."""
    res = run_grid(cells, ("twostage", PREEMPT), workers=workers)  # one pool: no wait between the halves
    return [(c, res[(c, "twostage")], res[(c, PREEMPT)]) for c in cells]


def lines(rows: Sequence[tuple[Cell, Metrics, Metrics]]) -> list[str]:
    out = []
    for cell, off, on in rows:
        lost = on.preempted_device_s / on.busy_device_s if on.busy_device_s > 0 else 0.0
        jct = on.mean_jct_s / off.mean_jct_s - 1 if off.mean_jct_s > 0 else 0.0
        targets = (f"Jain >= 0.95 {'met' if on.jain >= 0.95 else 'MISSED'}, lost <= 3 % "
                   f"{'met' if lost <= 0.03 else 'MISSED'}, JCT <= +5 % {'met' if jct <= 0.05 else 'MISSED'}"
                   if cell.load >= 1.5 else "load < 1.5: no targets")
        out.append(f"{cell.name}: mean JCT {off.mean_jct_s:.0f} -> {on.mean_jct_s:.0f} s ({100 * jct:+.1f} %), "
                   f"Jain {off.jain:.3f} -> {on.jain:.3f}, {on.preemptions} preemptions, "
                   f"{100 * lost:.2f} % of device time lost; gang-bound windows {100 * on.gang_bound_share:.1f} % of "
                   f"the used device time, Jain outside them {on.jain_unbound:.3f}; {targets}")
    return out


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality_preempt",
                                description="twostage with [policy] preempt off and on over cells of the quality grid")
    p.add_argument("cells", nargs="*", type=parse_cell, metavar="SLICE:LOAD[:SEED[:CACHE_GB]]",
                   help="grid cells (default philly_500:2.5)")
    cells = p.parse_args(list(argv)).cells or [parse_cell("philly_500.csv:2.5")]
    print("\n".join(lines(compare(cells))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
