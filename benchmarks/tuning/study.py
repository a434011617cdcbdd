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
- **Pruning** from the per-epoch validation curve: :class:`TrialReporter` (``pruning``) is the trainer's
  ``on_validation`` callback; it reports each validation to the study and asks the pruner whether to stop. It holds
  only names (the storage URL, the study, the trial's number), so it pickles to joblib and Dask workers, which share
  the study through its database.
- **Resumable**: finished trials are in the database the moment the driver hears of them. ``--resume`` marks
  trials that were running when a driver died as failed and queues their settings again (they resume from their
  checkpoints); a killed local worker's trial is run again by the executor.
- **The test split is touched once**, by the final runs: the chosen settings of each (dataset, model), written as
  a ``--config`` file (``tuned.toml``, tables per model and dataset, with a ``tuned_from`` table that the rows
  carry), and the default settings under the same budget, over the requested seeds.

Optuna is imported only by the modules that need it (not by ``space``), so the rest of the suite runs without it.
"""
from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import TrialState

from recbench.benchmarks.config import ResolvedConfig, parse_override, read_overlay, resolve
from recbench.benchmarks.execution import Executor
from recbench.benchmarks.jobs import GridError, GridInterrupted, Job, PlannedJob
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.planner import plan_grid, prepare_negatives
from recbench.benchmarks.provenance import git_commit
from recbench.benchmarks.store import TRIAL, TUNING_STUDY, ResultStore, write_atomic
from recbench.benchmarks.tuning.chosen import choose, final_runs, tuned_toml, write_summary
from recbench.benchmarks.tuning.pruning import (
    PRUNED,
    TrialReporter,
    make_pruner,
    open_storage,
    shown_storage,
    trial_by_number,
)
from recbench.benchmarks.tuning.space import Space, declared_space, space_problems, spec_problems
from recbench.benchmarks.worker import JobOutcome, JobPayload
from recbench.datasets import resolve_cache_dir
from recbench.datasets.errors import unknown
from recbench.models import model_class, model_names
from recbench.models.base import NeuralRecommender

SAMPLERS = ("tpe", "grid", "random")
PRUNERS = ("median", "hyperband", "none")
BUDGETS = {"epochs": "max_epochs", "steps": "max_steps", "cpu": "cpu_budget_s"}  # --budget-X -> trainer setting


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


class ExhaustiveGrid(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its call to ``study.stop()``, which works only inside ``study.optimize``; the
    search counts its trials itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def make_sampler(name: str, space: Space, seed: int, parallel: bool):
    if name == "grid":
        return ExhaustiveGrid(space.grid(), seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # With parallel trials, TPE treats the running ones as if they had the worst value, so it spreads them.
    return optuna.samplers.TPESampler(seed=seed, constant_liar=parallel)


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


def search_base(model: str, dataset: str, options: RunOptions, settings: SearchSettings, overlays) -> ResolvedConfig:
    """The settings every trial of a study starts from, and the defaults' trial runs: the profile's, with the
    per-trial budget, the objective and ``--set``."""
    return resolve(model, dataset, options.profile, (*settings.budget, *settings.objective, *settings.overrides),
                   overlays)


def default_values(space: Space, base: ResolvedConfig) -> dict:
    """The model's own value, under ``base``, of each field that ``space`` searches."""
    return {name: getattr(base.model if hasattr(base.model, name) else base.train, name) for name in space.dimensions}


class Study:
    """One study: asks Optuna for trials as workers become free, runs each as a job, tells the outcomes. Its
    Optuna study is ``optuna`` once :meth:`open` has made or loaded it."""

    def __init__(self, context: Context, dataset: str, model: str, space: Space):
        self.context, self.dataset, self.model, self.space = context, dataset, model, space
        self.name = f"{context.settings.study_prefix}-{dataset}-{model}"
        self.store = ResultStore(context.options.output.resolve())  # where a running trial keeps its checkpoint
        self.lock = threading.RLock()
        self.running: dict[str, tuple] = {}  # key -> (trial, planned job)
        self.waiting: dict[str, list] = {}  # key -> trials with the same settings, told when it finishes
        self.completed: dict[str, Finished] = {}  # key -> the first finished trial with that key
        self.counted = 0  # trials that count toward --trials
        self.seconds: list[float] = []  # of the trials that trained
        self.error: BaseException | None = None
        self.fixed = {parse_override(text)[1] for text in context.settings.overrides}
        self.base = search_base(model, dataset, context.options, context.settings, context.overlays)
        self.first_epoch = 2 * self.base.train.valid_every

    # ------------------------------------------------------------------------------------ the study

    def open(self) -> None:
        """Create the study, or load it with ``--resume`` (the trials that a dead driver left running are marked
        failed and queued again); a study made for other settings is an error."""
        settings, options = self.context.settings, self.context.options
        parallel = self.context.executor.parallelism > 1
        self.optuna = optuna.create_study(storage=open_storage(self.context.storage), study_name=self.name,
                                          direction="maximize", pruner=make_pruner(settings.pruner, self.first_epoch),
                                          load_if_exists=True)
        spec = {**settings.spec(options.profile), "space": sorted(d.text for d in self.space.dimensions.values())}
        trials = self.optuna.get_trials(deepcopy=False)
        # A resumed study continues its sampler's draws rather than repeating the first ones.
        self.optuna.sampler = make_sampler(settings.sampler, self.space, settings.sampler_seed + len(trials), parallel)
        if trials and not options.resume:
            raise GridError(f"study {self.name!r} already has {len(trials)} trial(s) in "
                            f"{shown_storage(self.context.storage)}: rerun with --resume to continue it, or choose "
                            f"another --output or --study-prefix")
        recorded = self.optuna.user_attrs.get("spec")
        if recorded is not None and recorded != spec:
            changed = sorted(k for k in spec if spec[k] != recorded.get(k))
            raise GridError(f"study {self.name!r} was made with other {', '.join(changed)}; choose another --output "
                            f"or --study-prefix for a new search")
        self.optuna.set_user_attr("spec", spec)
        self._take_stock(trials)

    def _take_stock(self, trials: list) -> None:
        """Count the finished trials, remember their keys, queue again what a dead driver left running, and queue
        the defaults' trial unless the study has one."""
        has_defaults = False
        for trial in trials:
            defaults = {"defaults": True} if trial.user_attrs.get("defaults") else {}
            if trial.state == TrialState.RUNNING:
                running = trial_by_number(self.optuna, open_storage(self.context.storage), trial.number)
                running.set_user_attr("interrupted", True)
                self.optuna.tell(trial.number, state=TrialState.FAIL)
                self.optuna.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number, **defaults})
                self.context.log(f"  {self.name}: trial {trial.number} was running when its driver stopped; marked "
                                 f"failed and queued again")
            elif trial.state.is_finished() and not trial.user_attrs.get("interrupted"):
                self.counted += 1
                if trial.state == TrialState.COMPLETE and "key" in trial.user_attrs:
                    self.completed.setdefault(trial.user_attrs["key"], Finished(trial.number, trial.value,
                                                                                trial.user_attrs))
            has_defaults = has_defaults or bool(defaults)
        if not has_defaults:
            self._queue_defaults()

    def defaults(self) -> dict:
        """The model's own value of each searched field (:func:`default_values`)."""
        return default_values(self.space, self.base)

    def _inside(self) -> dict:
        """The defaults' values that lie inside their field's range: the defaults' trial's parameters."""
        return {name: value for name, value in self.defaults().items() if self.space.dimensions[name].contains(value)}

    def _queue_defaults(self) -> None:
        """The model's own settings as a trial of the study, always, and so a candidate for the choice. Its
        parameters are the values that lie inside the space (the sampler learns from them); Optuna records no value
        outside a parameter's range (the paper's ℓ2 grid leaves out the suite's own 0 or 1e-5), so those stay out
        of its parameters, and the trial runs the defaults as they are."""
        self.optuna.enqueue_trial(self.space.encoded(self._inside()), user_attrs={"defaults": True})

    @property
    def target(self) -> int:
        """The trials the study runs: ``--trials`` (else every point of the grid for the grid sampler, else 20) and
        the defaults' trial."""
        grid = self.space.grid()
        size = math.prod(len(values) for values in grid.values()) if grid else None
        if self.context.settings.trials is not None:
            return self.context.settings.trials + 1
        return (size if self.context.settings.sampler == "grid" else 20) + 1

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
        trial = self.optuna.ask(self._distributions())
        # The defaults' trial runs the defaults as they are, with no searched value (nor the settings tied to one).
        values = {} if trial.user_attrs.get("defaults") else self.space.values(trial.params)
        overrides = (*self.space.overrides(values, self.base, self.fixed), *context.settings.budget,
                     *context.settings.objective, *context.settings.overrides)
        trial.set_user_attr("overrides", list(overrides))
        job = Job(self.dataset, self.model, context.settings.seeds[0], study=TUNING_STUDY, variant=TRIAL,
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

    def _distributions(self) -> dict:
        """The parameters to ask for: the space's, or the defaults' trial's own when it is next in the queue (the
        study's one driver asks for every trial, so the first waiting trial is the one the next ask takes)."""
        waiting = self.optuna.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        distributions = self.space.distributions()
        if waiting and waiting[0].user_attrs.get("defaults"):
            return {name: distributions[name] for name in self._inside()}
        return distributions

    def _payload(self, trial, planned: PlannedJob) -> JobPayload:
        context, executor = self.context, self.context.executor
        cache = resolve_cache_dir(context.options.cache_dir)
        prepare_negatives([planned], context.datasets, cache, context.log)
        # The defaults' trial reports its curve to the pruner but runs to its end: it is always a candidate.
        reporter = TrialReporter(context.storage, self.name, trial.number, context.settings.pruner, self.first_epoch,
                                 prunable=not trial.user_attrs.get("defaults"))
        # resume: a checkpoint under this key can only be an interrupted trial's (a finished trial's is deleted)
        return JobPayload(planned=planned, device=context.options.device, threads=executor.threads_per_job,
                          negatives_dir=str(cache / "negatives"),
                          checkpoint=str(self.store.checkpoint(planned.file_stem)), resume=True, keep_weights=False,
                          progress=executor.worker_progress, epoch_lines=executor.worker_epoch_lines,
                          commit=context.commit, compile=context.options.compile,
                          on_validation=reporter, test=False)

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
        self.store.checkpoint(planned.file_stem).unlink(missing_ok=True)
        if outcome.trained:
            self.seconds.append(outcome.seconds)
        what = (f"{value:.4f}" if state == "complete" else f"pruned at epoch {attrs['epochs_run']}"
                if state == "pruned" else f"FAILED: {attrs.get('error')}")
        self._show(trial.number, f"{what} in {outcome.seconds:.0f}s")

    def _tell(self, trial, state: str, value, attrs: dict) -> None:
        for name, item in attrs.items():
            trial.set_user_attr(name, item)
        states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}
        self.optuna.tell(trial, value if state == "complete" else None, state=states[state])
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
class TuneResult:
    studies: list
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
    jobs = [Job(dataset, model, settings.seeds[0], study=TUNING_STUDY, variant=TRIAL,
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
    studies = []
    try:
        _check_workers_import_optuna(executor)
        context = Context(options, settings, storage, executor, datasets, overlays, git_commit(), log)
        for dataset, model in pairs:
            study = Study(context, dataset, model, spaces[(dataset, model)])
            study.run()
            studies.append(study)
    finally:
        executor.close()
    result = TuneResult(studies, [chosen for chosen in map(choose, studies) if chosen is not None])
    write_summary(output, studies)
    if result.chosen:
        result.config_file = output / "tuned.toml"
        write_atomic(result.config_file, tuned_toml(result.chosen, options.command, settings.budget))
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
