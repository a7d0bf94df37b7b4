"""Reasons are data: a kind, plain words and the time they name; their sentence is today's words.

The arbiters' reasons are checked by kind here (their words are checked in test_arbiters); the queue's
"in 25s" and "for 25s more" are worked out from ``at_s``, never read back out of the words.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from policies.registry import ARBITERS, get_arbiter
from scheduler.cli.queuefacts import plain_reason, relative
from scheduler.core.decide import decide
from scheduler.core.placement import Decision
from scheduler.core.policy_config import PolicyConfig
from scheduler.core.reasons import FROM, UNTIL, Reason, ReasonKind, fmt_t
from scheduler.core.snapshot import Snapshot
from tests.builders import cluster, job

T = 1_700_000_000.0


def decided(snap: Snapshot, cfg: PolicyConfig) -> Decision:
    return decide(snap, cfg, get_arbiter(cfg.arbiter))[1]


# ---------------------------------------------------------------- the value


@pytest.mark.parametrize("kind", list(ReasonKind))
def test_the_sentence_is_the_message_then_the_time_it_names(kind: ReasonKind) -> None:
    assert Reason(kind, "some words").text() == "some words"
    assert Reason(kind, "some words", 1030.0).text() == "some words until t=1030s"
    assert Reason(kind, "some words", 1030.4, FROM).text() == "some words from t=1030s"  # rounded as before


def test_the_sentences_are_the_words_the_cycle_always_wrote() -> None:
    assert Reason(ReasonKind.LOCALITY_WAIT, "waiting for locality", 1030).text() == "waiting for locality until t=1030s"
    assert Reason(ReasonKind.RESERVED, "reserved for job 12", 1030).text() == "reserved for job 12 until t=1030s"
    assert (Reason(ReasonKind.RESERVED, "devices busy: needs 4, 2 free; devices reserved for it", 1030, FROM).text()
            == "devices busy: needs 4, 2 free; devices reserved for it from t=1030s")
    assert fmt_t(1029.6) == "t=1030s"


def test_the_kinds_are_the_metrics_label_values_and_bind_failed() -> None:
    assert [k.value for k in ReasonKind] == ["new", "devices_busy", "locality_wait", "reserved", "too_large",
                                             "data_missing", "queue_order", "requeued", "preempted", "bind_failed", "held",
                                             "dependency", "other"]
    assert ReasonKind.DEVICES_BUSY == "devices_busy"  # compares equal to the stored string


def test_as_dict_is_json_and_reads_back_equal() -> None:
    for r in (Reason(ReasonKind.NEW, "submitted"), Reason(ReasonKind.LOCALITY_WAIT, "waiting for locality", 130.0),
              Reason(ReasonKind.RESERVED, "devices busy; devices reserved for it", 4600.0, FROM)):
        doc = json.loads(json.dumps(r.as_dict()))
        assert set(doc) == {"kind", "message", "at_s", "at_word"}
        assert Reason.from_dict(doc) == r
    assert Reason.from_dict({"kind": "from a newer server", "message": "x"}) == Reason(ReasonKind.OTHER, "x")


def test_a_reason_is_frozen_and_names_a_time_only_until_or_from() -> None:
    r = Reason(ReasonKind.NEW, "submitted")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.message = "other"  # type: ignore[misc]
    with pytest.raises(ValueError, match="at_word"):
        Reason(ReasonKind.RESERVED, "x", 5.0, "after")  # type: ignore[arg-type]
    assert (r.at_s, r.at_word) == (None, UNTIL)


# ---------------------------------------------------------------- the arbiters give kinds


def test_a_gang_that_fits_nowhere_holds_the_reservation_and_the_next_one_is_held_back_by_it() -> None:
    snap = (
        cluster()
        .node("n1", free=0)
        .node("n2")
        .running(9, "carol", {"n1": 4}, end_by_s=1000)
        .pending(job(1, ranks=8, submit_s=0), job(2, ranks=4, submit_s=1))
        .at(2)
        .build()
    )
    d = decided(snap, PolicyConfig(reserve_min_wait_s=0))
    assert d.reasons[1] == Reason(ReasonKind.RESERVED, "devices busy: needs 8, 4 free; devices reserved for it",
                                  1000.0, FROM)
    assert d.reasons[2] == Reason(ReasonKind.RESERVED, "reserved for job 1", 1000.0, UNTIL)


def test_a_locality_wait_names_its_end_and_so_do_the_candidates_it_passes_over() -> None:
    snap = (
        cluster()
        .node("a", rack="r1", free=0).holds("d", shards=[0])
        .node("b", rack="r1")
        .running(9, "carol", {"a": 4}, end_by_s=10_000)
        .pending(job(1, dataset="d", submit_s=100, waiting_since_s=100))
        .at(110)
        .build()
    )  # fmt: skip
    d = decided(snap, PolicyConfig(locality_wait_s=30, locality_threshold_ms=0))
    assert d.reasons[1] == Reason(ReasonKind.LOCALITY_WAIT, "waiting for locality", 130.0)
    assert d.candidate_reasons[(1, 0)] == Reason(
        ReasonKind.LOCALITY_WAIT, "costs 320 ms > 0 ms: waiting for locality", 130.0)


@pytest.mark.parametrize("name", sorted(ARBITERS))
def test_every_arbiter_says_too_large_data_missing_and_devices_busy_by_kind(name: str) -> None:
    snap = (
        cluster()
        .node("a", free=2).holds("d", shards=[0])
        .dataset("lost", shards=1)
        .pending(job(1, ranks=5, submit_s=0), job(2, dataset="lost", submit_s=1), job(3, ranks=3, submit_s=2))
        .at(3)
        .build()
    )  # fmt: skip
    d = decided(snap, PolicyConfig(arbiter=name, locality_wait_s=0))
    assert d.reasons[1].kind == ReasonKind.TOO_LARGE
    assert d.reasons[2].kind == ReasonKind.DATA_MISSING
    assert d.reasons[3].kind == ReasonKind.DEVICES_BUSY  # fifo too: the jobs that can never run do not block it
    assert all(r.at_s is None for r in d.reasons.values())


def test_fifo_says_who_the_queue_waits_behind() -> None:
    snap = cluster().node("a", free=2).pending(job(1, ranks=4, submit_s=0), job(2, ranks=1, submit_s=1)).build()
    d = decided(snap, PolicyConfig(arbiter="fifo"))
    assert d.reasons == {1: Reason(ReasonKind.DEVICES_BUSY, "devices busy: needs 4, 2 free"),
                         2: Reason(ReasonKind.QUEUE_ORDER, "behind job 1 in the FIFO queue")}


# ---------------------------------------------------------------- the queue reads at_s


def pending(why: Reason | None, reason: str | None = None) -> dict[str, object]:
    return {"state": "PENDING", "reason": why.text() if why is not None else reason,
            "why": None if why is None else why.as_dict()}


def test_until_reads_for_so_long_more_then_until_now() -> None:
    wait = Reason(ReasonKind.LOCALITY_WAIT, "waiting for locality", T + 25)
    assert plain_reason(pending(wait), T) == "waiting for locality for 25s more"
    assert plain_reason(pending(wait), T + 25) == "waiting for locality until now"


def test_from_reads_in_so_long_then_now() -> None:
    held = Reason(ReasonKind.RESERVED, "devices busy: needs 8, 4 free; devices reserved for it", T + 125, FROM)
    assert plain_reason(pending(held), T) == "devices busy: needs 8, 4 free; devices reserved for it in 2m05s"
    assert plain_reason(pending(held), T + 200) == "devices busy: needs 8, 4 free; devices reserved for it now"
    assert (relative(T + 60, FROM, T), relative(T + 60, UNTIL, T)) == ("in 1m00s", "for 1m00s more")


def test_words_without_data_are_shown_as_they_are_never_parsed() -> None:
    busy = Reason(ReasonKind.DEVICES_BUSY, "devices busy: needs 4, 2 free")
    assert plain_reason(pending(busy), T) == "devices busy: needs 4, 2 free"
    # A reason stored without its data (a row from before reasons were data) keeps its words.
    assert plain_reason(pending(None, f"waiting for locality until t={T + 25:.0f}s"), T) == (
        f"waiting for locality until t={T + 25:.0f}s")
    # A time is only read for a pending job: a finished job's words are its own.
    done = {"state": "FAILED", "reason": "rank 0 exited", "why": Reason(ReasonKind.OTHER, "x", T + 5).as_dict()}
    assert plain_reason(done, T) == "rank 0 exited"
