"""The command-line side of a grid, shared by ``run_all.py`` and ``python -m benchmarks.studies``: the options
that say where and how jobs run, ``--dry-run``, the table and report at the end, a summary of failed jobs, and
errors a user can act on in one or two lines (``--debug`` shows tracebacks).

Exit codes: 0 every job finished; 1 some jobs failed (the others' table and report are still written);
2 the grid could not start (bad setting, missing data, bad option); 130 interrupted (Ctrl-C).
"""
from __future__ import annotations

import argparse
import math
import os
import socket
import sys
from collections import Counter
from pathlib import Path
from typing import Callable

from recbench.benchmarks.checkpoint import saved_progress
from recbench.benchmarks.device import resolve_device
from recbench.benchmarks.estimate import (
    estimate_jobs,
    finished_stops,
    memory_lines,
    reference_job_stops,
    reference_stops,
    total_lines,
)
from recbench.benchmarks.grid import interrupted, progress_text, run_jobs
from recbench.benchmarks.jobs import GridInterrupted
from recbench.benchmarks.options import RunOptions, cpu_threads
from recbench.benchmarks.planner import plan_grid
from recbench.benchmarks.store import ResultStore, implausible, now, row_threads
from recbench.benchmarks.tracking import TRACKERS
from recbench.datasets.splits import LEAVE_ONE_OUT, SCHEMES, SplitSpec
from recbench.reports import generate_report

EXIT_FAILED_JOBS, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options of every grid command: the split, data, output, resume, parallelism, diagnostics."""
    parser.add_argument("--split", default=LEAVE_ONE_OUT, choices=SCHEMES,
                        help="leave-one-out: each user's last item is the test target, the one before it the "
                             "validation target (the paper's; default); temporal: a global temporal split at two cut "
                             "times, models trained on the interactions before the first (PROTOCOL.md, \"Temporal "
                             "split\"); needs data with times")
    cuts = parser.add_mutually_exclusive_group()
    cuts.add_argument("--cut-quantiles", nargs=2, type=float, default=None, metavar=("Q1", "Q2"),
                      help="--split temporal: the cuts at these quantiles of the interaction times (default 0.8 0.9)")
    cuts.add_argument("--cut-times", nargs=2, type=int, default=None, metavar=("T1", "T2"),
                      help="--split temporal: the cuts at these times, in the data's unit (unix seconds for "
                           "MovieLens and Amazon, days since 0001-01-01 for Steam, a log's own numbers)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda[:N]")
    parser.add_argument("--data-dir", default=None,
                        help="folder with local dataset files (else $RECBENCH_DATA_DIR, else download)")
    parser.add_argument("--cache-dir", default=None,
                        help="where prepared datasets and negatives are cached (else $RECBENCH_CACHE_DIR, "
                             "else ~/.cache/recbench)")
    parser.add_argument("--output", default=None, help="output folder")
    parser.add_argument("--config", dest="config_files", action="append", default=[], metavar="FILE",
                        help="a TOML file of settings per model ([sasrec.model] hidden = 128, [sasrec.train.ml-1m] "
                             "lr = 5e-4, ...), applied over the suite's configs and under --set (repeatable; "
                             "the format of benchmarks/configs/, one table per model)")
    parser.add_argument("--resume", action="store_true",
                        help="skip jobs whose results are recorded with the same settings (the same key) and "
                             "continue interrupted training from its checkpoint")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="run N jobs at once in worker processes (CPU threads are divided among them; "
                             "with several GPUs each job gets one)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads per job (default: the cores the load average leaves free, divided "
                             "by --jobs; with --resume the count the folder's rows were trained with; a seed "
                             "repeats a CPU run only at the same count)")
    parser.add_argument("--dask-scheduler", default=None, metavar="ADDRESS",
                        help="send the jobs to a running Dask cluster, e.g. tcp://10.0.0.5:8786 "
                             "(pip install -e \".[distributed]\")")
    parser.add_argument("--compile", action="store_true",
                        help="run each model's training step through torch.compile (not part of a job's key; on the "
                             "CPU it trains slower, on one H200 it gained nothing: "
                             "results/reference/compile-speed-cpu.json, compile-speed-cuda-h200.json)")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each finished job's selected weights under weights/ (else only its results)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the grid, print every job with its resolved settings and key (with --resume: "
                             "which are done and where each interrupted one stands), and exit")
    parser.add_argument("--track", default=None, choices=TRACKERS,
                        help="also write each job's loss and validation metrics every epoch, and its test metrics "
                             "and settings, to TensorBoard (<output>/tensorboard) or MLflow ($MLFLOW_TRACKING_URI, "
                             "else <output>/mlflow.db); pip install -e \".[track]\"")
    parser.add_argument("--no-report", action="store_true", help="do not generate the report at the end")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors and failed jobs")


def run_options(args: argparse.Namespace, *, protocols, profile: str, output: Path,
                logs: dict | None = None) -> RunOptions:
    """The :class:`RunOptions` of the options :func:`add_run_options` added, for this grid's protocols, profile
    and output folder (and the logs of the user's own among its datasets, ``datasets.log_entries``)."""
    return RunOptions(output=output, protocols=tuple(protocols), profile=profile,
                      config_files=tuple(args.config_files), device=args.device, data_dir=args.data_dir,
                      cache_dir=args.cache_dir, resume=args.resume, n_jobs=args.jobs, threads=args.threads,
                      dask_scheduler=args.dask_scheduler, keep_checkpoints=args.keep_checkpoints,
                      compile=args.compile, progress=not args.quiet, logs=dict(logs or {}), split=split_spec(args),
                      track=getattr(args, "track", None))


def choose_threads(args: argparse.Namespace) -> str:
    """Set ``args.threads`` where ``--threads`` left it open and jobs train on this machine's CPU, and say the
    choice in words for a run's first line (nothing on a GPU or a Dask cluster, whose workers decide). With
    ``--resume``, the count the folder's rows (else its checkpoints) were trained with, so that they count as done
    (a resumed run reuses only rows and checkpoints of its own count); else the cores the load average leaves
    free, divided among ``--jobs``: threads beyond the free cores wait for each other, and a run beside one busy
    core took 10× its quiet time."""
    if args.threads:
        return f"{args.threads} CPU thread(s) per job (--threads)"
    if getattr(args, "dask_scheduler", None) or resolve_device(args.device).type != "cpu":
        return ""
    if args.resume and args.output:
        what, counts = "rows", Counter(count for row in ResultStore(Path(args.output)).rows
                                       if (count := row_threads(row)))
        if not counts:  # a first job interrupted: its checkpoint's count (read only then: it holds the weights too)
            what, counts = "checkpoints", Counter(state.threads for path in (Path(args.output) / "checkpoints").glob(
                "*.pt") if (state := saved_progress(path)) is not None and state.threads)
        if counts:
            args.threads = counts.most_common(1)[0][0]
            return (f"{args.threads} CPU thread(s) per job, the count this folder's {what} were trained with "
                    f"(--threads N to choose another)")
    cores, busy = machine_load()
    args.threads = max(1, max(1, math.floor(cores - busy + 0.5)) // max(1, args.jobs))
    return (f"{args.threads} CPU thread(s) per job: {cores} core(s), {busy:.1f} busy by the 1-minute load average "
            f"(--threads N to choose)")


def busy_note(options: RunOptions, estimate: bool) -> str | None:
    """One line for a dry run or an estimate on a CPU that other work keeps busy (half a core or more by the
    1-minute load average): what the run's threads are, and that an estimate timed now holds only while the work
    goes on."""
    threads = options.cpu_threads_per_job()
    cores, busy = machine_load()
    if threads is None or busy < 0.5:
        return None
    timed = (" --estimate times its steps beside that work: its figures hold while the work goes on and overstate "
             "the time once it ends (rerun it then)." if estimate else "")
    return (f"note: the machine is busy ({busy:.1f} of {cores} core(s) by the 1-minute load average): each job gets "
            f"{threads} CPU thread(s) x {options.n_jobs} job(s) at once, and other work slows its training.{timed}")


def machine_load() -> tuple[int, float]:
    """(the cores this process may use, how many of them other work keeps busy by the 1-minute load average,
    at most all of them)."""
    cores = cpu_threads()
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this system
        load = 0.0
    return cores, min(float(cores), load)


def split_spec(args: argparse.Namespace) -> SplitSpec:
    """The :class:`SplitSpec` of ``--split``, ``--cut-quantiles`` and ``--cut-times``."""
    return SplitSpec(args.split, quantiles=tuple(args.cut_quantiles) if args.cut_quantiles else None,
                     cut_times=tuple(args.cut_times) if args.cut_times else None)


def run_grid(args: argparse.Namespace, jobs: list, options: RunOptions, *, table: Callable[[list[dict]], str],
             plan: tuple | None = None, twins: dict | None = None, estimate: bool = False,
             estimates: dict | None = None) -> int:
    """Run ``jobs`` with ``options`` (``--dry-run``: plan and print them, with ``estimate`` each job's training
    time left), then write ``table.md`` (``table(rows)`` gives it) and the report; returns the exit code.
    ``plan``: what :func:`plan_grid` returned, when the caller has planned the jobs already; ``twins``: the study
    jobs a ``--reuse`` folder holds (:func:`benchmarks.reuse.reusable_twins`); ``estimates``: the training the plan
    expects of each job (:func:`training_left`), from which a run states its time left; with ``estimate`` and
    none given, a run times its jobs first and prints their total."""
    try:
        if args.dry_run or (estimate and estimates is None):
            plan = plan or plan_grid(jobs, options)
            planned, datasets = plan
            store = ResultStore(options.output, threads=options.cpu_threads_per_job())
            # read once, and only where used: a checkpoint holds the weights too (hundreds of MB)
            states = interrupted(planned, store) if args.dry_run or options.resume else {}
            note = busy_note(options, estimate)
            if note:
                print(note)
            if estimate:
                estimates = training_left(planned, datasets, store, args, states if options.resume else {}, twins)
            if args.dry_run:
                print_plan(planned, store, options.resume, states, twins, estimates, args.jobs)
                return 0
            if estimates:
                print(*total_lines(estimates, args.jobs), *memory_lines(estimates, args.jobs), sep="\n")
        store = ResultStore(options.output)
        others = store.others_filling()
        if others and not options.resume:
            print(f"error: {options.output} is being filled by another run ({others[0]}); wait for it to end, add "
                  f"--resume to share the folder (each job then trains once), or choose another --output",
                  file=sys.stderr)
            return EXIT_USAGE
        for other in others:
            print(f"note: another run is filling {options.output} ({other}); the jobs it runs are left to it")
        with store.filling(f"pid {os.getpid()} on {socket.gethostname()} since {now()}: {' '.join(sys.argv)}"):
            result = run_jobs(jobs, options, plan=plan, twins=twins, estimates=estimates)
    except GridInterrupted:
        print(f"\ninterrupted: finished jobs are recorded in {options.output}/; rerun the same command with --resume "
              f"to continue (interrupted training resumes from its checkpoint)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _finish(args, result, options, table)


def _finish(args: argparse.Namespace, result, options: RunOptions, table: Callable[[list[dict]], str]) -> int:
    """The table and report of what finished, and a summary of what failed; returns the exit code."""
    output, store = options.output, ResultStore(options.output)
    order = {job.key: number for number, job in enumerate(result.planned)}
    rows = sorted((row for row in store.rows if row.get("key") in order), key=lambda row: order[row["key"]])
    if rows:
        (output / "table.md").write_text(table(rows))
        if not args.no_report:
            print(f"report: {generate_report(output)}")
        print(f"results: {output / 'results.jsonl'}")
    for row in rows:
        if (why := implausible(row)) is not None:
            print(f"warning: {row['run_id']} {row['protocol']}: {why}")
    for outcome in result.failed:
        if args.debug and outcome.traceback:
            print(outcome.traceback, file=sys.stderr)
    if result.failed:
        print(f"\n{len(result.failed)} of {len(result.planned)} job(s) failed (details in {store.failures_path}):",
              *(f"  {o.run_id} (key {o.key[:12]}): {o.error}" for o in result.failed),
              "Fix the cause and rerun the same command with --resume: finished jobs are kept.",
              sep="\n", file=sys.stderr)
        return EXIT_FAILED_JOBS
    return 0


def training_left(planned: list, datasets: dict, store: ResultStore, args: argparse.Namespace, resumed: dict,
                  twins: dict | None = None) -> dict:
    """{job key: :class:`benchmarks.estimate.Estimate`} of the training the ``planned`` jobs have left on this
    machine, with the device, threads and jobs at once of ``args``. ``resumed``: {key: where its training stands}
    of the interrupted jobs a run with --resume continues (empty without --resume, when every job starts afresh and
    no finished one is skipped). None for the jobs that are done (with --resume) or reused from ``twins``, the steps
    not trained yet for the resumed ones, all of them for the rest. Where the done and reused jobs stopped early
    is where the others of their model are expected to stop, before the reference runs (:func:`finished_stops`), as
    is where the jobs of the output folder outside this plan stopped (an earlier run of a study with other
    ``--variants``); a job a reference file holds, same key, is expected where that row stopped
    (:func:`reference_job_stops`)."""
    twins = twins or {}
    rows = store.rows if args.resume else []
    finished = store.finished(planned, rows)
    pending = [job for job in planned if job.key not in twins and job.key not in finished]
    if not pending:
        return {}
    first_row = {}
    for row in rows:
        first_row.setdefault(row.get("key"), row)
    own = [(job.run_id, first_row[job.key], "") for job in planned if job.key in finished]
    planned_keys = {job.key for job in planned}
    own += [(row["run_id"], row, "a row of this folder outside this plan") for key, row in first_row.items()
            if key not in planned_keys]
    own += [(job.run_id, twins[job.key].rows[0], f"reused from {twins[job.key].folder}") for job in planned
            if job.key in twins]
    estimates = estimate_jobs(pending, datasets, device=args.device, threads=args.threads, n_jobs=args.jobs,
                              stops={**reference_stops(), **finished_stops(own), **reference_job_stops()})
    return {key: estimate.after(resumed[key]) if key in resumed else estimate for key, estimate in estimates.items()}


def print_plan(planned: list, store: ResultStore, resume: bool, states: dict, twins: dict | None = None,
               estimates: dict | None = None, n_jobs: int = 1, notes: dict | None = None) -> None:
    """``--dry-run``: every job with its key, what would happen to it (with ``resume``: skipped when done,
    resumed from its checkpoint, where it stands in ``states`` (:func:`benchmarks.grid.interrupted`); reused
    where ``twins`` has its rows), the lines ``notes`` holds for it, every resolved setting, and the training it
    has left where ``estimates`` (:func:`training_left`) has it (then also the total, one job after another and
    ``n_jobs`` at once). A resume skips only rows of the store's CPU thread count (others train again)."""
    def settings(values: dict) -> str:
        return " ".join(f"{name}={value}" for name, value in values.items())

    rows = store.rows if resume else []
    finished = store.finished(planned, rows)
    other_threads = store.other_threads(planned, rows)
    for number, job in enumerate(planned, start=1):
        action = "run"
        if job.key in finished:
            action = "skip (done)"
        elif job.key in (twins or {}):
            action = f"reuse the same job's rows in {twins[job.key].where}"
        elif job.key in states:
            where = progress_text(job, states[job.key])
            action = f"resume from {where}" if resume else f"refused without --resume (its checkpoint: {where})"
        elif job.key in other_threads:
            action = (f"run again (its rows were trained on {other_threads[job.key]} CPU thread(s), this run uses "
                      f"{store.threads}; --threads {other_threads[job.key]} keeps them)")
        described = job.describe()
        print(f"[{number}/{len(planned)}] {job.run_id}  key {job.key[:12]}  {action}",
              *(notes or {}).get(job.key, ()), sep="\n")
        print(f"    protocols: {' '.join(job.protocols)}  profile: {job.profile}{_split_text(job.split)}\n"
              f"    model: {settings(described['hyperparameters']) or '(no settings)'}\n"
              f"    train: {settings(described['train_settings']) if described['train_settings'] else '(no training)'}")
        if job.key in (estimates or {}) and estimates[job.key].seconds is not None:
            left = " left" if resume and job.key in states else ""
            print(f"    estimated training{left}: {estimates[job.key].describe()}")
    if estimates is not None:
        print(*total_lines(estimates, n_jobs), *memory_lines(estimates, n_jobs), sep="\n")
    print(f"{len(planned)} job(s); nothing was run (--dry-run)")


def _split_text(record: dict | None) -> str:
    """The plan's words for a job's split: nothing for leave-one-out, else the scheme and its cut times."""
    if record is None:
        return ""
    first, second = record["cut_times"]
    quantiles = f" (quantiles {' '.join(f'{q:g}' for q in record['quantiles'])})" if record["quantiles"] else ""
    return f"  split: {record['scheme']}, cut times {first} and {second}{quantiles}"


def guard(main: Callable[[], int], debug: bool) -> int:
    """Run ``main``; an error no grid step caught becomes two lines instead of a traceback (unless --debug)."""
    try:
        return main()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, OSError) as error:  # bad input: a setting, a file, missing data (GridError: one per line)
        if debug:
            raise
        lines = str(error).splitlines() or [""]
        print(f"error: {lines[0]}", *(f"       {line}" for line in lines[1:]), sep="\n", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:  # noqa: BLE001  (a bug: say how to get the details)
        if debug:
            raise
        print(f"internal error: {type(error).__name__}: {error}\n"
              f"       rerun with --debug for the traceback, and please report it", file=sys.stderr)
        return EXIT_FAILED_JOBS
