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

``--seeds 0-5`` and ``--caches 0,200`` run every named cell at each of those seeds and node caches (in
place of the ones it names): the grid has three seeds, and in the contended ``itp_500`` cells the
mean-JCT change moves by several points from seed to seed, so a verdict read from three is partly
chance (benchmarks/RESULTS.md, "Issue 22's mean bound over twelve cells").  ``NAME=VALUE`` arguments
are ``[policy]`` knobs for both runs, checked as ``benchmarks.quality_row`` checks them.  The last line
sums up the cells at load >= 1.5: how many meet all three targets, the mean-JCT change (mean,
standard deviation, worst cell), Jain (lowest cell, mean) and the most device time lost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace

from benchmarks.quality import PREEMPT, Cell, Metrics, run_grid
from benchmarks.quality_row import knobs
from scheduler.core import arrays
from scheduler.core.policy_config import PolicyConfig


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


def parse_ints(text: str) -> list[int]:
    """``0-5`` or ``0,2,4`` (or both: ``0-2,7``), in the grammar of sbatch's ``--array`` without its
    ``%N`` (:func:`scheduler.core.arrays.parse`: sorted, each once); a malformed one raises
    ``argparse.ArgumentTypeError``."""
    try:
        seeds, cap = arrays.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: not a list of seeds like 0-5 or 0,2,4 ({e})") from None
    if cap is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: not a list of seeds like 0-5 or 0,2,4 (no %)")
    return seeds


def parse_floats(text: str) -> list[float]:
    """``0,200``; a malformed one raises ``argparse.ArgumentTypeError``."""
    try:
        return [float(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a list of node caches in GB like 0,200") from None


def expand(cells: Sequence[Cell], seeds: Sequence[int] | None, caches: Sequence[float] | None) -> list[Cell]:
    """Each cell at each of ``seeds`` and ``caches`` (None: the cell's own), without repeats, in order."""
    out: list[Cell] = []
    for c in cells:
        for seed in seeds if seeds is not None else [c.seed]:
            for cache in caches if caches is not None else [c.cache_gb]:
                cell = replace(c, seed=seed, cache_gb=cache)
                if cell not in out:
                    out.append(cell)
    return out


def compare(cells: Sequence[Cell], workers: int = 2, cfg: PolicyConfig | None = None
            ) -> list[tuple[Cell, Metrics, Metrics]]:
    """(cell, off, on) for each cell, twostage only."""
    res = run_grid(cells, ("twostage", PREEMPT), cfg, workers=workers)  # one pool: no wait between the halves
    return [(c, res[(c, "twostage")], res[(c, PREEMPT)]) for c in cells]


def _lost(on: Metrics) -> float:
    return on.preempted_device_s / on.busy_device_s if on.busy_device_s > 0 else 0.0


def _jct(off: Metrics, on: Metrics) -> float:
    return on.mean_jct_s / off.mean_jct_s - 1 if off.mean_jct_s > 0 else 0.0


def _met(off: Metrics, on: Metrics) -> tuple[bool, bool, bool]:
    """Issue 22's three targets: Jain >= 0.95, at most 3 % of device time lost, mean JCT at most +5 %."""
    return on.jain >= 0.95, _lost(on) <= 0.03, _jct(off, on) <= 0.05


def lines(rows: Sequence[tuple[Cell, Metrics, Metrics]]) -> list[str]:
    out = []
    for cell, off, on in rows:
        lost, jct = _lost(on), _jct(off, on)
        fair, cheap, quick = _met(off, on)
        targets = (f"Jain >= 0.95 {'met' if fair else 'MISSED'}, lost <= 3 % "
                   f"{'met' if cheap else 'MISSED'}, JCT <= +5 % {'met' if quick else 'MISSED'}"
                   if cell.load >= 1.5 else "load < 1.5: no targets")
        out.append(f"{cell.name}: mean JCT {off.mean_jct_s:.0f} -> {on.mean_jct_s:.0f} s ({100 * jct:+.1f} %), "
                   f"Jain {off.jain:.3f} -> {on.jain:.3f}, {on.preemptions} preemptions, "
                   f"{100 * lost:.2f} % of device time lost; gang-bound windows {100 * on.gang_bound_share:.1f} % of "
                   f"the used device time, Jain outside them {on.jain_unbound:.3f}; {targets}")
    return out


def summary(rows: Sequence[tuple[Cell, Metrics, Metrics]]) -> str:
    """One line over the cells at load >= 1.5 (those with targets)."""
    hot = [(c, off, on) for c, off, on in rows if c.load >= 1.5]
    if not hot:
        return "no cell at load >= 1.5: no targets"
    met = sum(all(_met(off, on)) for _, off, on in hot)
    jcts = [100 * _jct(off, on) for _, off, on in hot]
    worst = max(hot, key=lambda r: _jct(r[1], r[2]))
    lowest = min(hot, key=lambda r: r[2].jain)
    sd = statistics.stdev(jcts) if len(jcts) > 1 else 0.0
    return (f"{met} of {len(hot)} cells at load >= 1.5 meet all three targets; mean JCT change "
            f"{statistics.mean(jcts):+.1f} % (sd {sd:.1f}, worst {100 * _jct(worst[1], worst[2]):+.1f} % in "
            f"{worst[0].name}); Jain lowest {lowest[2].jain:.3f} ({lowest[0].name}), mean "
            f"{statistics.mean(on.jain for _, _, on in hot):.3f}; device time lost at most "
            f"{100 * max(_lost(on) for _, _, on in hot):.2f} %")


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality_preempt",
                                description="twostage with [policy] preempt off and on over cells of the quality grid")
    p.add_argument("cells", nargs="*", metavar="SLICE:LOAD[:SEED[:CACHE_GB]] | NAME=VALUE",
                   help="grid cells (default philly_500:2.5), and [policy] knobs for both runs")
    p.add_argument("--seeds", type=parse_ints, default=None, help="run each cell at these seeds (0-5, 0,2,4)")
    p.add_argument("--caches", type=parse_floats, default=None, help="run each cell at these node caches, GB (0,200)")
    args = p.parse_intermixed_args(list(argv))
    try:
        cells = [parse_cell(a) for a in args.cells if "=" not in a] or [parse_cell("philly_500.csv:2.5")]
        pairs = [a for a in args.cells if "=" in a]
        if any(a.partition("=")[0] == "preempt" for a in pairs):
            raise ValueError("preempt: not a knob here (the two runs are preemption off and on)")
        cfg = knobs(pairs)
    except (argparse.ArgumentTypeError, ValueError) as e:  # ConfigError too
        p.error(str(e))
    rows = compare(expand(cells, args.seeds, args.caches), cfg=cfg)
    print("\n".join([*lines(rows), summary(rows)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
