"""The lifecycle without sockets or a database: the states' stored strings, every legal move's effects,
every illegal move refused, and a job's move derived from its ranks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler.core import lifecycle as lc
from scheduler.core.lifecycle import (
    TABLE,
    TRANSITIONS,
    CloseStaging,
    IllegalTransition,
    JobState,
    Move,
    NodeState,
    RankState,
    Record,
    ReplicaState,
    SetFields,
    StopRanks,
    TransferState,
    derive,
    plan,
)
from scheduler.protocol import states as wire

NOW = 1000.0


@dataclass
class J:
    """A job's facts, as a ``Job`` row has them."""

    state: str
    id: int = 7
    attempt: int = 1
    restarts: int = 0
    failures: int = 0
    started_at: float | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    explain: dict[str, Any] = field(default_factory=dict)


@dataclass
class R:
    """A rank's facts, as a ``Rank`` row has them."""

    rank: int
    state: str
    node: str = "n1"
    exit_code: int | None = None
    ended_at: float | None = None
    log_tail: str = ""


# ---------------------------------------------------------------- the states


def test_states_are_the_strings_the_database_and_the_api_hold() -> None:
    assert [s.value for s in JobState] == ["PENDING", "BOUND", "STAGING", "RUNNING", "COMPLETED", "FAILED",
                                           "CANCELLED", "TIMEOUT"]
    assert [s.value for s in RankState] == ["ASSIGNED", "STAGING", "READY", "RUNNING", "EXITED", "KILLING", "KILLED"]
    assert [s.value for s in NodeState] == ["up", "down"]
    assert [s.value for s in ReplicaState] == ["healthy", "corrupt", "missing", "staging"]
    assert [s.value for s in TransferState] == ["pending", "running", "done", "failed", "delete", "job"]
    # A member is the plain string read back from a row: equal, same hash, same text.
    assert JobState.PENDING == "PENDING" and "up" in {NodeState.UP} and f"{TransferState.DONE}" == "done"


def test_the_wire_states_are_defined_once_in_the_protocol_and_re_exported() -> None:
    assert lc.RankState is wire.RankState and lc.TransferState is wire.TransferState
    assert lc.RANK_FINAL is wire.RANK_FINAL == {"EXITED", "KILLED"}


def test_the_sets_of_states() -> None:
    assert lc.ACTIVE == {"BOUND", "STAGING", "RUNNING"}
    assert lc.FINAL == {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}
    assert lc.RANK_LIVE == {"ASSIGNED", "STAGING", "READY", "RUNNING"}


# ---------------------------------------------------------------- the table


def test_the_table_holds_exactly_the_moves_the_server_always_allowed() -> None:
    assert TRANSITIONS == {
        "PENDING": {"BOUND", "CANCELLED", "FAILED"},
        # COMPLETED without RUNNING: every rank ran and exited 0 between two heartbeats (["true"])
        "BOUND": {"STAGING", "RUNNING", "PENDING", "FAILED", "CANCELLED", "TIMEOUT", "COMPLETED"},
        "STAGING": {"RUNNING", "PENDING", "FAILED", "CANCELLED", "TIMEOUT", "COMPLETED"},
        "RUNNING": {"COMPLETED", "FAILED", "CANCELLED", "PENDING", "TIMEOUT"},
        "COMPLETED": set(), "FAILED": set(), "CANCELLED": set(), "TIMEOUT": set(),
    }


ILLEGAL = [(a, b) for a in JobState for b in JobState if (a, b) not in TABLE]


@pytest.mark.parametrize(("old", "new"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_every_illegal_move_raises_and_changes_nothing(old: JobState, new: JobState) -> None:
    job = J(old)
    with pytest.raises(IllegalTransition, match=f"job 7: {old} -> {new} is not allowed"):
        plan(job, new, "why", NOW, nodes=("n1",), transfer_bytes=0, transfer_cost_ms=0, local_fraction=1.0,
             actor="user:alice", max_restarts=3)
    assert job == J(old)
    assert not lc.can_transition(old, new)


def test_a_state_the_table_does_not_know_is_illegal_too() -> None:
    with pytest.raises(IllegalTransition, match="job 7: LOST -> RUNNING is not allowed"):
        plan(J("LOST"), JobState.RUNNING, "", NOW, nodes=())


def test_bind_starts_the_next_attempt_and_records_its_staging_cost() -> None:
    job = J("PENDING", attempt=2, progress={"epoch": 3})
    assert plan(job, JobState.BOUND, "bound to n1, n2", NOW, nodes=("n1", "n2"), transfer_bytes=2000,
                transfer_cost_ms=640, local_fraction=0.5) == [
        SetFields({"state": "BOUND", "reason": "bound to n1, n2", "attempt": 3, "locality_wait_since": None,
                   "master_port": None, "transfer_bytes": 2000, "transfer_cost_ms": 640, "local_fraction": 0.5,
                   "progress": {}}),
        Record("job.bind", "attempt 3 on n1, n2; 2000 bytes to stage (~640 ms)"),
    ]
    assert job.attempt == 2  # planned, not done


def test_a_bound_job_whose_ranks_get_ready_is_staging() -> None:
    assert plan(J("BOUND"), JobState.STAGING, "staging data and starting ranks", NOW) == [
        SetFields({"state": "STAGING", "reason": "staging data and starting ranks"})]


@pytest.mark.parametrize("old", [JobState.BOUND, JobState.STAGING])
def test_running_drops_the_staging_progress_closes_staging_and_names_the_nodes(old: JobState) -> None:
    job = J(old, progress={"staging": {"0": {"bytes": 5}}, "staged_ranks": {"0": {}}})
    assert plan(job, JobState.RUNNING, "running", NOW, nodes=("n2", "n1")) == [
        SetFields({"state": "RUNNING", "reason": "running", "started_at": NOW,
                   "progress": {"staged_ranks": {"0": {}}, "staged": True}}),
        CloseStaging(),
        Record("job.running", "on n1, n2"),
    ]


def test_a_resumed_job_keeps_its_first_start_time() -> None:
    effects = plan(J("STAGING", started_at=400.0), JobState.RUNNING, "running", NOW, nodes=("n1",))
    assert isinstance(effects[0], SetFields) and effects[0].fields["started_at"] == 400.0


UNSEEN = [(JobState.BOUND, JobState.COMPLETED), (JobState.STAGING, JobState.COMPLETED)]
FINISHES = [(a, b) for (a, b) in TABLE if b in (JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT)
            and (a, b) not in UNSEEN]


@pytest.mark.parametrize(("old", "new"), UNSEEN, ids=[f"{a}->{b}" for a, b in UNSEEN])
def test_a_job_done_before_it_was_seen_running_started_and_ended_now(old: JobState, new: JobState) -> None:
    assert plan(J(old, progress={"staging": {"0": {}}}), new, "all ranks exited 0", NOW) == [
        SetFields({"started_at": NOW, "progress": {"staged": True}}),
        CloseStaging(),
        SetFields({"state": new, "reason": "all ranks exited 0", "ended_at": NOW}),
        StopRanks(),
        Record(f"job.{new.value.lower()}", "all ranks exited 0"),
    ]


@pytest.mark.parametrize(("old", "new"), FINISHES, ids=[f"{a}->{b}" for a, b in FINISHES])
def test_a_finish_ends_the_job_now_stops_its_ranks_and_records_the_state(old: JobState, new: JobState) -> None:
    assert plan(J(old), new, "all ranks exited 0", NOW) == [
        SetFields({"state": new, "reason": "all ranks exited 0", "ended_at": NOW}),
        StopRanks(),
        Record(f"job.{new.value.lower()}", "all ranks exited 0"),
    ]


@pytest.mark.parametrize("old", ["PENDING", "BOUND", "STAGING", "RUNNING"])
def test_a_cancel_ends_the_job_and_is_recorded_in_the_canceller_s_name(old: str) -> None:
    assert plan(J(old), JobState.CANCELLED, "cancelled by alice", NOW, actor="user:alice") == [
        SetFields({"state": "CANCELLED", "reason": "cancelled by alice", "ended_at": NOW}),
        StopRanks(),
        Record("job.cancel", "", "user:alice"),
    ]


@pytest.mark.parametrize("old", ["BOUND", "STAGING", "RUNNING"])
def test_a_requeue_stops_the_ranks_and_counts_a_restart(old: str) -> None:
    # The last cycle's explanation is kept; its "why" becomes the requeue's reason as data.
    last = {"queue_position": 1, "reason": "bound", "why": None}
    assert plan(J(old, restarts=1, explain=last), JobState.PENDING, "node n2 is down", NOW, max_restarts=3) == [
        StopRanks(),
        SetFields({"state": "PENDING", "reason": "requeued: node n2 is down", "restarts": 2, "pending_since": NOW,
                   "locality_wait_since": None, "master_port": None,
                   "explain": {"queue_position": 1, "reason": "bound",
                               "why": {"kind": "requeued", "message": "requeued: node n2 is down", "at_s": None,
                                       "at_word": "until"}}}),
        Record("job.requeue", "node n2 is down (restart 2)"),
    ]


def test_past_max_restarts_a_requeue_fails_the_job_with_the_earlier_requeues() -> None:
    # restarts 2 of max_restarts 2: the third loss gives up.
    effects = plan(J("RUNNING", restarts=2), JobState.PENDING, "node n3 is down", NOW, max_restarts=2,
                   earlier=["node n1 is down (restart 1)", "node n2 is down (restart 2)"])
    reason = ("node n3 is down; gave up after 2 restarts (max_restarts=2)"
              "\n  earlier: node n1 is down (restart 1)\n  earlier: node n2 is down (restart 2)")
    assert effects == [SetFields({"state": "FAILED", "reason": reason, "ended_at": NOW}), StopRanks(),
                       Record("job.failed", reason)]


def test_a_retry_counts_a_failure_not_a_restart() -> None:
    # restarts stays 1; the event names the restart it would have been (1 + 1 = 2), as it always did.
    effects = plan(J("RUNNING", restarts=1, failures=0), JobState.PENDING, "rank 0 on n1 exited with code 1; "
                   "retry 1 of 2", NOW, max_restarts=3, retry=True)
    assert effects == [
        StopRanks(),
        SetFields({"state": "PENDING", "reason": "requeued: rank 0 on n1 exited with code 1; retry 1 of 2",
                   "restarts": 1, "pending_since": NOW, "locality_wait_since": None, "master_port": None,
                   "explain": {"why": {"kind": "requeued",
                                       "message": "requeued: rank 0 on n1 exited with code 1; retry 1 of 2",
                                       "at_s": None, "at_word": "until"}},
                   "failures": 1}),
        Record("job.requeue", "rank 0 on n1 exited with code 1; retry 1 of 2 (restart 2)"),
    ]


def test_a_retry_past_max_restarts_fails_counting_the_failure_and_one_restart_less() -> None:
    effects = plan(J("RUNNING", restarts=3, failures=0), JobState.PENDING, "rank 0 on n1 exited with code 1; "
                   "retry 1 of 2", NOW, max_restarts=3, retry=True)
    reason = "rank 0 on n1 exited with code 1; retry 1 of 2; gave up after 3 restarts (max_restarts=3)"
    assert effects == [SetFields({"state": "FAILED", "reason": reason, "ended_at": NOW}), StopRanks(),
                       Record("job.failed", reason), SetFields({"failures": 1, "restarts": 2})]


def test_every_legal_move_has_a_handler_and_each_is_tested_above() -> None:
    handled = {
        lc._bind: [("PENDING", "BOUND")],
        lc._stage: [("BOUND", "STAGING")],
        lc._run: [("BOUND", "RUNNING"), ("STAGING", "RUNNING")],
        lc._cancel: [(s, "CANCELLED") for s in ("PENDING", "BOUND", "STAGING", "RUNNING")],
        lc._requeue: [(s, "PENDING") for s in ("BOUND", "STAGING", "RUNNING")],
        lc._finish: FINISHES,
        lc._finish_unseen: UNSEEN,
    }
    assert {move: h for h, moves in handled.items() for move in moves} == TABLE


def test_a_move_without_the_context_its_handler_needs_is_an_error() -> None:
    with pytest.raises(TypeError):
        plan(J("RUNNING"), JobState.CANCELLED, "cancelled by alice", NOW)  # no actor
    with pytest.raises(TypeError):
        plan(J("RUNNING"), JobState.TIMEOUT, "late", NOW, actor="user:alice")  # a finish takes none


def test_a_job_walks_submit_to_completion_through_the_table() -> None:
    job = J("PENDING", attempt=0)

    def do(to: JobState, reason: str, **context: Any) -> list[str]:
        kinds = []
        for e in plan(job, to, reason, NOW, **context):
            if isinstance(e, SetFields):
                for k, v in e.fields.items():
                    setattr(job, k, v)
            kinds.append(e.kind if isinstance(e, Record) else type(e).__name__)
        return kinds

    assert do(JobState.BOUND, "bound to n1", nodes=("n1",), transfer_bytes=0, transfer_cost_ms=0,
              local_fraction=1.0) == ["SetFields", "job.bind"]
    assert do(JobState.STAGING, "staging data and starting ranks") == ["SetFields"]
    assert do(JobState.RUNNING, "running", nodes=("n1",)) == ["SetFields", "CloseStaging", "job.running"]
    assert do(JobState.COMPLETED, "all ranks exited 0") == ["SetFields", "StopRanks", "job.completed"]
    assert (job.state, job.attempt, job.started_at, job.reason) == ("COMPLETED", 1, NOW, "all ranks exited 0")
    with pytest.raises(IllegalTransition):
        do(JobState.RUNNING, "running", nodes=("n1",))


# ---------------------------------------------------------------- a job's move from its ranks


def test_a_rank_failed_within_the_grace_changes_nothing_yet() -> None:
    ranks = [R(0, "EXITED", exit_code=1, ended_at=995.0), R(1, "RUNNING", node="n2")]
    # failed at 995, grace 10 s: settled at 1005, not at 1000
    assert derive(J("RUNNING"), ranks, NOW, failure_grace_s=10.0, retries=1) is None
    assert derive(J("RUNNING"), ranks, 1005.0, failure_grace_s=10.0, retries=1) is not None


def test_after_the_grace_with_retries_left_the_job_is_retried_with_one_failure_more() -> None:
    ranks = [R(0, "EXITED", exit_code=1, ended_at=990.0), R(1, "RUNNING", node="n2")]
    assert derive(J("RUNNING", failures=1), ranks, NOW, failure_grace_s=10.0, retries=2) == Move(
        JobState.PENDING, "rank 0 on n1 exited with code 1; retry 2 of 2", {"retry": True})


def test_with_retries_exhausted_the_job_fails_naming_the_rank_and_its_last_log_lines() -> None:
    log = "\n".join(f"line {i}" for i in range(1, 13)) + "\n"  # 12 lines: the last 10 are kept
    ranks = [R(0, "RUNNING"), R(1, "EXITED", node="n2", exit_code=2, ended_at=990.0, log_tail=log)]
    move = derive(J("RUNNING", failures=2), ranks, NOW, failure_grace_s=10.0, retries=2)
    assert move == Move(JobState.FAILED, "rank 1 on n2 exited with code 2\n" + "\n".join(
        f"line {i}" for i in range(3, 13)))


def test_the_first_failure_is_the_cause_and_a_signal_beats_an_error_at_the_same_time() -> None:
    ranks = [R(0, "EXITED", exit_code=1, ended_at=990.0), R(1, "EXITED", node="n2", exit_code=-9, ended_at=990.0),
             R(2, "EXITED", node="n3", exit_code=1, ended_at=980.0)]
    # rank 2 failed first (980); at 990 rank 1's SIGKILL comes before rank 0's error.
    assert derive(J("RUNNING"), ranks, NOW) == Move(
        JobState.FAILED, "rank 2 on n3 exited with code 1; then rank 1 on n2 exited with code -9 (SIGKILL), "
                         "rank 0 on n1 exited with code 1")


def test_a_rank_that_exited_without_a_code_has_failed() -> None:
    assert derive(J("STAGING"), [R(0, "EXITED", exit_code=None, ended_at=NOW)], NOW) == Move(
        JobState.FAILED, "rank 0 on n1 exited with code None")


def test_all_ranks_exited_0_completes_the_job() -> None:
    ranks = [R(0, "EXITED", exit_code=0, ended_at=990.0), R(1, "EXITED", node="n2", exit_code=0, ended_at=995.0)]
    assert derive(J("RUNNING"), ranks, NOW) == Move(JobState.COMPLETED, "all ranks exited 0")


@pytest.mark.parametrize("old", ["BOUND", "STAGING"])
def test_every_rank_running_makes_the_job_running_on_its_nodes(old: str) -> None:
    ranks = [R(0, "RUNNING", node="n2"), R(1, "RUNNING", node="n1"), R(2, "EXITED", node="n2", exit_code=0)]
    assert derive(J(old), ranks, NOW) == Move(JobState.RUNNING, "running", {"nodes": ("n1", "n2")})


def test_a_running_job_whose_ranks_run_needs_no_move() -> None:
    assert derive(J("RUNNING"), [R(0, "RUNNING"), R(1, "RUNNING", node="n2")], NOW) is None


@pytest.mark.parametrize("ranks", [
    [R(0, "KILLED"), R(1, "RUNNING", node="n2")],
    [R(0, "KILLED", exit_code=-15), R(1, "EXITED", node="n2", exit_code=0)],
])
def test_a_killed_rank_means_the_attempt_is_being_torn_down_so_nothing(ranks: list[R]) -> None:
    assert derive(J("RUNNING"), ranks, NOW) is None


@pytest.mark.parametrize("ready", ["STAGING", "READY", "RUNNING"])
def test_a_bound_job_with_a_rank_getting_ready_is_staging(ready: str) -> None:
    ranks = [R(0, ready), R(1, "ASSIGNED", node="n2")]
    assert derive(J("BOUND"), ranks, NOW) == Move(JobState.STAGING, "staging data and starting ranks")
    assert derive(J("STAGING"), ranks, NOW) is None  # already staging


def test_only_an_active_job_with_ranks_is_derived() -> None:
    assert derive(J("BOUND"), [R(0, "ASSIGNED")], NOW) is None
    assert derive(J("RUNNING"), [], NOW) is None
    for state in ("PENDING", "COMPLETED", "CANCELLED"):
        assert derive(J(state), [R(0, "EXITED", exit_code=0)], NOW) is None


def test_exit_words_name_the_signal_when_there_is_one() -> None:
    assert lc.exit_words(R(3, "EXITED", node="n4", exit_code=-15)) == "rank 3 on n4 exited with code -15 (SIGTERM)"
    assert lc.exit_words(R(3, "EXITED", node="n4", exit_code=-99)) == "rank 3 on n4 exited with code -99"
    assert lc.exit_words(R(3, "EXITED", node="n4", exit_code=3)) == "rank 3 on n4 exited with code 3"
