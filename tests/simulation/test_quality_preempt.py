"""benchmarks/quality_preempt.py: cells named on the command line, and the targets it reports."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.quality import Cell, Metrics
from benchmarks.quality_preempt import expand, lines, main, parse_cell, parse_ints, summary


def metrics(mean_jct_s: float, jain: float, preemptions: int = 0, lost_ds: float = 0.0,
            busy_ds: float = 1000.0) -> Metrics:
    return Metrics(mean_jct_s, 0, 0, 0, 0, 0, jain, 1.0, 0, 0, 0.5, 4, 0, 0, 1.0, preemptions, lost_ds, busy_ds)


def test_parse_cell() -> None:
    assert parse_cell("itp_500:1.5:2:200") == Cell("itp_500.csv", 1.5, 2, 200.0)
    assert parse_cell("philly_500.csv") == Cell("philly_500.csv", 2.5, 0, 0.0)


@pytest.mark.parametrize("arg, says", [("--help", "SLICE:LOAD"), ("itp_500:x", "'itp_500:x': could not convert"),
                                       ("itp", "'itp': not SLICE:LOAD"), ("itp_500:1:2:3:4", "not SLICE:LOAD"),
                                       ("--seeds=0-x", "'0-x': not a list of seeds"),
                                       ("--caches=0,big", "'0,big': not a list of node caches"),
                                       ("preempt_after_s=soon", "policy.preempt_after_s"),
                                       ("preempt=false", "preempt: not a knob here"),
                                       ("no_such_knob=1", "no_such_knob")])
def test_the_command_line_answers_help_and_names_a_malformed_cell(arg: str, says: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:  # before any simulation runs
        main([arg])
    out = capsys.readouterr()
    assert says in out.out + out.err and stop.value.code == (0 if arg == "--help" else 2)


def test_knobs_may_follow_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    # read as a knob, not refused as an unrecognised argument: the knob's own check answers
    with pytest.raises(SystemExit) as stop:
        main(["itp_500:2.5", "--seeds", "0-5", "--caches", "0,200", "preempt=false"])
    assert "preempt: not a knob here" in capsys.readouterr().err and stop.value.code == 2


def test_targets_are_judged_only_at_load_1_5_and_above() -> None:
    hot, cool = Cell("x.csv", 2.5, 0, 0.0), Cell("x.csv", 1.0, 0, 0.0)
    # on: JCT 106 vs 100 (+6 %: missed), Jain 0.96 (met), 20 of 1000 device-s lost (2 %: met)
    [line] = lines([(hot, metrics(100, 0.9), metrics(106, 0.96, 3, 20.0))])
    assert "+6.0 %" in line and "JCT <= +5 % MISSED" in line and "Jain >= 0.95 met" in line
    assert "2.00 % of device time lost" in line and "lost <= 3 % met" in line and "3 preemptions" in line
    [line] = lines([(cool, metrics(100, 0.9), metrics(106, 0.5))])
    assert "no targets" in line


def test_seeds_and_caches_multiply_the_cells_named() -> None:
    assert parse_ints("0-2,7") == [0, 1, 2, 7] and parse_ints("4") == [4] and parse_ints("7,0-1,1") == [0, 1, 7]
    for bad in ("5-2", "0-3%2", ""):  # a range from high to low, a cap, nothing: refused
        with pytest.raises(argparse.ArgumentTypeError, match="not a list of seeds"):
            parse_ints(bad)
    a, b = parse_cell("itp_500:2.5:9:50"), parse_cell("philly_500:1.5")
    cells = expand([a, b, a], [0, 1], [0.0, 200.0])
    assert cells == [Cell(s, load, seed, cache) for s, load in (("itp_500.csv", 2.5), ("philly_500.csv", 1.5))
                     for seed in (0, 1) for cache in (0.0, 200.0)]  # the cells' own seed and cache replaced, no repeats
    assert expand([a], None, [200.0]) == [Cell("itp_500.csv", 2.5, 9, 200.0)]
    assert expand([a, b], None, None) == [a, b]


def test_the_summary_counts_the_cells_with_targets_and_names_the_worst() -> None:
    rows = [(Cell("x.csv", 2.5, 0, 0.0), metrics(100, 0.9), metrics(104, 0.96, 1, 10.0)),  # all met
            (Cell("x.csv", 2.5, 1, 0.0), metrics(100, 0.9), metrics(110, 0.97)),  # JCT +10 %: missed
            (Cell("x.csv", 1.5, 2, 0.0), metrics(100, 0.9), metrics(97, 0.94, 2, 40.0)),  # Jain missed
            (Cell("x.csv", 1.0, 0, 0.0), metrics(100, 0.9), metrics(200, 0.1))]  # no targets: left out
    line = summary(rows)
    assert line.startswith("1 of 3 cells at load >= 1.5 meet all three targets")
    # changes +4, +10, -3: mean +3.7, sample sd 6.5
    assert "mean JCT change +3.7 % (sd 6.5, worst +10.0 % in x load 2.5 seed 1 cache 0 GB)" in line
    assert "Jain lowest 0.940 (x load 1.5 seed 2 cache 0 GB), mean 0.957" in line
    assert line.endswith("device time lost at most 4.00 %")
    assert summary(rows[3:]) == "no cell at load >= 1.5: no targets"
