"""Runs a list of (dataset, model, seed) jobs: train, select on validation, test once, write result rows.

A job's ``task`` is ``next-item`` (rank the test target among each protocol's candidates) or ``relevance``
(judge each user's test pair, ``benchmarks.relevance``): a model trained for relevance is selected on the
validation pairs and gives its own probabilities; any other model trains and is selected as for ranking, then
its scores are calibrated on the validation pairs.

Used by ``run_all.py`` for the main grid and by ``benchmarks.studies`` for ablations, sweeps and the Cloze
study (those only build different :class:`Job` lists). Each finished evaluation is appended to
``results.jsonl`` atomically, with everything ``protocol.md`` asks a result to record; a rerun with
``resume=True`` skips finished jobs and continues interrupted training from its checkpoint.
"""
from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from benchmarks.config import resolve
from benchmarks.evaluator import Evaluator
from benchmarks.jobs import Job
from benchmarks.negatives import PAIRS
from benchmarks.provenance import PeakMemory, describe_device, git_commit, library_versions
from benchmarks.store import ResultStore, write_json
from benchmarks.relevance import SELECTION_METRICS, TASK as RELEVANCE, RelevanceEvaluator, calibrate
from benchmarks.trainer import fit_model, resolve_device
from datasets import load_dataset, resolve_cache_dir, resolve_data_dir
from datasets.sequences import LeaveOneOutSplit
from models import model_class
from models.relevance import RelevanceModel

SCHEMA_VERSION = 1


def run_jobs(jobs: list[Job], *, protocols=("full", "pop100"), profile: str = "smoke", device: str = "auto",
             data_dir: str | None = None, cache_dir: str | None = None, output: Path,
             resume: bool = False, progress: bool = True, log=print,
             preloaded: dict | None = None) -> list[dict]:
    """Run every job and return the result rows written (also found in ``output/results.jsonl``).

    ``preloaded`` maps dataset names to ready :class:`SequenceData` (in-memory data, tests); other names are
    loaded through :func:`datasets.load_dataset`.
    """
    output = Path(output)
    torch_device = resolve_device(device)
    cache = resolve_cache_dir(cache_dir)
    store = ResultStore(output)
    resolved = {(job.dataset, job.model, job.run_id): resolve(job.model, job.dataset, profile, job.overrides)
                for job in jobs}  # fails early on a bad config, before any training
    write_json(output / "config.json", {
        "profile": profile, "protocols": list(protocols), "device": describe_device(torch_device),
        "data_dir": str(resolve_data_dir(data_dir)) if resolve_data_dir(data_dir) else None,
        "jobs": [{**dataclasses.asdict(job), "run_id": job.run_id,
                  **resolved[(job.dataset, job.model, job.run_id)].as_dict()} for job in jobs]})
    commit, versions = git_commit(), library_versions()
    written, started = [], time.perf_counter()
    datasets = {name: (data, LeaveOneOutSplit(data)) for name, data in (preloaded or {}).items()}
    finished_runs = 0
    for number, job in enumerate(jobs, start=1):
        if resume and store.done(job.run_id, job.protocols(protocols)):
            log(f"[{number}/{len(jobs)}] {job.run_id}: already in results.jsonl, skipped")
            continue
        left = sum(not (resume and store.done(j.run_id, j.protocols(protocols))) for j in jobs[number - 1:])
        elapsed = time.perf_counter() - started
        eta = f", about {elapsed / finished_runs * left / 60:.1f} min left" if finished_runs else ""
        log(f"[{number}/{len(jobs)}] {job.run_id}{eta}")
        if job.dataset not in datasets:
            data = load_dataset(job.dataset, data_dir=data_dir, cache_dir=cache, progress=progress)
            datasets[job.dataset] = (data, LeaveOneOutSplit(data))
        data, split = datasets[job.dataset]
        checkpoint = output / "checkpoints" / f"{job.file_stem}.pt"
        if not resume:
            store.drop(job.run_id)
            checkpoint.unlink(missing_ok=True)
        config = resolved[(job.dataset, job.model, job.run_id)]
        rows = run_one(job, data, split, config, protocols, torch_device, cache / "negatives", checkpoint,
                       output, progress, commit, versions, log)
        for row in rows:
            store.append(row)
        written.extend(rows)
        finished_runs += 1
    return written


def validation_users(settings, n_users: int, seed: int) -> np.ndarray | None:
    """The fixed random subset of user rows validated on when ``settings.valid_users`` asks for one, else None
    (every user)."""
    if settings.valid_users and settings.valid_users < n_users:
        return np.sort(np.random.default_rng(seed).choice(n_users, settings.valid_users, replace=False))
    return None


def run_one(job: Job, data, split, config, protocols, device, negatives_dir, checkpoint, output, progress,
            commit, versions, log) -> list[dict]:
    torch.manual_seed(job.seed)
    np.random.seed(job.seed)
    settings = dataclasses.replace(config.train, seed=job.seed, checkpoint=str(checkpoint), progress=progress)
    evaluator = Evaluator(split, seed=job.seed, cache_dir=negatives_dir)
    pairs = RelevanceEvaluator(split, seed=job.seed, cache_dir=negatives_dir)
    cls = model_class(job.model)
    memory = PeakMemory(device)
    memory.reset()
    model = cls(data.n_users, data.n_items, config.model)
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
    info = {"sha256": data.content_sha256(), "stats": data.stats(), "provenance": data.provenance}

    def result_row(protocol, tie_policy, metrics, users_evaluated, per_user, eval_seconds, **extra) -> dict:
        """One line of results.jsonl (results/README.md) for one test evaluation of this run; logs its metrics."""
        log(f"    {protocol:>6}: " + "  ".join(f"{name} {value:.4f}" for name, value in metrics.items())
            + f"  (train {fit['train_seconds']:.1f}s, {fit['epochs_run']} epochs)")
        return {
            "schema": SCHEMA_VERSION, "run_id": job.run_id, "study": job.study, "variant": job.variant,
            "sweep": job.sweep, "dataset": job.dataset, "dataset_info": info, "model": job.model,
            "hyperparameters": dataclasses.asdict(config.model),
            "train_settings": fit.get("settings"), "task": job.task, "protocol": protocol,
            "tie_policy": tie_policy, "split": "test", "seed": job.seed,
            "metrics": metrics, "users_evaluated": users_evaluated,
            "per_user_file": str(per_user), "epochs_run": fit["epochs_run"], "best_epoch": fit["best_epoch"],
            "best_valid": fit["best_valid"], "valid_metric": selection if fit.get("settings") else None,
            "curve": fit["curve"], "train_seconds": fit["train_seconds"], "eval_seconds": eval_seconds,
            "peak_memory_mb": memory.peak_mb(), "device": describe_device(device), "versions": versions,
            "commit": commit, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), **extra,
        }

    if job.task == RELEVANCE:
        # A ranker's scores become probabilities by Platt scaling fitted on the validation pairs only.
        scorer = model if isinstance(model, RelevanceModel) else calibrate(model, pairs, job.model)
        evaluation = pairs.evaluate(scorer, "test", job.model)
        per_user = Path("per_user") / f"{job.file_stem}__{PAIRS}.npz"
        evaluation.save(output / per_user)
        calibration = ({"method": "platt", "fitted_on": "valid", **dataclasses.asdict(scorer.platt)}
                       if scorer is not model else None)
        # AUC counts a tie as ½, the expected value under random tie-breaking.
        return [result_row(PAIRS, "expected", evaluation.metrics, len(evaluation.users), per_user,
                           evaluation.seconds, calibration=calibration)]
    rows = []
    for protocol in protocols:
        evaluation = evaluator.evaluate(model, "test", protocol, job.model)
        per_user = Path("per_user") / f"{job.file_stem}__{protocol}.npz"
        evaluation.counts.save(output / per_user)
        rows.append(result_row(protocol, evaluation.tie_policy, evaluation.metrics, len(evaluation.counts.users),
                               per_user, evaluation.seconds))
    if hasattr(model, "attention_maps"):
        save_attention(model, evaluator, job, output)
    return rows


def save_attention(model, evaluator: Evaluator, job: Job, output: Path, user: int = 0) -> None:
    """Attention of every layer and head for one user's test input, for the report's heat maps."""
    view = evaluator.view("test")
    history = torch.from_numpy(view.padded(np.array([user]), model.history_length)).to(model.device)
    users = torch.tensor([view.users[user]], device=model.device)
    model.eval()
    with torch.inference_mode():
        weights = model.attention_maps(users, history)
    items = getattr(model, "attention_items", lambda h: h)(history)[0]
    path = output / "attention" / f"{job.file_stem}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, weights=weights.float().cpu().numpy(), items=items.cpu().numpy(), user=user)
    tmp.replace(path)


def print_tables(rows: list[dict], log=print) -> str:
    """Paper-style tables (metrics × models), one per dataset and protocol; returns the Markdown."""
    from tabulate import tabulate

    blocks = []
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
