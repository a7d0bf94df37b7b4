"""One grammar for durations (scheduler/core/durations.py): units, Slurm's clock forms, bare seconds."""

from __future__ import annotations

import pytest

from scheduler.core.durations import parse_duration


@pytest.mark.parametrize("text,seconds", [
    (90, 90), ("90", 90), ("90s", 90), ("30m", 1800), ("30 m", 1800), ("2h", 7200), ("2h30m", 9000),
    ("1d", 86400), ("1d12h", 129600), ("1h0m5s", 3605),
    ("30:00", 1800), ("1:30:00", 5400), ("48:00:00", 172800), ("120:00", 7200),  # MM:SS, HH:MM:SS
    ("2-12", 216000), ("2-12:30", 217800), ("0-00:00:59", 59), ("5-00:00:00", 432000),  # D-HH[:MM[:SS]]
])
def test_each_form_means_what_slurm_and_the_docs_say(text: int | str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text,words", [
    ("99:99", "seconds must be below 60"),
    ("1:60:00", "minutes and seconds must be below 60"),
    ("1:00:60", "minutes and seconds must be below 60"),
    ("2-24", "hours must be below 24"),
    ("2-23:60", "below 60"),
    ("1h1d", "not a duration"),  # units largest first
    ("forever", "not a duration"),
    ("-5", "not a duration"),
    ("", "empty"),
    ("1:2:3:4", "not a duration"),
    (True, "must be a duration"),
    (1.5, "must be a duration"),
    (-1, "must not be negative"),
])
def test_a_bad_duration_says_why(text: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_duration(text)  # type: ignore[arg-type]
