"""Section ``launch`` (placeholder until written): see the report."""

from __future__ import annotations

from benchmarks.common import Report


def run(report: Report) -> None:
    report.note("launch", "not implemented yet")
