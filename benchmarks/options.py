"""How a grid runs: :class:`RunOptions`, the one options object of :func:`benchmarks.grid.run_jobs`, the
command line (``run_all.py``, the studies) and the Python API.

A job says *what* is computed (dataset, model, seed, overrides; ``benchmarks.jobs``); the options say where the
data and the results live, with which profile, protocols and configuration files, and how the jobs run (device,
parallelism, resume). Of the options only ``profile``, ``protocols``, ``config_files`` and ``split`` change what a
job computes, and they do so through its resolved settings and its split, which its key covers (the split only
when it is not the paper's leave-one-out, so that those keys stay as they were).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from recbench.benchmarks.config import PROFILES
from recbench.benchmarks.device import resolve_device
from recbench.benchmarks.evaluator import PROTOCOLS
from recbench.benchmarks.negatives import PAIRS
from recbench.benchmarks.tracking import missing as tracking_problem
from recbench.datasets.errors import unknown
from recbench.datasets.splits import LEAVE_ONE_OUT, SplitSpec


@dataclass
class RunOptions:
    output: Path | str  # the results folder
    protocols: tuple = ("full", "pop100")  # candidate protocols of the next-item task's test split
    profile: str = "smoke"  # "smoke" (seconds per model) or "paper" (the paper's settings)
    config_files: tuple = ()  # --config files, applied in order over the suite's configs
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:N"
    data_dir: str | Path | None = None  # local dataset files (else $RECBENCH_DATA_DIR, else download)
    cache_dir: str | Path | None = None  # prepared datasets and negatives (else $RECBENCH_CACHE_DIR, ...)
    resume: bool = False  # skip finished jobs, continue interrupted training from its checkpoint
    n_jobs: int = 1  # jobs at once in local worker processes
    threads: int | None = None  # torch CPU threads per job (None: all cores divided by n_jobs)
    dask_scheduler: str | None = None  # run the jobs on this Dask cluster instead
    keep_checkpoints: bool = False  # keep each finished job's selected weights under weights/
    compile: bool = False  # run each training step through torch.compile
    progress: bool = True  # progress bars
    command: list[str] | None = field(default=None)  # the invocation recorded in manifest.jsonl (None: sys.argv)
    logs: dict = field(default_factory=dict)  # dataset name -> datasets.InteractionLog, a log of the user's own
    split: SplitSpec | str = "leave-one-out"  # or "temporal", or a SplitSpec with the temporal split's cuts
    track: str | None = None  # "tensorboard" or "mlflow": each job's curve and figures there too (benchmarks.tracking)

    def __post_init__(self):
        self.output = Path(self.output)
        self.protocols = tuple(self.protocols)
        self.config_files = tuple(Path(path) for path in self.config_files)
        self.split = self.split if isinstance(self.split, SplitSpec) else SplitSpec(self.split)

    def cpu_threads_per_job(self) -> int | None:
        """The torch threads each job trains with where jobs train on this machine's CPU (``threads``, else the
        cores divided among ``n_jobs`` worker processes, else this process's torch threads); None on CUDA or a Dask
        cluster, whose workers decide. Rows record it, and a resumed run reuses only rows of the same count."""
        if self.dask_scheduler or resolve_device(self.device).type != "cpu":
            return None
        if self.threads:
            return self.threads
        if self.n_jobs > 1:
            return max(1, cpu_threads() // self.n_jobs)
        return torch.get_num_threads()

    def problems(self) -> list[str]:
        """Every option that cannot work, one line each (empty when all is well); checked before planning."""
        found = []
        if self.profile not in PROFILES:
            found.append(str(unknown("profile", self.profile, PROFILES)))
        found += [str(unknown("protocol", name, PROTOCOLS)) for name in self.protocols
                  if name not in (*PROTOCOLS, PAIRS)]
        if self.n_jobs < 1:
            found.append(f"--jobs {self.n_jobs}: must be >= 1")
        if self.threads is not None and self.threads < 1:
            found.append(f"--threads {self.threads}: must be >= 1")
        if self.dask_scheduler and self.n_jobs != 1:
            found.append("--jobs and --dask-scheduler exclude each other: the Dask cluster decides how many jobs "
                         "run at once")
        if self.dask_scheduler:
            try:
                import dask.distributed  # noqa: F401  (optional: whether the extra is installed)
            except ImportError:
                found.append('--dask-scheduler needs Dask: pip install -e ".[distributed]"')
        found += [f"--config {path}: no such file" for path in self.config_files if not path.is_file()]
        if self.track and (problem := tracking_problem(self.track)):
            found.append(problem)
        try:
            resolve_device(self.device)
        except (RuntimeError, ValueError) as error:
            found.append(str(error))
        return found


def cpu_threads() -> int:
    """CPU cores this process may use (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def output_suffix(scheme: str) -> str:
    """What a default output folder name gains for the split ``scheme``: nothing for leave-one-out, so that its
    folders stay where they were, else ``-temporal``; rows of both splits never share a folder by default."""
    return "" if scheme == LEAVE_ONE_OUT else f"-{scheme}"
