"""Runs a grid of jobs: check everything first, train and test each job once, keep every result.

:func:`run_jobs` is the driver used by ``run_all.py`` and ``benchmarks.studies`` (and the experiments):

1. **Plan** (:func:`plan_grid`): every job's settings are resolved and validated and every dataset is located
   (downloaded where allowed) and prepared *before the first training step*; all problems are reported together.
   Each job gets its key (:mod:`benchmarks.jobs`).
2. **Execute** (:mod:`benchmarks.execution`): the jobs not already finished run in this process, in joblib
   worker processes (``n_jobs``) or on a Dask cluster. A worker runs :func:`run_job` and returns its result rows
   and per-user arrays; it writes nothing but its own checkpoint.
3. **Record** (:class:`benchmarks.store.ResultStore`): the driver alone writes, one job at a time and
   atomically: a finished job's rows replace only rows of the same key; a failed job is recorded with its error
   and the grid goes on; every invocation is appended to ``manifest.jsonl``.

A job's ``task`` is ``next-item`` (rank the test target among each protocol's candidates) or ``relevance``
(judge each user's test pair, ``benchmarks.relevance``): a model trained for relevance is selected on the
validation pairs and gives its own probabilities; any other model trains and is selected as for ranking, then
its scores are calibrated on the validation pairs.
"""
from __future__ import annotations

import dataclasses
import io
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from recbench.benchmarks.config import ConfigError, check_overrides, resolve
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.jobs import TIE_POLICY, Job, PlannedJob
from recbench.benchmarks.negatives import PAIRS, SAMPLED_PROTOCOLS, load_or_sample
from recbench.benchmarks.provenance import PeakMemory, describe_device, git_commit, library_versions
from recbench.benchmarks.relevance import SELECTION_METRICS, TASK as RELEVANCE, RelevanceEvaluator, calibrate
from recbench.benchmarks.store import ResultStore
from recbench.benchmarks.trainer import fit_model, resolve_device
from recbench.datasets import (DatasetFormatError, MissingDataError, dataset_on_disk, load_dataset, resolve_cache_dir,
                      resolve_data_dir)
from recbench.datasets.sequences import LeaveOneOutSplit, SequenceData
from recbench.models import model_class
from recbench.models.relevance import RelevanceModel

SCHEMA_VERSION = 1


class GridError(ValueError):
    """The grid cannot start: each line of the message is one problem (a bad setting, a missing dataset)."""


class GridInterrupted(KeyboardInterrupt):
    """Ctrl-C during a grid; finished jobs are recorded and checkpoints kept."""


# -------------------------------------------------------------------------------------------------- planning

def plan_grid(jobs: list[Job], *, protocols, profile: str, data_dir=None, cache_dir=None, progress: bool = True,
              preloaded: dict | None = None, log=print) -> tuple[list[PlannedJob], dict[str, SequenceData]]:
    """Resolve and validate every job and load every dataset before anything trains.

    Raises :class:`GridError` listing every problem found: settings (type and range, in one message shape per
    model, e.g. ``sasrec: heads=3 must divide hidden=64``) and datasets (every missing file of every dataset).
    """
    problems: list[str] = []
    notes = []
    for overrides in dict.fromkeys(job.overrides for job in jobs):
        try:
            notes += check_overrides(overrides, sorted({job.model for job in jobs if job.overrides == overrides}))
        except ConfigError as error:
            problems.append(str(error))
    if problems:  # the command itself is wrong; every job would repeat it
        raise GridError("\n".join(dict.fromkeys(problems)))
    for note in dict.fromkeys(notes):
        log(f"note: {note}")
    configs, per_model = {}, {}  # per_model: a problem's text -> the models it concerns
    for job in jobs:
        try:
            model_class(job.model)
            configs[job] = resolve(job.model, job.dataset, profile, job.overrides)
        except ConfigError as error:
            model, _, text = str(error).partition(": ")
            per_model.setdefault(text, []).append(model)
        except ValueError as error:  # an unknown model or dataset name
            problems.append(str(error))
    for model, text in _construction_problems(configs):
        per_model.setdefault(text, []).append(model)
    problems += [f"{', '.join(dict.fromkeys(models))}: {text}" for text, models in per_model.items()]
    if problems:
        raise GridError("\n".join(dict.fromkeys(problems)))
    datasets = dict(preloaded or {})
    wanted = [name for name in dict.fromkeys(job.dataset for job in jobs) if name not in datasets]
    # Datasets that need a download go first, so that a missing one is reported before any long parse.
    wanted.sort(key=lambda name: dataset_on_disk(name, data_dir, cache_dir))
    for name in wanted:
        try:
            if problems and dataset_on_disk(name, data_dir, cache_dir):
                continue  # the grid cannot run anyway; report the missing data without preparing the rest
            datasets[name] = load_dataset(name, data_dir=data_dir, cache_dir=cache_dir, progress=progress)
        except (MissingDataError, DatasetFormatError, OSError, ValueError) as error:
            problems.append(str(error) if str(error).startswith("dataset") else f"dataset {name!r}: {error}")
    if problems:
        raise GridError("\n".join(problems))
    planned = {}
    for job in jobs:
        plan = PlannedJob(job, profile, job.protocols(protocols), configs[job], datasets[job.dataset].content_sha256())
        if plan.key in planned:
            log(f"note: {job.run_id} repeats {planned[plan.key].run_id} (same key {plan.key[:12]}); it runs once")
        planned.setdefault(plan.key, plan)
    return list(planned.values()), datasets


def _construction_problems(configs: dict) -> list[tuple[str, str]]:
    """(model, problem) for each distinct (model, settings) that cannot be built on a toy size, so that a
    setting only a model's constructor rejects fails now rather than hours into the grid."""
    problems, seen = [], set()
    for job, config in configs.items():
        signature = (job.model, repr(config.model))
        if signature in seen:
            continue
        seen.add(signature)
        try:
            model_class(job.model)(4, 8, config.model)
        except (ValueError, TypeError, RuntimeError) as error:
            problems.append((job.model, str(error)))
    return problems


def prepare_negatives(planned: list[PlannedJob], datasets: dict[str, SequenceData], cache: Path,
                      log=print) -> None:
    """Draw every sampled candidate list the grid will read (test protocols, validation protocols, relevance
    pairs) once, in the driver, so that parallel workers only read them."""
    needed = {}
    for job in planned:
        seed, name = job.job.seed, job.job.dataset
        for protocol in job.protocols:
            if protocol in SAMPLED_PROTOCOLS or protocol == PAIRS:
                needed[(name, "test", protocol, seed)] = None
        valid = job.config.train.valid_protocol
        if valid in SAMPLED_PROTOCOLS:
            needed[(name, "valid", valid, seed)] = None
        if job.job.task == RELEVANCE:
            needed[(name, "valid", PAIRS, seed)] = None
    for number, (name, split, protocol, seed) in enumerate(needed, start=1):
        started = time.perf_counter()
        load_or_sample(datasets[name], split, protocol, seed, cache / "negatives")
        if time.perf_counter() - started > 2:
            log(f"  negatives {number}/{len(needed)}: {name} {split} {protocol} seed {seed} "
                f"({time.perf_counter() - started:.0f}s)")


# ----------------------------------------------------------------------------------------------- one job

@dataclass
class JobPayload:
    """Everything a worker needs to run one job, apart from the dataset (passed beside it, so that joblib and
    Dask send each dataset once)."""

    planned: PlannedJob
    device: str  # "auto", "cpu", "cuda", "cuda:N"
    threads: int | None  # torch CPU threads for this job (None: leave as is)
    negatives_dir: str
    checkpoint: str  # absolute path of the resumable training state
    resume: bool  # continue from the checkpoint when it exists (else start afresh)
    keep_weights: bool  # return the selected weights with the results
    progress: bool
    commit: str
    device_pool: object = None  # a queue of CUDA devices shared by local workers, or None
    driver_pid: int = field(default_factory=os.getpid)  # the process that planned the job


@dataclass
class JobOutcome:
    """What a worker hands back: the rows and per-user arrays of a finished job, or the error of a failed one."""

    key: str
    run_id: str
    status: str  # "finished" or "failed"
    rows: list[dict] = field(default_factory=list)
    files: dict = field(default_factory=dict)  # relative path -> {name: array} (.npz) or bytes
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    seconds: float = 0.0
    trained: bool = False  # whether the job did real work (training), for the time-left estimate


def run_job(payload: JobPayload, data: SequenceData, log=None) -> JobOutcome:
    """Train, select on validation and test one job. Never raises for a failing job (out of memory, NaN loss,
    bad data): the error comes back as a failed outcome, so the grid goes on. Ctrl-C still interrupts."""
    started = time.perf_counter()
    job = payload.planned
    device = None
    if os.getppid() == payload.driver_pid:
        _exit_with_driver(payload.driver_pid)
    try:
        if payload.threads:
            torch.set_num_threads(payload.threads)
        device = payload.device_pool.get() if payload.device_pool is not None else payload.device
        rows, files, trained = _train_and_test(payload, data, resolve_device(device), log or (lambda *_: None))
        return JobOutcome(job.key, job.run_id, "finished", rows, files, seconds=time.perf_counter() - started,
                          trained=trained)
    except Exception as error:  # noqa: BLE001  (every failure of one job is recorded; the grid goes on)
        return JobOutcome(job.key, job.run_id, "failed", error=_one_line(error), error_type=type(error).__name__,
                          traceback=traceback.format_exc(), seconds=time.perf_counter() - started)
    finally:
        if payload.device_pool is not None and device is not None:
            payload.device_pool.put(device)


_watching_driver = False


def _exit_with_driver(driver_pid: int) -> None:
    """In a local worker process: end this process as soon as the driver that started it is gone (killed), so
    that an orphaned worker never goes on writing a checkpoint that a resumed run is using."""
    global _watching_driver
    if _watching_driver:
        return
    _watching_driver = True

    def watch() -> None:
        while os.getppid() == driver_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-driver", daemon=True).start()


def _one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text if isinstance(error, (ValueError, FloatingPointError, OSError)) else f"{type(error).__name__}: {text}"


def validation_users(settings, n_users: int, seed: int) -> np.ndarray | None:
    """The fixed random subset of user rows validated on when ``settings.valid_users`` asks for one, else None
    (every user)."""
    if settings.valid_users and settings.valid_users < n_users:
        return np.sort(np.random.default_rng(seed).choice(n_users, settings.valid_users, replace=False))
    return None


def _train_and_test(payload: JobPayload, data: SequenceData, device: torch.device, log) -> tuple[list, dict, bool]:
    planned, job = payload.planned, payload.planned.job
    torch.manual_seed(job.seed)
    np.random.seed(job.seed)
    # Seeds alone do not repeat a CPU run on 2+ threads: a SASRec smoke run ended at full NDCG@10 0.3272, 0.3213,
    # 0.3221 and 0.3260 in four runs; with deterministic kernels, 0.3245 each time at the same speed. CUDA runs
    # (bf16, fused kernels) are not bit-repeatable anyway, and this mode would slow them.
    torch.use_deterministic_algorithms(device.type == "cpu", warn_only=True)
    checkpoint = Path(payload.checkpoint)
    if not payload.resume:
        checkpoint.unlink(missing_ok=True)
    elif checkpoint.exists():
        log(f"    resuming from {checkpoint.name}")
    settings = dataclasses.replace(planned.config.train, seed=job.seed, checkpoint=str(checkpoint),
                                   progress=payload.progress)
    split = LeaveOneOutSplit(data)
    evaluator = Evaluator(split, seed=job.seed, cache_dir=Path(payload.negatives_dir), progress=payload.progress)
    pairs = RelevanceEvaluator(split, seed=job.seed, cache_dir=Path(payload.negatives_dir))
    memory = PeakMemory(device)
    memory.reset()
    model = model_class(job.model)(data.n_users, data.n_items, planned.config.model)
    if isinstance(model, torch.nn.Module):
        model.to(device)
    valid_users = validation_users(settings, data.n_users, job.seed)

    if isinstance(model, RelevanceModel):  # trained for relevance: selected on the validation pairs
        if settings.valid_metric not in SELECTION_METRICS:
            raise ValueError(f"{job.model}: valid_metric {settings.valid_metric!r} cannot select a relevance model; "
                             f"use one of {SELECTION_METRICS} (higher is better)")
        selection = f"{settings.valid_metric} on {PAIRS}"

        def validate(current) -> dict:
            return pairs.evaluate(current, "valid", job.model, valid_users).metrics
    else:
        selection = f"{settings.valid_metric} under {settings.valid_protocol}"

        def validate(current) -> dict:
            return evaluator.evaluate(current, "valid", settings.valid_protocol, job.model, valid_users).metrics

    fit = fit_model(model, split.train(), validate, settings)
    info = {"sha256": planned.data_sha256, "stats": data.stats(), "provenance": data.provenance}
    versions = library_versions()
    files = {}

    def result_row(protocol, tie_policy, metrics, users_evaluated, per_user, eval_seconds, **extra) -> dict:
        """One line of results.jsonl (results/README.md) for one test evaluation of this run; logs its metrics."""
        log(f"    {protocol:>6}: " + "  ".join(f"{name} {value:.4f}" for name, value in metrics.items())
            + f"  (train {fit['train_seconds']:.1f}s, {fit['epochs_run']} epochs)")
        return {
            "schema": SCHEMA_VERSION, "key": planned.key, "run_id": job.run_id, "study": job.study,
            "variant": job.variant, "sweep": job.sweep, "profile": planned.profile, "dataset": job.dataset,
            "dataset_info": info, "model": job.model, "hyperparameters": dataclasses.asdict(planned.config.model),
            "train_settings": fit.get("settings"), "task": job.task, "protocol": protocol,
            "tie_policy": tie_policy, "split": "test", "seed": job.seed,
            "metrics": metrics, "users_evaluated": users_evaluated,
            "per_user_file": per_user, "epochs_run": fit["epochs_run"], "best_epoch": fit["best_epoch"],
            "best_valid": fit["best_valid"], "valid_metric": selection if fit.get("settings") else None,
            "stopped_by": fit.get("stopped_by"), "resumed_from_epoch": fit.get("resumed_from_epoch"),
            "curve": fit["curve"], "train_seconds": fit["train_seconds"], "eval_seconds": eval_seconds,
            "peak_memory_mb": memory.peak_mb(), "device": describe_device(device), "versions": versions,
            "commit": payload.commit, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), **extra,
        }

    rows = []
    if job.task == RELEVANCE:
        # A ranker's scores become probabilities by Platt scaling fitted on the validation pairs only.
        scorer = model if isinstance(model, RelevanceModel) else calibrate(model, pairs, job.model)
        evaluation = pairs.evaluate(scorer, "test", job.model)
        per_user = f"per_user/{planned.file_stem}__{PAIRS}.npz"
        files[per_user] = evaluation.arrays()
        calibration = ({"method": "platt", "fitted_on": "valid", **dataclasses.asdict(scorer.platt)}
                       if scorer is not model else None)
        # AUC counts a tie as ½, the expected value under random tie-breaking.
        rows.append(result_row(PAIRS, TIE_POLICY, evaluation.metrics, len(evaluation.users), per_user,
                               evaluation.seconds, calibration=calibration))
    else:
        for protocol in planned.protocols:
            evaluation = evaluator.evaluate(model, "test", protocol, job.model)
            per_user = f"per_user/{planned.file_stem}__{protocol}.npz"
            files[per_user] = dataclasses.asdict(evaluation.counts)
            rows.append(result_row(protocol, evaluation.tie_policy, evaluation.metrics,
                                   len(evaluation.counts.users), per_user, evaluation.seconds))
    if hasattr(model, "attention_maps"):
        attention = f"attention/{planned.file_stem}.npz"
        files[attention] = attention_arrays(model, evaluator)
        for row in rows:
            row["attention_file"] = attention
    if payload.keep_weights and isinstance(model, torch.nn.Module):
        buffer = io.BytesIO()
        torch.save({key: value.cpu() for key, value in model.state_dict().items()}, buffer)
        files[f"weights/{planned.file_stem}.pt"] = buffer.getvalue()
    return rows, files, fit["epochs_run"] > 0


def attention_arrays(model, evaluator: Evaluator, user: int = 0) -> dict[str, np.ndarray]:
    """Attention of every layer and head for one user's test input, for the report's heat maps."""
    view = evaluator.view("test")
    history = torch.from_numpy(view.padded(np.array([user]), model.history_length)).to(model.device)
    users = torch.tensor([view.users[user]], device=model.device)
    model.eval()
    with torch.inference_mode():
        weights = model.attention_maps(users, history)
    items = getattr(model, "attention_items", lambda h: h)(history)[0]
    return {"weights": weights.float().cpu().numpy(), "items": items.cpu().numpy(), "user": np.array(user)}


# ----------------------------------------------------------------------------------------------- the grid

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


def run_jobs(jobs: list[Job], *, protocols=("full", "pop100"), profile: str = "smoke", device: str = "auto",
             data_dir: str | None = None, cache_dir: str | None = None, output: Path,
             resume: bool = False, progress: bool = True, log=print, preloaded: dict | None = None,
             n_jobs: int = 1, threads: int | None = None, dask_scheduler: str | None = None,
             keep_checkpoints: bool = False, command: list[str] | None = None) -> GridResult:
    """Plan, run and record a grid of jobs (see the module docstring); returns what became of each job.

    ``preloaded`` maps dataset names to ready :class:`SequenceData` (in-memory data, tests); other names are
    loaded through :func:`datasets.load_dataset`. ``resume`` skips jobs whose key already has every result row
    and continues interrupted training from its checkpoint; without it a job runs afresh, and its new rows
    replace the old rows of the same key once it has finished. ``n_jobs`` runs that many jobs at once in
    worker processes, ``dask_scheduler`` sends them to a Dask cluster. Raises :class:`GridError` before any
    training when the grid cannot run, and :class:`GridInterrupted` on Ctrl-C.
    """
    from recbench.benchmarks.execution import Executor

    output = Path(output).resolve()
    cache = resolve_cache_dir(cache_dir)
    Executor.check(n_jobs, device, dask_scheduler, threads)
    planned, datasets = plan_grid(jobs, protocols=protocols, profile=profile, data_dir=data_dir,
                                  cache_dir=cache, progress=progress, preloaded=preloaded, log=log)
    result = GridResult(planned)
    store = ResultStore(output)
    pending = []
    for number, job in enumerate(planned, start=1):
        if resume and store.done(job.key, job.protocols):
            log(f"[{number}/{len(planned)}] {job.run_id}: already in results.jsonl (key {job.key[:12]}), skipped")
            result.skipped.append(job)
        else:
            pending.append(job)
    invocation = {
        "command": command if command is not None else sys.argv, "cwd": str(Path.cwd()), "commit": git_commit(),
        "profile": profile, "protocols": list(protocols), "device": device, "resume": resume, "n_jobs": n_jobs,
        "dask_scheduler": dask_scheduler,
        "data_dir": str(resolve_data_dir(data_dir)) if resolve_data_dir(data_dir) else None,
    }
    store.start_invocation(invocation, planned, {job.key for job in pending})
    if pending:
        prepare_negatives(pending, datasets, cache, log)
    executor = Executor(n_jobs=n_jobs, threads=threads, device=device, dask_scheduler=dask_scheduler,
                        progress=progress, log=log)
    clock = Progress(planned, pending, executor.parallelism, log)
    payloads = [JobPayload(job, executor.device_for_payload, executor.threads_per_job, str(cache / "negatives"),
                           str(output / "checkpoints" / f"{job.file_stem}.pt"), resume,
                           keep_checkpoints, executor.worker_progress, invocation["commit"])
                for job in pending]
    checkpoints = {payload.planned.key: Path(payload.checkpoint) for payload in payloads}
    try:
        for outcome in executor.run(payloads, datasets, clock.started):
            if outcome.status == "finished":
                store.commit(outcome.key, outcome.rows, outcome.files)
                checkpoints[outcome.key].unlink(missing_ok=True)  # its rows hold all the job's results now
                result.finished.append(outcome)
            else:
                store.record_failure(outcome)
                result.failed.append(outcome)
            clock.done(outcome)
    except KeyboardInterrupt:
        result.interrupted = True
        raise GridInterrupted() from None
    finally:
        executor.close()
        store.end_invocation(result)
    return result


class Progress:
    """One line per started and finished job, with the time left estimated from the jobs that trained (jobs
    without training, like POP, take seconds and would make the estimate far too short)."""

    def __init__(self, planned: list[PlannedJob], pending: list[PlannedJob], parallelism: int, log):
        self.pending = {job.key: job for job in pending}
        self.number = {job.key: number for number, job in enumerate(planned, start=1)}
        self.total = len(planned)
        self.parallelism = max(1, parallelism)
        self.log = log
        self.seconds: dict[str, list[float]] = {}  # model -> seconds of its finished jobs that trained

    def started(self, job: PlannedJob) -> None:
        self.log(f"[{self.number[job.key]}/{self.total}] {job.run_id} (key {job.key[:12]}){self._left()}")

    def done(self, outcome: JobOutcome) -> None:
        job = self.pending.pop(outcome.key)
        if outcome.trained:
            self.seconds.setdefault(job.job.model, []).append(outcome.seconds)
        if outcome.status == "failed":
            self.log(f"  FAILED {job.run_id} (key {job.key[:12]}): {outcome.error}")
        elif self.parallelism > 1:
            metrics = "; ".join(f"{row['protocol']} NDCG@10 {row['metrics']['NDCG@10']:.4f}"
                                for row in outcome.rows if "NDCG@10" in row["metrics"])
            self.log(f"  done [{self.number[job.key]}/{self.total}] {job.run_id} in {outcome.seconds:.0f}s"
                     f"{': ' + metrics if metrics else ''}{self._left()}")

    def _left(self) -> str:
        if not self.seconds or not self.pending:
            return ""
        overall = float(np.mean([s for values in self.seconds.values() for s in values]))
        left = sum(np.mean(self.seconds[job.job.model]) if job.job.model in self.seconds else overall
                   for job in self.pending.values()) / self.parallelism
        return f", about {left / 60:.1f} min left" if left >= 60 else f", about {left:.0f} s left"


# ---------------------------------------------------------------------------------------------- the table

def print_tables(rows: list[dict], log=print) -> str:
    """Paper-style tables (metrics × models), one per dataset and protocol; returns the Markdown. Smoke-profile
    results say that they only check the installation."""
    from tabulate import tabulate

    blocks = []
    if any(row.get("profile") == "smoke" for row in rows):
        blocks.append("> **Smoke profile: installation check, not the paper's settings.** These models were "
                      "trained for seconds on small budgets; their numbers say that everything runs, not how the "
                      "models compare. Use `--profile paper` for results to report.")
    for dataset in dict.fromkeys(row["dataset"] for row in rows):
        for protocol in dict.fromkeys(row["protocol"] for row in rows if row["dataset"] == dataset):
            chosen = [r for r in rows if r["dataset"] == dataset and r["protocol"] == protocol and r["study"] == "main"]
            models = list(dict.fromkeys(r["model"] for r in chosen))
            if not models:
                continue
            metrics = list(chosen[0]["metrics"])
            table = []
            for metric in metrics:
                cells = [metric]
                for name in models:
                    values = [r["metrics"][metric] for r in chosen if r["model"] == name]
                    cells.append(f"{np.mean(values):.4f}" + (f" ± {np.std(values):.4f}" if len(values) > 1 else ""))
                table.append(cells)
            seeds = len({r["seed"] for r in chosen})
            title = f"### {dataset} — protocol `{protocol}` ({seeds} seed{'s' if seeds > 1 else ''}, test split)"
            blocks.append(title + "\n\n" + tabulate(table, headers=["metric", *models], tablefmt="github",
                                                   disable_numparse=True, colalign=("left",) + ("right",) * len(models)))
    text = "\n\n".join(blocks) + "\n"
    log("\n" + text)
    return text
