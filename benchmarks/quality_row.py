"""Replay one row of the quality grid with changed ``[policy]`` knobs and compare it, cell by cell, with
the last full run's figures (``quality_grid.json``), without running the baselines again.

    python -m benchmarks.quality_row twostage+preempt preempt_after_s=310
    python -m benchmarks.quality_row twostage locality_wait_s=60 --cells "philly_500 load 0.7|itp_500 load 1.0"

Prints, per metric, how many cells are within tolerance of the best baseline before and after, then
every verdict that flipped (the cell, the figure before and after, the best baseline's).  The
baselines' figures are those of the JSON: the simulator is deterministic, so a row replayed with the
same knobs gives the same figures (wall time aside).  Knobs are the ``[policy]`` keys of gsched.toml
(:class:`PolicyConfig`'s fields), given as ``name=value`` and checked as the server checks them
(``preempt=true``, ``preempt_after_s=5m``).  A row takes 1-5 minutes over the whole grid on two
workers; ``--cells`` keeps the cells whose name contains one of its ``|``-separated texts.

A change to the contended cells moves counts by chance: a 10 s change of ``preempt_after_s`` flipped
twelve verdicts (benchmarks/RESULTS.md, "how much the counts move by chance").  Read the flips, not
only the counts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.quality import (
    CELLS,
    POLICIES,
    PREEMPT,
    TOLERANCES,
    Cell,
    Metrics,
    best_baseline,
    load_cells,
    run_grid,
    save_cells,
)
from scheduler.core.policy_config import PolicyConfig
from scheduler.server.config import policy_with

Results = Mapping[tuple[Cell, str], Metrics]


def knobs(pairs: Sequence[str]) -> PolicyConfig:
    """A :class:`PolicyConfig` with ``name=value`` pairs over the defaults, read and checked by the
    server's own ``[policy]`` schema (durations as text, each key's type and range); ``ValueError``
    (``ConfigError``) names a bad one."""
    values: dict[str, str] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"{pair!r}: expected NAME=VALUE")
        values[name] = text
    return policy_with(values, "knobs")


def verdicts(res: Results, base: Results, cell: Cell, row: str) -> dict[str, tuple[bool, float, float]]:
    """Per metric label: (within tolerance, the row's figure, the best baseline's) in ``cell``."""
    out = {}
    for metric, label, higher, ok, _ in TOLERANCES:
        _, best = best_baseline(base, cell, metric, higher)
        v = getattr(res[(cell, row)], metric)
        out[label] = (bool(ok(v, best)), v, best)
    return out


def compare(new: Results, base: Results, row: str) -> list[str]:
    """The report's lines: counts before -> after per metric, then each flipped verdict."""
    cells = sorted({c for c, r in new if r == row}, key=lambda c: c.name)
    before = {label: 0 for _, label, *_ in TOLERANCES}
    after = dict(before)
    flips = []
    for cell in cells:
        old, now = verdicts(base, base, cell, row), verdicts(new, base, cell, row)
        for label in before:
            before[label] += old[label][0]
            after[label] += now[label][0]
            if old[label][0] != now[label][0]:
                flips.append(f"  {cell.name}: {label} {'in' if now[label][0] else 'out'} "
                             f"({old[label][1]:.4g} -> {now[label][1]:.4g}; best baseline {now[label][2]:.4g})")
    counts = ", ".join(f"{label} {before[label]} -> {after[label]}" for label in before)
    return [f"{row} over {len(cells)} cells, within tolerance of the best baseline: {counts}",
            f"{len(flips)} verdicts flipped" + (":" if flips else ""), *flips]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality_row", description=__doc__.split("\n\n")[0])
    p.add_argument("row", choices=(*POLICIES, PREEMPT), help="the row to replay")
    p.add_argument("knobs", nargs="*", help="[policy] knobs, NAME=VALUE")
    p.add_argument("--cells", default="", help="only cells whose name contains one of these |-separated texts")
    p.add_argument("--grid", default=str(CELLS), help="the full run's figures (default: %(default)s)")
    p.add_argument("--out", default=None, help="also write the replayed row's figures here (JSON)")
    args = p.parse_intermixed_args(argv)
    try:
        cfg = knobs(args.knobs)
    except ValueError as e:  # ConfigError too
        p.error(str(e))
    base = load_cells(Path(args.grid))
    wanted = [t for t in args.cells.split("|") if t]
    cells = sorted({c for c, r in base if r == args.row and (not wanted or any(t in c.name for t in wanted))},
                   key=lambda c: c.name)
    if not cells:
        p.error(f"no cell of {args.grid} has a {args.row} row" + (f" and matches {args.cells!r}" if wanted else ""))

    def progress(cell: Cell, row: str, m: Metrics) -> None:
        print(f"  {cell.name}: mean JCT {m.mean_jct_s / 3600:.2f} h ({m.wall_s:.0f} s)", file=sys.stderr, flush=True)

    new = run_grid(cells, (args.row,), cfg, progress=progress)
    if args.out:
        save_cells(new, Path(args.out))
    print("\n".join(compare(new, base, args.row)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
