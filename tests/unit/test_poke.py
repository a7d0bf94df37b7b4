"""``ServerContext.poke``: a submit asks for a cycle soon, and a stream of submits never delays it.

Real APScheduler, a cycle interval of an hour (so only pokes can make it run), and a stand-in cycle
function that counts its runs; no database.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from scheduler.server.context import ServerContext


def _context_with_timer(runs: list[float]) -> tuple[ServerContext, Any]:
    from apscheduler.schedulers.background import BackgroundScheduler

    ctx = ServerContext(settings=None, db=None)  # type: ignore[arg-type]
    sched = BackgroundScheduler(daemon=True)
    sched.add_job(lambda: runs.append(time.monotonic()), "interval", seconds=3600, id="cycle", max_instances=1,
                  coalesce=True, misfire_grace_time=None)
    sched.start()
    ctx.scheduler = sched
    return ctx, sched


def test_a_steady_stream_of_pokes_does_not_postpone_the_cycle() -> None:
    runs: list[float] = []
    ctx, sched = _context_with_timer(runs)
    try:
        stop = threading.Event()

        def submitter() -> None:  # a submit every 10 ms, as a busy client would
            while not stop.is_set():
                ctx.poke()
                time.sleep(0.01)

        t = threading.Thread(target=submitter)
        t.start()
        deadline = time.monotonic() + 10
        while len(runs) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        t.join()
        # Each poke once its cycle has run asks for the next one: several cycles ran while pokes went on
        # (a poke that moved the timer to "200 ms from now" every time would have let none run).
        assert len(runs) >= 3, runs
    finally:
        sched.shutdown(wait=False)


def test_a_poke_never_moves_an_earlier_cycle_later(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime, timedelta

    import scheduler.server.context as server

    monkeypatch.setattr(server, "POKE_DELAY_S", 30.0)  # a poke would ask for a cycle 30 s from now
    runs: list[float] = []
    ctx, sched = _context_with_timer(runs)
    try:
        soon = datetime.now().astimezone() + timedelta(seconds=5)
        sched.modify_job("cycle", next_run_time=soon)
        ctx.poke()
        assert sched.get_job("cycle").next_run_time == soon
        sched.modify_job("cycle", next_run_time=soon + timedelta(seconds=3000))
        ctx.poke()  # now the poke is earlier than the timer: it moves the cycle up to 30 s from now
        assert sched.get_job("cycle").next_run_time <= soon + timedelta(seconds=30)
    finally:
        sched.shutdown(wait=False)


def test_a_poke_leaves_as_long_after_a_cycle_as_the_cycle_took() -> None:
    """A cycle over a long queue took 5 s: a submit right after it asks for the next one 5 s after it
    ended, not 0.2 s (the cycle process would otherwise run back to back under a stream of submits)."""
    from datetime import datetime, timedelta

    runs: list[float] = []
    ctx, sched = _context_with_timer(runs)
    try:
        ctx._cycle_ended, ctx._cycle_took = time.monotonic(), 5.0
        before = datetime.now().astimezone()
        ctx.poke()
        due = sched.get_job("cycle").next_run_time
        assert before + timedelta(seconds=4.5) <= due <= before + timedelta(seconds=5.5)
        ctx._poked_for = None
        ctx._cycle_ended, ctx._cycle_took = time.monotonic() - 10.0, 0.05  # a short cycle long ago
        before = datetime.now().astimezone()
        sched.modify_job("cycle", next_run_time=before + timedelta(seconds=3000))
        ctx.poke()
        assert sched.get_job("cycle").next_run_time <= before + timedelta(seconds=1)
    finally:
        sched.shutdown(wait=False)
