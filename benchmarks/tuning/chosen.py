"""What a search chose and what it left in the output folder: each study's best settings (``tuned.toml``, a
``--config`` file whose ``tuned_from`` table the rows carry), every study's trials for the report (``tuning.json``,
through :mod:`benchmarks.store`) and the final runs, the only jobs of the search that touch the test split.
"""
from __future__ import annotations

import dataclasses
import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from recbench.benchmarks.config import resolve, toml_value
from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.jobs import Job
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.planner import selection_metric
from recbench.benchmarks.store import DEFAULT, TUNED, TUNING_STUDY, record_tuning_studies
from recbench.benchmarks.tuning.pruning import shown_storage


@dataclass
class Chosen:
    """The settings a study chose for one (dataset, model): its best finished trial's."""

    dataset: str
    model: str
    config: object  # the ResolvedConfig of the best trial
    searched: tuple  # the fields the study searched
    tied: tuple  # the fields that followed them
    tuned_from: dict  # study, storage, trial, value, metric, profile, seed (the rows' `tuned_from`)


def choose(study) -> Chosen | None:
    """The best finished trial's settings of a :class:`~benchmarks.tuning.study.Study`, or None when no trial
    finished."""
    finished = [t for t in study.optuna.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if not finished:
        study.context.log(f"{study.name}: no trial finished; no settings chosen")
        return None
    best = max(finished, key=lambda t: (t.value, -t.number))
    context = study.context
    config = resolve(study.model, study.dataset, context.options.profile, tuple(best.user_attrs["overrides"]),
                     context.overlays)
    metric, protocol = selection_metric(Job(study.dataset, study.model, 0), study.base)
    tuned_from = {"study": study.name, "storage": shown_storage(context.storage), "trial": best.number,
                  "value": best.value, "metric": f"{metric} under {protocol}", "profile": context.options.profile,
                  "seed": context.settings.seeds[0]}
    return Chosen(study.dataset, study.model, config, tuple(study.space.dimensions),
                  tuple(t for t in study.space.tied if t not in study.space.dimensions), tuned_from)


def _toml_key(name: str) -> str:
    """A TOML key: bare when it can be (``ml-1m``), else quoted (``"gru4rec+"``)."""
    return name if name and all(c.isalnum() or c in "-_" for c in name) else toml_value(name)


def tuned_toml(chosen: list[Chosen], command: list[str] | None = None, budget: tuple = ()) -> str:
    """The chosen settings as a ``--config`` file: every model and trainer setting of each (dataset, model), so
    that the file alone reproduces the best trial (under any profile), and the ``tuned_from`` table its rows
    carry. Its header says what the settings were tuned for: the profile and the per-trial ``budget``."""
    profile, spent = chosen[0].tuned_from["profile"] if chosen else "?", " ".join(budget) or "the profile's own"
    lines = ["# Settings chosen on the validation split by python -m benchmarks.tune, one table per model and",
             "# dataset in the format of benchmarks/configs/ (use them with run_all.py or a study: --config FILE).",
             f"# Tuned for the {profile} profile's training (per-trial budget: {spent}): the best of the trials, the "
             f"defaults among",
             "# them, under that budget, which need not be the best for a longer or a shorter run.",
             f"# command: {shlex.join(command if command is not None else sys.argv)}"]
    for c in chosen:
        for section, values in (("model", dataclasses.asdict(c.config.model)),
                                ("train", dataclasses.asdict(c.config.train))):
            lines += ["", f"[{_toml_key(c.model)}.{section}.{_toml_key(c.dataset)}]"]
            for name, value in values.items():
                note = ("  # searched" if name in c.searched else "  # follows a searched setting" if name in c.tied
                        else "")
                lines.append(f"{name} = {toml_value(value)}{note}")
        lines += ["", f"[{_toml_key(c.model)}.tuned_from.{_toml_key(c.dataset)}]"]
        lines += [f"{name} = {toml_value(value)}" for name, value in c.tuned_from.items()]
    return "\n".join(lines) + "\n"


def study_summary(study) -> dict:
    """One :class:`~benchmarks.tuning.study.Study` as ``tuning.json`` keeps it for the report: every trial, the
    best, each parameter's importance."""
    trials = study.optuna.get_trials(deepcopy=False)
    keep = ("seconds", "cpu_seconds", "epochs_run", "stopped_by", "reused_from", "retry_of", "error", "interrupted",
            "defaults")
    # The defaults' trial's parameters are its values inside the space only; its row gives every searched field.
    rows = [{"number": t.number, "state": t.state.name.lower(), "value": t.value,
             "params": study.defaults() if t.user_attrs.get("defaults") else study.space.values(t.params),
             **{k: t.user_attrs[k] for k in keep if k in t.user_attrs}} for t in trials]
    complete = [row for row in rows if row["state"] == "complete"]
    best = max(complete, key=lambda row: (row["value"], -row["number"]), default=None)
    metric, protocol = selection_metric(Job(study.dataset, study.model, 0), study.base)
    settings = study.context.settings
    return {"study": study.name, "storage": shown_storage(study.context.storage), "dataset": study.dataset,
            "model": study.model, "objective": f"{metric} under {protocol}", "sampler": settings.sampler,
            "pruner": settings.pruner, "profile": study.context.options.profile, "seed": settings.seeds[0],
            "budget": list(settings.budget), "space": [d.text for d in study.space.dimensions.values()],
            "tied": study.space.tied, "target": study.target, "trials": rows, "best": best,
            "importances": importances(study.optuna, list(study.space.dimensions)),
            "cpu_seconds": sum(row.get("cpu_seconds") or 0.0 for row in rows)}


def importances(study, params: list[str]) -> dict[str, float]:
    """Each of ``params``' share of the variation of the objective over the finished trials of an Optuna study
    that have them all (PED-ANOVA where Optuna has it, which needs no scikit-learn); empty when there are too few
    trials to say."""
    evaluator = getattr(optuna.importance, "PedAnovaImportanceEvaluator", None)
    try:
        found = optuna.importance.get_param_importances(study, evaluator=evaluator() if evaluator else None,
                                                        params=params)
    except (ValueError, RuntimeError, ZeroDivisionError, ImportError):
        return {}
    return {name: float(value) for name, value in found.items() if math.isfinite(value)}


def write_summary(folder: Path, studies: list) -> None:
    """``tuning.json``: the studies of this folder (earlier invocations' studies kept)."""
    record_tuning_studies(folder, [study_summary(study) for study in studies])


def final_runs(chosen: list[Chosen], options: RunOptions, settings, config_file: Path, log=print) -> list:
    """The test split, touched once: the chosen settings (``tuned.toml``) and the default ones under the same
    budget and objective (``settings``, the search's :class:`~benchmarks.tuning.study.SearchSettings`), over every
    seed, as jobs of study ``tuning`` (variants ``tuned`` and ``default``)."""
    fixed = (*settings.budget, *settings.objective)
    tuned = [Job(c.dataset, c.model, seed, study=TUNING_STUDY, variant=TUNED, overrides=settings.overrides)
             for c in chosen for seed in settings.seeds]
    defaults = [Job(c.dataset, c.model, seed, study=TUNING_STUDY, variant=DEFAULT,
                    overrides=(*fixed, *settings.overrides)) for c in chosen for seed in settings.seeds]
    log(f"final runs: the chosen and the default settings of {len(chosen)} model(s) over {len(settings.seeds)} "
        f"seed(s), tested under {', '.join(options.protocols)}")
    with_chosen = dataclasses.replace(options, config_files=(*options.config_files, config_file))
    return [run_jobs(tuned, with_chosen, log=log), run_jobs(defaults, options, log=log)]
