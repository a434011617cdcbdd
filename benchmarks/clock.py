"""Wall-clock time during which a process could run: the training time a result row records.

A run paused with ``kill -STOP`` (to time something else on a busy machine, say) or on a suspended machine keeps
counting ``time.perf_counter()``, so its row said it trained hours it spent stopped. :class:`RunClock` counts the
pauses instead: a heartbeat thread notes the time every ``interval`` seconds, and a beat that comes more than
``threshold`` seconds late means the whole process stood still (a stopped process runs none of its threads), for
that long less the interval. A busy machine only delays a beat by milliseconds, far below the threshold; a pause
shorter than it is not noticed.
"""
from __future__ import annotations

import threading
import time


class RunClock:
    """``now()``: ``time.perf_counter()`` less the pauses counted so far (``paused``), while used as a context."""

    def __init__(self, interval: float = 0.1, threshold: float = 1.0):
        self.interval, self.threshold = interval, threshold
        self.paused = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="run-clock", daemon=True)

    def __enter__(self) -> RunClock:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def now(self) -> float:
        with self._lock:
            return time.perf_counter() - self.paused

    def _beat(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            self.count(time.perf_counter() - last)
            last = time.perf_counter()

    def count(self, between_beats: float) -> None:
        """Count a pause where two beats lie further apart than the interval and the threshold allow."""
        late = between_beats - self.interval
        if late > self.threshold:
            with self._lock:
                self.paused += late
