"""The reproduction's reference files: the converge-profile results of ``run_all.py`` on each dataset, with the
commands that wrote them, as a table beside the paper and a figure of the Transformers' validation curves.

    python -m benchmarks.experiments.converge_reference results/converge-ml-1m results/converge-beauty

For each results folder (one dataset, ``--profile converge``) it writes ``results/reference/converge-<dataset>.json``:
every invocation of ``manifest.jsonl`` that trained a job of the folder (time, command, commit), one summary per model
over its seeds (test NDCG@10 and HR@10 under ``pop100`` and ``full``, mean and std; epochs, best epoch, training
hours, precision, patience, why each seed stopped and where half its patience would have stopped it, read off its own
curve: :func:`shorter_patience`) and the rows themselves, validation curves included. From the folders, and the
reference files of the datasets not given, it writes ``results/reference/converge/reproduced.{md,tex}`` and prints its
table (it writes no document: ``python -m reports`` reads the reference files): our pop100 NDCG@10 and HR@10
beside the published row each is held against (the report's own rule, :func:`reports.tables.published_anchor`: Table
5's default row for BERT4Rec at d = 64, its HR@10 from Table 4's column of the same configuration; Table 2 otherwise)
and their ratio, our full-ranking NDCG@10, and whether early stopping ended every seed (a run that a budget or a cap
ended has not converged, and the table says so).
``converge/curves_<dataset>.png`` draws validation NDCG@10 against epochs and training seconds for SASRec, SASRec-CE
and BERT4Rec (the report's curve figure), with the rows chosen on validation (below) beside them. A folder of bf16
rows, or of rows trained with settings other than the profile's (a diagnosis run's ``--set``), is refused in one
line, so that it never overwrites the reference of the profile's own runs.

The paper chose dropout and the ℓ2 weight on validation (§4.3) while the profile keeps the authors' configuration. A
folder of converge runs that differ from the profile only there (``--set bert4rec:dropout=0.1`` and the like) becomes
a row of its own, labelled with its settings, under ``--chosen-on-validation FOLDER``, and only where validation
chooses it: its mean best validation NDCG@10 is above the profile row's over the same seeds (every seed of the profile
row, each run to its end). Otherwise it is refused in one line with both means. Its rows go to
``results/reference/chosen-on-validation-<dataset>.json``, and the rule is checked again against the profile's
current rows whenever the table is written:

    python -m benchmarks.experiments.converge_reference results/converge-ml-1m \\
        --chosen-on-validation results/probe-ml-1m-dropout

The results folders are git-ignored and the reference files are what a clone has. ``--restore`` turns a reference file
back into the folder it was written from (its rows and the manifest lines of its invocations, and the rows' per-user
files, which the report's paired tests over users read: each reference keeps those its folder still held in
``results/reference/per-user/<reference's name>/``; checkpoints are not kept), into an empty folder or one where a run
has started without finishing a job, so that a fresh clone adds seeds or models to the committed rows with ``run_all.py
... --resume``, which skips the jobs already there, and this command then rewrites the reference with all of them:

    python -m benchmarks.experiments.converge_reference --restore results/reference/converge-ml-1m.json \\
        results/converge-ml-1m

A folder that is not a reference of the table (a probe's, a ``--chosen-on-validation`` candidate's whose other seed
still runs, a bf16 comparison's) is kept the same way with ``--keep FOLDER``: its rows and invocations, whatever their
settings, go to ``results/reference/rows-<folder's name>.json``, which ``--restore`` turns back into the folder. Keep
each run's rows as it finishes: a machine lost with its work tree then costs the unfinished runs only.

A reference row restored without its per-user files (kept before the files were) gets them from a retraining of the
same job, ``--retraced FOLDER``: a row of the folder with the same key (or the key of the run a study's row reused:
Table 5's default is the main grid's run), seed, protocol and split lends its per-user file to every reference file
in ``--output`` that holds the row, where its metrics equal the stored ones to the last
digit (a CPU run retraces bit for bit on the same kind of machine and thread count). A row whose metrics differ is
named in one line with both values and left as it is; ``--replace`` puts the retrained row in its place instead, its
own metrics, curve and device, with the replaced row's metrics, device and commit kept under ``replaced``:

    python -m benchmarks.experiments.converge_reference --retraced results/retrain-ml-1m
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from recbench.benchmarks.config import resolve
from recbench.benchmarks.estimate import reference_path, reference_paths
from recbench.benchmarks.store import ResultStore, now, read_results, write_atomic
from recbench.benchmarks.trainer import improves, patience_spent
from recbench.models import is_registered
from recbench.reports import names
from recbench.reports.figures import curve_figures
from recbench.reports.published import load_published
from recbench.reports.render import Cell, Table, fmt, write_table
from recbench.reports.results import ResultsError, ResultSet, load_results, row_settings, settings_differing
from recbench.reports.stats import summarize
from recbench.reports.tables import label, paper_value, value_cell

ROOT = Path(__file__).resolve().parents[2]
TRANSFORMERS = ("sasrec", "sasrec-ce", "bert4rec")
METRICS = ("NDCG@10", "HR@10")
CONVERGED = "early stopping"
# What the paper tuned on validation (§4.3: dropout and the ℓ2 weight; also d, which the profile keeps at the authors'
# 64, the d of Table 5's rows): the settings in which a row chosen on validation may differ from the profile's.
VALIDATION_GRID = ("dropout", "attention_dropout", "weight_decay")


def chosen_path(folder: Path, dataset: str) -> Path:
    """The reference file of ``dataset``'s rows chosen on validation (``--chosen-on-validation``) in ``folder``."""
    return Path(folder) / f"chosen-on-validation-{dataset}.json"


def invocations(folder: Path, keys: set[str]) -> list[dict]:
    """The ``start`` lines of the folder's manifest that planned one of ``keys``: when, what and from which
    commit; a resumed job appears under every invocation that trained it."""
    found = []
    for line in (folder / "manifest.jsonl").read_text().splitlines():
        entry = json.loads(line)
        jobs = [job["run_id"] for job in entry.get("jobs", []) if job["key"] in keys and job["action"] == "run"]
        if entry.get("event") == "start" and jobs:
            found.append({"time": entry["time"], "command": " ".join(["python", *entry["command"]]),
                          "commit": entry["commit"], "cwd": entry.get("cwd"), "jobs": jobs})
    return sorted(found, key=lambda run: run["time"])  # a restore appends earlier invocations after later ones


def shorter_patience(curve: list[dict], metric: str, patience: int) -> dict | None:
    """Where early stopping with ``patience`` would have ended a run whose validation ``curve`` (the row's, one
    entry per epoch, ``valid_<metric>`` where validated) went on longer: the trainer's rule replayed on it. None
    where the curve never waits that long. With the same seed that run would have followed this curve exactly, as a
    CPU run does."""
    best, best_epoch, bad = float("-inf"), 0, 0
    for entry in curve:
        value = entry.get(f"valid_{metric}")
        if value is None:
            continue
        if improves(value, best):
            best, best_epoch, bad = value, entry["epoch"], 0
        else:
            bad += 1
            if patience_spent(bad, patience):
                return {"stop_epoch": entry["epoch"], "best_epoch": best_epoch, "best_valid": round(best, 4)}
    return None


def model_summary(rows: list) -> dict:
    """One model of one folder over its seeds (``rows``: every protocol's row of every seed)."""
    runs = {row.seed: row for row in rows if row.protocol == "full"}
    summary = {"model": rows[0].model, "seeds": sorted(runs),
               "precision": sorted({row.get("precision", "fp32") for row in runs.values()}),
               "stopped_by": {seed: row.get("stopped_by") for seed, row in runs.items()},
               "converged": (None if all(row.get("epochs_run") == 0 for row in runs.values())  # POP: no training
                             else all(row.get("stopped_by") == CONVERGED for row in runs.values())),
               "epochs_run": {seed: row.get("epochs_run") for seed, row in runs.items()},
               "patience": {seed: (row.get("train_settings") or {}).get("patience") for seed, row in runs.items()},
               # what half the patience would have given, from each seed's own validation curve
               "half_patience": {seed: shorter_patience(row.get("curve") or [], train["valid_metric"],
                                                         train["patience"] // 2)
                                 for seed, row in runs.items()
                                 if ((train := row.get("train_settings") or {}).get("patience") or 0) >= 2},
               "best_epoch": {seed: row.get("best_epoch") for seed, row in runs.items()},
               "train_hours": {seed: round((row.get("train_seconds") or 0.0) / 3600, 2) for seed, row in runs.items()}}
    for protocol in ("pop100", "full"):
        chosen = [row for row in rows if row.protocol == protocol]
        for metric in METRICS:
            result = summarize(chosen, metric)
            if result is not None:
                summary[f"{protocol} {metric}"] = {"mean": round(result.mean, 4), "std": None if result.std is None
                                                   else round(result.std, 4), "n": result.n}
    return summary


def settings_off_profile(row, dataset: str) -> list[str]:
    """The model and trainer settings of ``row`` that differ from the converge profile's for its model on
    ``dataset`` (precision aside: a bf16 folder is refused on its own), such as a diagnosis run's ``--set``."""
    if not is_registered(row.model):  # a user's model has no profile settings of the suite's
        return []
    return [name for name in settings_differing(row.raw, resolve(row.model, dataset, "converge"))
            if name != "precision"]


def chosen_settings(rows: list, dataset: str) -> dict:
    """The settings, off the converge profile's, with which every seed of one model in ``rows`` ran; ValueError
    (its one line) where there are none, where one lies outside :data:`VALIDATION_GRID` or where seeds differ."""
    runs = [row for row in rows if row.protocol == "full"]
    model = runs[0].model
    found = {tuple((name, row_settings(row.raw)[name]) for name in settings_off_profile(row, dataset))
             for row in runs}
    if len(found) != 1:
        raise ValueError(f"{model}: its seeds ran with different settings ({sorted(map(dict, found), key=str)}); "
                         f"one setting of the grid per folder")
    settings = dict(found.pop())
    if not settings or set(settings) - set(VALIDATION_GRID):
        raise ValueError(f"{model}: settings other than the profile's {sorted(settings) or 'none'}; a row chosen on "
                         f"validation differs from the profile only in {', '.join(VALIDATION_GRID)} (the paper's "
                         f"validation grid, §4.3)")
    return {name: settings[name] for name in VALIDATION_GRID if name in settings}


def chosen_label(rows: list, dataset: str) -> str:
    """How the table and the curves name one model's rows chosen on validation: the model and its settings."""
    settings = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in chosen_settings(rows, dataset).items())
    return f"{names.model_name(rows[0].model)}, {settings}"


def transformer_curves(profile: ResultSet, chosen: ResultSet | None, dataset: str) -> ResultSet:
    """The rows whose validation curves ``converge/curves_<dataset>`` draws: the profile's Transformers and, beside
    them, the Transformers chosen on validation, each renamed to its label (:func:`chosen_label`) so that the
    figure gives it a line colour and legend entry of its own, as it does a user's model."""
    rows = profile.select(model=TRANSFORMERS)
    for model in sorted(chosen.values("model") & set(TRANSFORMERS)) if chosen else ():
        variant = chosen.select(model=model, study="main")
        rows += [replace(row, model=chosen_label(variant, dataset)) for row in variant]
    return ResultSet(profile.folder, rows, profile.config)


def validation_choice(variant: list, profile: list) -> dict:
    """The rule a row chosen on validation passes: over the seeds of the profile's row (``profile``, its rows of one
    model), the variant (``variant``: rows of the same model and seeds) has the higher mean best validation value,
    each seed's ``best_valid`` at the end of its run. ValueError (its one line) where the seeds differ or it does
    not; else both means and each seed's value."""
    ours = {row.seed: row.get("best_valid") for row in variant if row.protocol == "full"}
    theirs = {row.seed: row.get("best_valid") for row in profile if row.protocol == "full"}
    model, metric = variant[0].model, variant[0].get("valid_metric", "the validation metric")
    if not theirs:
        raise ValueError(f"{model}: the profile has no row of it on this dataset to be chosen over")
    if sorted(ours) != sorted(theirs):
        raise ValueError(f"{model}: seeds {sorted(ours)} against the profile row's {sorted(theirs)}; run the "
                         f"profile row's seeds, so that both are compared over the same ones")
    mean, profile_mean = float(np.mean(list(ours.values()))), float(np.mean(list(theirs.values())))
    choice = {"valid_metric": metric, "seeds": sorted(ours), "mean_best_valid": round(mean, 4),
              "profile_mean_best_valid": round(profile_mean, 4),
              "best_valid": {seed: round(value, 4) for seed, value in sorted(ours.items())},
              "profile_best_valid": {seed: round(value, 4) for seed, value in sorted(theirs.items())}}
    if not mean > profile_mean:
        raise ValueError(f"{model}: mean best validation {metric} {mean:.4f} over seeds {sorted(ours)} against the "
                         f"profile's {profile_mean:.4f}; validation keeps the profile's settings")
    return choice


def table_row(rows: list, published: list, model_label: str) -> list[Cell]:
    """One model of one dataset over its seeds (``rows``, both protocols): ours against the paper on pop100, our
    full ranking, best epochs, hours and convergence."""
    pop100 = [row for row in rows if row.protocol == "pop100"]
    full = [row for row in rows if row.protocol == "full"]
    cells = [label(names.dataset_name(pop100[0].dataset)), label(model_label), Cell(str(len(pop100)), len(pop100))]
    sources = []
    for metric in METRICS:
        ours = summarize(pop100, metric)
        paper, where = paper_value(pop100[0], published, metric)
        if where and where not in sources:
            sources.append(where if not sources else f"{metric}: {where}")
        ratio = ours.mean / paper if ours is not None and paper else None
        cells += [value_cell(ours), Cell(fmt(paper), paper), Cell(f"{ratio:.2f}" if ratio is not None else "–", ratio)]
    summary = model_summary(rows)
    epochs = [summary["best_epoch"][seed] for seed in summary["seeds"]]
    hours = list(summary["train_hours"].values())
    return cells + [value_cell(summarize(full, "NDCG@10")), label("; ".join(sources)),
                    Cell("/".join(str(e) for e in epochs), float(np.mean(epochs)) if epochs else None),
                    Cell(f"{np.mean(hours):.1f}" if hours else "–", float(np.mean(hours)) if hours else None),
                    label({None: "no training", True: "yes"}.get(summary["converged"], "no: " + ", ".join(
                        sorted({str(s) for s in summary["stopped_by"].values()}))))]


def reproduced_table(results: list[ResultSet], published: list, chosen: dict[str, ResultSet] | None = None) -> Table:
    """Every model of every folder: ours against the paper on pop100, our full ranking, and convergence; after
    each dataset's profile rows, its rows chosen on validation (``chosen``: {dataset: their results}), labelled
    with their settings."""
    table_rows, breaks = [], set()
    for result in results:
        breaks.add(len(table_rows))
        dataset = result.values("dataset").pop()
        for source, label_of in ((result, lambda rows: names.model_name(rows[0].model)),
                                 ((chosen or {}).get(dataset), lambda rows: chosen_label(rows, dataset))):
            for model in names.order_models(source.values("model")) if source else ():
                rows = source.select(model=model, study="main")
                if any(row.protocol == "pop100" for row in rows):
                    table_rows.append(table_row(rows, published, label_of(rows)))
    notes = ["Ours: test metrics, mean ± std over the seeds (n), converge profile (models/fidelity.md), the "
             "precision each file records; paper: Sun et al. (2019), the row each of ours is held against "
             "(BERT4Rec at d = 64: Table 5's default row, which gives NDCG@10 only, and for HR@10 Table 4's column at "
             "the dataset's N, the same configuration: its NDCG@10 is Table 5's; the others: Table 2); "
             "–: no published value (LSTM and SASRec-CE are not in the paper). "
             "pop100: 100 negatives sampled by popularity, the paper's protocol; full: every item ranked. "
             "Best epoch per seed; training hours on 2 CPU cores, one thread per job. Converged: early stopping "
             "on validation NDCG@10 ended every seed."]
    if chosen:
        notes.append("A model named with settings ran the profile with those settings, chosen on validation as the "
                     "paper chose dropout and the ℓ2 weight (§4.3): its mean best validation NDCG@10 was above the "
                     "profile row's over the same seeds (chosen-on-validation-<dataset>.json).")
    return Table("reproduced", "Reproduced here: the converge profile against the paper",
                 ["Dataset", "Model", "Seeds", "NDCG@10", "Paper", "Ratio", "HR@10", "Paper", "Ratio",
                  "Full NDCG@10", "Paper row", "Best epoch", "Hours", "Converged"],
                 table_rows, notes=notes, align="llrrrrrrrrlrrl", breaks=breaks)


def restore(reference: Path, folder: Path) -> int:
    """Fill ``folder`` with what ``reference`` (a file this module wrote) was made from: ``results.jsonl`` with its rows
    as they are, in ``manifest.jsonl`` one start line per invocation (its time, command and commit) and a line saying
    where they came from, and the per-user files kept with it (:func:`restore_per_user`). A run already started in the
    folder (``--resume`` launched before the restore) keeps its manifest lines and adds its rows after these. Refused in
    one line where the folder holds rows."""
    try:
        written = json.loads(reference.read_text())
        rows, runs = written["rows"], written["invocations"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        sys.exit(f"{reference}: not a reference file of this module ({type(error).__name__}: {error}); pass "
                 f"results/reference/converge-<dataset>.json")
    keys = {row["run_id"]: row["key"] for row in rows}
    manifest = [{"event": "start", "time": run["time"], "command": run["command"].split(" ")[1:],
                 "commit": run["commit"], "cwd": run.get("cwd"),
                 "jobs": [{"key": keys[run_id], "run_id": run_id, "action": "run"} for run_id in run["jobs"]]}
                for run in runs]
    manifest.append({"event": "restore", "time": now(), "from": str(reference), "rows": len(rows)})
    try:
        adopt(ResultStore(folder), rows, manifest)
    except ValueError as error:  # its results.jsonl is not JSON Lines: the line to fix
        sys.exit(str(error))
    except FileExistsError:
        sys.exit(f"{folder} already holds results.jsonl; --restore fills a folder without rows, so pass an empty one "
                 f"(or one whose run has not finished a job yet)")
    restore_per_user(rows, reference, folder)
    return len(rows)


def adopt(store: ResultStore, rows: list[dict], manifest: list[dict]) -> None:
    """Fill ``store``'s folder, which holds no rows yet, with rows written elsewhere (a reference file's) and the
    manifest lines that say where they came from, appended under the folder's lock: a run started in the folder
    beforehand keeps its own lines and writes its rows after these. Refused (FileExistsError) where the folder already
    holds rows; a ``results.jsonl`` that is not JSON Lines is the ValueError of ``read_results``."""
    with store.locked():
        if read_results(store.path):
            raise FileExistsError(f"{store.path} already holds results; adopting rows needs a folder without any")
        write_atomic(store.path, "".join(json.dumps(row) + "\n" for row in rows))
        for entry in manifest:
            store.append_manifest(entry)


def per_user_copies(reference: Path) -> Path:
    """Where the per-user files of ``reference``'s rows are kept: ``per-user/<its name>/`` beside it."""
    return reference.parent / "per-user" / reference.stem


def keep_per_user(rows: list[dict], folder: Path, reference: Path) -> str:
    """Copy the per-user files of ``rows`` that ``folder`` still holds to :func:`per_user_copies` of ``reference``:
    the report's paired tests over users read them, and the folder is lost with its machine. Copies of rows the
    reference no longer holds (a job run again under another key) are removed, so that the copies follow the rows
    instead of only growing. Says how many."""
    copied, missing, copies = 0, [], per_user_copies(reference)
    names = {Path(row["per_user_file"]).name for row in rows if row.get("per_user_file")}
    for row in rows:
        name = row.get("per_user_file")
        if name and (folder / name).is_file():
            write_atomic(copies / Path(name).name, (folder / name).read_bytes())
            copied += 1
        elif name and not (copies / Path(name).name).is_file():  # nor kept before
            missing.append(Path(name).name)
    stale = [path for path in copies.glob("*") if path.is_file() and path.name not in names] if copies.is_dir() else []
    for path in stale:
        path.unlink()
    return (f"{copied} per-user files kept" + (f", {len(missing)} missing from the folder" if missing else "")
            + (f", {len(stale)} of rows no longer in the reference removed" if stale else ""))


def restore_per_user(rows: list[dict], reference: Path, folder: Path) -> int:
    """Put back the per-user files :func:`keep_per_user` kept for ``rows``, where the folder lacks them."""
    restored = 0
    for row in rows:
        name = row.get("per_user_file")
        kept = per_user_copies(reference) / Path(name).name if name else None
        if kept is not None and kept.is_file() and not (folder / name).exists():
            write_atomic(folder / name, kept.read_bytes())
            restored += 1
    return restored


def table_lines(markdown: str) -> list[str]:
    """The lines of the first Markdown table in ``markdown`` (the block of lines that start with ``|``)."""
    lines = markdown.splitlines()
    start = next(number for number, line in enumerate(lines) if line.startswith("|"))
    end = next((number for number in range(start, len(lines)) if not lines[number].startswith("|")), len(lines))
    return lines[start:end]


def load_converge(folder: Path) -> tuple[str, ResultSet]:
    """The dataset and results of a folder of converge-profile fp32 runs of one dataset; SystemExit (its one line)
    for anything else."""
    try:
        result = load_results(folder)
    except ResultsError as error:
        sys.exit(str(error))
    datasets = result.values("dataset")
    profiles = {result.profile(row) for row in result.rows}
    if len(datasets) != 1 or profiles != {"converge"}:
        sys.exit(f"{folder}: expected the rows of one dataset under --profile converge, found datasets "
                 f"{sorted(datasets)} and profiles {sorted(map(str, profiles))}")
    if {row.get("precision") for row in result.rows} - {"fp32", None}:
        sys.exit(f"{folder}: holds bf16 rows; the reproduction's reference files are the fp32 runs, and "
                 f"python -m benchmarks.experiments.precision_quality compares a bf16 folder with them")
    return datasets.pop(), result


def check_chosen(variants: ResultSet, profile: ResultSet, dataset: str, source: Path) -> dict:
    """{model: its validation choice} for every model of ``variants`` against the profile's rows of ``dataset``;
    SystemExit (its one line, naming ``source``) where one is not chosen."""
    choices = {}
    for model in names.order_models(variants.values("model")):
        rows = variants.select(model=model, study="main")
        try:
            choices[model] = {"settings": chosen_settings(rows, dataset),
                              **validation_choice(rows, profile.select(model=model, study="main"))}
        except ValueError as error:
            sys.exit(f"{source}: {error}")
    return choices


def keep(folder: Path, output: Path) -> Path:
    """Write every row of ``folder`` and the invocations that trained them to ``output/rows-<folder's name>.json``,
    with the rows' per-user files (:func:`keep_per_user`), which :func:`restore` turns back into the folder."""
    rows = ResultStore(folder).rows  # none where the folder or its results.jsonl does not exist
    if not rows:
        sys.exit(f"{folder}: no results.jsonl rows to keep; pass the results folder of a run that finished a job")
    path = Path(output) / f"rows-{folder.name}.json"
    kept = {"folder": str(folder), "invocations": invocations(folder, {row["key"] for row in rows}), "rows": rows}
    write_atomic(path, json.dumps(kept, indent=1) + "\n")
    print(f"written: {path} ({len(rows)} rows; {keep_per_user(rows, folder, path)})")
    return path


def _twin_key(row: dict, key: str | None = None) -> tuple:
    return key or row.get("key"), row.get("seed"), row.get("protocol"), row.get("split"), row.get("task")


def _twins(row: dict, twins: dict) -> dict | None:
    """The retrained row of ``row``'s job: of its own key, or of the job it reused (a study's default row is the
    main grid's run of the same settings, ``reused_from``)."""
    reused = (row.get("reused_from") or {}).get("key") if isinstance(row.get("reused_from"), dict) else None
    return twins.get(_twin_key(row)) or (twins.get(_twin_key(row, reused)) if reused else None)


# What names a row in its reference file; a retrained row that replaces it takes everything else.
IDENTITY = ("key", "run_id", "study", "variant", "sweep", "per_user_file", "attention_file", "reused_from")


def _difference(stored: dict, retraced: dict) -> str:
    """How a retrained row's metrics part from the stored ones, in one short clause: NDCG@10 both ways, how many
    metrics differ and the largest relative difference among those both sides have."""
    differ = [metric for metric, value in retraced.items() if stored.get(metric) != value]
    relative = {metric: abs(retraced[metric] / stored[metric] - 1) for metric in differ
                if isinstance(stored.get(metric), float) and isinstance(retraced[metric], float) and stored[metric]}
    largest = max(relative, key=relative.get, default=None)
    return (f"NDCG@10 {stored.get('NDCG@10')!r} stored, {retraced.get('NDCG@10')!r} retraced; {len(differ)} of "
            f"{len(retraced)} metrics differ" + (f", the most {relative[largest]:.2%} ({largest})" if largest else ""))


def retraced(folder: Path, output: Path, replace: bool = False) -> list[str]:
    """Give each row of the reference files in ``output`` that lacks its per-user file the file of ``folder``'s row
    of the same job (:func:`_twins`), seed, protocol and split, where the metrics agree (with ``replace``, wherever
    they do not too: the folder's measurements take the stored row's place under its names, the stored metrics,
    device and commit under ``replaced``). Returns one line per row whose metrics differ and was left as it was."""
    twins = {_twin_key(row): row for row in ResultStore(folder).rows
             if row.get("per_user_file") and (folder / row["per_user_file"]).is_file()}
    if not twins:
        sys.exit(f"{folder}: no rows with per-user files to lend; pass the folder of a finished retraining")
    differing, adopted = [], 0
    for path in sorted(Path(output).glob("*.json")):
        kept = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(kept, dict) or not isinstance(kept.get("rows"), list):
            continue
        copies, changed = per_user_copies(path), False
        for number, row in enumerate(kept["rows"]):
            name = row.get("per_user_file") or None
            twin = _twins(row, twins)
            if twin is None or (name and (copies / Path(name).name).is_file()):
                continue
            same = twin["metrics"] == row["metrics"]
            if not same and not replace:
                differing.append(f"{path.name}: {row.get('run_id')} {row.get('protocol')}: "
                                 f"{_difference(row['metrics'], twin['metrics'])}")
                continue
            name = name or twin["per_user_file"]
            kept["rows"][number] = ({**row, "per_user_file": name} if same else
                                    {**twin, **{field: row[field] for field in IDENTITY if field in row},
                                     "per_user_file": name,
                                     "replaced": {field: row.get(field) for field in ("metrics", "device", "commit")}})
            write_atomic(copies / Path(name).name, (folder / twin["per_user_file"]).read_bytes())
            changed, adopted = True, adopted + 1
        if changed:
            write_atomic(path, json.dumps(kept, indent=1) + "\n")
    print(f"{adopted} reference rows took their per-user files from {folder}"
          + (f"; {len(differing)} left as they were, their metrics differ" if differing else ""))
    return differing


def write_reference(path: Path, dataset: str, folder: Path, command: str, result: ResultSet, **extra) -> None:
    """Write one reference file (see the module's docstring) of ``result``, read from ``folder``."""
    keys = {row.get("key") for row in result.rows}
    summaries = [model_summary(result.select(model=model, study="main"))
                 for model in names.order_models(result.values("model"))]
    write_atomic(path, json.dumps({
        "dataset": dataset, "profile": "converge", "folder": str(folder), "command": command, **extra,
        "invocations": invocations(folder, keys), "summary": summaries,
        "rows": [row.raw for row in result.rows]}, indent=1) + "\n")
    print(f"written: {path} ({len(summaries)} models; {keep_per_user([row.raw for row in result.rows], folder, path)})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", type=Path, help="results folders of run_all.py --profile converge")
    parser.add_argument("--chosen-on-validation", dest="chosen", type=Path, action="append", default=[],
                        metavar="FOLDER", help="a folder of converge runs that differ from the profile only in "
                        "dropout or weight decay: a row of its own where validation chooses it (see above)")
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "reference")
    parser.add_argument("--restore", type=Path, metavar="REFERENCE",
                        help="write the one folder given from this reference file instead (see above)")
    parser.add_argument("--keep", type=Path, metavar="FOLDER",
                        help="write FOLDER's rows, whatever their settings, to rows-<its name>.json (see above)")
    parser.add_argument("--retraced", type=Path, metavar="FOLDER",
                        help="lend the per-user files of FOLDER's retrained rows to the reference rows of the same "
                             "jobs that lack them, where the metrics agree (see above)")
    parser.add_argument("--replace", action="store_true",
                        help="with --retraced: a retrained row whose metrics differ replaces the stored one")
    args = parser.parse_args(argv)
    if args.replace and args.retraced is None:
        parser.error("--replace goes with --retraced FOLDER")
    if args.retraced is not None:
        if args.folders or args.chosen or args.restore or args.keep:
            parser.error("--retraced reads one folder: pass no other folder, --chosen-on-validation, --restore or "
                         "--keep")
        differing = retraced(args.retraced, args.output, args.replace)
        print("\n".join(f"metrics differ, left as stored (--replace takes the retrained row): {line}"
                         for line in differing))
        return 1 if differing else 0
    if args.keep is not None:
        if args.folders or args.chosen or args.restore:
            parser.error("--keep writes one folder's rows: pass no other folder, --chosen-on-validation or --restore")
        keep(args.keep, args.output)
        return 0
    if args.restore is not None:
        if len(args.folders) != 1 or args.chosen:
            parser.error("--restore writes one folder: pass exactly one, and no --chosen-on-validation")
        rows = restore(args.restore, args.folders[0])
        files = len(list((args.folders[0] / "per_user").glob("*.npz")))
        print(f"restored: {args.folders[0]} ({rows} rows from {args.restore}, {files} per-user files)")
        return 0
    if not args.folders and not args.chosen:
        parser.error("pass the results folders to write references of")
    command = "python -m benchmarks.experiments.converge_reference " + " ".join(
        [*map(str, args.folders), *(f"--chosen-on-validation {folder}" for folder in args.chosen)])
    published, _ = load_published()
    loaded, chosen = {}, {}  # dataset: its profile results; dataset: its results chosen on validation
    for folder in args.folders:
        dataset, result = load_converge(folder)
        differing = sorted(f"{row.model} seed {row.seed}: {', '.join(fields)}" for row in result.rows
                           if row.protocol == "full" and (fields := settings_off_profile(row, dataset)))
        if differing:
            sys.exit(f"{folder}: rows trained with settings other than the converge profile's ({'; '.join(differing)});"
                     f" the reproduction's reference files hold the profile's own runs (a row whose dropout or weight"
                     f" decay validation chose: --chosen-on-validation)")
        loaded[dataset] = result
    with tempfile.TemporaryDirectory() as scratch:
        # the profile's rows of every dataset with a reference file, not only the folders given: the table covers
        # them all, and a row chosen on validation is checked against them
        others = {dataset: path for dataset, path in reference_paths(args.output).items()
                  if dataset in names.DATASETS and dataset not in loaded}
        profiles = dict(loaded)
        for dataset, path in others.items():
            restore(path, Path(scratch) / path.stem)
            profiles[dataset] = load_results(Path(scratch) / path.stem)
        given = {}  # dataset: (folder, results) of --chosen-on-validation
        for folder in args.chosen:
            dataset, result = load_converge(folder)
            if dataset in given:
                sys.exit(f"{folder}: a second --chosen-on-validation folder of {dataset} (the first: "
                         f"{given[dataset][0]}); pass the one folder of the settings validation chose")
            if dataset not in profiles:
                sys.exit(f"{folder}: no profile rows of {dataset} to be chosen over; pass its converge folder too")
            given[dataset] = folder, result
        for path in sorted(Path(args.output).glob(chosen_path("", "*").name)):  # rows chosen before: checked again
            dataset = path.stem.removeprefix(chosen_path("", "").stem)
            if dataset not in given and dataset in profiles:
                restore(path, Path(scratch) / path.stem)
                chosen[dataset] = load_results(Path(scratch) / path.stem)
                check_chosen(chosen[dataset], profiles[dataset], dataset, path)
        choices = {dataset: check_chosen(result, profiles[dataset], dataset, folder)
                   for dataset, (folder, result) in given.items()}  # every folder checked before any file is written
        for dataset, result in loaded.items():
            write_reference(reference_path(args.output, dataset), dataset, result.folder, command, result)
        for dataset, (folder, result) in given.items():
            write_reference(chosen_path(args.output, dataset), dataset, folder, command, result,
                            chosen_on_validation=choices[dataset])
            chosen[dataset] = result
        for dataset in names.order_datasets(loaded.keys() | given.keys()):
            curves = transformer_curves(profiles[dataset], chosen.get(dataset), dataset)
            for figure in curve_figures(curves, args.output / "converge").figures:
                print(f"written: {', '.join(map(str, figure.paths))}")
        ordered = [profiles[dataset] for dataset in names.order_datasets(profiles)]
        md, tex = write_table(reproduced_table(ordered, published, chosen), args.output / "converge")
    print(f"written: {md}, {tex}" + (f" (with {', '.join(path.name for path in others.values())})" if others else ""))
    print("\n".join(table_lines(md.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
