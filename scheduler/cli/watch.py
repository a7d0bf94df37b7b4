"""``gsched queue --watch``: the queue redrawn in place about once a second (rich ``Live``).

Who calls: ``cli.cmd_queue``.  Every page of ``GET /v1/jobs`` per frame; ``select`` filters the view
(user, state, mine, recently finished) before it is drawn.  On a terminal the view takes the
alternate screen, like ``top``: frames replace each other whole (no flicker, no scroll-back litter),
and the last frame is printed to the normal screen on exit so it stays readable.  Without a terminal
(a pipe, a log) it prints a frame per refresh.  If the server stops answering, the last frame stays
and a red line says so; the watch retries every interval.  Ctrl-C ends it with status 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from scheduler.protocol.client import Client
from scheduler.protocol.servererror import ServerError


def watch(c: Client, select: Callable[[dict[str, Any]], dict[str, Any]], interval_s: float = 1.0,
          query: Callable[[], dict[str, Any]] | None = None, max_frames: int | None = None, note: str = "") -> int:
    """Redraw until Ctrl-C (or ``max_frames`` frames, for tests); returns the exit status.  Each frame
    is ``select`` of every page of ``GET /v1/jobs`` with the parameters ``query()`` gives then (default:
    none)."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    from scheduler.cli.render import QueueView

    console = Console()
    interval_s = max(0.2, interval_s)
    hint = f"refresh {interval_s:g}s, Ctrl-C to quit"
    note = f"{note}  {hint}" if note else hint
    last: Any = Text("connecting to the gsched server...", style="dim")
    frames = 0
    if not console.is_terminal:
        return _print_frames(c, select, interval_s, query, max_frames, note, console)
    live = Live(last, console=console, auto_refresh=False, screen=True, transient=False,
                redirect_stdout=False, redirect_stderr=False, vertical_overflow="crop")
    try:
        with live:
            next_at = time.monotonic()
            while max_frames is None or frames < max_frames:
                try:
                    view = select(c.every_page("/v1/jobs", **(query() if query else {})))
                    last = QueueView(view, note)
                    live.update(last, refresh=True)
                except ServerError as e:
                    error = Text(f"server unreachable ({e.message}); retrying every {interval_s:g}s", style="red")
                    live.update(Group(error, last), refresh=True)
                frames += 1
                next_at += interval_s
                time.sleep(max(0.0, next_at - time.monotonic()))
                next_at = max(next_at, time.monotonic() - interval_s)  # after a slow request: no catch-up burst
    except KeyboardInterrupt:
        pass
    if isinstance(last, QueueView):
        console.print(last)  # the alternate screen is gone: leave the last frame on the normal one
    return 0


def _print_frames(c: Client, select: Callable[[dict[str, Any]], dict[str, Any]], interval_s: float,
                  query: Callable[[], dict[str, Any]] | None, max_frames: int | None, note: str,
                  console: Any) -> int:
    """Not a terminal: one frame after another, separated by a blank line (for logs and pipes)."""
    from scheduler.cli.render import QueueView

    frames = 0
    try:
        while max_frames is None or frames < max_frames:
            try:
                console.print(QueueView(select(c.every_page("/v1/jobs", **(query() if query else {}))), note))
            except ServerError as e:
                console.print(f"server unreachable ({e.message}); retrying every {interval_s:g}s")
            console.print()
            console.file.flush()
            frames += 1
            if max_frames is None or frames < max_frames:
                time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    return 0
