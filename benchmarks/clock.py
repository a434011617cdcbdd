"""Wall-clock time during which a process could run: the training time a result row records.

A run paused with ``kill -STOP`` (to time something else on a busy machine, say), or in a virtual machine its host
paused, keeps counting ``time.perf_counter()``, so its row said it trained hours it spent stopped. :class:`RunClock`
counts those pauses instead: a heartbeat thread notes the time every ``interval`` seconds, and a beat more than
``threshold`` seconds late, during whose lateness the process used less than half a core, means the process stood
still for that long less the interval. The CPU test keeps out the other reason a beat can be late, a main thread
holding Python's lock in a long call while it works (a core busy all along); a busy machine delays a beat by
milliseconds. A pause shorter than the threshold is not noticed, nor one shorter than a fifth of a second per
thread that was busy when it began (the CPU time of the beat's interval before it).
"""
from __future__ import annotations

import threading
import time

IDLE_CORES = 0.5  # a late beat whose lateness used less CPU than this many cores for as long: the process stood still


class RunClock:
    """``now()``: ``time.perf_counter()`` less the pauses counted so far (``paused``), while used as a context."""

    def __init__(self, interval: float = 0.1, threshold: float = 1.0):
        self.interval, self.threshold = interval, threshold
        self.paused = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="run-clock", daemon=True)
        self._last = (time.perf_counter(), time.process_time())  # the last beat: wall and CPU time

    def __enter__(self) -> RunClock:
        self._last = (time.perf_counter(), time.process_time())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def now(self) -> float:
        """The time less every pause, the one the heartbeat has not counted yet included (the main thread can
        resume before the heartbeat does)."""
        wall, cpu = time.perf_counter(), time.process_time()
        with self._lock:
            return wall - self.paused - self._pause(wall - self._last[0], cpu - self._last[1])

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            wall, cpu = time.perf_counter(), time.process_time()
            with self._lock:
                self.paused += self._pause(wall - self._last[0], cpu - self._last[1])
                self._last = (wall, cpu)

    def _pause(self, between_beats: float, cpu_between: float) -> float:
        """The pause in a gap of ``between_beats`` seconds during which the process used ``cpu_between``."""
        late = between_beats - self.interval
        return late if late > self.threshold and cpu_between < IDLE_CORES * late else 0.0
