"""The training clock leaves out the time a process stood stopped (benchmarks/clock.py)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from recbench.benchmarks.clock import RunClock
from tests.helpers import ROOT


def test_only_a_beat_later_than_the_threshold_counts_as_a_pause():
    clock = RunClock(interval=0.1, threshold=1.0)
    clock.count(0.15)  # a beat a little late on a busy machine
    clock.count(1.05)  # 0.95 s late: still below the threshold
    assert clock.paused == 0.0
    clock.count(5.1)  # five seconds with no beat: the process stood still
    assert clock.paused == pytest.approx(5.0)
    assert time.perf_counter() - clock.now() == pytest.approx(5.0, abs=0.01)


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
    time.sleep(1.5)
    child.send_signal(signal.SIGCONT)
    wall, counted, paused = map(float, child.stdout.readline().split())
    assert child.wait(timeout=30) == 0
    assert 1.2 < paused < 1.7  # the stop, less a beat's interval
    assert counted == pytest.approx(wall - paused, abs=0.01)
