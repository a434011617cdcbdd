"""Hyper-parameter search as the paper did it: every model "under its optimal hyper-parameter settings", tuned on
the validation sets (BERT4Rec §4.3; PAPER.md, "Settings of the published tables"), through the suite's run layer.

- **One study per (dataset, model)**, Optuna's ask-and-tell (TPE by default; ``grid`` runs every point of the
  space to the end; ``random`` for comparison), kept in a database: SQLite in the output folder by default, or an
  RDB URL (PostgreSQL, MySQL) that every machine of a Dask cluster can reach.
- **A trial is a job** (:mod:`benchmarks.jobs`): study ``tuning``, variant ``trial``, its settings given as
  overrides (the searched values, the settings tied to them, the trial budget, the objective, the user's ``--set``)
  and no test protocol. The worker trains it and returns its validation row (``JobPayload.test`` false): no trial
  computes or reads a test metric. Its key covers its resolved settings and budget, so a trial whose settings equal
  a finished trial's reuses that result, and a pruned trial, stored as pruned, never stands for a full run.
- **Pruning** from the per-epoch validation curve: :class:`TrialReporter` is the trainer's ``on_validation``
  callback; it reports each validation to the study and asks the pruner whether to stop. It holds only names (the
  storage URL, the study, the trial), so it pickles to joblib and Dask workers, which share the study through its
  database.
- **Resumable**: finished trials are in the database the moment the driver hears of them. ``--resume`` marks
  trials that were running when a driver died as failed and queues their settings again (they resume from their
  checkpoints); a killed local worker's trial is run again by the executor.
- **The test split is touched once**, by the final runs: the chosen settings of each (dataset, model), written as
  a ``--config`` file (``tuned.toml``, tables per model and dataset, with a ``tuned_from`` table that the rows
  carry), and the default settings under the same budget, over the requested seeds.

Optuna is imported only by the functions that need it, so the rest of the suite runs without it.
"""
from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

from recbench.benchmarks.config import parse_override, read_overlay, resolve
from recbench.benchmarks.execution import Executor
from recbench.benchmarks.jobs import GridError, GridInterrupted, Job, PlannedJob
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.planner import plan_grid, prepare_negatives, selection_metric
from recbench.benchmarks.provenance import git_commit
from recbench.benchmarks.store import write_atomic, write_json
from recbench.benchmarks.tuning.space import Space, declared_space, space_problems, spec_problems, toml_value
from recbench.benchmarks.worker import JobOutcome, JobPayload
from recbench.datasets import resolve_cache_dir
from recbench.models import model_class, model_names
from recbench.models.base import NeuralRecommender

STUDY, TRIAL = "tuning", "trial"  # the study label of trial jobs and final runs; the variant of a trial
SAMPLERS = ("tpe", "grid", "random")
PRUNERS = ("median", "hyperband", "none")
BUDGETS = {"epochs": "max_epochs", "steps": "max_steps", "cpu": "cpu_budget_s"}  # --budget-X -> trainer setting
PRUNED = "pruned"  # the stop reason TrialReporter gives the trainer


@dataclass
class SearchSettings:
    """What a search does, apart from the run options (:class:`benchmarks.options.RunOptions`)."""

    trials: int | None = None  # trials per (dataset, model); None: the grid's size (grid sampler), else 20
    sampler: str = "tpe"
    pruner: str = "median"
    sampler_seed: int = 0
    storage: str | None = None  # an RDB URL; None: SQLite in the output folder
    study_prefix: str = "tune"
    budget: tuple = ()  # "max_epochs=20", "cpu_budget_s=60": the per-trial budget, part of every trial's settings
    objective: tuple = ()  # "valid_metric=NDCG@10", "valid_protocol=full" (else the model's own)
    spaces: tuple = ()  # --space strings
    overrides: tuple = ()  # --set strings, applied to trials and final runs alike
    seeds: tuple = (0,)  # trials train with the first; the final runs use every one
    final: bool = True  # test the chosen and the default settings at the end

    def problems(self) -> list[str]:
        from recbench.datasets.errors import unknown

        found = [str(unknown(kind, value, valid)) for kind, value, valid in
                 (("sampler", self.sampler, SAMPLERS), ("pruner", self.pruner, PRUNERS)) if value not in valid]
        if self.trials is not None and self.trials < 1:
            found.append(f"--trials {self.trials}: must be >= 1")
        if not self.seeds:
            found.append("--seeds: give at least one seed")
        return found

    def spec(self, profile: str) -> dict:
        """What a study's trials mean; a resumed study must have been made with the same."""
        return {"profile": profile, "budget": list(self.budget), "objective": list(self.objective),
                "overrides": list(self.overrides), "seed": self.seeds[0], "sampler": self.sampler}


# ------------------------------------------------------------------------------------------ in the workers

_STORAGES: dict[str, object] = {}  # one database connection pool per URL and process


def open_storage(url: str):
    """Optuna's storage for ``url``, once per process; SQLite waits up to a minute for a lock held by another
    process (the driver and local workers write to one file)."""
    if url not in _STORAGES:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        _STORAGES[url] = optuna.storages.RDBStorage(url, engine_kwargs=engine)
    return _STORAGES[url]


def make_pruner(name: str, first_epoch: int):
    """Optuna's pruner, never before ``first_epoch`` (the second validation: one value says little): ``median``
    stops a trial whose value is below the median of the earlier trials' at the same epoch (once 4 trials have
    finished); ``hyperband`` is Li et al.'s bandit over successive halvings; ``none`` never stops one."""
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=first_epoch)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=first_epoch, reduction_factor=3)
    return optuna.pruners.NopPruner()


@dataclass
class TrialReporter:
    """A trial's ``TrainRun.on_validation``: reports each validation's value to the study at its epoch and stops
    the run ("pruned") when the study's pruner says so. Only names travel with it, so it pickles to any worker."""

    storage: str
    study_name: str
    trial_id: int
    pruner: str
    first_epoch: int  # the pruner's first epoch (make_pruner)
    _trial: object = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_trial": None}

    def __call__(self, validation) -> str | None:
        if self._trial is None:
            import optuna

            study = optuna.load_study(study_name=self.study_name, storage=open_storage(self.storage),
                                      pruner=make_pruner(self.pruner, self.first_epoch))
            self._trial = optuna.trial.Trial(study, self.trial_id)
        self._trial.report(validation.value, validation.epoch)
        return PRUNED if self._trial.should_prune() else None


# ------------------------------------------------------------------------------------------ in the driver

def make_sampler(name: str, space: Space, seed: int, parallel: bool):
    import optuna

    if name == "grid":
        class ExhaustiveGrid(optuna.samplers.GridSampler):
            """Optuna's grid sampler without its call to ``study.stop()``, which works only inside
            ``study.optimize``; the search counts its trials itself."""

            def after_trial(self, study, trial, state, values) -> None:
                return None

        return ExhaustiveGrid(space.grid(), seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # With parallel trials, TPE treats the running ones as if they had the worst value, so it spreads them.
    return optuna.samplers.TPESampler(seed=seed, constant_liar=parallel)


def shown_storage(url: str) -> str:
    """The storage URL without a password (it goes into rows and files)."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@dataclass
class Context:
    """What every study of one search shares."""

    options: RunOptions
    settings: SearchSettings
    storage: str
    executor: Executor
    datasets: dict
    overlays: list
    commit: str
    log: object = print


@dataclass(frozen=True)
class Finished:
    """A finished trial, as a trial with equal settings reuses it."""

    number: int
    value: float
    attrs: dict


class Search:
    """One study: asks Optuna for trials as workers become free, runs each as a job, tells the outcomes."""

    def __init__(self, context: Context, dataset: str, model: str, space: Space):
        self.context, self.dataset, self.model, self.space = context, dataset, model, space
        self.name = f"{context.settings.study_prefix}-{dataset}-{model}"
        self.lock = threading.RLock()
        self.running: dict[str, tuple] = {}  # key -> (trial, planned job)
        self.waiting: dict[str, list] = {}  # key -> trials with the same settings, told when it finishes
        self.completed: dict[str, Finished] = {}  # key -> the first finished trial with that key
        self.counted = 0  # trials that count toward --trials
        self.seconds: list[float] = []  # of the trials that trained
        self.error: BaseException | None = None
        self.fixed = {parse_override(text)[1] for text in context.settings.overrides}
        self.base = resolve(model, dataset, context.options.profile,
                            (*context.settings.budget, *context.settings.objective, *context.settings.overrides),
                            context.overlays)
        self.first_epoch = 2 * self.base.train.valid_every

    # ------------------------------------------------------------------------------------ the study

    def open(self) -> None:
        """Create the study, or load it with ``--resume`` (the trials that a dead driver left running are marked
        failed and queued again); a study made for other settings is an error."""
        import optuna

        settings, options = self.context.settings, self.context.options
        parallel = self.context.executor.parallelism > 1
        self.study = optuna.create_study(storage=open_storage(self.context.storage), study_name=self.name,
                                         direction="maximize", pruner=make_pruner(settings.pruner, self.first_epoch),
                                         load_if_exists=True)
        spec = {**settings.spec(options.profile), "space": sorted(d.text for d in self.space.dimensions.values())}
        trials = self.study.get_trials(deepcopy=False)
        # A resumed study continues its sampler's draws rather than repeating the first ones.
        self.study.sampler = make_sampler(settings.sampler, self.space, settings.sampler_seed + len(trials), parallel)
        if trials and not options.resume:
            raise GridError(f"study {self.name!r} already has {len(trials)} trial(s) in "
                            f"{shown_storage(self.context.storage)}: rerun with --resume to continue it, or choose "
                            f"another --output or --study-prefix")
        recorded = self.study.user_attrs.get("spec")
        if recorded is not None and recorded != spec:
            changed = sorted(k for k in spec if spec[k] != recorded.get(k))
            raise GridError(f"study {self.name!r} was made with other {', '.join(changed)}; choose another --output "
                            f"or --study-prefix for a new search")
        self.study.set_user_attr("spec", spec)
        self._take_stock(trials)

    def _take_stock(self, trials: list) -> None:
        """Count the finished trials, remember their keys, and queue again what a dead driver left running."""
        from optuna.trial import TrialState

        for trial in trials:
            if trial.state == TrialState.RUNNING:
                self.study._storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
                self.study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
                self.study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
                self.context.log(f"  {self.name}: trial {trial.number} was running when its driver stopped; marked "
                                 f"failed and queued again")
            elif trial.state.is_finished() and not trial.user_attrs.get("interrupted"):
                self.counted += 1
                if trial.state == TrialState.COMPLETE and "key" in trial.user_attrs:
                    self.completed.setdefault(trial.user_attrs["key"], Finished(trial.number, trial.value,
                                                                                trial.user_attrs))
        if not trials and self.context.settings.sampler != "grid":
            self._queue_defaults()

    def _queue_defaults(self) -> None:
        """The model's own settings as the first trial, when they lie inside the space."""
        defaults = {name: getattr(self.base.model if hasattr(self.base.model, name) else self.base.train, name)
                    for name in self.space.dimensions}
        if all(self.space.dimensions[name].contains(value) for name, value in defaults.items()):
            self.study.enqueue_trial(self.space.encoded(defaults), user_attrs={"defaults": True})

    @property
    def target(self) -> int:
        grid = self.space.grid()
        size = math.prod(len(values) for values in grid.values()) if grid else None
        if self.context.settings.trials is not None:
            return self.context.settings.trials
        return size if self.context.settings.sampler == "grid" else 20

    # ------------------------------------------------------------------------------------ the trials

    def payloads(self):
        """Each trial to run, asked for when a worker is free (from joblib's dispatching thread when trials run
        in parallel). Trials that reuse a finished result, or wait for a running trial with the same settings, are
        told here and never reach a worker. An error stops the stream and is raised by :meth:`run`."""
        while True:
            with self.lock:
                pending = len(self.running) + sum(len(trials) for trials in self.waiting.values())
                if self.error is not None or self.counted + pending >= self.target:
                    return
                try:
                    payload = self._next()
                except Exception as error:  # noqa: BLE001  (raised in the driver's thread by run())
                    self.error = error
                    return
            if payload is not None:
                yield payload

    def _next(self) -> JobPayload | None:
        """Ask for a trial; its payload, or None when it was told at once."""
        context = self.context
        trial = self.study.ask(self.space.distributions())
        values = self.space.values(trial.params)
        overrides = (*self.space.overrides(values, self.base, self.fixed), *context.settings.budget,
                     *context.settings.objective, *context.settings.overrides)
        trial.set_user_attr("overrides", list(overrides))
        job = Job(self.dataset, self.model, context.settings.seeds[0], study=STUDY, variant=TRIAL,
                  overrides=overrides)
        try:
            planned = plan_grid([job], dataclasses.replace(context.options, protocols=()),
                                preloaded=context.datasets, log=lambda *_: None)[0][0]
        except GridError as error:  # settings the space allows but the model refuses together
            self._tell(trial, "failed", None, {"error": str(error)})
            context.log(f"  trial {trial.number}: {error}")
            return None
        trial.set_user_attr("key", planned.key)
        if planned.key in self.completed:
            earlier = self.completed[planned.key]
            self._tell(trial, "complete", earlier.value, {**_result_attrs(earlier.attrs),
                                                         "reused_from": earlier.number})
            self._show(trial.number, f"same settings as trial {earlier.number}, its result reused")
            return None
        if planned.key in self.running:
            self.waiting.setdefault(planned.key, []).append(trial)
            return None
        self.running[planned.key] = (trial, planned)
        return self._payload(trial, planned)

    def _payload(self, trial, planned: PlannedJob) -> JobPayload:
        context, executor = self.context, self.context.executor
        cache = resolve_cache_dir(context.options.cache_dir)
        prepare_negatives([planned], context.datasets, cache, context.log)
        checkpoint = Path(context.options.output).resolve() / "checkpoints" / f"{planned.file_stem}.pt"
        reporter = TrialReporter(context.storage, self.name, trial._trial_id, context.settings.pruner,
                                 self.first_epoch)
        # resume: a checkpoint under this key can only be an interrupted trial's (a finished trial's is deleted)
        return JobPayload(planned, context.options.device, executor.threads_per_job, str(cache / "negatives"),
                          str(checkpoint), True, False, executor.worker_progress, context.commit,
                          compile=context.options.compile, on_validation=reporter, test=False)

    def record(self, outcome: JobOutcome) -> None:
        """Tell the study what became of a trial (and of the trials waiting for the same settings)."""
        with self.lock:
            trial, planned = self.running.pop(outcome.key)
            state, value, attrs = _judge(outcome)
            self._tell(trial, state, value, attrs)
            for waiting in self.waiting.pop(outcome.key, []):
                self._tell(waiting, state, value, {**_result_attrs(attrs), "reused_from": trial.number})
                self._show(waiting.number, f"same settings as trial {trial.number}, its result reused")
            if state == "complete":
                self.completed.setdefault(outcome.key, Finished(trial.number, value, attrs))
        (Path(self.context.options.output).resolve() / "checkpoints" / f"{planned.file_stem}.pt").unlink(
            missing_ok=True)
        if outcome.trained:
            self.seconds.append(outcome.seconds)
        what = (f"{value:.4f}" if state == "complete" else f"pruned at epoch {attrs['epochs_run']}"
                if state == "pruned" else f"FAILED: {attrs.get('error')}")
        self._show(trial.number, f"{what} in {outcome.seconds:.0f}s")

    def _tell(self, trial, state: str, value, attrs: dict) -> None:
        from optuna.trial import TrialState

        for name, item in attrs.items():
            trial.set_user_attr(name, item)
        states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}
        self.study.tell(trial, value if state == "complete" else None, state=states[state])
        self.counted += 1

    def _show(self, number: int, what: str) -> None:
        """``trial k/n``, what became of it, the best so far and the time left."""
        best = max(self.completed.values(), key=lambda t: t.value, default=None)
        best_text = f"; best {best.value:.4f} (trial {best.number})" if best is not None else ""
        left = ""
        if self.seconds and self.counted < self.target:
            seconds = sum(self.seconds) / len(self.seconds) * (self.target - self.counted) / max(
                1, self.context.executor.parallelism)
            left = f", about {seconds / 60:.1f} min left" if seconds >= 60 else f", about {seconds:.0f} s left"
        self.context.log(f"[trial {self.counted}/{self.target}] {self.dataset}/{self.model} #{number}: {what}"
                         f"{best_text}{left}")

    def run(self) -> None:
        """All trials of the study (those missing when resumed)."""
        self.open()
        if self.counted >= self.target:
            self.context.log(f"{self.name}: {self.counted} trial(s) already finished, none to run")
            return
        self.context.log(f"{self.name}: trials {self.counted + 1} to {self.target} ({self.context.settings.sampler}, "
                         f"pruner {self.context.settings.pruner}) -> {shown_storage(self.context.storage)}")
        try:
            for outcome in self.context.executor.run(self.payloads(), self.context.datasets, lambda planned: None):
                self.record(outcome)
        except KeyboardInterrupt:
            raise GridInterrupted() from None
        if self.error is not None:
            raise self.error


def _judge(outcome: JobOutcome) -> tuple[str, float | None, dict]:
    """(state, value, facts to keep with the trial) of a trial's outcome."""
    if outcome.status != "finished":
        return "failed", None, {"error": outcome.error, "error_type": outcome.error_type}
    row = outcome.rows[0]
    attrs = {"seconds": outcome.seconds, "cpu_seconds": row.get("train_cpu_seconds"), "epochs_run": row["epochs_run"],
             "best_epoch": row["best_epoch"], "stopped_by": row["stopped_by"], "metrics": row["metrics"],
             "run_id": row["run_id"]}
    if row["stopped_by"] == PRUNED:
        return "pruned", None, attrs
    value = row.get("best_valid")
    if value is None or not math.isfinite(value):
        return "failed", None, {**attrs, "error": f"no finite validation value ({value})"}
    return "complete", float(value), attrs


def _result_attrs(attrs: dict) -> dict:
    """What a trial that reuses another's result copies of it (not its own key, overrides or provenance)."""
    return {name: attrs[name] for name in ("epochs_run", "best_epoch", "stopped_by", "metrics") if name in attrs}


# ------------------------------------------------------------------------------------------ the whole search

@dataclass
class Chosen:
    """The settings a study chose for one (dataset, model): its best finished trial's."""

    dataset: str
    model: str
    config: object  # the ResolvedConfig of the best trial
    searched: tuple  # the fields the study searched
    tied: tuple  # the fields that followed them
    tuned_from: dict  # study, storage, trial, value, metric, profile, seed (the rows' `tuned_from`)


@dataclass
class TuneResult:
    searches: list
    chosen: list
    config_file: Path | None = None  # tuned.toml
    finals: list = field(default_factory=list)  # the GridResults of the final runs


def check_search(pairs: list, options: RunOptions, settings: SearchSettings, log=print) -> tuple:
    """Every problem of the search, one line each, before any trial: options, spaces, budget, objective, data.
    Returns (datasets, --config tables, spaces by (dataset, model)); raises :class:`GridError`."""
    models = list(dict.fromkeys(model for _, model in pairs))
    problems = options.problems() + settings.problems() + spec_problems(settings.spaces, models)
    problems += [f"{model}: has no training, so nothing to tune" for model in models
                 if not issubclass(model_class(model), NeuralRecommender)]
    if problems:
        raise GridError("\n".join(dict.fromkeys(problems)))
    try:
        overlays = [read_overlay(path, model_names()) for path in options.config_files]
    except ValueError as error:
        raise GridError(str(error)) from None
    spaces = {}
    for dataset, model in pairs:
        try:
            space = spaces[(dataset, model)] = declared_space(model, dataset, overlays, settings.spaces,
                                                              options.config_files)
        except ValueError as error:
            problems.append(f"{model}: {error}")
            continue
        problems += space_problems(space, options.profile, (*settings.objective, *settings.overrides), overlays,
                                   settings.budget)
        if not space.dimensions:
            problems.append(f"{model}: nothing to search; declare a [search] table in its config or give --space")
        elif settings.sampler == "grid" and space.grid() is None:
            ranges = [d.text for d in space.dimensions.values() if d.grid() is None]
            problems.append(f"{model}: the grid sampler needs values, not ranges ({'; '.join(ranges)}): give a list "
                            f"or a step with --space, or leave the field out with --space FIELD=none")
    if problems:
        raise GridError("\n".join(dict.fromkeys(problems)))
    jobs = [Job(dataset, model, settings.seeds[0], study=STUDY, variant=TRIAL,
                overrides=(*settings.budget, *settings.objective, *settings.overrides)) for dataset, model in pairs]
    _, datasets = plan_grid(jobs, dataclasses.replace(options, protocols=()), log=log)
    return datasets, overlays, spaces


def run_search(pairs: list, options: RunOptions, settings: SearchSettings, log=print) -> TuneResult:
    """Tune each (dataset, model) of ``pairs``, write the chosen settings (``tuned.toml``) and a summary
    (``tuning.json``) into the output folder, then test the chosen and the default settings over the seeds."""
    datasets, overlays, spaces = check_search(pairs, options, settings, log)
    output = Path(options.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    storage = settings.storage or f"sqlite:///{output / 'tuning.db'}"
    executor = Executor(options, log)
    searches = []
    try:
        _check_workers_import_optuna(executor)
        context = Context(options, settings, storage, executor, datasets, overlays, git_commit(), log)
        for dataset, model in pairs:
            search = Search(context, dataset, model, spaces[(dataset, model)])
            search.run()
            searches.append(search)
    finally:
        executor.close()
    result = TuneResult(searches, [chosen for chosen in map(choose, searches) if chosen is not None])
    write_summary(output / "tuning.json", searches)
    if result.chosen:
        result.config_file = output / "tuned.toml"
        write_atomic(result.config_file, tuned_toml(result.chosen, options.command))
        log(f"chosen settings: {result.config_file} (use it with --config)")
    if settings.final and result.chosen:
        result.finals = final_runs(result.chosen, options, settings, result.config_file, log)
    return result


def _check_workers_import_optuna(executor: Executor) -> None:
    """Dask workers report to the study, so they need Optuna as the driver does."""
    if executor.client is None:
        return
    failed = [address for address, error in executor.client.run(exec, "import optuna", on_error="return").items()
              if isinstance(error, BaseException)]
    if failed:
        raise GridError(f"Dask worker(s) {', '.join(failed)} cannot import optuna, which trials need to report to "
                        f"their study: pip install optuna on every worker")


def choose(search: Search) -> Chosen | None:
    """The best finished trial's settings, or None when no trial finished."""
    from optuna.trial import TrialState

    finished = [t for t in search.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if not finished:
        search.context.log(f"{search.name}: no trial finished; no settings chosen")
        return None
    best = max(finished, key=lambda t: (t.value, -t.number))
    context = search.context
    config = resolve(search.model, search.dataset, context.options.profile, tuple(best.user_attrs["overrides"]),
                     context.overlays)
    metric, protocol = selection_metric(Job(search.dataset, search.model, 0), search.base)
    tuned_from = {"study": search.name, "storage": shown_storage(context.storage), "trial": best.number,
                  "value": best.value, "metric": f"{metric} under {protocol}", "profile": context.options.profile,
                  "seed": context.settings.seeds[0]}
    return Chosen(search.dataset, search.model, config, tuple(search.space.dimensions),
                  tuple(t for t in search.space.tied if t not in search.space.dimensions), tuned_from)


def _key(name: str) -> str:
    """A TOML key: bare when it can be (``ml-1m``), else quoted (``"gru4rec+"``)."""
    return name if name and all(c.isalnum() or c in "-_" for c in name) else toml_value(name)


def tuned_toml(chosen: list[Chosen], command: list[str] | None = None) -> str:
    """The chosen settings as a ``--config`` file: every model and trainer setting of each (dataset, model), so
    that the file alone reproduces the best trial (under any profile), and the ``tuned_from`` table its rows
    carry."""
    import shlex
    import sys

    lines = ["# Settings chosen on the validation split by python -m benchmarks.tune, one table per model and",
             "# dataset in the format of benchmarks/configs/ (use them with run_all.py or a study: --config FILE).",
             f"# command: {shlex.join(command if command is not None else sys.argv)}"]
    for c in chosen:
        for section, values in (("model", dataclasses.asdict(c.config.model)),
                                ("train", dataclasses.asdict(c.config.train))):
            lines += ["", f"[{_key(c.model)}.{section}.{_key(c.dataset)}]"]
            for name, value in values.items():
                note = ("  # searched" if name in c.searched else "  # follows a searched setting" if name in c.tied
                        else "")
                lines.append(f"{name} = {toml_value(value)}{note}")
        lines += ["", f"[{_key(c.model)}.tuned_from.{_key(c.dataset)}]"]
        lines += [f"{name} = {toml_value(value)}" for name, value in c.tuned_from.items()]
    return "\n".join(lines) + "\n"


def study_summary(search: Search) -> dict:
    """One study as ``tuning.json`` keeps it for the report: every trial, the best, each parameter's importance."""
    trials = search.study.get_trials(deepcopy=False)
    keep = ("seconds", "cpu_seconds", "epochs_run", "stopped_by", "reused_from", "retry_of", "error", "interrupted",
            "defaults")
    rows = [{"number": t.number, "state": t.state.name.lower(), "value": t.value,
             "params": search.space.values(t.params), **{k: t.user_attrs[k] for k in keep if k in t.user_attrs}}
            for t in trials]
    complete = [row for row in rows if row["state"] == "complete"]
    best = max(complete, key=lambda row: (row["value"], -row["number"]), default=None)
    metric, protocol = selection_metric(Job(search.dataset, search.model, 0), search.base)
    settings = search.context.settings
    return {"study": search.name, "storage": shown_storage(search.context.storage), "dataset": search.dataset,
            "model": search.model, "objective": f"{metric} under {protocol}", "sampler": settings.sampler,
            "pruner": settings.pruner, "profile": search.context.options.profile, "seed": settings.seeds[0],
            "budget": list(settings.budget), "space": [d.text for d in search.space.dimensions.values()],
            "tied": search.space.tied, "target": search.target, "trials": rows, "best": best,
            "importances": importances(search.study),
            "cpu_seconds": sum(row.get("cpu_seconds") or 0.0 for row in rows)}


def importances(study) -> dict[str, float]:
    """Each parameter's share of the variation of the objective over the finished trials (PED-ANOVA where Optuna
    has it, which needs no scikit-learn); empty when there are too few trials to say."""
    import optuna

    evaluator = getattr(optuna.importance, "PedAnovaImportanceEvaluator", None)
    try:
        found = optuna.importance.get_param_importances(study, evaluator=evaluator() if evaluator else None)
    except (ValueError, RuntimeError, ZeroDivisionError, ImportError):
        return {}
    return {name: float(value) for name, value in found.items() if math.isfinite(value)}


def write_summary(path: Path, searches: list[Search]) -> None:
    """``tuning.json``: the studies of this folder (earlier invocations' studies kept)."""
    import json

    studies = {}
    if path.exists():
        studies = {study["study"]: study for study in json.loads(path.read_text()).get("studies", [])}
    studies.update({search.name: study_summary(search) for search in searches})
    write_json(path, {"studies": list(studies.values())})


def final_runs(chosen: list[Chosen], options: RunOptions, settings: SearchSettings, config_file: Path,
               log=print) -> list:
    """The test split, touched once: the chosen settings (``tuned.toml``) and the default ones under the same
    budget and objective, over every seed, as jobs of study ``tuning`` (variants ``tuned`` and ``default``)."""
    from recbench.benchmarks.grid import run_jobs

    fixed = (*settings.budget, *settings.objective)
    tuned = [Job(c.dataset, c.model, seed, study=STUDY, variant="tuned", overrides=settings.overrides)
             for c in chosen for seed in settings.seeds]
    defaults = [Job(c.dataset, c.model, seed, study=STUDY, variant="default", overrides=(*fixed, *settings.overrides))
                for c in chosen for seed in settings.seeds]
    log(f"final runs: the chosen and the default settings of {len(chosen)} model(s) over {len(settings.seeds)} "
        f"seed(s), tested under {', '.join(options.protocols)}")
    with_chosen = dataclasses.replace(options, config_files=(*options.config_files, config_file))
    return [run_jobs(tuned, with_chosen, log=log), run_jobs(defaults, options, log=log)]
