"""``python -m benchmarks --quick`` runs end to end for the cycle and quality sections (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.__main__ import main
from benchmarks.quality import TRACES
from scheduler.core.policy_config import PolicyConfig


def test_quick_bench_prints_one_line_per_figure_and_writes_results(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "RESULTS.md"
    out.write_text("# old\n\n- date: 2026-12-01 10:00\n\n## Figures\n\n- [launch] old launch line; target x: MET\n"
                   "- [cycle] old cycle line; target y: MET\n\n## Notes\n\n- [launch] an old note\n\n"
                   "## Hand-written\n\nkept words\n")
    assert main(["--quick", "--only", "cycle,quality", "--results", str(out)]) == 0
    printed = capsys.readouterr().out
    figures = [line for line in printed.splitlines() if line.startswith("[") and "; target " in line]
    cycle = [f for f in figures if f.startswith("[cycle]")]
    quality = [f for f in figures if f.startswith("[quality]")]
    latency = [f for f in cycle if "median" in f and "stage1" in f and "stage2" in f]
    ratio = [f for f in cycle if "decide / stage 1" in f and "ratio " in f]
    plan = [f for f in cycle if "preemption plan" in f and "plan / twostage decide" in f and f.endswith("n/a")]
    assert len(latency) == 2 and len(ratio) == 2 and len(plan) == 2 and len(cycle) == 6
    if (TRACES / "philly_500.csv").is_file() and (TRACES / "itp_500.csv").is_file():
        # one line per metric (mean JCT, p95 JCT, Jain, local reads, bytes, max queueing) over 4 cells, for
        # the default and again for twostage+preempt (reported, no target)
        assert len(quality) == 12
        assert all(" 4 cells" in f or "max queueing" in f for f in quality)
        on = [f for f in quality if "(twostage+preempt)" in f]
        assert len(on) == 6 and all("twostage+preempt within" in f or "max queueing" in f for f in on)
        assert all(f.endswith("n/a") for f in on)
    text = out.read_text()
    assert "machine:" in text and "date:" in text
    assert all(f"- {f}" in text for f in figures)
    # sections not run keep their lines, marked with the run they came from; hand-written ones stay
    assert "- [launch] old launch line; target x: MET (from the run of 2026-12-01 10:00)" in text
    assert "- [launch] an old note (from the run of 2026-12-01 10:00)" in text
    assert "old cycle line" not in text and "kept words" in text


def test_unknown_section_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--quick", "--only", "cycle,nope"])


@pytest.mark.integration
@pytest.mark.skipif(not (TRACES / "itp_500.csv").is_file(), reason="needs the trace slices (../shared/traces)")
def test_quick_burst_runs_true_and_sleep_jobs_through_the_real_server_and_agents(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--only", "burst"]) == 0
    printed = capsys.readouterr().out
    figures = [line for line in printed.splitlines() if line.startswith("[burst]") and "; target " in line]
    assert len(figures) == 3, printed
    assert "all finished" in figures[0] and "from bound to ended" in figures[1] and "JCT/ideal" in figures[2]
    assert "did not complete" not in printed  # every job of both parts ended COMPLETED


def test_the_grid_cells_round_trip_through_their_json(tmp_path: Path) -> None:
    from benchmarks.quality import Cell, Metrics, load_cells, save_cells

    a = Metrics(3600.0, 1800.0, 7200.0, 0.0, 60.0, 120.0, 0.9, 0.75, 10**12, 86400.0, 0.5, 9, 0, 0, 1.5,
                preemptions=3, preempted_device_s=42.0, busy_device_s=1e6, gang_bound_share=0.25, jain_unbound=0.99)
    b = Metrics(4000.0, 2000.0, 8000.0, 10.0, 70.0, 130.0, 0.8, 0.5, 2 * 10**12, 90000.0, 0.4, 9, 1, 2, 2.5)
    res = {(Cell("philly_500.csv", 2.5, 0, 0.0), "twostage"): a, (Cell("itp_500.csv", 1.5, 2, 200.0), "flow"): b}
    path = tmp_path / "cells.json"
    save_cells(res, path)
    back = load_cells(path)
    assert back == res
    assert back[(Cell("itp_500.csv", 1.5, 2, 200.0), "flow")].bytes_moved == 2 * 10**12


def test_a_summary_over_no_cells_meets_no_target() -> None:
    # a grid thinned to nothing (a slice missing, a filter that matches no cell) is not "every cell"
    from benchmarks.quality import Cell, Metrics, summarise

    figures = summarise({}, [])
    assert figures and all(f.met is not True for f in figures)
    assert [f.met for f in figures[:5]] == [False] * 5 and "0/0 cells" in figures[0].ratio
    # one cell where twostage is best on every count: each of the five targets is met
    cell = Cell("philly_500.csv", 2.5, 0, 0.0)
    good = Metrics(3600.0, 1800.0, 7200.0, 0.0, 60.0, 120.0, 0.95, 0.9, 10**11, 86400.0, 0.5, 9, 0, 0, 1.0)
    worse = Metrics(4000.0, 2000.0, 8000.0, 10.0, 70.0, 130.0, 0.8, 0.5, 2 * 10**12, 90000.0, 0.4, 9, 0, 0, 1.0)
    res = {(cell, "twostage"): good} | {(cell, p): worse for p in ("fairshare", "flow", "fifo", "backfill")}
    assert [f.met for f in summarise(res, [cell])[:5]] == [True] * 5


def test_quality_row_reads_policy_knobs_and_names_a_bad_one() -> None:
    from benchmarks.quality_row import knobs

    # read by the server's [policy] schema, as GSCHED_* variables are: durations as text too
    cfg = knobs(["preempt=true", "preempt_after_s=5m10s", "preempt_max_per_hour=3"])
    assert (cfg.preempt, cfg.preempt_after_s, cfg.preempt_max_per_hour) == (True, 310.0, 3)
    assert knobs([]) == PolicyConfig()
    with pytest.raises(ValueError, match="'preempt_afterwards': expected NAME=VALUE"):
        knobs(["preempt_afterwards"])
    with pytest.raises(ValueError, match=r"knobs: policy\.preempt_afterwards: unknown key \(known: age_max_s, "):
        knobs(["preempt_afterwards=1"])
    with pytest.raises(ValueError, match=r"knobs: policy\.preempt: Input should be a valid boolean"):
        knobs(["preempt=maybe"])
    with pytest.raises(ValueError, match="knobs: policy.preempt_after_s: 'soon' is not a duration"):
        knobs(["preempt_after_s=soon"])
    with pytest.raises(ValueError, match=r"knobs: policy\.preempt_max_per_hour: Input should be less than or equal to 1000"):
        knobs(["preempt_max_per_hour=5000"])


def test_quality_row_counts_and_lists_each_flipped_verdict() -> None:
    from benchmarks.quality import Cell, Metrics
    from benchmarks.quality_row import compare

    def m(mean: float, jain: float) -> Metrics:
        return Metrics(mean, 1800.0, 7200.0, 0.0, 60.0, 120.0, jain, 0.9, 10**11, 86400.0, 0.5, 9, 0, 0, 1.0)

    a, b = Cell("philly_500.csv", 2.5, 0, 0.0), Cell("itp_500.csv", 1.5, 1, 200.0)
    base = {(c, p): m(3600.0, 0.9) for c in (a, b) for p in ("fairshare", "flow", "fifo", "backfill")}
    base |= {(a, "twostage"): m(3600.0, 0.9), (b, "twostage"): m(4000.0, 0.9)}  # b: mean JCT +11 %: out
    new = {(a, "twostage"): m(3700.0, 0.95), (b, "twostage"): m(3650.0, 0.9)}  # a out (+2.8 %), b in
    lines = compare(new, base, "twostage")
    assert lines[0].startswith("twostage over 2 cells, within tolerance of the best baseline: mean JCT 1 -> 1,")
    assert "Jain's index 2 -> 2" in lines[0]
    assert lines[1] == "2 verdicts flipped:"
    assert lines[2:] == ["  itp_500 load 1.5 seed 1 cache 200 GB: mean JCT in (4000 -> 3650; best baseline 3600)",
                         "  philly_500 load 2.5 seed 0 cache 0 GB: mean JCT out (3600 -> 3700; best baseline 3600)"]


@pytest.mark.skipif(not (TRACES / "philly_500.csv").is_file(), reason="needs the trace slices (../shared/traces)")
def test_quality_row_replays_a_row_of_a_saved_grid_to_the_same_figures(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # a one-cell grid (the first 40 jobs of philly_500 at load 2.5), every row, saved as a full run saves it
    from benchmarks.quality import ROWS, Cell, run_grid, save_cells
    from benchmarks.quality_row import main as row_main

    cell = Cell("philly_500.csv", 2.5, 0, 0.0, 40)
    path = tmp_path / "grid.json"
    save_cells(run_grid([cell], ROWS, workers=1), path)
    # a knob after the options is read as one (preempt_after_s=300 is the default: the same figures)
    assert row_main(["twostage+preempt", "--grid", str(path), "preempt_after_s=300",
                     "--out", str(tmp_path / "row.json")]) == 0
    out = capsys.readouterr().out
    assert "twostage+preempt over 1 cells" in out and "0 verdicts flipped" in out
    from benchmarks.quality import load_cells

    again, saved = load_cells(tmp_path / "row.json"), load_cells(path)
    assert again[(cell, "twostage+preempt")].mean_jct_s == saved[(cell, "twostage+preempt")].mean_jct_s
    with pytest.raises(SystemExit):  # a filter that keeps no cell is an error, not an empty report
        row_main(["twostage", "--grid", str(path), "--cells", "itp_5000"])
