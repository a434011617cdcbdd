"""The account of the reproduction, written from the result files under ``results/reference/``.

    python -m reports --reproduction            # rewrite the generated blocks of README.md and results/REPRODUCTION.md
    python -m reports --reproduction --check    # exit 1 naming each block that differs from its files

A document holds a generated block between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``; the
text between them is :data:`BLOCKS`'s builder of ``NAME`` run on the reference folder, every table built by the
report's own code (``reports.tables``, ``reports.splits``) from the rows the files keep, and each block names the
files it read. The prose around a block interprets it; no figure is typed there. The figures a block shows are drawn
into ``results/figures/`` by the same command (``--check`` compares the text only).

The reference files (results/README.md lists them): ``converge-<dataset>.json``, the converge profile's rows of every
model; ``chosen-on-validation-<dataset>.json``, rows of a setting the paper chose on validation; ``rows-*.json`` and
``converge-<dataset>-<model>-patience<N>.json``, runs that changed one thing against the profile's rows;
``refit-gap-<dataset>-converge-<models>.json``, the profile's runs retrained on the validation item too;
``splits-<dataset>.json``, the models under leave-one-out and a global temporal split.
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy import stats

from recbench.benchmarks.store import LEAVE_ONE_OUT, write_atomic
from recbench.reports import anchors, claims, figures, losses, names, splits, tables
from recbench.reports.published import load_published
from recbench.reports.render import Cell, Table, fmt, to_markdown
from recbench.reports.results import ResultSet, Row, reference_results, row_settings
from recbench.reports.sampled import Expectations
from recbench.reports.stats import PerUser, holm, summarize
from recbench.reports.tables import label, value_cell

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference"
DOCUMENTS = (ROOT / "README.md", ROOT / "results" / "REPRODUCTION.md")
FIGURES = ROOT / "results" / "figures"
DATASETS = ("ml-1m", "beauty")  # the datasets the reproduction trained every model on
TRANSFORMERS = ("sasrec", "sasrec-ce", "bert4rec")  # the models whose validation curves the account draws
# A run beside the profile's rows that README's comparison shows as a row of its own, not as a probe.
CHOSEN = "chosen-on-validation-{dataset}.json"
# Files of runs that changed one thing against the profile: what was tried. The dropout probe's rows are the
# chosen-on-validation rows, shown in README's comparison.
PROBES = re.compile(r"(rows-probe-(?!ml-1m-dropout\b).*|rows-converge-.*|converge-.*-patience\d+)\.json")
REFITS = "refit-gap-*-converge-*.json"
LOSSES = "rows-study-losses-converge.json"  # the losses study's runs to early stopping (--keep of its folder)
LOSSES_SECTION = "beyond-the-paper-the-loss-and-the-direction"  # the reproduction document's section on losses
BLOCK = re.compile(r"<!-- generated: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- end generated: (?P=name) -->", re.S)


@lru_cache(maxsize=None)
def _load(path: Path) -> ResultSet:
    return reference_results(path)


def _source(paths) -> str:
    """How a block names the files it read: relative to the repository."""
    paths = [Path(path).resolve() for path in paths]
    return ", ".join(f"`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}`" for path in paths)


def _chosen(reference: Path, dataset: str) -> tuple[str, ResultSet] | None:
    """The rows chosen on validation for ``dataset`` with their label (model and settings), or None."""
    path = reference / CHOSEN.format(dataset=dataset)
    if not path.is_file():
        return None
    choice = json.loads(path.read_text(encoding="utf-8"))["chosen_on_validation"]
    (model, chosen), = choice.items()
    settings = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in chosen["settings"].items())
    return f"{names.model_name(model)}, {settings}", _load(path)


def _groups(reference: Path, protocol: str, with_chosen: bool = True) -> tuple[list[tuple[str, list[Row]]], list[Path]]:
    """Every model of the converge profile on each of :data:`DATASETS`, then (``with_chosen``) its rows chosen on
    validation, as (label, rows of ``protocol``) in the paper's order; and the files read."""
    groups, read = [], []
    for dataset in names.order_datasets(DATASETS):
        path = reference / f"converge-{dataset}.json"
        read.append(path)
        found = tables.group(_load(path).select(study="main", protocol=protocol), "model")
        groups += [(names.model_name(model), found[(model,)]) for model in names.order_models(m for m, in found)]
        chosen = _chosen(reference, dataset) if with_chosen else None
        if chosen:
            groups.append((chosen[0], chosen[1].select(study="main", protocol=protocol)))
            read.append(reference / CHOSEN.format(dataset=dataset))
    return groups, read


def _table_block(table: Table | None, read: list[Path]) -> str:
    if table is None:
        return f"No rows to show in {_source(read)}.\n"
    table.notes.append(f"Read from {_source(read)} by `python -m reports --reproduction`.")
    return to_markdown(table, title=False)


# ----------------------------------------------------------------------------------------------------- blocks

def paper_comparison(reference: Path) -> str:
    """README's summary: every model of the converge profile against the paper, with ratios."""
    groups, read = _groups(reference, tables.PUBLISHED_PROTOCOL)
    return _table_block(tables.ratio_table(groups, load_published()[0]), read)


GAPS_SECTION = "## Where ours and the paper part"  # the reproduction document's account of each gap


def _gap_headings() -> list[str]:
    """The headings under :data:`GAPS_SECTION` of the reproduction document, one per gap's account."""
    text = DOCUMENTS[1].read_text(encoding="utf-8")
    part = text[text.index(GAPS_SECTION):]
    return re.findall(r"^### (.+)$", part[:part.find("\n## ", len(GAPS_SECTION))], re.M)


def _gap_section(dataset: str, model: str, headings: list[str]) -> str:
    """The anchor of the account of a gap among :func:`_gap_headings`: the heading that names the model (and the
    dataset where a heading names one, "BERT4Rec on Beauty"), else the whole section."""
    named = [h for h in headings if names.model_name(model) in re.split(r"[\s,:]+", h)]
    on_dataset = [h for h in named if h.endswith(f" on {names.dataset_name(dataset)}")]
    generic = [h for h in named if not re.search(r" on \S+$", h)]
    heading = (on_dataset or generic or [GAPS_SECTION.lstrip("# ")])[0]
    return re.sub(r"[^\w\s-]", "", heading.lower()).strip().replace(" ", "-")


def gaps(reference: Path) -> str:
    """README's list of the rows further than :data:`GAP_BAND` from the paper's NDCG@10, each with whether the runs
    resolve it and a link to its account. The noise is a run's: the seed-to-seed spread of log NDCG@10, pooled over
    every row of the dataset with two seeds or more (one row's two seeds alone give a t-test of one degree of
    freedom, which resolves nothing); the published figure is taken to carry one run's noise of the same size. A
    t-test of our mean log value against the paper's, Holm over the gaps, says which are resolved, so that no gap
    reads as measured that the runs cannot tell from their own spread."""
    groups, read = _groups(reference, tables.PUBLISHED_PROTOCOL)
    published = load_published()[0]
    spread = {}  # dataset: (sum of squared deviations of log values, degrees of freedom)
    for _, rows in groups:
        logs = np.log([row.metrics["NDCG@10"] for row in rows])
        total, df = spread.get(rows[0].dataset, (0.0, 0))
        spread[rows[0].dataset] = (total + float(((logs - logs.mean()) ** 2).sum()), df + len(logs) - 1)
    found = []  # (dataset, model, label, ratio, p-value or None)
    for name, rows in groups:
        paper = tables.paper_value(rows[0], published, "NDCG@10")[0]
        logs = np.log([row.metrics["NDCG@10"] for row in rows])
        total, df = spread[rows[0].dataset]
        ratio = float(np.mean([row.metrics["NDCG@10"] for row in rows])) / paper if paper else None
        if ratio is None or abs(ratio - 1) <= GAP_BAND:
            continue
        t = (logs.mean() - np.log(paper)) / np.sqrt(total / df * (1 / len(logs) + 1)) if df else None
        found.append((rows[0].dataset, rows[0].model, name, ratio, 2 * stats.t.sf(abs(t), df) if df else None))
    adjusted = iter(holm([pvalue for *_, pvalue in found if pvalue is not None]))
    headings, lines = _gap_headings(), []
    for dataset, model, name, ratio, pvalue in found:
        if pvalue is None:
            verdict = "not tested: no row of its dataset has two seeds"
        else:
            p = next(adjusted)
            verdict = f"{'resolved' if p < GAP_ALPHA else 'not resolved'}, p = {p:.2g}"
        lines.append(f"- **{names.dataset_name(dataset)} {name}** {'below' if ratio < 1 else 'above'} the paper "
                     f"(ours / paper {ratio:.2f}): {verdict} "
                     f"([account](results/REPRODUCTION.md#{_gap_section(dataset, model, headings)})).")
    freedom = ", ".join(f"{names.dataset_name(d)} {df}" for d, (_, df) in sorted(spread.items()) if df)
    return (f"Where ours and the paper part by more than {GAP_BAND:.0%} on NDCG@10, and whether the runs resolve "
            f"each gap: a t-test of the row's mean log NDCG@10 against the published figure's, with a run's noise "
            f"pooled over the seeds of every row of the dataset (degrees of freedom: {freedom}) and the published "
            f"figure taken as one run of that noise, Holm over the gaps, α = {GAP_ALPHA:g}. An unresolved gap may be "
            f"a difference of seeds rather than of implementations; each account says what was measured about it "
            f"({_source(read)}).\n\n" + "\n".join(lines) + "\n")


def cost(reference: Path) -> str:
    """README's cost of the comparison: the training time of the reference runs of the paper's models (Table 2's)."""
    paper_models = {entry.model for entry in load_published()[0] if entry.table == "Table 2"}
    groups, read = _groups(reference, "full", with_chosen=False)  # one full-ranking row per training run
    runs = [rows for _, rows in groups if rows[0].model in paper_models]
    seconds = sum(row.get("train_seconds", 0.0) for rows in runs for row in rows)
    two_seeds = sum(2 * sum(row.get("train_seconds", 0.0) for row in rows) / len(rows) for rows in runs)
    devices = sorted({names.device_name(row.get("device")) for rows in runs for row in rows})
    return (f"Cost: the {sum(map(len, runs))} reference runs of the paper's {len({r[0].model for r in runs})} "
            f"models trained for {seconds / 3600:.0f} hours in all on {' and '.join(f'`{d}`' for d in devices)} "
            f"(`train_seconds` of the rows of {_source(read)}); two seeds of every model come to about "
            f"{two_seeds / 3600:.0f} hours. `--jobs N` trains N at once "
            "([the guide](benchmarks/GUIDE.md#running-a-large-grid)), and on a GPU a run takes minutes where a CPU "
            "takes hours.\n")


def runs(reference: Path) -> str:
    """How each run of the comparison ended: full ranking, best epochs, why training stopped, its hours."""
    full, read = _groups(reference, "full")
    table_rows, breaks, last = [], set(), None
    for name, rows in full:
        rows = sorted(rows, key=lambda row: row.seed)
        if rows[0].dataset != last:
            breaks.add(len(table_rows))
            last = rows[0].dataset
        stopped = sorted({str(row.get("stopped_by") or "no training") for row in rows})
        table_rows.append([label(names.dataset_name(rows[0].dataset)), label(name), Cell(str(len(rows)), len(rows)),
                           value_cell(summarize(rows, "NDCG@10")),
                           label("/".join(str(row.get("best_epoch", "–")) for row in rows)),
                           label("/".join(str(row.get("epochs_run", "–")) for row in rows)),
                           label("/".join(f"{row.get('train_seconds', 0.0) / 3600:.1f}" for row in rows)),
                           label(", ".join(stopped))])
    devices = sorted({names.device_name(row.get("device")) for _, rows in full for row in rows})
    notes = ["Protocol full (every item ranked), test split; mean ± sample standard deviation over the seeds. Best "
             "epoch, epochs run and training hours per seed (seed 0/seed 1); stopped by: what ended each seed's "
             f"training. Devices: {'; '.join(devices)}."]
    return _table_block(Table("runs", "How the runs ended", ["Dataset", "Model", "Seeds", "Full NDCG@10", "Best epoch",
                                                             "Epochs", "Hours", "Stopped by"], table_rows,
                              notes=notes, align="llrrrrrl", breaks=breaks), read)


def _curve_results(reference: Path) -> ResultSet:
    """The Transformers' rows of the comparison, a chosen row renamed to its label so that it gets a line of its own."""
    groups, _ = _groups(reference, "full")
    rows = [replace(row, model=row.model if name == names.model_name(row.model) else name)
            for name, found in groups for row in found if row.model in TRANSFORMERS]
    return ResultSet(reference, rows)


def curves(reference: Path) -> str:
    """The Transformers' validation curves, one figure per dataset (drawn by :func:`draw_figures`)."""
    return _figure_block(_curve_figure_names(_curve_results(reference)), "Validation NDCG@10 (full) of SASRec, "
                         "SASRec-CE and BERT4Rec during training, against epochs and seconds, one line per seed")


def _curve_figure_names(results: ResultSet) -> list[str]:
    return [f"curves_{figures._slug(dataset)}" for dataset in names.order_datasets(results.values("dataset"))]


def _figure_block(found: list[str], caption: str) -> str:
    lines = [f"![{name}: {caption}](figures/{name}.png)  \n[{name}.pdf](figures/{name}.pdf)" for name in found]
    return "\n\n".join(lines) + "\n"


def _ablation_path(reference: Path) -> Path:
    return reference / "rows-ablation-ml-1m-dropout.json"


def table5(reference: Path) -> str:
    """Table 5 on ML-1m under pop100 and under full ranking: each variant's NDCG@10 and change against the default,
    the paper's beside them (pop100), paired tests over users where the per-user files were kept."""
    path = _ablation_path(reference)
    results = _load(path)
    built = [tables.ablation_table(results, protocol, published=load_published()[0], per_user=PerUser(results.folder))
             for protocol in (tables.PUBLISHED_PROTOCOL, "full")]
    return "\n".join(_table_block(table, [path]) for table in built)


def ablation_curves(reference: Path) -> str:
    results = _load(_ablation_path(reference))
    found = [f"ablation_curves_{figures._slug(d)}_{figures._slug(m)}"
             for d, m in sorted({(r.dataset, r.model) for r in results.select(study="ablation")})]
    return _figure_block(found, "Table 5's runs: validation NDCG@10 of each variant against epochs and seconds")


NOTHING_CHANGED = "nothing (another run)"


def _changed(row: Row, profile: list[Row]) -> str:
    """The settings in which ``row`` differs from the profile's row of its model, dataset and seed."""
    base = next((r for r in profile if (r.model, r.seed) == (row.model, row.seed)), None)
    if base is None:
        return "–"
    ours, theirs = row_settings(row.raw), row_settings(base.raw)
    ours["precision"], theirs["precision"] = row.get("precision", "fp32"), base.get("precision", "fp32")
    return ", ".join(f"{name.replace('_', ' ')} {ours.get(name)}" for name in sorted(ours.keys() | theirs.keys())
                     if ours.get(name) != theirs.get(name)) or NOTHING_CHANGED


def _change(value: float | None, against: float | None) -> Cell:
    if value is None or not against:
        return Cell()
    change = (value - against) / against
    return Cell(f"{100 * change:+.1f}%".replace("-", "−"), change)


def probes(reference: Path) -> str:
    """What was tried beside the profile: each run that changed something, against the profile's row of the same
    model, dataset and seeds."""
    table_rows, read = [], []
    for path in sorted(p for p in reference.glob("*.json") if PROBES.fullmatch(p.name)):
        results = _load(path)
        read.append(path)
        for (dataset, model), found in sorted(tables.group(results.select(study="main"), "dataset", "model").items(),
                                              key=lambda item: (names.order_datasets(DATASETS).index(item[0][0])
                                                                if item[0][0] in DATASETS else 9, item[0][1])):
            profile = _load(reference / f"converge-{dataset}.json").select(study="main", model=model)
            seeds = sorted({row.seed for row in found})
            cells = [label(names.dataset_name(dataset)), label(names.model_name(model)),
                     label(_changed(found[0], profile)), Cell(str(len(seeds)), len(seeds))]
            for protocol in (tables.PUBLISHED_PROTOCOL, "full"):
                ours = summarize([r for r in found if r.protocol == protocol], "NDCG@10")
                base = summarize([r for r in profile if r.protocol == protocol and r.seed in seeds], "NDCG@10")
                cells += [value_cell(ours), _change(ours and ours.mean, base and base.mean)]
            runs_ = sorted((r for r in found if r.protocol == "full"), key=lambda r: r.seed)
            cells += [label("/".join(str(r.get("best_epoch", "–")) for r in runs_)),
                      label(", ".join(sorted({str(r.get("stopped_by")) for r in runs_}))), label(f"`{path.name}`")]
            table_rows.append(cells)
    notes = ["Test split, NDCG@10, mean over the seeds; Δ: the change against the converge profile's row of the "
             "same model, dataset and seeds (`converge-<dataset>.json`); changed: the settings in which the run "
             "differs from that row. Best epoch per seed; stopped by: what ended training."]
    return _table_block(Table("probes", "Runs beside the profile", [
        "Dataset", "Model", "Changed", "Seeds", "pop100 NDCG@10", "Δ", "Full NDCG@10", "Δ", "Best epoch",
        "Stopped by", "File"], table_rows, notes=notes, align="lllrrrrrrll"), read)


def refits(reference: Path) -> str:
    """The profile's runs retrained from scratch on every item but the test one (the validation item included, as
    the BERT4Rec authors' pipeline trains), for each run's best epoch count: evidence outside the protocol."""
    table_rows, read = [], sorted(reference.glob(REFITS))
    for path in read:
        kept = json.loads(path.read_text(encoding="utf-8"))
        found = kept["rows"]
        cells = [label(names.dataset_name(kept["dataset"])), label(names.model_name(found[0]["model"])),
                 Cell(str(len(found)), len(found))]
        for protocol in (tables.PUBLISHED_PROTOCOL, "full"):
            refit = [run["refit_on_s[:-1]"]["metrics"][protocol]["NDCG@10"] for run in found]
            before = [run["protocol_run"]["metrics"][protocol]["NDCG@10"] for run in found]
            mean, base = sum(refit) / len(refit), sum(before) / len(before)
            cells += [Cell(fmt(mean), mean), _change(mean, base)]
        cells += [label("/".join(str(run["refit_on_s[:-1]"]["epochs_run"]) for run in found)),
                  label(f"`{path.name}`")]
        table_rows.append(cells)
    notes = ["Test split, NDCG@10 of the retrained runs, mean over the seeds; Δ: against the same seeds' rows under "
             "the protocol, which never train on the validation item (PROTOCOL.md). Epochs: each retrained run's "
             "fixed length, its row's best epoch."]
    return _table_block(Table("refits", "Retrained on the validation item too", [
        "Dataset", "Model", "Seeds", "pop100 NDCG@10", "Δ", "Full NDCG@10", "Δ", "Epochs", "File"],
        table_rows, notes=notes, align="llrrrrrrl"), read)


def split_tables(reference: Path) -> str:
    """The models under leave-one-out and the global temporal split: side by side, Kendall's τ, the lists."""
    blocks, read = [], sorted(reference.glob("splits-*.json"))
    for path in read:
        results = _load(path)
        built, _ = splits.split_tables(results, PerUser(results.folder))
        built.append(splits.beyond_accuracy_table(results))
        blocks += [f"**{table.heading}** (`{path.name}`)\n\n" + to_markdown(table, title=False)
                   for table in built if table is not None]
    return "\n".join(blocks) + f"\nRead from {_source(read)} by `python -m reports --reproduction`.\n"


def tuning_searches(reference: Path) -> str:
    """What a validation search costs and gives on ML-100k: SASRec with and without median pruning, and the chosen
    settings against each model's own on the test split."""
    pruning, models = reference / "tuning-pruning-ml-100k.json", reference / "tuning-models-ml-100k.json"
    runs = json.loads(pruning.read_text(encoding="utf-8"))["runs"]
    tuned = json.loads(models.read_text(encoding="utf-8"))["models"]
    def same(a: dict, b: dict) -> bool:  # one search reported in both files
        return all(a.get(key) == b.get(key) for key in ("study", "best_trial", "trial_cpu_seconds"))

    searches = [("sasrec", f"pruner {pruner}", run, next((t.get("test_NDCG@10") for t in tuned.values()
                                                          if same(t, run)), None)) for pruner, run in runs.items()]
    searches += [(model, "pruner median", run, run.get("test_NDCG@10")) for model, run in tuned.items()
                 if not any(same(run, other) for other in runs.values())]
    table_rows = []
    for model, how, run, test in searches:
        cells = [label(names.model_name(model)), label(how), Cell(f"{run['pruned']} of {run['trials']}", run["pruned"]),
                 Cell(f"{run['trial_cpu_seconds']:,.0f}", run["trial_cpu_seconds"]),
                 Cell(fmt(run["best_valid"]), run["best_valid"])]
        for protocol in ("full", "pop100"):
            default, chosen = ((test or {}).get(f"{which} {protocol}") for which in ("default", "tuned"))
            cells.append(Cell(f"{fmt(default)} → {fmt(chosen)}") if test else Cell())
        table_rows.append(cells)
    notes = ["ML-100k, 20 TPE trials each, the model's own settings among them; one thread per search; CPU-seconds of "
             "the trials, the machine being shared. Best valid: the best trial's validation NDCG@10 (full ranking); "
             "test NDCG@10: the model's own settings → the chosen ones, mean over seeds 0 and 1."]
    return _table_block(Table("tuning", "Validation searches", [
        "Model", "Search", "Pruned", "CPU-s of trials", "Best valid", "Test full", "Test pop100"], table_rows,
        notes=notes, align="llrrrrr"), [pruning, models])


def _machine(kept: dict) -> str:
    """The device a measurement file records, else its machine, as the tables name a device."""
    machine = kept.get("machine") or {}
    if kept.get("device"):
        return names.device_name(kept["device"])
    if isinstance(machine, dict) and machine:
        threads = machine.get("torch_threads")
        return f"cpu ({machine.get('cpu', 'cpu')}, {machine.get('cores')} cores" + (
            f", {threads} thread{'s' if threads != 1 else ''})" if threads else ")")
    return "not recorded"


def speed(reference: Path) -> str:
    """Speed ratios of the measurements behind the manual's advice, one line per (file, model, setting)."""
    table_rows, read = [], []

    def add(name: str, what: str, model: str, setting: str, ratio: float, kept: dict) -> None:
        table_rows.append([label(what), label(names.model_name(model) if model else "–"), label(setting),
                           Cell(f"{ratio:.2f}×", ratio), label(_machine(kept)), label(f"`{name}`")])

    def load(name: str) -> dict:
        read.append(reference / name)
        return json.loads((reference / name).read_text(encoding="utf-8"))

    for name in ("compile-speed-cpu.json", "compile-speed-cuda-h200.json"):
        kept = load(name)
        for entry in kept["summary"]:
            add(name, "compiled / eager steps a second", entry["model"], f"median of {entry['rounds']} rounds",
                entry["median_compiled_over_eager"], kept)
    for name in ("precision-speed-cpu-1thread.json", "precision-speed-cpu-1thread-avx512bf16.json"):
        kept = load(name)
        for entry in kept["summary"]:
            add(name, "bf16 / fp32 steps a second", entry["model"], f"d = {entry['hidden']}, six batches",
                entry["median_bf16_over_fp32"], kept)
    kept = load("precision-speed-real-run-ml-1m-avx512bf16.json")
    for setting, ratio in kept["bf16_over_fp32"].items():
        add(read[-1].name, "bf16 / fp32 sequences a second", "bert4rec",
            f"two epochs of a run, {setting.replace('_', ' ')}", ratio, kept)
    kept = load("parallel-grid-ml-1m-bert4rec.json")
    add(read[-1].name, "--jobs 2 --threads 1 / --jobs 1 --threads 2", "bert4rec", "two jobs of 200 steps",
        kept["speedup"], kept)
    kept = load("shared-cores-cpu.json")
    add(read[-1].name, "alone / beside a busy core", "bert4rec", "a 2-thread job", kept["slowdown"], kept)
    kept = load("adam-fused-speed-cpu.json")
    for entry in kept["results"]:
        add(read[-1].name, "fused / looped Adam step", entry["model"], names.dataset_name(entry["dataset"]),
            entry["median_loop_over_fused"], kept)
    notes = ["Ratios of speeds (above 1: the first is faster), medians of interleaved rounds where the file has "
             "rounds; each on the device or machine its file records."]
    return _table_block(Table("speed", "Speed", ["Measured", "Model", "Setting", "Ratio", "Machine", "File"],
                              table_rows, notes=notes, align="lllrll"), read)


def _anchor_candidates(reference: Path) -> tuple[dict[str, dict[str, dict[str, list[Row]]]], list[Path]]:
    """{dataset: {configuration: {protocol: rows}}}: every model of the converge profile, the rows chosen on
    validation, each probe's setting (labelled by what it changes against the profile's row, :func:`_changed`), each
    loss of the losses study, but those whose runs are all listed already (the study reuses Table 2's SASRec,
    SASRec-CE and BERT4Rec jobs, the chosen rows are a probe's: one configuration, listed once); and the files
    read."""
    candidates, read = {}, []
    for dataset in DATASETS:
        path = reference / f"converge-{dataset}.json"
        read.append(path)
        found = candidates.setdefault(dataset, {})
        for (model, protocol), rows in tables.group(_load(path).select(study="main", task=losses.RANKING),
                                                     "model", "protocol").items():
            found.setdefault(names.model_name(model), {})[protocol] = rows
        choice = _chosen(reference, dataset)
        if choice:
            read.append(reference / CHOSEN.format(dataset=dataset))
            found[choice[0]] = tables.group(choice[1].select(study="main", task=losses.RANKING), "protocol")
            found[choice[0]] = {protocol: rows for (protocol,), rows in found[choice[0]].items()}
    beside = {}  # (dataset, configuration, protocol): rows of the probes and the losses study
    for path in sorted(p for p in reference.glob("*.json") if PROBES.fullmatch(p.name)):
        read.append(path)
        for row in _load(path).select(study="main", task=losses.RANKING):
            if row.dataset not in DATASETS:
                continue
            changed = _changed(row, _load(reference / f"converge-{row.dataset}.json").select(study="main",
                                                                                          model=row.model))
            if changed not in ("–", NOTHING_CHANGED):  # a seed the profile lacks, or the profile's own setting
                beside.setdefault((row.dataset, f"{names.model_name(row.model)}, {changed}", row.protocol),
                                 []).append(row)
    path = reference / LOSSES
    if path.is_file():
        read.append(path)
        for (dataset, variant, protocol), rows in tables.group(
                _load(path).select(study=losses.STUDY, task=losses.RANKING), "dataset", "variant", "protocol").items():
            beside[(dataset, f"losses study: {variant}", protocol)] = rows
    listed = {dataset: {_trained_key(row) for configuration in by_name.values() for rows in configuration.values()
                        for row in rows} for dataset, by_name in candidates.items()}
    for (dataset, configuration, protocol), rows in beside.items():
        if not {_trained_key(row) for row in rows} <= listed.get(dataset, set()):
            candidates.setdefault(dataset, {}).setdefault(configuration, {})[protocol] = rows
    return candidates, read


def _trained_key(row: Row) -> str:
    """The key of the job that trained ``row``: a reused row's source job, whose key the study's differs from."""
    return (row.get("reused_from") or {}).get("key") or row.get("key")


def anchor_tables(reference: Path) -> str:
    """Ours, chosen on validation, against the best published figures; and every candidate it was chosen from."""
    candidates, read = _anchor_candidates(reference)
    return "\n".join(_table_block(table, read) for table in (anchors.anchor_table(candidates),
                                                             anchors.candidate_table(candidates)))


def loss_tables(reference: Path) -> str:
    """The losses study under full ranking and pop100, each loss tested over users against the full softmax."""
    path = reference / LOSSES
    if not path.is_file():
        return (f"No rows yet: {path.name} is written under results/reference/ when the study's first run ends "
                "and its rows are kept.\n")
    results = _load(path)
    built = [_table_block(losses.loss_table(results, protocol, PerUser(results.folder)), [path])
             for protocol in ("full", tables.PUBLISHED_PROTOCOL)]
    rows = [r for r in results.select(study=losses.STUDY, task=losses.RANKING) if r.variant]
    found = [f"losses_quality_vs_time_{protocol}" for protocol in names.order_protocols({r.protocol for r in rows})]
    found += [f"losses_curves_{figures._slug(dataset)}" for dataset in names.order_datasets({r.dataset for r in rows})]
    return "\n".join(built) + "\n" + _figure_block(found, "the losses study: test NDCG@10 against training seconds, "
                                                          "and each run's validation curve")


ALPHA = 0.01  # the significance level of the reproduction's paired tests, as the report's default
GAP_BAND = 0.03  # README lists every row whose NDCG@10 is further than this from the paper's, relatively
GAP_ALPHA = 0.05  # the level at which the seeds' t-tests call a gap from the paper resolved


def _judged(results: ResultSet, pops: ResultSet | None = None) -> list[claims.Comparison]:
    """The claims section's comparisons of a reference file's rows, judged over the per-user files kept beside it."""
    per_user = PerUser(results.folder)
    return claims.judge(results, per_user, Expectations(per_user), ALPHA, pops=pops)


@lru_cache(maxsize=None)
def _ledger(reference: Path) -> tuple[list[claims.Comparison], list[Path]]:
    """Every comparison Table 2 (the converge profile's rows of each dataset) and Table 5 (the ablation's rows)
    make, judged over users where both sides kept per-user files, Holm-corrected as one table; and the files read."""
    found, read = [], []
    for dataset in names.order_datasets(DATASETS):
        path = reference / f"converge-{dataset}.json"
        found += _judged(_load(path))
        read.append(path)
    path = _ablation_path(reference)
    results = _load(path)
    found += _judged(results, pops=_load(reference / f"converge-{results.rows[0].dataset}.json"))
    read.append(path)
    return claims.adjust(found, ALPHA), read


def losses_summary(reference: Path) -> str:
    """README's sentence on the losses study: each loss's change against the full softmax on SASRec's network, and
    whether a paired test over users resolves it; nothing is called better or worse that a test does not resolve."""
    path = reference / LOSSES
    link = f"[losses study](results/REPRODUCTION.md#{LOSSES_SECTION})"
    if not path.is_file():
        return (f"Beyond the paper, the {link} (gBCE, sampled softmax with and without logQ and the full softmax on "
                "SASRec's network, BERT4Rec's Cloze objective with its softmax and with gBCE) has no converged run "
                "kept yet.\n")
    found = [c for c in _judged(_load(path)) if c.study == losses.STUDY]
    said = []
    for comparison in found:
        rows = comparison.first.get((LEAVE_ONE_OUT, "full"), [])
        base = comparison.second.get((LEAVE_ONE_OUT, "full"), [])
        if not rows or not base:
            continue
        change = 100 * (summarize(rows, claims.METRIC).mean / summarize(base, claims.METRIC).mean - 1)
        verdict = comparison.label()
        said.append(f"{rows[0].variant} {change:+.1f}% on {names.dataset_name(rows[0].dataset)} "
                    f"({len(rows)} seed{'s' if len(rows) > 1 else ''}, {verdict})")
    if not said:
        return (f"Beyond the paper, the {link} has runs kept but none yet beside its full-softmax reference on the "
                f"same dataset ({_source([path])}).\n")
    return (f"Beyond the paper, in the {link}, against the full softmax on SASRec's network (SASRec-CE; "
            "full-ranking NDCG@10, labelled by paired tests over users; only a robust change is one): "
            f"{'; '.join(said)} ({_source([path])}).\n")


def table2(reference: Path) -> str:
    """The paper's Table 2 as the report writes it, one per dataset under the paper's protocol, BERT4Rec marked
    where a paired test over users sets it apart from the best baseline."""
    blocks = []
    for dataset in names.order_datasets(DATASETS):
        path = reference / f"converge-{dataset}.json"
        results = _load(path)
        table = tables.main_table(results, tables.PUBLISHED_PROTOCOL, PerUser(results.folder), ALPHA)
        blocks.append(f"**{names.dataset_name(dataset)}**\n\n" + _table_block(table, [path]))
    return "\n".join(blocks)


def ledger(reference: Path) -> str:
    """REPRODUCTION.md's ledger: each comparison of Table 2 and Table 5, beside the paper's, with its label."""
    found, read = _ledger(reference)
    return _table_block(claims.ledger_table(found, load_published()[0], ALPHA), read)


def claims_summary(reference: Path) -> str:
    """README's count of the comparisons that agree with the paper: only the resolved ones count."""
    found, read = _ledger(reference)
    count = claims.agreement_counts(found, load_published()[0])
    return (f"Of the {count['made']} comparisons between models that the paper's Table 2 and Table 5 also make, "
            f"ours go the paper's way in {count['its way']} (a collapsed run's counted nowhere), and a paired test "
            f"over users resolves {count['resolved its way']} of them ({count['resolved the other way']} resolved the "
            f"other way). Not tested, or tested on some seeds only, their rows' per-user files not kept: "
            f"{count[claims.NOT_TESTED] + count[claims.PARTLY_TESTED]}; not resolved "
            f"or resolved under one protocol only: {count['not resolved'] + count['protocol-dependent']}; with a "
            f"collapsed run: {count['collapsed']}. Only the resolved ones count as agreeing with the "
            f"paper ([the ledger](results/REPRODUCTION.md#which-comparisons-hold); {_source(read)}).\n")


BLOCKS = {"paper-comparison": paper_comparison, "gaps": gaps, "cost": cost, "runs": runs, "curves": curves,
          "table5": table5, "ablation-curves": ablation_curves, "probes": probes, "refits": refits,
          "splits": split_tables, "tuning": tuning_searches, "speed": speed, "anchors": anchor_tables,
          "losses": loss_tables, "ledger": ledger, "claims-summary": claims_summary, "table2": table2,
          "losses-summary": losses_summary}


# -------------------------------------------------------------------------------------------------- documents

def expected(document: Path, reference: Path = REFERENCE) -> dict[str, tuple[str, str]]:
    """{block name: (its text in ``document``, the text its builder gives)} for every generated block there; an
    unknown name's builder text says so."""
    text = Path(document).read_text(encoding="utf-8")
    return {match["name"]: (match["body"], BLOCKS[match["name"]](reference) if match["name"] in BLOCKS
                            else f"(no builder named {match['name']!r}; known: {', '.join(BLOCKS)})\n")
            for match in BLOCK.finditer(text)}


def stale(document: Path, reference: Path = REFERENCE) -> list[str]:
    """The names of ``document``'s generated blocks whose text differs from what their files give."""
    return [name for name, (found, wanted) in expected(document, reference).items() if found != wanted]


def rewrite(document: Path, reference: Path = REFERENCE) -> list[str]:
    """Put each generated block of ``document`` in place from its files; the names of those that changed."""
    document = Path(document)
    text, wanted = document.read_text(encoding="utf-8"), expected(document, reference)
    new = BLOCK.sub(lambda m: f"<!-- generated: {m['name']} -->\n{wanted[m['name']][1]}"
                              f"<!-- end generated: {m['name']} -->", text)
    if new != text:
        write_atomic(document, new)
    return [name for name, (found, built) in wanted.items() if found != built]


def draw_figures(reference: Path = REFERENCE, folder: Path = FIGURES) -> list[Path]:
    """The figures the generated blocks show: the Transformers' curves, Table 5's runs and the losses study's."""
    with figures.house_style():
        drawn = [figures.curve_figures(_curve_results(reference), folder),
                 figures.ablation_curve_figures(_load(_ablation_path(reference)), folder)]
        if (reference / LOSSES).is_file():
            drawn.append(losses.loss_figures(_load(reference / LOSSES), folder))
    return [path for outcome in drawn for figure in outcome.figures for path in figure.paths]


def update_documents(check: bool = False, reference: Path = REFERENCE) -> int:
    """``python -m reports --reproduction``: rewrite (or with ``check``, compare) every document's blocks."""
    differing = []
    for document in DOCUMENTS:
        changed = stale(document, reference) if check else rewrite(document, reference)
        differing += [f"{document.relative_to(ROOT)}: {name}" for name in changed]
    if check:
        print("\n".join(f"differs from its files: {entry}" for entry in differing) or "every generated block is "
              "as its files give it")
        return 1 if differing else 0
    for path in draw_figures(reference):
        print(f"drew {path.relative_to(ROOT)}")
    print("\n".join(f"rewrote {entry}" for entry in differing) or "every generated block was already up to date")
    return 0
