"""The cockpit's views, rendered to a recording console at fixed widths for one known cluster state.

The state (``queue_state()``): four nodes in two racks (one down), three users, six jobs in every
kind of state, seen at server time T.  Expected screens are whole texts: a change to the layout shows
up here as a readable diff.  Times are relative to T, so nothing depends on the clock; the header's
wall-clock time is printed in UTC (``utc`` fixture).
"""

from __future__ import annotations

import io
import re
import struct
import time
from typing import Any

import pytest
from rich.console import Console

from scheduler.cli.queuefacts import eta_s, job_facts, plain_reason
from scheduler.cli.queuetext import Terminal, queue_lines, table
from scheduler.cli.render import QueueView, explain, fit_columns, job_detail
from scheduler.core.reasons import FROM, Reason, ReasonKind

T = 1_700_000_000.0  # 22:13:20 UTC
GB, MB = 1_000_000_000, 1_000_000


def job(id: int, name: str, user: str, state: str, *, ranks: int = 2, per_rank: int = 1, nodes: tuple[str, ...] = (),
        age_s: float = 0, started_s: float | None = None, ended_s: float | None = None, epochs: int = 3,
        done: int = 0, reason: str = "", local: float = 0.0, factor: float = 0.5, restarts: int = 0,
        progress: dict[str, Any] | None = None, why: Reason | None = None) -> dict[str, Any]:
    """A job summary as ``GET /v1/jobs`` returns it; ``*_s`` are seconds before T.  A pending job's
    reason given as ``why`` (data) is also its ``reason`` (``why.text()``)."""
    if why is not None:
        reason = why.text()
    return {"id": id, "name": name, "user": user, "state": state, "ranks": ranks, "gpus_per_rank": per_rank,
            "dataset": "digits", "nodes": list(nodes), "local_fraction": local, "transfer_bytes": 0,
            "factor": factor, "priority": factor, "submitted_at": T - age_s, "pending_since": T - age_s,
            "started_at": None if started_s is None else T - started_s,
            "ended_at": None if ended_s is None else T - ended_s, "epochs": epochs, "epochs_done": done,
            "restarts": restarts, "reason": reason, "progress": progress or {},
            "reason_kind": None if why is None else why.kind.value, "reason_at_s": None if why is None else why.at_s,
            "why": None if why is None else why.as_dict()}


def node(name: str, rack: str, *, up: bool = True, devices: int = 4, free: int = 0, seen_s: float = 1,
         shards: int = 6, staged: int = 0) -> dict[str, Any]:
    return {"name": name, "rack": rack, "state": "up" if up else "down", "last_seen": T - seen_s, "devices": devices,
            "devices_free": free, "device_kind": "gpu", "shards": shards, "staged_bytes": staged}


def queue_state() -> dict[str, Any]:
    staging = {"0": {"bytes": 500 * MB, "total": GB, "rate_bps": 100 * MB},
               "1": {"bytes": 250 * MB, "total": GB, "rate_bps": 100 * MB}}
    jobs = [
        job(1, "first", "alice", "COMPLETED", nodes=("node-a1", "node-a2"), age_s=3000, started_s=2990, ended_s=1790,
            done=3, local=1.0, factor=0.8),
        job(2, "smoke", "bob", "FAILED", ranks=1, nodes=("node-a2",), age_s=900, started_s=890, ended_s=850,
            epochs=1, local=1.0, reason="rank 0 exited with code 1\nTraceback (most recent call last):"),
        # 2 of 5 epochs in 300 s: 150 s an epoch, 3 left -> ETA 7m30s.
        job(3, "resnet-digits", "alice", "RUNNING", nodes=("node-a1", "node-b1"), age_s=400, started_s=300,
            epochs=5, done=2, local=1.0, factor=0.8123),
        # 750 MB of 2 GB staged at 200 MB/s -> 6 s left.
        job(4, "big-sweep-lr-0.1-warmup", "bob", "STAGING", ranks=4, per_rank=2,
            nodes=("node-a1", "node-a2", "node-b1", "node-b2"), age_s=200, started_s=30, epochs=10, local=0.5,
            restarts=1, progress={"staging": staging}),
        job(5, "probe", "carol", "PENDING", age_s=95, epochs=1, factor=0.25,
            why=Reason(ReasonKind.RESERVED, "devices busy: needs 2, 0 free; devices reserved for it", T + 125, FROM)),
        job(6, "wait-local", "alice", "PENDING", ranks=1, age_s=10, factor=0.8123,
            why=Reason(ReasonKind.LOCALITY_WAIT, "waiting for locality", T + 20)),
    ]
    users = [{"user": "alice", "shares": 2.0, "norm_shares": 0.5, "usage": 5400.0, "factor": 0.8123},
             {"user": "bob", "shares": 1.0, "norm_shares": 0.25, "usage": 7200.0, "factor": 0.5},
             {"user": "carol", "shares": 1.0, "norm_shares": 0.25, "usage": 14400.0, "factor": 0.25}]
    nodes = [node("node-a1", "rack-a", free=1, staged=1500 * MB), node("node-a2", "rack-a", free=2, seen_s=2, shards=5),
             node("node-b1", "rack-b", seen_s=0.5, staged=250 * MB),
             node("node-b2", "rack-b", up=False, seen_s=75, shards=3)]
    return {"time": T, "jobs": jobs, "users": users, "nodes": nodes}


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def screen(renderable: Any, width: int, colour: bool = False) -> str:
    """What a terminal ``width`` columns wide shows; with ``colour`` the ANSI codes are kept."""
    console = Console(file=io.StringIO(), width=width, record=True, force_terminal=colour,
                      color_system="standard" if colour else None, legacy_windows=False, _environ={})
    console.print(renderable)
    text = console.export_text(styles=colour)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


WIDE_150 = """\
gsched queue  22:13:20  6 jobs: 1 running, 1 staging, 2 pending, 1 completed, 1 failed

ID  USER   NAME                  STATE      RANKS  NODES               LOCAL  FACTOR  WAIT/RUN  EPOCH    ETA  REASON
──────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────
 1  alice  first                 COMPLETED    2x1  node-a1,node-a2      100%    0.81    20m00s    3/3      -
 2  bob    smoke                 FAILED       1x1  node-a2              100%    0.50       40s    0/1      -  rank 0 exited with code 1
 3  alice  resnet-digits         RUNNING      2x1  node-a1,node-b1      100%    0.81     5m00s    2/5  7m30s
 4  bob    big-sweep-lr-0.1-wa~  STAGING      4x2  node-a1,node-a2,+2    50%    0.50       30s   0/10      -  staging 38% of 2.0 GB, 200.0 MB/s, 6s
                                                                                                              left
 5  carol  probe                 PENDING      2x1  -                       -    0.25     1m35s    0/1      -  devices busy: needs 2, 0 free; devices
                                                                                                              reserved for it in 2m05s
 6  alice  wait-local            PENDING      1x1  -                       -    0.81       10s    0/3      -  waiting for locality for 20s more

fair share                                nodes (9/12 devices busy)
USER    SHARES  USAGE  FACTOR             NODE     RACK    STATE  DEVICES BUSY  SHARDS  STAGED IN  HEARTBEAT
──────────────────────────────────────    ──────────────────────────────────────────────────────────────────
alice  2 (50%)  1h30m  0.81 ■■■■■■■■□□    node-a1  rack-a  up     ■■■□ 3/4 gpu       6     1.5 GB     1s ago
bob    1 (25%)  2h00m  0.50 ■■■■■□□□□□    node-a2  rack-a  up     ■■□□ 2/4 gpu       5        0 B     2s ago
carol  1 (25%)  4h00m  0.25 ■■□□□□□□□□    node-b1  rack-b  up     ■■■■ 4/4 gpu       6   250.0 MB     0s ago
                                          node-b2  rack-b  down   □□□□ 0/4 gpu       3        0 B  1m15s ago
"""


NARROW_80 = """\
22:13:20  6 jobs: 1 running, 1 staging, 2 pending, 1 completed, 1 failed

ID  USER   NAME        STATE    RANKS  WAIT/RUN  NOTE
────────────────────────────────────────────────────────────────────────────────
 1  alice  first       DONE       2x1    20m00s
 2  bob    smoke       FAILED     1x1       40s  rank 0 exited with code 1
 3  alice  resnet-di~  RUNNING    2x1     5m00s  epoch 2/5, ETA 7m30s
 4  bob    big-sweep~  STAGING    4x2       30s  staging 38% of 2.0 GB, 200.0 M…
 5  carol  probe       PENDING    2x1     1m35s  devices busy: needs 2, 0 free;…
 6  alice  wait-local  PENDING    1x1       10s  waiting for locality for 20s m…

fair share
USER    SHARES  USAGE  FACTOR
──────────────────────────────────────
alice  2 (50%)  1h30m  0.81 ■■■■■■■■□□
bob    1 (25%)  2h00m  0.50 ■■■■■□□□□□
carol  1 (25%)  4h00m  0.25 ■■□□□□□□□□

nodes (9/12 devices busy)
NODE     RACK    STATE  DEVICES BUSY  SHARDS  STAGED IN  HEARTBEAT
──────────────────────────────────────────────────────────────────
node-a1  rack-a  up     ■■■□ 3/4 gpu       6     1.5 GB     1s ago
node-a2  rack-a  up     ■■□□ 2/4 gpu       5        0 B     2s ago
node-b1  rack-b  up     ■■■■ 4/4 gpu       6   250.0 MB     0s ago
node-b2  rack-b  down   □□□□ 0/4 gpu       3        0 B  1m15s ago
"""


def test_queue_at_150_columns_shows_every_column_and_whole_reasons(utc: None) -> None:
    assert screen(QueueView(queue_state()), 150) == WIDE_150


def test_queue_at_80_columns_keeps_one_line_per_job_and_drops_low_value_columns(utc: None) -> None:
    out = screen(QueueView(queue_state()), 80)
    assert out == NARROW_80
    assert max(len(line) for line in out.splitlines()) <= 80
    # Not "every cell wrapped to 3 characters": each job is exactly one line.
    assert [line.split()[0] for line in out.splitlines()[4:10]] == ["1", "2", "3", "4", "5", "6"]


@pytest.mark.parametrize("width", [60, 100, 119, 120, 200])
def test_queue_never_overflows_the_terminal(utc: None, width: int) -> None:
    out = screen(QueueView(queue_state()), width)
    assert max(len(line) for line in out.splitlines()) <= width
    for state in ("RUNNING", "STAGING", "PENDING", "FAILED"):
        assert state in out


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_colour_is_a_second_cue_only(utc: None) -> None:
    coloured = screen(QueueView(queue_state()), 80, colour=True)
    assert "\x1b[32mRUNNING" in coloured and "\x1b[33mPENDING" in coloured  # green, yellow
    assert "\x1b[1;31mFAILED" in coloured  # bold red
    assert "\n".join(line.rstrip() for line in ANSI.sub("", coloured).splitlines()) + "\n" == NARROW_80


def test_no_color_environment_turns_colour_off(utc: None) -> None:
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system="standard",
                      legacy_windows=False, _environ={"NO_COLOR": "1"})
    console.print(QueueView(queue_state()))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert not re.search(r"\x1b\[[0-9;]*3[0-7]m", out), "no foreground colours with NO_COLOR"
    assert "\n".join(line.rstrip() for line in ANSI.sub("", out).splitlines()) + "\n" == NARROW_80


def test_empty_cluster_reads_plainly(utc: None) -> None:
    out = screen(QueueView({"time": T, "jobs": [], "users": [], "nodes": []}), 80)
    assert "0 jobs" in out and "(no jobs)" in out and "(no users)" in out and "(no nodes)" in out


# ------------------------------------------------------------------ derived figures


def test_fit_columns_drops_in_order_and_gives_the_reason_the_rest() -> None:
    headers = {"ID": "ID", "A": "A", "B": "B", "REASON": "REASON"}
    rows = [{"ID": "1", "A": "x" * 10, "B": "y" * 10, "REASON": "z" * 40}]
    # 2 + 10 + 10 + 3 separators of 2 = 28 fixed; the reason needs min(40, 24) = 24 -> 52 columns.
    assert fit_columns(headers, rows, 52, ("A", "B"), flex="REASON") == (
        ["ID", "A", "B", "REASON"], {"ID": 2, "A": 10, "B": 10, "REASON": 24})
    # One column less: 2 + 10 + 2 * 2 = 16 fixed, 35 left for the reason.
    assert fit_columns(headers, rows, 51, ("A", "B"), flex="REASON") == (
        ["ID", "B", "REASON"], {"ID": 2, "B": 10, "REASON": 35})


def test_plain_reason_turns_scheduler_times_into_durations() -> None:
    pending = job(9, "x", "alice", "PENDING", why=Reason(ReasonKind.LOCALITY_WAIT, "waiting for locality", T + 90))
    assert pending["reason"] == f"waiting for locality until t={T + 90:.0f}s"  # the words stored, as before
    assert plain_reason(pending, T) == "waiting for locality for 1m30s more"
    assert plain_reason(pending, T + 100) == "waiting for locality until now"
    assert plain_reason(job(9, "x", "a", "PENDING", reason="submitted"), T) == "submitted; waiting for the next cycle"
    assert plain_reason(job(9, "x", "a", "RUNNING", restarts=2), T) == "restarted 2x"


def test_eta_uses_the_running_epochs_step_progress() -> None:
    # Epoch 1 done and half of epoch 2 after 150 s: 100 s an epoch; 2.5 of 4 epochs left -> 250 s.
    j = job(9, "x", "alice", "RUNNING", started_s=150, epochs=4, done=1,
            progress={"train": {"epoch": 2, "step": 50, "steps": 100}})
    assert eta_s(j, T) == pytest.approx(250.0)
    assert job_facts(j, T) == {"elapsed_s": 150.0, "eta_s": 250.0, "epochs_progress": 1.5, "reason_text": ""}
    assert eta_s(job(9, "x", "alice", "PENDING"), T) is None


# ------------------------------------------------------------------ show, explain


def detail_doc() -> dict[str, Any]:
    doc = job(7, "resnet", "alice", "RUNNING", nodes=("n1", "n2"), age_s=400, started_s=300, epochs=5, done=2,
              local=0.75, restarts=1)
    doc.update(
        attempt=2, rank_count=2, transfer_cost_ms=320, transfer_bytes=GB,
        spec={"train": {"batch_size": 32, "lr": 0.05, "grad_accum_steps": 1}},
        ranks=[{"rank": 0, "node": "n1", "devices": [0], "state": "RUNNING", "exit_code": None, "log_tail": ""},
               {"rank": 1, "node": "n2", "devices": [0], "state": "RUNNING", "exit_code": None, "log_tail": ""}],
        shards=[{"shard": 0, "rank": 0, "node": "n1", "source": "n1", "local": True, "bytes": GB, "staged_bytes": 0},
                {"shard": 1, "rank": 0, "node": "n1", "source": "n1", "local": True, "bytes": GB, "staged_bytes": 0},
                {"shard": 2, "rank": 1, "node": "n2", "source": "n2", "local": True, "bytes": GB, "staged_bytes": 0},
                {"shard": 3, "rank": 1, "node": "n2", "source": "n3", "local": False, "bytes": GB,
                 "staged_bytes": GB}],
        metrics=[{"epoch": 1, "loss": 1.2345, "accuracy": None, "images_per_s": 410.2, "data_wait_fraction": 0.05,
                  "step_time_s": 0.078},
                 {"epoch": 2, "loss": 0.8, "accuracy": 0.71, "images_per_s": 420, "data_wait_fraction": 0.04,
                  "step_time_s": 0.076, "backend": "nccl", "device": "cuda", "bf16": True, "channels_last": True}],
        checkpoints=[{"epoch": 1, "path": "p1", "nodes": ["n1"], "bytes": 45 * MB},
                     {"epoch": 2, "path": "p2", "nodes": ["n1", "n2"], "bytes": 45 * MB}],
        history=[{"attempt": 1, "rank": 0, "node": "n3", "devices": [0], "state": "KILLED", "exit_code": None},
                 {"attempt": 2, "rank": 0, "node": "n1", "devices": [0], "state": "RUNNING", "exit_code": None}],
        events=[{"time": T - 400, "actor": "alice", "kind": "job.submit", "message": "resnet: 2x1 on digits"},
                {"time": T - 300, "actor": "server", "kind": "job.requeue", "message": "node n3 is down (restart 1)"}],
        explain={})
    return doc


def test_show_has_every_section(utc: None) -> None:
    out = screen_of(lambda c: job_detail(detail_doc(), c, now=T), 100)
    for needle in ("job 7", "RUNNING", "2 ranks x 1 device on data set digits", "2/5 done, ETA 7m30s",
                   "restarts   1 (attempt 2)", "75% of bytes read locally", "shard map", "0, 1", "3 (n3)",
                   "1.0 GB/1.0 GB", "epochs", "1.2345", "71.0%",
                   "ran with nccl on cuda: bf16 on, channels-last on", "checkpoints  epochs 1, 2; latest (epoch 2) 45.0 MB "
                   "on n1, n2", "attempts", "KILLED", "events", "job.requeue", "node n3 is down"):
        assert needle in out, needle
    assert "no checkpoints" not in out
    doc = detail_doc()
    doc["spec"] = {"train": {"batch_size": 32, "lr": 0.05, "grad_accum_steps": 1, "checkpoint": False}}
    assert "batch_size 32, lr 0.05, grad_accum_steps 1, no checkpoints" in screen_of(
        lambda c: job_detail(doc, c, now=T), 100)


def test_explain_prints_reason_and_candidates(utc: None) -> None:
    why = Reason(ReasonKind.LOCALITY_WAIT, "waiting for locality", T + 20)
    cand_why = Reason(ReasonKind.LOCALITY_WAIT, "costs 800 ms > 500 ms: waiting for locality", T + 20)
    doc = {"job": 5, "user": "carol", "state": "PENDING", "factor": 0.25, "queue_position": 2, "queue_length": 3,
           "reason": "", "pending_reason": f"waiting for locality until t={T + 20:.0f}s", "decided_at": T,
           "why": why.as_dict(), "reason_kind": "locality_wait", "reason_at_s": T + 20,
           "reservation": None, "transfer_bytes": 0, "local_fraction": 0.0,
           "candidates": [{"nodes": ["n1", "n2"], "ranks_per_node": {"n1": 1, "n2": 1}, "local_fraction": 0.5,
                           "transfer_bytes": GB, "transfer_cost_ms": 800, "chosen": False,
                           "reason": f"costs 800 ms > 500 ms: waiting for locality until t={T + 20:.0f}s",
                           "why": cand_why.as_dict()}]}
    assert (why.text(), cand_why.text()) == (doc["pending_reason"], doc["candidates"][0]["reason"])
    out = screen_of(lambda c: explain(doc, c), 120)
    assert "why pending: waiting for locality for 20s more" in out
    assert "n1x1,n2x1" in out and "800 ms" in out and "costs 800 ms > 500 ms" in out
    assert f"t={T + 20:.0f}s" not in out  # the candidate's time too is read from its data, as a duration
    assert "preemption" not in out
    doc["preemptions"] = ["preempted job 3: carol is under their share (factor 1.00) and waited 400 s: "
                          "would preempt job 3 (alice, loses 120 s)"]
    out = screen_of(lambda c: explain(doc, c), 200)
    assert "preemption: preempted job 3: carol is under their share" in out and "loses 120 s" in out
    assert "waits first" not in out and "preempts nobody" not in out
    doc["preempts_nobody"] = "carol is not under their share among users with jobs (factor 0.25; ...)"
    out = screen_of(lambda c: explain(doc, c), 200)
    assert "preempts nobody: carol is not under their share among users with jobs (factor 0.25" in out
    doc["stopping"] = [{"node": "n2", "rank": 1, "attempt": 1, "state": "KILLING"}]
    out = screen_of(lambda c: explain(doc, c), 200)
    assert "waits first for its last attempt's ranks to stop: rank 1 on n2 (KILLING)" in out
    assert "own jobs" not in out  # nothing said of the user's own jobs unless newer ones went first
    doc["own_ahead"], doc["own_older"] = 1, 1
    assert "own jobs" not in screen_of(lambda c: explain(doc, c), 200)
    doc["own_ahead"], doc["own_older"] = 3, 1
    out = screen_of(lambda c: explain(doc, c), 200)
    assert "3 of carol's own jobs are ahead of it, 1 of them older: a user's own jobs go smallest first" in out
    assert "lower priority" not in out  # nothing said of other jobs unless one of a lower priority is ahead
    doc["lower_ahead"] = 1
    out = screen_of(lambda c: explain(doc, c), 200)
    assert "1 job of a lower priority is ahead of it: near-ties in priority ([policy] tie_window_s" in out
    doc["lower_ahead"] = 4
    assert "4 jobs of a lower priority are ahead of it" in screen_of(lambda c: explain(doc, c), 200)


def screen_of(draw: Any, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None, legacy_windows=False,
                      _environ={})
    draw(console)
    return console.export_text()


# ------------------------------------------------------------------ plots, completion


def png_size(path: Any) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (bytes 16..24 after the 8-byte signature)."""
    head = open(path, "rb").read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_plots_write_fixed_size_pngs(tmp_path: Any) -> None:
    from scheduler.cli.plots import HEIGHT_PX, WIDTH_PX, plot_cluster, plot_job

    plot_job(detail_doc(), tmp_path / "job.png")
    history = [{"time": T + 5 * i, "devices_total": 4, "devices_busy": i % 5, "pending": 3 - i % 4, "running": 1,
                "durations": {}} for i in range(50)]
    plot_cluster(history, tmp_path / "cluster.png")
    for name in ("job.png", "cluster.png"):
        assert png_size(tmp_path / name) == (WIDTH_PX, HEIGHT_PX) == (1000, 600)
        assert (tmp_path / name).stat().st_size > 20_000  # drawn, not blank
    with pytest.raises(ValueError, match="no epoch metrics yet"):
        plot_job({**detail_doc(), "metrics": []}, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


# ------------------------------------------------------------------ the plain queue (no rich)


def long_words_state() -> dict[str, Any]:
    """Cells rich must fold or cut: a reason with a word longer than its column, a long note."""
    state = queue_state()
    state["jobs"][1]["reason"] = "rank 0 exited: " + "x" * 130 + " then more words after it"
    state["nodes"][0]["drained"] = True
    state["nodes"][0]["drain_reason"] = "disk swap scheduled by the operators for the weekend window"
    return state


@pytest.mark.parametrize("width", [60, 80, 100, 119, 120, 150, 200])
@pytest.mark.parametrize("state", [queue_state, long_words_state,
                                   lambda: {"time": T, "jobs": [], "users": [], "nodes": []}],
                         ids=["cluster", "long-words", "empty"])
def test_the_plain_queue_is_the_rich_queue_without_rich(utc: None, width: int, state: Any) -> None:
    view = state()
    plain = "\n".join(queue_lines(view, Terminal(width), note="filter: user=alice")) + "\n"
    assert plain == screen(QueueView(view, note="filter: user=alice"), width)


def test_the_plain_queue_colours_states_as_rich_does(utc: None) -> None:
    coloured = "\n".join(queue_lines(queue_state(), Terminal(80, colour=True))) + "\n"
    assert "\x1b[32mRUNNING" in coloured and "\x1b[33mPENDING" in coloured and "\x1b[1;31mFAILED" in coloured
    assert "\n".join(line.rstrip() for line in ANSI.sub("", coloured).splitlines()) + "\n" == NARROW_80


def test_the_plain_queue_reads_its_terminal_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setenv("COLUMNS", "133")
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    term = Terminal.of(stream)
    assert (term.width, term.colour) == (133, True)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not Terminal.of(stream).colour
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.delenv("NO_COLOR")
    assert not Terminal.of(stream).colour  # not a terminal


@pytest.mark.parametrize("width", [60, 80, 150])
def test_the_plain_nodes_table_is_the_rich_one(width: int) -> None:
    from scheduler.cli.queuecells import nodes_layout
    from scheduler.cli.render import nodes_table

    nodes = long_words_state()["nodes"]
    plain = "\n".join(line.rstrip() for line in table(nodes_layout(nodes, T, width=width), Terminal(width))) + "\n"
    assert plain == screen(nodes_table(nodes, T, width=width), width)
