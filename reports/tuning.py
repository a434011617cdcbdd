"""The tuning section of a report (``python -m benchmarks.tune``): each study's trials and best validation value,
the best value against the number of trials, each parameter's importance, and the test table of the default
against the chosen settings with paired significance over users, Holm-corrected for the number of comparisons in
the table. Read from ``tuning.json`` and the rows of study ``tuning``; Optuna is not needed to draw it.
"""
from __future__ import annotations

import json
from pathlib import Path

from recbench.benchmarks.store import DEFAULT, TUNED, TUNING_STUDY, read_results, read_tuning_studies
from recbench.reports import names
from recbench.reports.render import Cell, Table, fmt
from recbench.reports.results import ResultSet
from recbench.reports.stats import PerUser, summarize
from recbench.reports.tables import (
    RANKING,
    group,
    label,
    mark_significance,
    paired_test,
    significance_note,
    smoke_label,
    value_cell,
)


def _count(study: dict, state: str) -> int:
    return sum(trial["state"] == state for trial in study["trials"])


def best_so_far(study: dict) -> list[tuple[int, float]]:
    """(trial number, best value among finished trials up to it), from the first finished trial on."""
    points, best = [], None
    for trial in sorted(study["trials"], key=lambda t: t["number"]):
        if trial["state"] == "complete" and trial["value"] is not None:
            best = trial["value"] if best is None else max(best, trial["value"])
        if best is not None:
            points.append((trial["number"], best))
    return points


def studies_table(studies: list[dict]) -> Table | None:
    """One row per study: objective, sampler and pruner, trials by state, the best validation value and its
    trial, and the CPU-seconds the trials took."""
    if not studies:
        return None
    rows = []
    for study in studies:
        best = study.get("best") or {}
        rows.append([label(study["study"]), label(names.dataset_name(study["dataset"])),
                     label(names.model_name(study["model"])), label(study["objective"]),
                     label(f"{study['sampler']} / {study['pruner']}"), label(" ".join(study["budget"]) or "profile"),
                     Cell(str(_count(study, "complete")), _count(study, "complete")),
                     Cell(str(_count(study, "pruned")), _count(study, "pruned")),
                     Cell(str(_count(study, "fail")), _count(study, "fail")),
                     Cell(fmt(best.get("value")), best.get("value")),
                     Cell(str(best["number"]) if best else "–", best.get("number")),
                     Cell(f"{study['cpu_seconds']:.0f}", study["cpu_seconds"])])
    notes = ["Trials ran on the validation split only (the objective, under the study's validation protocol); the "
             "test split was evaluated once, by the final runs below. Pruned trials were stopped from their "
             "validation curve; failed ones include trials interrupted by a killed run and queued again.",
             "CPU-s: CPU-seconds of training and validation summed over the trials (all threads)."]
    return Table("tuning_studies", "Tuning studies (validation split)",
                 ["Study", "Dataset", "Model", "Objective", "Sampler / pruner", "Budget", "Finished", "Pruned",
                  "Failed", "Best", "Trial", "CPU-s"], rows, notes=notes)


def importance_table(studies: list[dict]) -> Table | None:
    """Each searched parameter's importance per study, and its value in the best trial."""
    rows, breaks = [], set()
    for study in studies:
        found = study.get("importances") or {}
        best = (study.get("best") or {}).get("params", {})
        if not found:
            continue
        breaks.add(len(rows))
        for name, value in sorted(found.items(), key=lambda item: -item[1]):
            chosen = best.get(name)
            rows.append([label(study["study"]), label(name), Cell(f"{value:.3f}", value),
                         label(f"{chosen:.4g}" if isinstance(chosen, float) else json.dumps(chosen))])
    if not rows:
        return None
    return Table("tuning_importance", "Parameter importance (validation split)",
                 ["Study", "Parameter", "Importance", "Best trial's value"], rows, breaks=breaks,
                 notes=["Importance: Optuna's PED-ANOVA, each parameter's share of the objective's variation among "
                        "the finished trials; with few trials a rough guide only."])


def default_vs_tuned_table(results: ResultSet, protocol: str, per_user: PerUser, alpha: float = 0.01) -> Table | None:
    """The final runs on the test split: the default and the chosen settings of each (dataset, model), per metric,
    with the relative change and paired significance marks, Holm-corrected over the table's comparisons."""
    rows = results.select(study=TUNING_STUDY, task=RANKING, protocol=protocol, variant=(DEFAULT, TUNED))
    if not rows:
        return None
    by_key = group(rows, "dataset", "model", "variant")
    pairs = list(dict.fromkeys((r.dataset, r.model) for r in rows))
    table_rows, breaks, tests, untested = [], set(), [], []
    for dataset, model in pairs:
        seeds = {variant: by_key.get((dataset, model, variant), []) for variant in (DEFAULT, TUNED)}
        breaks.add(len(table_rows))
        for metric in names.accuracy_metrics(m for r in rows if (r.dataset, r.model) == (dataset, model)
                                             for m in r.metrics):
            cells = {variant: value_cell(summarize(seeds[variant], metric)) for variant in seeds}
            found = [cell.value for cell in cells.values() if cell.value is not None]
            for cell in cells.values():
                cell.bold = len(found) == 2 and cell.value == max(found)
            tested = paired_test(per_user, cells, seeds, metric)
            if tested is False:
                untested.append(f"{dataset}/{model}")
            elif tested:
                tests.append((cells, *tested))
            before, after = cells[DEFAULT].value, cells[TUNED].value
            change = Cell() if not before or after is None else Cell(f"{100 * (after - before) / before:+.1f}%",
                                                                     (after - before) / before)
            table_rows.append([label(names.dataset_name(dataset)), label(names.model_name(model)), label(metric),
                               cells[DEFAULT], cells[TUNED], change])
    mark_significance(tests, alpha)
    smoke_title, smoke_notes = smoke_label(results, rows)
    notes = [*smoke_notes, f"Protocol {protocol}; test split. Default: the model's own settings; tuned: the settings "
             f"the study chose on validation (`tuned.toml`); both under the same trial budget and seeds.",
             significance_note(alpha, len(tests), "the default and the tuned settings")]
    if untested:
        notes.append(f"Not tested (per-user files missing): {', '.join(dict.fromkeys(untested))}.")
    return Table(f"tuning_test_{protocol}", f"Default against tuned settings, protocol {protocol}{smoke_title}",
                 ["Dataset", "Model", "Metric", "Default", "Tuned", "Δ%"], table_rows, notes=notes, breaks=breaks)


def tuning_tables(results: ResultSet, protocols: list[str], per_user: PerUser, alpha: float) -> list[Table]:
    studies = read_tuning_studies(results.folder)
    built = [studies_table(studies), importance_table(studies)]
    built += [default_vs_tuned_table(results, protocol, per_user, alpha) for protocol in protocols]
    return [table for table in built if table is not None]


def tuning_console(folder: Path) -> str:
    """A short text for the end of ``python -m benchmarks.tune``: each study's best, and the final runs' NDCG@10
    by protocol (default → tuned)."""
    lines = []
    for study in read_tuning_studies(folder):
        best = study.get("best") or {}
        lines.append(f"{study['study']}: best {study['objective']} {fmt(best.get('value'))} (trial "
                     f"{best.get('number', '–')}; {_count(study, 'complete')} finished, {_count(study, 'pruned')} "
                     f"pruned, {_count(study, 'fail')} failed; {study['cpu_seconds']:.0f} CPU-s)")
    rows = read_results(Path(folder) / "results.jsonl")
    finals = [r for r in rows if r.get("study") == TUNING_STUDY and r.get("variant") in (DEFAULT, TUNED)]
    for dataset, model, protocol in dict.fromkeys((r["dataset"], r["model"], r["protocol"]) for r in finals):
        values = {}
        for variant in (DEFAULT, TUNED):
            found = [r["metrics"]["NDCG@10"] for r in finals if "NDCG@10" in r["metrics"]
                     and (r["dataset"], r["model"], r["protocol"], r["variant"]) == (dataset, model, protocol, variant)]
            values[variant] = fmt(sum(found) / len(found)) if found else "–"
        lines.append(f"  test {dataset}/{model} {protocol}: NDCG@10 default {values[DEFAULT]} -> tuned "
                     f"{values[TUNED]}")
    return "\n".join(lines)
