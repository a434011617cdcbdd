"""What produced a result (``PROTOCOL.md``, "What a result row records"): the code's commit, library versions,
the device (on a CPU its model and its bf16 units, on which the speed of bf16 depends), and the job's peak memory."""
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
    return (checkout_commit(ROOT, (".", ":!results"), tracking=Path(__file__)) or os.environ.get(COMMIT_ENV)
            or "unknown")


def checkout_commit(folder: str | Path, paths: tuple = (), tracking: str | Path | None = None) -> str | None:
    """The commit of the git checkout that holds ``folder`` (a user's model, the suite), "-dirty" when tracked
    files (of ``paths``, default all) differ from it; None outside a git checkout, and None where that checkout
    does not track the file ``tracking``: a copy of the code in an untracked or ignored folder of another
    checkout, whose commit would name other code."""
    try:
        if tracking is not None:
            subprocess.run(["git", "ls-files", "--error-unmatch", "--", str(tracking)], cwd=folder,
                           capture_output=True, check=True)
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


# /proc/cpuinfo's flags for the matrix units that compute bf16 products natively: Intel's AMX and the AVX-512
# BF16 instructions (Intel since Cooper Lake, AMD since Zen 4). Without them bf16 is emulated and slower than fp32.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo_field(name: str, cpuinfo: Path | None) -> str | None:
    """The first ``name : value`` of Linux's ``cpuinfo`` (default :data:`CPUINFO`; None elsewhere, or where it has
    no such line)."""
    try:
        text = (cpuinfo or CPUINFO).read_text()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.split(":", 1)[0].strip() == name), None)


def cpu_flags(cpuinfo: Path | None = None) -> set[str]:
    """The CPU's feature flags as Linux lists them in ``cpuinfo`` (none elsewhere)."""
    return set((_cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_name(cpuinfo: Path | None = None) -> str:
    """The CPU's model as Linux names it (``AMD EPYC``, ``Intel(R) Xeon(R) Platinum 8480+``); elsewhere what
    Python knows (the architecture, at least)."""
    return _cpuinfo_field("model name", cpuinfo) or platform.processor() or platform.machine()


def bf16_units(cpuinfo: Path | None = None) -> list[str]:
    """Which of :data:`BF16_CPU_FLAGS` the CPU has, in that order (none elsewhere)."""
    flags = cpu_flags(cpuinfo)
    return [flag for flag in BF16_CPU_FLAGS if flag in flags]


def describe_device(device: torch.device) -> str:
    """The device in a row's words: ``cuda:0 (NVIDIA H200)``; ``cpu (1 thread, AMD EPYC, avx512_bf16)``, the bf16
    units named or ``no native bf16``."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    threads, units = torch.get_num_threads(), " ".join(bf16_units()) or "no native bf16"
    return f"cpu ({threads} thread{'s' if threads != 1 else ''}, {cpu_name()}, {units})"


def machine(threads: int | None = None) -> dict:
    """The machine of a measurement file: the CPU's model and bf16 units, the cores, torch's threads and version."""
    return {"cpu": cpu_name(), "bf16_units": bf16_units(),
            "cores": os.cpu_count(), "torch_threads": threads or torch.get_num_threads(), "torch": torch.__version__}


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
