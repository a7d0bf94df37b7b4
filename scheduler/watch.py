"""``gsched queue --watch``: a live view refreshed in place (rich Live), one request per refresh."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from scheduler.client import ApiError, Client


def watch(c: Client, select: Callable[[dict[str, Any]], dict[str, Any]], interval_s: float = 1.0,
          include_done: bool = True, max_frames: int | None = None) -> int:
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    from scheduler.render import queue_renderable

    console = Console()
    frames = 0
    with Live(Text("connecting..."), console=console, refresh_per_second=4, screen=False,
              auto_refresh=False, transient=False) as live:
        while max_frames is None or frames < max_frames:
            try:
                view = select(c.get("/v1/jobs", all="true" if include_done else None))
                stamp = Text(time.strftime("gsched queue  %H:%M:%S  (Ctrl-C to quit)"), style="dim")
                live.update(Group(stamp, queue_renderable(view)), refresh=True)
            except ApiError as e:
                live.update(Text(f"server unreachable: {e.message}; retrying", style="red"), refresh=True)
            frames += 1
            time.sleep(interval_s)
    return 0
