"""benchmarks/quality_preempt.py: cells named on the command line, and the targets it reports."""

from __future__ import annotations

import pytest

from benchmarks.quality import Cell, Metrics
from benchmarks.quality_preempt import lines, main, parse_cell


def metrics(mean_jct_s: float, jain: float, preemptions: int = 0, lost_ds: float = 0.0,
            busy_ds: float = 1000.0) -> Metrics:
    return Metrics(mean_jct_s, 0, 0, 0, 0, 0, jain, 1.0, 0, 0, 0.5, 4, 0, 0, 1.0, preemptions, lost_ds, busy_ds)


def test_parse_cell() -> None:
    assert parse_cell("itp_500:1.5:2:200") == Cell("itp_500.csv", 1.5, 2, 200.0)
    assert parse_cell("philly_500.csv") == Cell("philly_500.csv", 2.5, 0, 0.0)


@pytest.mark.parametrize("arg, says", [("--help", "SLICE:LOAD"), ("itp_500:x", "'itp_500:x': could not convert"),
                                       ("itp", "'itp': not SLICE:LOAD"), ("itp_500:1:2:3:4", "not SLICE:LOAD")])
def test_the_command_line_answers_help_and_names_a_malformed_cell(arg: str, says: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:  # before any simulation runs
        main([arg])
    out = capsys.readouterr()
    assert says in out.out + out.err and stop.value.code == (0 if arg == "--help" else 2)


def test_targets_are_judged_only_at_load_1_5_and_above() -> None:
    hot, cool = Cell("x.csv", 2.5, 0, 0.0), Cell("x.csv", 1.0, 0, 0.0)
    # on: JCT 106 vs 100 (+6 %: missed), Jain 0.96 (met), 20 of 1000 device-s lost (2 %: met)
    [line] = lines([(hot, metrics(100, 0.9), metrics(106, 0.96, 3, 20.0))])
    assert "+6.0 %" in line and "JCT <= +5 % MISSED" in line and "Jain >= 0.95 met" in line
    assert "2.00 % of device time lost" in line and "lost <= 3 % met" in line and "3 preemptions" in line
    [line] = lines([(cool, metrics(100, 0.9), metrics(106, 0.5))])
    assert "no targets" in line
