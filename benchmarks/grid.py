"""Runs a grid of jobs: check everything first, train and test each job once, keep every result.

:func:`run_jobs` is the driver used by ``run_all.py``, the studies, tuning and the Python API:

1. **Plan** (:mod:`benchmarks.planner`): every job's settings are resolved and checked and every dataset is
   located (downloaded where allowed) and prepared *before the first training step*; all problems are reported
   together. Each job gets its key (:mod:`benchmarks.jobs`).
2. **Execute** (:mod:`benchmarks.execution`): the jobs not already finished run in this process, in joblib
   worker processes or on a Dask cluster; a study job that another folder already holds as a main-grid job
   (:class:`benchmarks.reuse.Twin`) takes that job's rows instead. One line per started and finished job says the
   time left (:class:`benchmarks.grid_progress.GridProgress`). A worker runs :func:`benchmarks.worker.run_job`
   and returns its result rows and per-user arrays; it writes nothing but its own checkpoint and the claim beside
   it.
3. **Record** (:class:`benchmarks.store.ResultStore`): the driver alone writes, one job at a time and
   atomically: a finished job's rows replace only rows of the same key; a failed job is recorded with its error
   and the grid goes on; every invocation is appended to ``manifest.jsonl``.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

from recbench.benchmarks.checkpoint import TrainState, saved_progress
from recbench.benchmarks.estimate import duration
from recbench.benchmarks.execution import Executor
from recbench.benchmarks.grid_progress import GridProgress
from recbench.benchmarks.jobs import KEY_VERSION, GridError, GridInterrupted, Job, PlannedJob
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.planner import plan_grid, prepare_negatives
from recbench.benchmarks.provenance import git_commit
from recbench.benchmarks.reuse import reused_outcome
from recbench.benchmarks.store import ResultStore, row_threads, thread_count_line
from recbench.benchmarks.tracking import Tracker
from recbench.benchmarks.worker import JobOutcome, JobPayload
from recbench.datasets import resolve_cache_dir, resolve_data_dir


@dataclass
class GridResult:
    """What one invocation planned and what became of each job."""

    planned: list[PlannedJob]
    finished: list[JobOutcome] = field(default_factory=list)
    failed: list[JobOutcome] = field(default_factory=list)
    skipped: list[PlannedJob] = field(default_factory=list)
    interrupted: bool = False

    @property
    def rows(self) -> list[dict]:
        """The rows this invocation wrote, in the order the jobs were planned."""
        order = {job.key: number for number, job in enumerate(self.planned)}
        return [row for outcome in sorted(self.finished, key=lambda o: order[o.key]) for row in outcome.rows]


def run_jobs(jobs: list[Job], options: RunOptions, *, preloaded: dict | None = None, plan: tuple | None = None,
             log=print, twins: dict | None = None, estimates: dict | None = None) -> GridResult:
    """Plan, run and record a grid of jobs (see the module docstring); returns what became of each job.

    ``preloaded`` maps dataset names to ready :class:`~datasets.sequences.SequenceData` (in-memory data);
    other names are loaded through :func:`datasets.load_dataset`. ``plan`` is what :func:`plan_grid` returned for
    these jobs and options, when the caller has planned them already (to show the plan first). ``twins``: the study
    jobs that take another folder's rows of the same computation instead of training
    (:func:`benchmarks.reuse.reusable_twins`).
    ``estimates``: the plan's training time of each job (:func:`benchmarks.commands.cli.training_left`), for the
    time left it states. With ``options.resume`` jobs whose key already has every result row are skipped and
    interrupted training continues from its checkpoint; without it a job runs afresh, and its new rows replace the
    old rows of the same key once it has finished. Raises :class:`~benchmarks.jobs.GridError` before any training
    when the grid cannot run (without ``resume`` also where a job's checkpoint holds an interrupted run's training),
    and :class:`~benchmarks.jobs.GridInterrupted` on Ctrl-C.
    """
    planned, datasets = plan or plan_grid(jobs, options, preloaded=preloaded, log=log)
    store = ResultStore(Path(options.output).resolve(), threads=options.cpu_threads_per_job())
    result = GridResult(planned)
    pending = _pending(planned, store, options.resume, result, log)
    reused = _same_threads({job.key: twins[job.key] for job in pending if twins and job.key in twins}, store, log)
    pending = [job for job in pending if job.key not in reused]
    invocation = _invocation(options)
    store.start_invocation(invocation, planned, {job.key for job in pending}, reused=set(reused))
    for number, job in enumerate(planned, start=1):
        if job.key in reused:
            log(f"[{number}/{len(planned)}] {job.run_id}: reused from {reused[job.key].where}, the same job there")
            _record(reused_outcome(job, reused[job.key]), store, result)
    cache = resolve_cache_dir(options.cache_dir)
    if pending:
        prepare_negatives(pending, datasets, cache, log)
    sources = {job.job.model: job.model_source for job in planned if job.model_source}
    executor = Executor(options, log, sources=sources)
    clock = GridProgress(planned, pending, executor.parallelism, log, estimates, datasets)
    tracker = Tracker(options.track, store.folder) if options.track else None  # --track: benchmarks.tracking
    payloads = [JobPayload(planned=job, device=options.device, threads=executor.threads_per_job,
                           negatives_dir=str(cache / "negatives"), checkpoint=str(store.checkpoint(job.file_stem)),
                           resume=options.resume, keep_weights=options.keep_checkpoints,
                           progress=executor.worker_progress, epoch_lines=executor.worker_epoch_lines,
                           commit=invocation["commit"], compile=options.compile,
                           on_validation=tracker.start(job) if tracker else None)
                for job in pending]
    try:
        for outcome in executor.run(payloads, datasets, clock.started):
            _record(outcome, store, result)
            if tracker:
                tracker.finish(outcome)
            clock.done(outcome)
    except KeyboardInterrupt:
        result.interrupted = True
        raise GridInterrupted() from None
    finally:
        executor.close()
        store.end_invocation(result)
    return result


def _same_threads(twins: dict, store: ResultStore, log) -> dict:
    """The ``twins`` whose rows were trained on the store's CPU thread count (or on a GPU): rows of another count are
    another computation, which the job trains here instead, saying so."""
    kept = {}
    for key, twin in twins.items():
        recorded = {row_threads(row) for row in twin.rows} - {None, store.threads}
        if store.threads is None or not recorded:
            kept[key] = twin
            continue
        log(f"{twin.rows[0]['run_id']}: not reused from {twin.where}: its rows were trained on {min(recorded)} CPU "
            f"thread(s), this run uses {store.threads}, and the same seed gives other metrics on another count; it "
            f"trains here (--threads {min(recorded)} reuses them)")
    return kept


def _pending(planned: list[PlannedJob], store: ResultStore, resume: bool, result: GridResult, log) -> list:
    """The jobs to run: all of them, or with ``resume`` those without every result row (of the store's CPU thread
    count). Says plainly when rows written under an older key version or another thread count will not be reused;
    without ``resume``, refuses to discard the checkpoint of an interrupted run (:func:`_refuse_to_discard`)."""
    pending = []
    rows = store.rows if resume else []  # read once: a grid's file holds thousands of rows
    finished = store.finished(planned, rows)
    other_threads = store.other_threads(planned, rows)
    for number, job in enumerate(planned, start=1):
        if job.key in finished:
            log(f"[{number}/{len(planned)}] {job.run_id}: already in results.jsonl (key {job.key[:12]}), skipped")
            result.skipped.append(job)
        else:
            if job.key in other_threads:
                log(thread_count_line(f"[{number}/{len(planned)}] {job.run_id}", other_threads[job.key],
                                      store.threads))
            pending.append(job)
    if not resume:
        _refuse_to_discard(pending, store)
    elif store.threads is not None:
        _refuse_other_threads(pending, store)
    if resume and pending:
        names = {job.run_id for job in pending}
        older = {row["run_id"] for row in rows
                 if row.get("key_version", 1) < KEY_VERSION and row.get("run_id") in names}
        if older:
            log(f"note: {len(older)} job(s) have results in {store.path} from an older version of the suite "
                f"(job key version < {KEY_VERSION}: the trainer's settings were reorganised), e.g. "
                f"{sorted(older)[0]}; their keys no longer match, so they run again (the old rows are kept)")
    return pending


def interrupted(planned: list[PlannedJob], store: ResultStore) -> dict[str, TrainState]:
    """{key: where its training stands} of the planned jobs that an earlier run left in a checkpoint."""
    states = {job.key: saved_progress(store.checkpoint(job.file_stem)) for job in planned if job.trains}
    return {key: state for key, state in states.items() if state is not None}


def progress_text(job: PlannedJob, state: TrainState) -> str:
    """Where an interrupted job's training stands, in the words of a plan: ``epoch 36 of at most 200, best
    validation NDCG@10 0.1134 at epoch 34 (1 validation without a better one, patience 10), 43.9 min trained``."""
    train = job.config.train
    text = f"epoch {state.epoch} of at most {train.max_epochs}"
    if state.best_epoch:
        since = f"{state.bad_validations} validation{'s' if state.bad_validations != 1 else ''} without a better one"
        patience = f", patience {train.patience}" if train.patience is not None else ""
        text += (f", best validation {train.valid_metric} {state.best_metric:.4f} at epoch {state.best_epoch} "
                 f"({since}{patience})")
    return f"{text}, {duration(state.train_seconds)} trained"


def _refuse_to_discard(pending: list[PlannedJob], store: ResultStore) -> None:
    """Without --resume a job trains afresh and deletes its checkpoint: refused, before anything runs, where that
    checkpoint holds an interrupted run's training (hours of it, under the converge profile)."""
    states = interrupted(pending, store)
    _refuse(pending, states, lambda jobs: (
        f"{store.folder / 'checkpoints'} holds the training of {len(jobs)} interrupted job(s) that a run without "
        f"--resume would discard; rerun with --resume (resume=True from Python) to continue them, or delete their "
        f"checkpoint files to train them afresh:"),
        lambda job: f"{job.run_id}: {progress_text(job, states[job.key])} ({job.file_stem}.pt)")


def _refuse_other_threads(pending: list[PlannedJob], store: ResultStore) -> None:
    """A resume on another CPU thread count than an interrupted job's checkpoint was trained with would go on with
    other arithmetic under the same key: refused before anything runs, naming the count that continues it."""
    states = {key: state for key, state in interrupted(pending, store).items()
              if state.threads not in (None, store.threads)}
    _refuse(pending, states, lambda jobs: (
        f"{len(jobs)} interrupted job(s) were trained on another CPU thread count than this run's {store.threads}, "
        f"with which a seed's figures differ: rerun with --threads {states[jobs[0].key].threads} to continue them, or "
        f"delete their checkpoint files to train them afresh:"),
        lambda job: f"{job.run_id}: {states[job.key].threads} thread(s) ({job.file_stem}.pt)")


def _refuse(pending: list[PlannedJob], states: dict, header, line) -> None:
    """Refuse the run, before anything runs, where ``states`` holds jobs of ``pending``: ``header(jobs)``, then
    ``line(job)`` for each."""
    jobs = [job for job in pending if job.key in states]
    if jobs:
        raise GridError("\n".join([header(jobs), *(line(job) for job in jobs)]))


def _invocation(options: RunOptions) -> dict:
    data_dir = resolve_data_dir(options.data_dir)
    return {"command": options.command if options.command is not None else sys.argv, "cwd": str(Path.cwd()),
            "commit": git_commit(), "profile": options.profile, "protocols": list(options.protocols),
            "config_files": [str(path) for path in options.config_files], "device": options.device,
            "resume": options.resume, "n_jobs": options.n_jobs, "dask_scheduler": options.dask_scheduler,
            "data_dir": str(data_dir) if data_dir else None, "split": dataclasses.asdict(options.split)}


def _record(outcome: JobOutcome, store: ResultStore, result: GridResult) -> None:
    """The driver's one write per job: a finished job's rows and files (its checkpoint is then deleted: its rows
    hold all of its results), or a failure."""
    if outcome.status == "finished":
        store.commit(outcome.key, outcome.rows, outcome.files)
        job = next(job for job in result.planned if job.key == outcome.key)
        store.checkpoint(job.file_stem).unlink(missing_ok=True)
        result.finished.append(outcome)
    else:
        store.record_failure(outcome)
        result.failed.append(outcome)
