"""The training clock leaves out the time a process stood stopped (benchmarks/clock.py)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from recbench.benchmarks.clock import RunClock
from tests.helpers import ROOT


def test_only_a_late_beat_of_an_idle_process_counts_as_a_pause():
    clock = RunClock(interval=0.1, threshold=1.0)
    assert clock._pause(0.15, 0.0) == 0.0  # a beat a little late on a busy machine
    assert clock._pause(1.05, 0.0) == 0.0  # 0.95 s late: still below the threshold
    assert clock._pause(5.1, 4.0) == 0.0  # late while the process worked: a long call held Python's lock
    assert clock._pause(5.1, 0.01) == pytest.approx(5.0)  # five seconds without a beat or CPU: it stood still
    assert clock._pause(5.1, 0.2) == pytest.approx(5.0)  # two threads busy for the interval before the stop


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX job control signals")
def test_a_process_stopped_with_sigstop_does_not_count_the_stop():
    """A child works for 3 s of wall-clock time, stopped for 1.5 s of it: its clock says about 1.5 s."""
    script = ("import time\nfrom recbench.benchmarks.clock import RunClock\n"
              "with RunClock() as clock:\n"
              "    print('ready', flush=True)\n"
              "    wall, start = time.perf_counter(), clock.now()\n"
              "    while time.perf_counter() - wall < 3.0:\n"
              "        sum(range(1000))\n"
              "    print(time.perf_counter() - wall, clock.now() - start, clock.paused, flush=True)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    child.send_signal(signal.SIGSTOP)
    stopped = time.perf_counter()
    time.sleep(1.5)
    child.send_signal(signal.SIGCONT)
    stopped = time.perf_counter() - stopped
    wall, counted, paused = map(float, child.stdout.readline().split())
    assert child.wait(timeout=30) == 0
    assert paused == pytest.approx(stopped, abs=0.3)  # the stop, less up to a beat's interval
    assert counted == pytest.approx(wall - paused, abs=0.05)
