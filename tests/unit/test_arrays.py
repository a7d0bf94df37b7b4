"""sbatch-style job arrays (scheduler/core/arrays.py): the grammar."""

from __future__ import annotations

import pytest

from scheduler.core.arrays import env, parse


@pytest.mark.parametrize("text,indexes,cap", [
    ("0-3", [0, 1, 2, 3], None),
    ("0-9%4", list(range(10)), 4),
    ("1,3,5-7", [1, 3, 5, 6, 7], None),
    ("5", [5], None),
    ("3,1,3", [1, 3], None),  # sorted, each once
])
def test_the_grammar(text: str, indexes: list[int], cap: int | None) -> None:
    assert parse(text) == (indexes, cap)


@pytest.mark.parametrize("text,words", [
    ("a-b", "give indexes"), ("5-1", "from low to high"), ("0-9%0", "how many may run"),
    ("0-9%x", "how many may run"), ("0-1000", "at most 1000 jobs"), ("", "give indexes"), ("1,", "give indexes"),
])
def test_a_bad_array_says_why(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse(text)


def test_each_rank_is_told_its_place() -> None:
    assert env(12, 3, 10) == {"GSCHED_ARRAY_JOB_ID": "12", "GSCHED_ARRAY_INDEX": "3", "GSCHED_ARRAY_COUNT": "10"}
