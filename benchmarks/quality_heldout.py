"""Does the quality grid's verdict hold at seeds it never ran?  Its cells at held-out seeds.

    python -m benchmarks.quality_heldout                       # seeds 3-5, node caches 0 and 200 GB
    python -m benchmarks.quality_heldout --seeds 6-8 --preempt stage_penalty=0.2 --out /tmp/h.json
    python -m benchmarks.quality_heldout --seeds 1 --caches 0 --slices philly_5000,itp_5000 --preempt

The grid (``benchmarks.quality``) runs seeds 0-2 (the 5,000-job slices seed 0), and every
``[policy]`` default was chosen by looking at them; a seed draws another placement of the data sets'
copies and another data set for each job on the same trace and cluster, so a default fitted to those
draws would lose ground on others.  This runs the grid's 500-job cells (``philly_500`` and
``itp_500`` at loads 0.7, 1.0, 1.5 and 2.5; ``--slices`` names others of the grid's slices: the
5,000-job ones at load 2.5, 2-7 minutes a row each) at other seeds, every baseline beside the default in the same run, and prints the grid's
summary line per metric (in how many cells the default is within tolerance of the cell's best
baseline, and the worst cell).  ``--preempt`` adds the ``twostage+preempt`` row: its summary lines,
and issue 22's line over the cells at load >= 1.5 (``benchmarks.quality_preempt``).  ``NAME=VALUE``
arguments are ``[policy]`` knobs for the default's rows only (the baselines keep their defaults, as in
``benchmarks.quality_row``).  Seeds 3-5 with both caches: 48 cells x 5 rows in about 4 minutes on two
workers (the preemption row about 5 more).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.quality import (
    BASELINES,
    CACHES_GB,
    LOADS_BY_SLICE,
    PREEMPT,
    SEEDS_BY_SLICE,
    SLICES,
    Cell,
    Metrics,
    run_grid,
    save_cells,
    summarise,
)
from benchmarks.quality_preempt import parse_floats, parse_ints, summary
from benchmarks.quality_row import knobs

DEFAULT_SLICES = ("philly_500.csv", "itp_500.csv")  # by default: the 5,000-job slices take 2-7 minutes a row


def parse_slices(text: str) -> tuple[str, ...]:
    """``philly_5000,itp_5000`` (``.csv`` optional): slices of the grid; another raises
    ``argparse.ArgumentTypeError`` naming the grid's."""
    names = tuple(t if t.endswith(".csv") else t + ".csv" for t in (t.strip() for t in text.split(",")) if t)
    bad = [n for n in names if n not in SLICES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: not a list of the grid's slices "
                                         f"({', '.join(s.removesuffix('.csv') for s in SLICES)})")
    return tuple(dict.fromkeys(names))


def cells(seeds: Sequence[int], caches: Sequence[float], limit: int | None = None,
          slices: Sequence[str] = DEFAULT_SLICES) -> list[Cell]:
    """The grid's cells of ``slices`` (each at each of its loads) at ``seeds`` and ``caches``;
    ``limit``: the first jobs of each slice only (tests)."""
    return [Cell(s, load, seed, cache, limit) for s in slices for load in LOADS_BY_SLICE[s] for seed in seeds
            for cache in caches]


def report(res: dict[tuple[Cell, str], Metrics], todo: Sequence[Cell], preempt: bool) -> list[str]:
    """The grid's summary lines for the default (and, with ``preempt``, its preemption row and issue
    22's line) over ``todo``."""
    out = [f.line() for f in summarise(res, todo)]
    if preempt:
        out += [f.line() for f in summarise(res, todo, who=PREEMPT)]
        out.append("issue 22: " + summary([(c, res[(c, "twostage")], res[(c, PREEMPT)]) for c in todo]))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality_heldout", description=__doc__.split("\n\n")[0])
    p.add_argument("knobs", nargs="*", metavar="NAME=VALUE", help="[policy] knobs for the default's rows")
    p.add_argument("--seeds", type=parse_ints, default=[3, 4, 5], help="seeds (default 3-5; the grid runs 0-2)")
    p.add_argument("--caches", type=parse_floats, default=list(CACHES_GB), help="node caches in GB (default 0,200)")
    p.add_argument("--slices", type=parse_slices, default=DEFAULT_SLICES,
                   help="the grid's slices to run (default philly_500,itp_500)")
    p.add_argument("--preempt", action="store_true", help="add the twostage+preempt row and issue 22's line")
    p.add_argument("--limit", type=int, default=None, help="the first N jobs of each slice only (tests)")
    p.add_argument("--out", default=None, help="also write every figure here (JSON, as quality_grid.json)")
    args = p.parse_intermixed_args(None if argv is None else list(argv))
    try:
        cfg = knobs(args.knobs)
    except ValueError as e:  # ConfigError too
        p.error(str(e))
    if args.limit is not None and args.limit < 1:
        p.error(f"--limit {args.limit}: must be at least 1")
    todo = cells(args.seeds, args.caches, args.limit, args.slices)
    grid_seeds = sorted({s for slice_ in args.slices for s in SEEDS_BY_SLICE[slice_]})
    mine = ("twostage", PREEMPT) if args.preempt else ("twostage",)
    print(f"{len(todo)} cells ({', '.join(s.removesuffix('.csv') for s in args.slices)}) at seeds "
          f"{', '.join(map(str, args.seeds))} (the grid runs {', '.join(map(str, grid_seeds))}); rows: "
          f"{', '.join(mine + BASELINES)}" + (f"; knobs for the default's rows: {' '.join(args.knobs)}"
                                                if args.knobs else ""), flush=True)

    def progress(cell: Cell, row: str, m: Metrics) -> None:
        print(f"  {cell.name}, {row}: mean JCT {m.mean_jct_s / 3600:.2f} h ({m.wall_s:.0f} s)", file=sys.stderr, flush=True)

    if args.knobs:  # the baselines keep the defaults: two runs
        res = run_grid(todo, mine, cfg, progress=progress) | run_grid(todo, BASELINES, progress=progress)
    else:
        res = run_grid(todo, mine + BASELINES, progress=progress)
    if args.out:
        save_cells(res, Path(args.out))
    print("\n".join(report(res, todo, args.preempt)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
