"""What produced a result (``PROTOCOL.md``, "What a result row records"): the code's commit, library versions,
the device, and the job's peak memory."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import numpy as np
import pandas
import scipy
import torch

ROOT = Path(__file__).resolve().parents[1]
# The commit of a checkout copied without its .git folder (a device machine's copy), set by whoever copied it.
COMMIT_ENV = "RECBENCH_COMMIT"


def git_commit() -> str:
    """The checkout's commit, "-dirty" when its code differs; else ``$RECBENCH_COMMIT``; else "unknown"."""
    # Changed code makes a result "-dirty"; rewritten result files (results/reference/) do not.
    return checkout_commit(ROOT, (".", ":!results")) or os.environ.get(COMMIT_ENV) or "unknown"


def checkout_commit(folder: str | Path, paths: tuple = ()) -> str | None:
    """The commit of the git checkout that holds ``folder`` (a user's model, the suite), "-dirty" when tracked
    files (of ``paths``, default all) differ from it; None outside a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
                               cwd=folder, capture_output=True, text=True, check=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def library_versions() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "scipy": scipy.__version__, "pandas": pandas.__version__, "platform": platform.platform()}


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})"


class PeakMemory:
    """Peak memory of one job: CUDA's allocator peak on GPU, the process's peak RSS (VmHWM) on CPU.

    On Linux the RSS peak is reset per job through ``/proc/self/clear_refs``; where that is not possible the
    figure is the process's peak so far, which can only overstate a job's own peak.
    """

    def __init__(self, device: torch.device):
        self.device = device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        import resource  # only where /proc is absent (macOS); Windows has no such module

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
