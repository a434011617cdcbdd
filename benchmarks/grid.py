"""Runs a grid of jobs: check everything first, train and test each job once, keep every result.

:func:`run_jobs` is the driver used by ``run_all.py``, the studies, the experiments and the Python API:

1. **Plan** (:mod:`benchmarks.planner`): every job's settings are resolved and checked and every dataset is
   located (downloaded where allowed) and prepared *before the first training step*; all problems are reported
   together. Each job gets its key (:mod:`benchmarks.jobs`).
2. **Execute** (:mod:`benchmarks.execution`): the jobs not already finished run in this process, in joblib
   worker processes or on a Dask cluster; a study job that another folder already holds as a main-grid job
   (:class:`Twin`) takes that job's rows instead. A worker runs :func:`benchmarks.worker.run_job`
   and returns its result rows and per-user arrays; it writes nothing but its own checkpoint and the claim beside
   it.
3. **Record** (:class:`benchmarks.store.ResultStore`): the driver alone writes, one job at a time and
   atomically: a finished job's rows replace only rows of the same key; a failed job is recorded with its error
   and the grid goes on; every invocation is appended to ``manifest.jsonl``.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recbench.benchmarks.checkpoint import TrainState, saved_progress
from recbench.benchmarks.estimate import at_once, duration
from recbench.benchmarks.execution import Executor
from recbench.benchmarks.jobs import KEY_VERSION, GridError, GridInterrupted, Job, PlannedJob
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.planner import plan_grid, prepare_negatives
from recbench.benchmarks.provenance import git_commit
from recbench.benchmarks.store import ResultStore
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


@dataclass(frozen=True)
class Twin:
    """A study job's computation already done in another folder: by the same study job (another machine, a GPU) or
    by a main-grid job with the same model, dataset, settings, seed, protocols and profile, only the study's labels
    differing (the ablation's default row is the main grid's job)."""

    folder: Path
    key: str
    rows: tuple

    @property
    def where(self) -> str:
        """The folder and key the twin's rows were computed under, as plans and logs name them."""
        return f"{self.folder} (key {self.key[:12]})"


def main_grid_key(job: PlannedJob) -> str:
    """The key ``job`` would have as a main-grid job (``run_all.py``): its identity without the study's labels."""
    return dataclasses.replace(job, job=dataclasses.replace(job.job, study="main", variant=None, sweep=None)).key


def reusable_twins(planned: list[PlannedJob], folders) -> dict[str, Twin]:
    """{key: twin} of the planned study jobs whose every result row a folder of ``folders`` already holds, under the
    job's own key (the same study job run elsewhere: another machine, a GPU) or under its main-grid key
    (:func:`main_grid_key`); the first folder that holds one counts."""
    twins = {}
    held = [(store.folder, store.rows) for store in (ResultStore(Path(folder).resolve()) for folder in folders)]
    for job in planned:
        if job.job.study == "main":
            continue
        candidates = ((folder, key, [row for row in folder_rows if row.get("key") == key])
                      for folder, folder_rows in held for key in (job.key, main_grid_key(job)))
        twin = next((Twin(folder, key, tuple(rows)) for folder, key, rows in candidates
                     if set(job.protocols) <= {row["protocol"] for row in rows}), None)
        if twin is not None:
            twins[job.key] = twin
    return twins


def _reused(job: PlannedJob, twin: Twin) -> JobOutcome:
    """``twin``'s rows and per-user files as ``job``'s own: relabelled with the job's key, labels and file names,
    and ``reused_from`` naming the folder and key they were computed under."""
    rows, files = [], {}
    for row in twin.rows:
        # the files a row names, under the names the worker gives a job's files
        names = {"per_user_file": f"per_user/{job.file_stem}__{row['protocol']}.npz",
                 "attention_file": f"attention/{job.file_stem}.npz"}
        renamed = {column: names[column] for column in names if row.get(column)}
        for column, name in renamed.items():
            files[name] = (twin.folder / row[column]).read_bytes()
        rows.append({**row, **renamed, "key": job.key, "run_id": job.run_id, "study": job.job.study,
                     "variant": job.job.variant, "sweep": job.job.sweep,
                     "reused_from": {"folder": str(twin.folder), "key": twin.key, "run_id": row.get("run_id")}})
    return JobOutcome(job.key, job.run_id, "finished", rows, files)


def run_jobs(jobs: list[Job], options: RunOptions, *, preloaded: dict | None = None, plan: tuple | None = None,
             log=print, twins: dict | None = None, estimates: dict | None = None) -> GridResult:
    """Plan, run and record a grid of jobs (see the module docstring); returns what became of each job.

    ``preloaded`` maps dataset names to ready :class:`~datasets.sequences.SequenceData` (in-memory data);
    other names are loaded through :func:`datasets.load_dataset`. ``plan`` is what :func:`plan_grid` returned for
    these jobs and options, when the caller has planned them already (to show the plan first). ``twins``: the study
    jobs that take another folder's rows of the same computation instead of training (:func:`reusable_twins`).
    ``estimates``: the plan's training time of each job (:func:`benchmarks.commands.cli.training_left`), for the
    time left it states. With ``options.resume`` jobs whose key already has every result row are skipped and
    interrupted training continues from its checkpoint; without it a job runs afresh, and its new rows replace the
    old rows of the same key once it has finished. Raises :class:`~benchmarks.jobs.GridError` before any training
    when the grid cannot run (without ``resume`` also where a job's checkpoint holds an interrupted run's training),
    and :class:`~benchmarks.jobs.GridInterrupted` on Ctrl-C.
    """
    planned, datasets = plan or plan_grid(jobs, options, preloaded=preloaded, log=log)
    store = ResultStore(Path(options.output).resolve())
    result = GridResult(planned)
    pending = _pending(planned, store, options.resume, result, log)
    reused = {job.key: twins[job.key] for job in pending if twins and job.key in twins}
    pending = [job for job in pending if job.key not in reused]
    invocation = _invocation(options)
    store.start_invocation(invocation, planned, {job.key for job in pending}, reused=set(reused))
    for number, job in enumerate(planned, start=1):
        if job.key in reused:
            log(f"[{number}/{len(planned)}] {job.run_id}: reused from {reused[job.key].where}, the same job there")
            _record(_reused(job, reused[job.key]), store, result)
    cache = resolve_cache_dir(options.cache_dir)
    if pending:
        prepare_negatives(pending, datasets, cache, log)
    sources = {job.job.model: job.model_source for job in planned if job.model_source}
    executor = Executor(options, log, sources=sources)
    clock = Progress(planned, pending, executor.parallelism, log, estimates)
    payloads = [JobPayload(planned=job, device=options.device, threads=executor.threads_per_job,
                           negatives_dir=str(cache / "negatives"), checkpoint=str(store.checkpoint(job.file_stem)),
                           resume=options.resume, keep_weights=options.keep_checkpoints,
                           progress=executor.worker_progress, epoch_lines=executor.worker_epoch_lines,
                           commit=invocation["commit"], compile=options.compile)
                for job in pending]
    try:
        for outcome in executor.run(payloads, datasets, clock.started):
            _record(outcome, store, result)
            clock.done(outcome)
    except KeyboardInterrupt:
        result.interrupted = True
        raise GridInterrupted() from None
    finally:
        executor.close()
        store.end_invocation(result)
    return result


def _pending(planned: list[PlannedJob], store: ResultStore, resume: bool, result: GridResult, log) -> list:
    """The jobs to run: all of them, or with ``resume`` those without every result row. Says plainly when rows
    written under an older key version will not be reused; without ``resume``, refuses to discard the
    checkpoint of an interrupted run (:func:`_refuse_to_discard`)."""
    pending = []
    rows = store.rows if resume else []  # read once: a grid's file holds thousands of rows
    finished = store.finished(planned, rows)
    for number, job in enumerate(planned, start=1):
        if job.key in finished:
            log(f"[{number}/{len(planned)}] {job.run_id}: already in results.jsonl (key {job.key[:12]}), skipped")
            result.skipped.append(job)
        else:
            pending.append(job)
    if not resume:
        _refuse_to_discard(pending, store)
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
    if states:
        jobs = [job for job in pending if job.key in states]
        raise GridError("\n".join(
            [f"{store.folder / 'checkpoints'} holds the training of {len(jobs)} interrupted job(s) that a run "
             f"without --resume would discard; rerun with --resume (resume=True from Python) to continue them, "
             f"or delete their checkpoint files to train them afresh:"]
            + [f"{job.run_id}: {progress_text(job, states[job.key])} ({job.file_stem}.pt)" for job in jobs]))


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


def _job_seconds(outcome: JobOutcome) -> float:
    """How long a finished job took: its training as its rows record it, summed over a resumed run's sessions (the
    process saw only the last: a job resumed at its end took seconds there), and its evaluations."""
    rows = outcome.rows
    return (rows[0].get("train_seconds") or 0.0) + sum(row.get("eval_seconds") or 0.0 for row in rows)


class Progress:
    """One line per started and finished job, with the time left: where the plan estimated a job's training
    (``estimates``, :mod:`benchmarks.estimate`: timed steps to where a converged run of its model stopped), that
    figure; else as long as the finished jobs of its model took on average. Jobs without training (POP) take
    seconds, and models differ a hundredfold under the converge profile (BPR-MF minutes, BERT4Rec hours), so a job
    of a model neither estimated nor timed gets no guess: the line counts it apart. The variants of a study differ
    threefold in a step's time (Table 5's L = 1 and h = 8), which a model's mean does not see and the plan does."""

    def __init__(self, planned: list[PlannedJob], pending: list[PlannedJob], parallelism: int, log,
                 estimates: dict | None = None):
        self.pending = {job.key: job for job in pending}
        self.number = {job.key: number for number, job in enumerate(planned, start=1)}
        self.total = len(planned)
        self.parallelism = max(1, parallelism)
        self.log = log
        # A bare upper bound (early stopping may end the job anywhere before its cap) is no time left: such a job
        # counts as untimed until a job of its model has finished.
        self.estimated = {key: estimate.likely or 0.0 for key, estimate in (estimates or {}).items()
                          if not estimate.bound_only}
        self.seconds: dict[str, list[float]] = {}  # model -> seconds of its finished jobs that trained
        self.began: dict[str, float] = {}  # key -> when a job was handed out (time.monotonic)

    def started(self, job: PlannedJob) -> None:
        self.began[job.key] = time.monotonic()
        self.log(f"[{self.number[job.key]}/{self.total}] {job.run_id} (key {job.key[:12]}){self._left()}")

    def done(self, outcome: JobOutcome) -> None:
        job = self.pending.pop(outcome.key)
        if outcome.trained:
            self.seconds.setdefault(job.job.model, []).append(_job_seconds(outcome))
        if outcome.status == "failed":
            self.log(f"  FAILED {job.run_id} (key {job.key[:12]}): {outcome.error}")
        elif self.parallelism > 1:
            metrics = "; ".join(f"{row['protocol']} NDCG@10 {row['metrics']['NDCG@10']:.4f}"
                                for row in outcome.rows if "NDCG@10" in row["metrics"])
            # a resumed job's earlier sessions count too (this one may have trained its last minutes only)
            took = duration(_job_seconds(outcome) if outcome.trained else outcome.seconds)
            self.log(f"  done [{self.number[job.key]}/{self.total}] {job.run_id} in {took}"
                     f"{': ' + metrics if metrics else ''}{self._left()}")

    def _left(self) -> str:
        now, left = time.monotonic(), []
        for job in self.pending.values():
            if job.key in self.estimated:
                expected = self.estimated[job.key]
            elif job.job.model in self.seconds:
                expected = float(np.mean(self.seconds[job.job.model]))
            else:
                continue
            # a running job has spent part of it (one that runs past it counts none)
            left.append(max(0.0, expected - (now - self.began.get(job.key, now))))
        untimed = len(self.pending) - len(left)
        if not left:
            return ""
        text = f"about {duration(at_once(left, self.parallelism))} left"
        if untimed:
            text += (f" for the {len(left)} job{'s' if len(left) > 1 else ''} of models timed so far, "
                     f"{untimed} more of models not yet timed")
        return ", " + text
