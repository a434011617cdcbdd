"""One job, start to end, wherever it runs (this process, a joblib worker process, a Dask worker): build the
model, train it with validation as the selection rule, test the selected checkpoint once under each protocol,
and hand back the result rows and the files behind them. A worker writes nothing but its own checkpoint and
the claim beside it (so that no second run trains the same job meanwhile); the driver (:mod:`benchmarks.grid`)
records what it returns.

A job's ``task`` is ``next-item`` (rank the test target among each protocol's candidates) or ``relevance``
(judge each user's test pair, ``benchmarks.relevance``): a model trained for relevance is selected on the
validation pairs and gives its own probabilities; any other model trains and is selected as for ranking, then
its scores are calibrated on the validation pairs (Platt scaling, fitted on validation only).

A tuning trial (``JobPayload.test`` false, :mod:`benchmarks.tuning`) stops after training: its one row holds the
validation metrics of its selected epoch, and the test split is never evaluated.

The job's split (``PlannedJob.data_split``) is the paper's leave-one-out or the temporal split; the models and this
module see the same interface either way, and every row names its scheme (``split_scheme``), a temporal row also
its cuts and what the split left out (``temporal_split``).
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import socket
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from recbench.benchmarks.attention import attention_arrays
from recbench.benchmarks.device import resolve_device
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.jobs import KEY_VERSION, TIE_POLICY, PlannedJob
from recbench.benchmarks.metrics import DEFAULT_METRICS, list_metric_names
from recbench.benchmarks.negatives import PAIRS
from recbench.benchmarks.planner import selection_metric
from recbench.benchmarks.provenance import PeakMemory, describe_device, library_versions
from recbench.benchmarks.relevance import TASK as RELEVANCE, RelevanceEvaluator, calibrate
from recbench.benchmarks.store import ClaimedElsewhere, claimed, now
from recbench.benchmarks.trainer import TrainRun, fit_model
from recbench.datasets.sequences import SequenceData
from recbench.datasets.splits import TEMPORAL
from recbench.models import model_class
from recbench.models.base import FitReport, InterfaceError, Recommender, wrong_return
from recbench.models.relevance import RelevanceModel

SCHEMA_VERSION = 1  # of a result row (results/README.md); rows only ever gain fields within a version


@dataclass(kw_only=True)
class JobPayload:
    """Everything a worker needs to run one job, apart from the dataset (passed beside it, so that joblib and
    Dask send each dataset once). Built by name only: its flags are easily swapped by position."""

    planned: PlannedJob
    device: str  # "auto", "cpu", "cuda", "cuda:N"
    threads: int | None  # torch CPU threads for this job (None: leave as is)
    negatives_dir: str
    checkpoint: str  # absolute path of the resumable training state
    resume: bool  # continue from the checkpoint when it exists (else start afresh)
    keep_weights: bool  # return the selected weights with the results
    progress: bool  # bars (in the driver's process), or lines where stderr is a log
    commit: str
    compile: bool = False  # torch.compile each training step
    on_validation: Callable | None = None  # called after each validation (TrainRun.on_validation); picklable
    test: bool = True  # False: a tuning trial, trained and validated only; its one row is the validation result
    device_pool: object = None  # a queue of CUDA devices shared by local workers, or None
    epoch_lines: bool = False  # a line an epoch, starting with the job's run id, and no bars (a worker beside others)
    driver_pid: int = field(default_factory=os.getpid)  # the process that planned the job
    driver_host: str = field(default_factory=socket.gethostname)


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


@dataclass
class TestResult:
    """One test evaluation of a job: its row's metrics and the per-user arrays behind them."""

    protocol: str
    tie_policy: str
    metrics: dict
    users_evaluated: int
    per_user_file: str
    arrays: dict
    seconds: float
    extra: dict = field(default_factory=dict)  # more fields of the row (the relevance task's calibration)


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
        with _claim(payload):
            rows, files, trained = train_and_test(payload, data, resolve_device(device), log or (lambda *_: None))
        return JobOutcome(job.key, job.run_id, "finished", rows, files, seconds=time.perf_counter() - started,
                          trained=trained)
    except Exception as error:  # noqa: BLE001  (every failure of one job is recorded; the grid goes on)
        return JobOutcome(job.key, job.run_id, "failed", error=_one_line(error), error_type=type(error).__name__,
                          traceback=traceback.format_exc(), seconds=time.perf_counter() - started)
    finally:
        if payload.device_pool is not None and device is not None:
            payload.device_pool.put(device)


@contextmanager
def _claim(payload: JobPayload):
    """The job's claim beside its checkpoint (``benchmarks.store.claimed``) while this process runs it. A second run
    of the job while the first is still going (a rerun beside it, or a ``--resume`` after killing a wrapper such as
    ``timeout`` whose Python process lives on) fails with one line, instead of training from the checkpoint file
    the first run keeps writing and then replacing the rows of one run with the other's."""
    worker = "" if os.getpid() == payload.driver_pid else f" (its worker process {os.getpid()})"
    holder = f"process {payload.driver_pid} on {payload.driver_host}{worker}, since {now()}"
    try:
        with claimed(Path(payload.checkpoint).with_suffix(".claim"), holder):
            yield
    except ClaimedElsewhere as error:
        raise ClaimedElsewhere(f"another run is training this job now: {error}; it records the result when it "
                               f"ends. If that run should not be going on, end that process, then rerun with "
                               f"--resume to continue from its checkpoint") from None


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


def validation_users(valid_users: int | None, n_users: int, seed: int) -> np.ndarray | None:
    """The fixed random subset of the ``n_users`` rows of the validation view validated on when ``valid_users``
    asks for one, else None (every row)."""
    if valid_users and valid_users < n_users:
        return np.sort(np.random.default_rng(seed).choice(n_users, valid_users, replace=False))
    return None


def _seed(seed: int, device: torch.device) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    # Seeds alone do not repeat a CPU run on 2+ threads: a SASRec smoke run ended at full NDCG@10 0.3272, 0.3213,
    # 0.3221 and 0.3260 in four runs; with deterministic kernels, 0.3245 each time at the same speed. CUDA runs
    # (bf16, fused kernels) are not bit-repeatable anyway, and this mode would slow them.
    torch.use_deterministic_algorithms(device.type == "cpu", warn_only=True)


def train_and_test(payload: JobPayload, data: SequenceData, device: torch.device, log,
                   model: Recommender | None = None) -> tuple[list, dict, bool]:
    """The job's result rows, the files behind them and whether it trained. ``model``: the job's model built by
    the caller (the interface check watches what the harness hands it), else built here."""
    planned, job = payload.planned, payload.planned.job
    _seed(job.seed, device)
    checkpoint = Path(payload.checkpoint)
    if not payload.resume:
        checkpoint.unlink(missing_ok=True)
    elif checkpoint.exists():
        log(f"    resuming from {checkpoint.name}")
    split = planned.data_split(data)
    evaluator = Evaluator(split, seed=job.seed, cache_dir=Path(payload.negatives_dir), progress=payload.progress)
    pairs = RelevanceEvaluator(split, seed=job.seed, cache_dir=Path(payload.negatives_dir))
    memory = PeakMemory(device)
    memory.reset()
    if model is None:
        model = _model_class(planned)(data.n_users, data.n_items, planned.config.model)
    if isinstance(model, torch.nn.Module):
        model.to(device)
    validate = _validator(model, planned, evaluator, pairs)
    run = TrainRun(seed=job.seed, checkpoint=checkpoint, progress=payload.progress or payload.epoch_lines,
                   bars=not payload.epoch_lines, label=job.run_id if payload.epoch_lines else None,
                   compile=payload.compile, on_validation=payload.on_validation)
    cpu_started = time.process_time()
    fit = fit_model(model, split.train(), validate, planned.config.train, run)
    facts = {**_job_fields(planned, data, split), **_fit_fields(planned, fit), "model_report": _training_report(model),
             # a resumed run's CPU time is the trainer's, summed over its sessions; this process saw the last one
             "train_cpu_seconds": time.process_time() - cpu_started if fit.cpu_seconds is None else fit.cpu_seconds,
             "peak_memory_mb": memory.peak_mb(),
             "device": describe_device(device), "versions": library_versions(), "commit": payload.commit}
    if not payload.test:  # a tuning trial: the test split is never evaluated
        return [_validation_row(planned, {**facts, **_split_fields(split, "valid")}, fit)], {}, fit.epochs_run > 0
    tests = _test(model, planned, evaluator, pairs)
    facts.update(_split_fields(split, "test"))
    rows = [_result_row(facts, test, log) for test in tests]
    files = {test.per_user_file: test.arrays for test in tests}
    files.update(_extra_files(model, payload, evaluator, rows))
    return rows, files, fit.epochs_run > 0


def _training_report(model: Recommender) -> dict:
    """``model.training_report()``, refused in one line unless a row can hold it (``results.jsonl`` is JSON)."""
    report, expected = model.training_report(), "a dict of JSON values (numbers, strings, lists, dicts)"
    if not isinstance(report, dict):
        raise wrong_return(model, "training_report()", report, expected)
    try:
        json.dumps(report)
    except (TypeError, ValueError) as error:
        raise InterfaceError(f"{model.name}.training_report() returned a dict that JSON cannot hold ({error}); "
                             f"return {expected}") from None
    return report


def _model_class(planned: PlannedJob):
    """The job's model class, from the source its key hashes (a model from outside the suite whose file changed
    after the grid was planned fails here rather than run other code under the planned key)."""
    source = planned.model_source
    return model_class(planned.job.model, source["sha256"] if source else None)


def _validator(model: Recommender, planned: PlannedJob, evaluator: Evaluator, pairs: RelevanceEvaluator):
    """The validation pass the trainer selects with: the relevance metrics of the validation pairs for a model
    trained for relevance, else the ranking metrics of the validation targets under ``valid_protocol`` (the
    selection metric among them, e.g. NDCG@20)."""
    job, settings = planned.job, planned.config.train
    users = validation_users(settings.valid_users, len(evaluator.view("valid")), job.seed)
    if isinstance(model, RelevanceModel):
        return lambda current: pairs.evaluate(current, "valid", job.model, users).metrics
    metrics = tuple(dict.fromkeys((*DEFAULT_METRICS, settings.valid_metric)))
    return lambda current: evaluator.evaluate(current, "valid", settings.valid_protocol, job.model, users,
                                              metrics=metrics).metrics


def _test(model: Recommender, planned: PlannedJob, evaluator: Evaluator, pairs: RelevanceEvaluator) -> list:
    """The selected model on the test split, once per protocol (the relevance task: its pairs); a full-ranking
    row also holds the beyond-accuracy metrics of the users' top-k lists."""
    job = planned.job
    if job.task != RELEVANCE:
        results = []
        for protocol in planned.protocols:
            metrics = (*DEFAULT_METRICS, *list_metric_names(DEFAULT_METRICS)) if protocol == "full" else None
            evaluation = evaluator.evaluate(model, "test", protocol, job.model, metrics=metrics)
            results.append(TestResult(protocol, evaluation.tie_policy, evaluation.metrics,
                                      len(evaluation.counts.users), f"per_user/{planned.file_stem}__{protocol}.npz",
                                      evaluation.counts.arrays(), evaluation.seconds))
        return results
    # A ranker's scores become probabilities by Platt scaling fitted on the validation pairs only.
    scorer = model if isinstance(model, RelevanceModel) else calibrate(model, pairs, job.model)
    evaluation = pairs.evaluate(scorer, "test", job.model)
    calibration = ({"method": "platt", "fitted_on": "valid", **dataclasses.asdict(scorer.platt)}
                   if scorer is not model else None)
    # AUC counts a tie as ½, the expected value under random tie-breaking.
    return [TestResult(PAIRS, TIE_POLICY, evaluation.metrics, len(evaluation.users),
                       f"per_user/{planned.file_stem}__{PAIRS}.npz", evaluation.arrays(), evaluation.seconds,
                       {"calibration": calibration})]


def _job_fields(planned: PlannedJob, data: SequenceData, split) -> dict:
    """The row's fields that say which job it is: labels, key, dataset, its split's scheme, model and every
    resolved setting."""
    job = planned.job
    return {"schema": SCHEMA_VERSION, "key": planned.key, "key_version": KEY_VERSION, "run_id": job.run_id,
            "study": job.study, "variant": job.variant, "sweep": job.sweep, "profile": planned.profile,
            "dataset": job.dataset,
            "dataset_info": {"sha256": planned.data_sha256, "stats": data.stats(), "provenance": data.provenance},
            "model": job.model, "model_source": planned.model_source,
            "hyperparameters": dataclasses.asdict(planned.config.model), "task": job.task,
            "split": "test", "split_scheme": split.scheme, "seed": job.seed, **_tuned_from(planned)}


def _split_fields(split, part: str) -> dict:
    """``temporal_split``: the temporal split's cuts and what ``part`` left out (absent under leave-one-out)."""
    return {"temporal_split": split.summary(part)} if split.scheme == TEMPORAL else {}


def _tuned_from(planned: PlannedJob) -> dict:
    """``tuned_from``: the tuning study whose chosen settings the job ran with (absent for untuned settings)."""
    return {"tuned_from": planned.config.tuned_from} if planned.config.tuned_from else {}


def _fit_fields(planned: PlannedJob, fit: FitReport) -> dict:
    """The row's fields that say how the model was trained and selected."""
    metric, selected_on = selection_metric(planned.job, planned.config)
    trained = fit.settings is not None
    return {"train_settings": fit.settings, "epochs_run": fit.epochs_run, "steps_run": fit.steps_run,
            "best_epoch": fit.best_epoch, "best_step": fit.best_step, "best_valid": fit.best_valid,
            "valid_metric": f"{metric} {'on' if selected_on == PAIRS else 'under'} {selected_on}" if trained else None,
            "stopped_by": fit.stopped_by, "resumed_from_epoch": fit.resumed_from_epoch, "curve": fit.curve,
            "train_seconds": fit.train_seconds, "train_paused_seconds": fit.paused_seconds,
            "train_samples_per_s": fit.samples_per_s, "precision": fit.precision}


def _result_row(facts: dict, test: TestResult, log) -> dict:
    """One line of results.jsonl (results/README.md) for one test evaluation of a job; logs its metrics."""
    log(f"    {test.protocol:>6}: " + "  ".join(f"{name} {value:.4f}" for name, value in test.metrics.items())
        + f"  (train {facts['train_seconds']:.1f}s, {facts['epochs_run']} epochs)")
    return {**facts, "protocol": test.protocol, "tie_policy": test.tie_policy, "metrics": test.metrics,
            "users_evaluated": test.users_evaluated, "per_user_file": test.per_user_file,
            "eval_seconds": test.seconds, **test.extra,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _validation_row(planned: PlannedJob, facts: dict, fit: FitReport) -> dict:
    """A tuning trial's one row: the validation metrics of its selected epoch, under its validation protocol."""
    best = next((entry for entry in fit.curve if entry["epoch"] == fit.best_epoch), {})
    metrics = {name[len("valid_"):]: value for name, value in best.items() if name.startswith("valid_")}
    _, protocol = selection_metric(planned.job, planned.config)
    return {**facts, "split": "valid", "protocol": protocol, "metrics": metrics,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _extra_files(model: Recommender, payload: JobPayload, evaluator: Evaluator, rows: list[dict]) -> dict:
    """Attention maps (for a model with attention) and, when asked for, the selected weights."""
    files, stem = {}, payload.planned.file_stem
    attention = attention_arrays(model, evaluator.view("test"))
    if attention is not None:
        files[f"attention/{stem}.npz"] = attention
        for row in rows:
            row["attention_file"] = f"attention/{stem}.npz"
    if payload.keep_weights and isinstance(model, torch.nn.Module):
        buffer = io.BytesIO()
        torch.save({key: value.cpu() for key, value in model.state_dict().items()}, buffer)
        files[f"weights/{stem}.pt"] = buffer.getvalue()
    return files
