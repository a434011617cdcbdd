"""Where jobs run: in this process, in joblib worker processes on this machine, or on a Dask cluster.

The driver (:func:`benchmarks.grid.run_jobs`) hands over :class:`~benchmarks.worker.JobPayload` values and
gets :class:`~benchmarks.worker.JobOutcome` values back as jobs finish; workers never write results.

- ``n_jobs = 1``: one job after another in this process, with progress bars.
- ``n_jobs = N``: N joblib (loky) worker processes, each writing a line an epoch that starts with its job's run
  id (bars of several processes would overwrite each other). The machine's CPU threads are divided among them
  (``threads`` overrides), and when several CUDA devices are visible each job takes one from a shared pool.
  A worker that dies (killed, out of memory) ends its job; the jobs it left unfinished are run again, resuming
  from their checkpoints, at most :data:`RETRIES` times.
- ``dask_scheduler = ADDRESS``: joblib's Dask backend sends the jobs to a running Dask cluster (``pip install
  -e ".[distributed]"``). Each dataset is sent to the workers once. The scheduler and every worker must have the
  same code installed (``pip install -e <checkout>``) and import every model of the user's own from the same source
  file (checked before the grid starts); a job uses as many torch threads as its Dask worker has.
"""
from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import time
from typing import Callable, Iterable, Iterator

import joblib
import torch

from recbench.benchmarks.device import resolve_device
from recbench.benchmarks.jobs import GridError
from recbench.benchmarks.options import RunOptions, cpu_threads
from recbench.benchmarks.worker import JobOutcome, run_job
from recbench.models import model_class, model_origin

RETRIES = 2  # new starts of the unfinished jobs after a local worker process died


def _handing(payloads: Iterator, handed: list) -> Iterator:
    """``payloads``, each noted in ``handed`` as it is handed out (to run again those a dead worker left)."""
    for payload in payloads:
        handed.append(payload)
        yield payload


def busy_cores(interval: float = 0.1) -> float | None:
    """How many of this process's cores other processes keep busy: their non-idle share over ``interval`` seconds
    in ``/proc/stat``, summed over the cores of the affinity mask (None where there is no ``/proc/stat``)."""
    def ticks() -> dict[int, list[int]]:
        with open("/proc/stat") as stat:
            fields = [line.split() for line in stat if line.startswith("cpu") and line[3].isdigit()]
        # user nice system idle iowait irq softirq steal: idle and iowait are the idle ticks
        return {int(name[3:]): [int(value) for value in values[:8]] for name, *values in fields}

    try:
        cores, before = os.sched_getaffinity(0), ticks()
        time.sleep(interval)
        after = ticks()
    except (OSError, AttributeError):  # not Linux
        return None
    busy = 0.0
    for core in cores & before.keys() & after.keys():
        spent = [later - earlier for earlier, later in zip(before[core], after[core])]
        busy += (sum(spent) - spent[3] - spent[4]) / sum(spent) if sum(spent) else 0.0
    return busy


def shared_cores_warning(threads: int, n_jobs: int, cores: int, busy: float) -> str | None:
    """One line when a run's torch threads (``threads`` per job, ``n_jobs`` at once) and the cores other
    processes keep ``busy`` exceed the ``cores`` it may use: torch's threads wait for each other at every
    operation, so a thread without a core of its own stalls the rest (benchmarks/GUIDE.md, "Running a large grid")."""
    wanted = threads * n_jobs
    if busy + wanted <= cores + 0.5:
        return None
    return (f"warning: this run starts {n_jobs} job(s) × {threads} torch thread(s) on {cores} core(s), "
            f"{busy:.1f} of them busy with other processes: threads that share a core wait for each other and "
            f"training can run many times slower; choose --jobs and --threads to fit the free cores, or start "
            f"when the other work ends")


# The rule, not the figure: the measurement is the result file's (the compiled step with the plain attention kernel
# against eager's recomputed one).
COMPILE_ON_CPU = ("note: --compile on the CPU trained the attention models slower than eager, as measured in "
                  "results/reference/compile-speed-cpu.json; leave it out on a CPU")


class Executor:
    """Runs payloads where the options say (module docstring) and yields their outcomes as they finish."""

    def __init__(self, options: RunOptions, log=print, sources: dict | None = None):
        """``sources``: model name -> origin (``models.model_origin``) of the grid's models from outside the
        suite, which every Dask worker must import from the same source."""
        n_jobs, dask_scheduler = options.n_jobs, options.dask_scheduler
        self.n_jobs, self.dask_scheduler, self.log = n_jobs, dask_scheduler, log
        self.client = None
        if dask_scheduler:
            from dask.distributed import Client  # optional: Dask is an extra (pip install -e ".[distributed]")

            try:
                self.client = Client(dask_scheduler, timeout="30s")
            except OSError as error:
                raise GridError(f"--dask-scheduler {dask_scheduler}: cannot connect ({error})") from None
            self._check_cluster()
            self._check_models(sources or {})
            self.parallelism = max(1, sum(self.client.nthreads().values()))
        else:
            self.parallelism = n_jobs
        local_parallel = n_jobs > 1 and not dask_scheduler
        self.threads_per_job = options.threads or (max(1, cpu_threads() // n_jobs) if local_parallel else None)
        if not dask_scheduler and resolve_device(options.device).type == "cpu":
            busy = busy_cores()
            warning = busy is not None and shared_cores_warning(self.threads_per_job or torch.get_num_threads(),
                                                                n_jobs, cpu_threads(), busy)
            if warning:
                log(warning)
            if options.compile:
                log(COMPILE_ON_CPU)
        self.worker_progress = options.progress and not local_parallel and not dask_scheduler
        # Workers side by side share the driver's stderr: a line an epoch each, named by its run id, and no bars.
        self.worker_epoch_lines = options.progress and local_parallel
        self.device_pool = None
        if local_parallel and resolve_device(options.device).type == "cuda" and torch.cuda.device_count() > 1:
            self.device_pool = self._cuda_pool(n_jobs)

    def _check_cluster(self) -> None:
        """The scheduler unpickles the tasks and the workers run them: both must import this suite's code,
        or the grid would hang. Say how to start them instead."""
        probe = "import recbench.benchmarks.worker"  # run with exec(), a builtin, which the cluster can always unpickle
        where = []
        try:
            self.client.run_on_scheduler(exec, probe)
        except ImportError:
            where.append("the scheduler")
        failed = [address for address, error in self.client.run(exec, probe, on_error="return").items()
                  if isinstance(error, BaseException)]
        if failed:
            where.append(f"worker(s) {', '.join(failed)}")
        if not self.client.nthreads():
            where.append("no worker is connected")
        if where:
            self.client.close()
            raise GridError(f"the Dask cluster at {self.dask_scheduler} cannot run the suite ({'; '.join(where)}): "
                              f"install this code where the scheduler and every worker run (pip install -e "
                              f"/path/to/checkout) and start them from that Python, e.g. "
                              f"python -m distributed.cli.dask_worker {self.dask_scheduler}")

    def _check_models(self, sources: dict) -> None:
        """Every worker imports each model of the user's own, from a file with the driver's source: else the
        grid would fail job by job, or run other code under the keys the driver planned."""
        problems = []
        for name, origin in sources.items():
            found = self.client.run(source_sha256, name, origin["sha256"], on_error="return")
            for address, sha256 in found.items():
                if isinstance(sha256, BaseException):
                    problems.append(f"worker {address} cannot import model {name!r} ({sha256})")
                elif sha256 != origin["sha256"]:
                    problems.append(f"worker {address} imports model {name!r} from other code than this driver "
                                    f"(sha256 {sha256[:12]}, here {origin['sha256'][:12]} from {origin['file']})")
        if problems:
            self.client.close()
            raise GridError(f"the Dask cluster at {self.dask_scheduler} cannot run the grid's own models: "
                            f"{'; '.join(problems)}; start every worker with the folder of each model's package on "
                            f"PYTHONPATH, from the same files, e.g. PYTHONPATH=/path/to/checkout:/path/to/yours dask "
                            f"worker {self.dask_scheduler}")

    def _cuda_pool(self, n_jobs: int):
        """A queue shared by the workers: every visible CUDA device, each ceil(n_jobs / devices) times."""
        devices = [f"cuda:{index}" for index in range(torch.cuda.device_count())]
        self._manager = multiprocessing.Manager()
        pool = self._manager.Queue()
        for _ in range(math.ceil(n_jobs / len(devices))):
            for name in devices:
                pool.put(name)
        self.log(f"{n_jobs} workers share {len(devices)} CUDA devices: {', '.join(devices)}")
        return pool

    def run(self, payloads: Iterable, datasets: dict, started: Callable) -> Iterator:
        """Outcomes of ``payloads`` as they finish; ``started(planned_job)`` is called as each is handed out.
        ``payloads`` may be a generator: it is read one payload at a time, as a worker becomes free (tuning asks
        for its next trial then), and from joblib's dispatching thread when jobs run in parallel."""
        payloads = self._with_device_pool(payloads)
        if self.n_jobs == 1 and not self.dask_scheduler:
            for payload in payloads:
                started(payload.planned)
                yield run_job(payload, datasets[payload.planned.job.dataset], log=self.log)
            return
        if self.dask_scheduler:
            with joblib.parallel_config(backend="dask", wait_for_workers_timeout=60):
                yield from self._parallel(payloads, datasets, started, n_jobs=-1)
            return
        remaining = payloads
        for attempt in range(RETRIES + 1):
            finished, handed = set(), []
            try:
                for outcome in self._parallel(_handing(remaining, handed), datasets, started, n_jobs=self.n_jobs):
                    finished.add(outcome.key)
                    yield outcome
                return
            except joblib.externals.loky.process_executor.TerminatedWorkerError:
                unfinished = [p for p in handed if p.planned.key not in finished]
                remaining = itertools.chain(unfinished, remaining)
                if attempt == RETRIES:
                    break
                self.log(f"a worker process died; running the {len(unfinished)} unfinished job(s) again, "
                         f"resuming from their checkpoints")
                for payload in unfinished:
                    payload.resume = True
        for payload in remaining:
            yield JobOutcome(payload.planned.key, payload.planned.run_id, "failed", error_type="WorkerDied",
                             error=f"its worker process died {RETRIES + 1} times (killed, or out of memory)")

    def _with_device_pool(self, payloads: Iterable) -> Iterator:
        for payload in payloads:
            payload.device_pool = self.device_pool
            yield payload

    def _parallel(self, payloads, datasets, started, n_jobs: int):
        def tasks():
            for payload in payloads:
                started(payload.planned)
                yield joblib.delayed(run_job)(payload, datasets[payload.planned.job.dataset])

        parallel = joblib.Parallel(n_jobs=n_jobs, return_as="generator_unordered", pre_dispatch="n_jobs",
                                   batch_size=1)
        return parallel(tasks())

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if getattr(self, "_manager", None) is not None:
            self._manager.shutdown()


def source_sha256(name: str, planned_sha256: str) -> str:
    """On a Dask worker: the sha256 of the source it imports model ``name`` from (:meth:`Executor._check_models`),
    after importing it again if its file was edited to the planned source since this worker imported it."""
    try:
        model_class(name, planned_sha256)
    except ValueError:
        pass  # a source that still differs: the driver names it
    return model_origin(name)["sha256"]
