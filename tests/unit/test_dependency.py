"""sbatch-style dependencies (scheduler/core/dependency.py): the grammar, and each kind's verdict."""

from __future__ import annotations

import pytest

from scheduler.core.dependency import MET, NEVER, WAIT, parse, text, verdict


@pytest.mark.parametrize("given,deps", [
    ("afterok:1", [("afterok", 1)]),
    ("afterok:1:2,afterany:3", [("afterok", 1), ("afterok", 2), ("afterany", 3)]),
    (" afternotok:7 ", [("afternotok", 7)]),
])
def test_the_grammar(given: str, deps: list[tuple[str, int]]) -> None:
    assert parse(given) == deps
    assert parse(text(deps)) == deps


@pytest.mark.parametrize("given,words", [
    ("after:1", "kind must be one of"), ("afterok", "name the jobs"), ("afterok:x", "'x' is not a job id"),
    ("afterok:1,", "kind must be one of"), ("afterok:0", "not a job id"),
])
def test_a_bad_dependency_says_why(given: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse(given)


@pytest.mark.parametrize("kind,state,expected", [
    # kind         the named job is   so the dependent job
    ("afterok",    "RUNNING",   WAIT),
    ("afterok",    "COMPLETED", MET),
    ("afterok",    "FAILED",    NEVER),
    ("afterok",    "CANCELLED", NEVER),
    ("afterany",   "PENDING",   WAIT),
    ("afterany",   "TIMEOUT",   MET),
    ("afterany",   "COMPLETED", MET),
    ("afternotok", "COMPLETED", NEVER),
    ("afternotok", "FAILED",    MET),
    ("afternotok", "BOUND",     WAIT),
])
def test_each_kind_against_each_end(kind: str, state: str, expected: str) -> None:
    assert verdict([(kind, 5)], {5: state})[0] == expected


def test_never_wins_over_waiting_and_a_gone_job_is_never() -> None:
    assert verdict([("afterok", 1), ("afterok", 2)], {1: "RUNNING", 2: "FAILED"}) == (
        NEVER, "dependency afterok:2 can never be satisfied: job 2 ended FAILED")
    assert verdict([("afterany", 9)], {})[0] == NEVER
    assert verdict([("afterok", 1), ("afterany", 2)], {1: "RUNNING", 2: "PENDING"}) == (
        WAIT, "waiting for dependency afterok:1,afterany:2")
