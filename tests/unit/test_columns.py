"""The plain tables of ``queue``, ``history`` and ``nodes`` (scheduler/cli/columns.py)."""

from __future__ import annotations

import pytest

from scheduler.cli.columns import JOB_COLUMNS, JOB_DEFAULT, FormatError, _span, pick, table


@pytest.mark.parametrize("seconds,text", [
    (None, "-"), (0, "00:00:00"), (59, "00:00:59"), (3661, "01:01:01"),
    (86400, "1-00:00:00"), (2 * 86400 + 3 * 3600 + 4 * 60 + 5, "2-03:04:05"),  # Slurm's elapsed forms
])
def test_spans_print_as_slurm_prints_them(seconds: float | None, text: str) -> None:
    assert _span(seconds) == text


def test_format_picks_columns_in_the_order_given_and_names_unknown_ones() -> None:
    assert pick("state,id", False, JOB_COLUMNS, JOB_DEFAULT) == ["state", "id"]
    assert pick(None, True, JOB_COLUMNS, JOB_DEFAULT) == list(JOB_COLUMNS)
    assert pick(None, False, JOB_COLUMNS, JOB_DEFAULT) == list(JOB_DEFAULT)
    with pytest.raises(FormatError, match="unknown column colour .*known: id,name"):
        pick("id,colour", False, JOB_COLUMNS, JOB_DEFAULT)


def test_a_table_is_padded_columns_under_a_header() -> None:
    rows = [{"id": 7, "user": "alice", "state": "RUNNING", "held_by": None, "started_at": 100.0, "ended_at": None},
            {"id": 12, "user": "bob", "state": "PENDING", "held_by": "bob", "started_at": None, "ended_at": None}]
    text = table(rows, ["id", "user", "state", "elapsed"], JOB_COLUMNS, now=190.0)
    assert text.splitlines() == [
        "JOBID  USER   STATE          ELAPSED",
        "7      alice  RUNNING        00:01:30",  # 190 - 100 s
        "12     bob    PENDING(held)  -",
    ]
