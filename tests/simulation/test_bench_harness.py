"""``python -m benchmarks --quick`` runs end to end for the cycle and quality sections (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.__main__ import main
from benchmarks.quality import TRACES


def test_quick_bench_prints_one_line_per_figure_and_writes_results(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "RESULTS.md"
    assert main(["--quick", "--only", "cycle,quality", "--results", str(out)]) == 0
    printed = capsys.readouterr().out
    figures = [line for line in printed.splitlines() if line.startswith("[") and "; target " in line]
    cycle = [f for f in figures if f.startswith("[cycle]")]
    quality = [f for f in figures if f.startswith("[quality]")]
    assert len(cycle) == 2 and all("median" in f and "stage1" in f and "stage2" in f for f in cycle)
    if (TRACES / "philly_500.csv").is_file() and (TRACES / "itp_500.csv").is_file():
        assert len(quality) == 8  # 2 traces x (local fraction, bytes moved, mean JCT, Jain)
        assert all("twostage/fairshare" in f for f in quality)
    text = out.read_text()
    assert "machine:" in text and "date:" in text
    assert all(f"- {f}" in text for f in figures)


def test_unknown_section_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--quick", "--only", "cycle,nope"])
