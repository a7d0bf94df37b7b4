"""How much an agent moves at once: at most ``max_transfers`` shard copies in flight (staging for ranks
and re-replication alike) and at most ``max_transfer_mbps`` megabits a second, the bytes its copies
receive and its data server sends counted together (``gsched agent --max-transfers``,
``--max-transfer-mbps``).  So a node copying a large data set leaves its link to the ranks' traffic.

A token bucket of one second's worth: ``take(n)`` returns once ``n`` bytes may pass.  Time and sleep
are parameters, so the bucket is tested with a fake clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Throttle:
    def __init__(self, max_transfers: int = 4, max_transfer_mbps: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if max_transfers < 1:
            raise ValueError(f"--max-transfers must be at least 1, got {max_transfers}")
        if max_transfer_mbps < 0:
            raise ValueError(f"--max-transfer-mbps must be 0 (no limit) or more, got {max_transfer_mbps}")
        self.max_transfers = max_transfers
        self.rate_bps = max_transfer_mbps * 1e6 / 8  # bytes per second; 0: no limit
        self._slots = threading.BoundedSemaphore(max_transfers)
        self._lock = threading.Lock()
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.rate_bps
        self._at = clock()
        self.in_flight = 0
        self.most_in_flight = 0  # the largest number of copies seen at once (for `gsched nodes` and tests)

    @contextmanager
    def transfer(self) -> Iterator[None]:
        """One shard copy: blocks while ``max_transfers`` are in flight on this agent."""
        with self._slots:
            with self._lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                yield
            finally:
                with self._lock:
                    self.in_flight -= 1

    def take(self, nbytes: int) -> None:
        """Wait until ``nbytes`` may pass under the bandwidth bound (returns at once without one)."""
        if self.rate_bps <= 0 or nbytes <= 0:
            return
        with self._lock:
            now = self._clock()
            self._tokens = min(self.rate_bps, self._tokens + (now - self._at) * self.rate_bps)
            self._at = now
            self._tokens -= nbytes
            wait_s = -self._tokens / self.rate_bps if self._tokens < 0 else 0.0
        if wait_s > 0:
            self._sleep(wait_s)


UNLIMITED = Throttle(max_transfers=1 << 16)
