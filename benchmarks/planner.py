"""Planning a grid: every job's settings resolved and checked, every dataset located and prepared, and every
sampled candidate list drawn, before the first training step. All problems are reported together, one line
each (:class:`benchmarks.jobs.GridError`), so that a grid never fails hours in on a setting it could have
refused at once.

Checks, in order (settings first, since data may take minutes to prepare):

0. every model resolves (a registered name, an entry point or an import path, ``models/__init__.py``), and a model
   from outside the suite can run where the jobs will run, from the code on disk;
1. ``--set`` prefixes and fields, and the ``--config`` files (models, sections, fields);
2. each job's settings: types and ranges (each config dataclass's ``__post_init__``), then whether the model
   can be built with them (on a toy size);
3. the datasets: every missing file of every dataset; under the temporal split, only files with interaction times,
   and every dataset without them refused in one line, as are cuts that leave a view empty;
4. rules across a job's settings, its model and its data (:func:`job_problems`), e.g. that the selection metric
   is one the job's validation computes and that its cutoff is below the number of candidates.
"""
from __future__ import annotations

import time
from pathlib import Path

from recbench.benchmarks.config import ConfigError, ResolvedConfig, check_overrides, read_overlay, resolve
from recbench.benchmarks.jobs import GridError, Job, PlannedJob
from recbench.benchmarks.metrics import parse_metric
from recbench.benchmarks.negatives import PAIRS, SAMPLED_PROTOCOLS, load_or_sample
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.provenance import checkout_commit
from recbench.benchmarks.relevance import SELECTION_METRICS, TASK as RELEVANCE
from recbench.datasets import (
    DatasetFormatError,
    MissingDataError,
    dataset_on_disk,
    load_dataset,
    load_log,
    resolve_cache_dir,
)
from recbench.datasets.sequences import SequenceData
from recbench.datasets.splits import SplitSpec, split_record
from recbench.models import changed_source, model_class, model_names, model_origin
from recbench.models.base import NeuralRecommender
from recbench.models.relevance import RelevanceModel

SAMPLED_CANDIDATES = 101  # the target and 100 negatives (benchmarks.negatives)


def plan_grid(jobs: list[Job], options: RunOptions, *, preloaded: dict | None = None,
              log=print) -> tuple[list[PlannedJob], dict[str, SequenceData]]:
    """Resolve and check every job and load every dataset (``preloaded`` maps names to ready data); returns the
    planned jobs, one per key, and the datasets by name. Raises :class:`GridError` listing every problem."""
    problems = options.problems()
    if problems:
        raise GridError("\n".join(problems))
    sources = _model_sources(jobs, options)
    overlays = _read_overlays(options)
    configs = _resolve_settings(jobs, options, overlays, log)
    datasets = _load_datasets(jobs, options, preloaded)
    splits = _split_records(datasets, options.split)
    problems = [f"{job.run_id}: {text}" for job in jobs for text in job_problems(job, configs[job],
                                                                                  datasets[job.dataset])]
    if problems:
        raise GridError("\n".join(dict.fromkeys(problems)))
    planned = {}
    for job in jobs:
        plan = PlannedJob(job, options.profile, job.protocols(options.protocols), configs[job],
                          datasets[job.dataset].content_sha256(), sources.get(job.model), splits[job.dataset])
        if plan.key in planned:
            log(f"note: {job.run_id} repeats {planned[plan.key].run_id} (same key {plan.key[:12]}); it runs once")
        planned.setdefault(plan.key, plan)
    return list(planned.values()), datasets


def _model_sources(jobs: list[Job], options: RunOptions) -> dict[str, dict]:
    """The origin of each model from outside the suite (``models.model_origin``) with the commit of the git
    checkout its file lives in (None outside one, or where that checkout does not track the file). Raises
    :class:`GridError` naming every model that does not resolve, whose file changed after this process imported
    it, or that the jobs' worker processes could not import (a class handed over in this process only)."""
    sources, problems = {}, []
    elsewhere = options.n_jobs > 1 or options.dask_scheduler
    for name in dict.fromkeys(job.model for job in jobs):
        try:
            origin = model_origin(name)
        except ValueError as error:
            problems.append(str(error))
            continue
        if origin is None:
            continue
        if changed_source(name):
            problems.append(f"model {name!r}: {changed_source(name)}")
        if origin["in_process"] and elsewhere:
            problems.append(f"model {name!r} was handed over as a class that no import path reaches, so worker "
                            f"processes cannot build it; move it into a module on PYTHONPATH, or run one job at "
                            f"a time (n_jobs=1, no Dask)")
        folder = Path(origin["file"]).parent if origin["file"] else None
        sources[name] = {**origin, "commit": checkout_commit(folder, tracking=origin["file"]) if folder else None}
    if problems:
        raise GridError("\n".join(problems))
    return sources


def _read_overlays(options: RunOptions) -> list[dict]:
    try:
        return [read_overlay(path, model_names()) for path in options.config_files]
    except ConfigError as error:
        raise GridError(str(error)) from None


def _resolve_settings(jobs: list[Job], options: RunOptions, overlays: list[dict], log) -> dict[Job, ResolvedConfig]:
    """Each job's resolved settings; raises :class:`GridError` with every problem, one line per problem with the
    models it concerns (``sasrec, bert4rec: heads=3 must divide hidden=64``)."""
    problems, notes = [], []
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
            configs[job] = resolve(job.model, job.dataset, options.profile, job.overrides, overlays)
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
    return configs


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


def _load_datasets(jobs: list[Job], options: RunOptions, preloaded: dict | None) -> dict[str, SequenceData]:
    """Every dataset of the grid (under the temporal split, from files with interaction times); the ones that
    need a download first, so that a missing one is reported before any long parse. Raises :class:`GridError`
    naming every missing or unreadable dataset."""
    cache = resolve_cache_dir(options.cache_dir)
    datasets = dict(preloaded or {})
    timed = options.split.temporal
    wanted = [name for name in dict.fromkeys(job.dataset for job in jobs) if name not in datasets]
    wanted.sort(key=lambda name: name in options.logs or dataset_on_disk(name, options.data_dir, cache, timed))
    problems = []
    for name in wanted:
        try:
            if name in options.logs:  # a log of the user's own, read whole before anything trains
                datasets[name] = load_log(options.logs[name], name, cache, options.progress)
                continue
            if problems and dataset_on_disk(name, options.data_dir, cache, timed):
                continue  # the grid cannot run anyway; report the missing data without preparing the rest
            datasets[name] = load_dataset(name, data_dir=options.data_dir, cache_dir=cache,
                                          progress=options.progress, timed=timed)
        except (MissingDataError, DatasetFormatError, OSError, ValueError) as error:
            problems.append(_dataset_problem(name, error))
    if problems:
        raise GridError("\n".join(problems))
    return datasets


def _dataset_problem(name: str, error: Exception) -> str:
    return str(error) if str(error).startswith("dataset") else f"dataset {name!r}: {error}"


def _split_records(datasets: dict[str, SequenceData], spec: SplitSpec) -> dict[str, dict | None]:
    """Each dataset's split as its jobs' keys record it (None: leave-one-out); raises :class:`GridError` naming
    every dataset that cannot be split so (no interaction times, a view left empty by the cuts)."""
    if not spec.temporal:  # leave-one-out checks its data where it splits it, as it always has
        return dict.fromkeys(datasets)
    records, problems = {}, []
    for name, data in datasets.items():
        try:
            split = spec.build(data)
        except ValueError as error:
            problems.append(_dataset_problem(name, error))
            continue
        records[name] = split_record(split)
        problems += split.problems()
    if problems:
        raise GridError("\n".join(problems))
    return records


def selection_metric(job: Job, config: ResolvedConfig) -> tuple[str, str]:
    """(metric, what it is computed on) that selects this job's checkpoint: a model trained for relevance is
    selected on the validation pairs, any other model on ranking the validation targets."""
    train = config.train
    if issubclass(model_class(job.model), RelevanceModel):
        return train.valid_metric, PAIRS
    return train.valid_metric, train.valid_protocol


def job_problems(job: Job, config: ResolvedConfig, data: SequenceData) -> list[str]:
    """Rules across a job's settings, its model and its data, one line per broken rule."""
    if not issubclass(model_class(job.model), NeuralRecommender):
        return []  # no training, no selection
    metric, selected_on = selection_metric(job, config)
    if selected_on == PAIRS:
        if metric not in SELECTION_METRICS:
            return [f"valid_metric={metric!r} cannot select {job.model}, a model trained for relevance, on the "
                    f"validation pairs; use one of {', '.join(SELECTION_METRICS)}"]
        return []
    if metric in SELECTION_METRICS:
        return [f"valid_metric={metric!r} is a relevance metric, but {job.model} is selected on ranking the "
                f"validation targets ({selected_on}); use HR@k, NDCG@k or MRR"]
    _, cutoff = parse_metric(metric)
    candidates = SAMPLED_CANDIDATES if selected_on in SAMPLED_PROTOCOLS else data.n_items
    if cutoff is not None and cutoff >= candidates:
        return [f"valid_metric={metric!r} must have k below the {candidates} candidates of valid_protocol="
                f"{selected_on!r} (at k = {cutoff} every model scores 1)"]
    return []


def prepare_negatives(planned: list[PlannedJob], datasets: dict[str, SequenceData], cache: Path,
                      log=print) -> None:
    """Draw every sampled candidate list the grid will read (test protocols, validation protocols, relevance
    pairs) once, in the driver, so that parallel workers only read them."""
    needed, splits = {}, {}
    for job in planned:
        seed, name = job.job.seed, job.job.dataset
        if name not in splits:  # one split per dataset: a grid has one scheme
            splits[name] = job.data_split(datasets[name])
        for protocol in job.protocols:
            if protocol in SAMPLED_PROTOCOLS or protocol == PAIRS:
                needed[(name, "test", protocol, seed)] = None
        valid = job.config.train.valid_protocol
        if valid in SAMPLED_PROTOCOLS:
            needed[(name, "valid", valid, seed)] = None
        if job.job.task == RELEVANCE:
            needed[(name, "valid", PAIRS, seed)] = None
    for number, (name, part, protocol, seed) in enumerate(needed, start=1):
        started = time.perf_counter()
        load_or_sample(splits[name], part, protocol, seed, cache / "negatives")
        if time.perf_counter() - started > 2:
            log(f"  negatives {number}/{len(needed)}: {name} {part} {protocol} seed {seed} "
                f"({time.perf_counter() - started:.0f}s)")
