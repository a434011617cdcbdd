"""The paper's tables built from result rows: each builder returns a :class:`Table` or None when it has no data.

- Table 1: dataset statistics.
- Table 2: models × (dataset, metric) per protocol, best bold, second underlined, BERT4Rec's improvement over
  the best baseline, and paired significance marks.
- Published comparison: our pop100 values next to the published row at each one's setting (``published.csv``).
- Table 3: the Cloze study (SASRec vs BERT4Rec with one item masked, both readings, vs BERT4Rec).
- Table 5: the ablation (NDCG@10 per variant with its change against the default, ↓ for a drop of more than 10%;
  under pop100 the paper's column beside ours where the rows are at its setting).
- Relevance: accuracy, AUC and log-loss of the relevance-prediction task.
A missing result is a "–" cell, never an error.
"""
from __future__ import annotations

from collections import defaultdict

from recbench.benchmarks.store import row_threads
from recbench.reports import names
from recbench.reports.published import PUBLISHED_PROTOCOL, TABLE_SETTINGS, Published, default_column, default_row
from recbench.reports.render import Cell, Table, fmt
from recbench.reports.results import CONVERGE_ADVICE, SMOKE_LABEL, ResultSet, Row
from recbench.reports.stats import PairedTest, PerUser, Summary, holm_tests, summarize

RANKING = "next-item"
CLOZE_MODELS = ("sasrec", "bert4rec-1mask", "bert4rec-1mask-random", "bert4rec")
CLOZE_METRICS = ("HR@10", "NDCG@10", "MRR")  # the columns of paper Table 3
ABLATION_METRIC = "NDCG@10"  # paper Table 5
ABLATION_DROP = 0.10  # ↓ marks a relative drop of more than this against the default
T_MARK, W_MARK = "†", "‡"


def group(rows: list[Row], *attributes: str) -> dict[tuple, list[Row]]:
    """Rows keyed by the values of ``attributes`` (one list per key, e.g. the seeds of one cell)."""
    out = defaultdict(list)
    for row in rows:
        out[tuple(getattr(row, a) for a in attributes)].append(row)
    return dict(out)


def value_cell(summary: Summary | None, digits: int = 4) -> Cell:
    """``mean`` or ``mean ± std`` (several seeds); a gap when there is no result."""
    if summary is None:
        return Cell()
    text = fmt(summary.mean, digits)
    if summary.std is not None:
        text += f" ± {fmt(summary.std, digits)}"
    return Cell(text=text, value=summary.mean)


def label(text: str) -> Cell:
    return Cell(text=text)


def mark_best(cells: list[Cell], lower_is_better: bool = False) -> None:
    """Bold the best value and underline the second best; equal values share the emphasis."""
    distinct = sorted({c.value for c in cells if c.value is not None}, reverse=not lower_is_better)
    for cell in cells:
        if cell.value is None:
            continue
        cell.bold = cell.value == distinct[0]
        cell.underline = len(distinct) > 1 and cell.value == distinct[1]


def _seed_notes(summaries: list[Summary]) -> list[str]:
    """A note on seeds when any cell averages several (nothing for single-seed tables)."""
    counts = sorted({s.n for s in summaries})
    if not counts or counts[-1] <= 1:
        return []
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return [f"Mean ± sample standard deviation (ddof=1) over {span} seeds; a value without ± is a single seed."]


def smoke_label(results: ResultSet, rows: list[Row]) -> tuple[str, list[str]]:
    """A title suffix and a note that label the smoke-profile results among ``rows`` (nothing when none is)."""
    smoke = [r for r in rows if results.is_smoke(r)]
    if not smoke:
        return "", []
    label = f"{SMOKE_LABEL[0].upper()}{SMOKE_LABEL[1:]}."
    advice = f"short training with settings chosen for speed; {CONVERGE_ADVICE}."
    if len(smoke) == len(rows):
        return f" ({SMOKE_LABEL})", [f"{label} Every result here comes from the smoke profile: {advice}"]
    pairs = {(r.dataset, r.model) for r in smoke}
    runs = ", ".join(f"{names.model_name(m)} on {names.dataset_name(d)}"
                     for d in names.order_datasets({d for d, _ in pairs})
                     for m in names.order_models({m for _, m in pairs}) if (d, m) in pairs)
    return f" (partly {SMOKE_LABEL})", [f"{label} From the smoke profile: {runs}; {advice}"]


def device_note(rows: list[Row], name_of) -> list[str]:
    """Where a table's rows were trained on more than one kind of device (a GPU beside CPUs), which ones came from
    the less common kinds, named by ``name_of(row)``: training on a GPU is not bit-for-bit repeatable, and a reader
    should know which figures it gave. Nothing when one kind trained them all (rows that record no device, older
    ones, are left out of the count)."""
    by_kind = defaultdict(lambda: defaultdict(list))  # "cuda" -> its full device texts -> their rows
    for row in rows:
        if row.get("device"):
            device = names.device_name(row.get("device"))
            by_kind[device.split(" (")[0]][device].append(row)
    notes = _thread_note(rows, name_of)
    if len(by_kind) < 2:
        return notes
    # "the rest": the kind that trained most rows, the CPU on a tie (this suite's usual device)
    usual = max(by_kind, key=lambda kind: (sum(map(len, by_kind[kind].values())), kind == "cpu", kind))
    others = [f"{', '.join(dict.fromkeys(map(name_of, found)))} on {device}"
              for kind in sorted(set(by_kind) - {usual}) for device, found in by_kind[kind].items()]
    return [f"Trained on more than one kind of device: {'; '.join(others)}; the rest on {usual}.", *notes]


def _thread_note(rows: list[Row], name_of) -> list[str]:
    """Where a table's CPU rows were trained with different torch thread counts, which rows used the less common
    counts: a seed repeats a CPU run only at the same count (the figures differ in the fourth decimal)."""
    by_count = defaultdict(list)
    for row in rows:
        if (count := row_threads(row)) is not None:
            by_count[count].append(row)
    if len(by_count) < 2:
        return []
    usual = max(by_count, key=lambda count: (len(by_count[count]), -count))
    others = [f"{', '.join(dict.fromkeys(map(name_of, by_count[count])))} on {count} thread{'s' * (count != 1)}"
              for count in sorted(set(by_count) - {usual})]
    return [f"Trained on the CPU with different thread counts, with which a seed's figures differ: "
            f"{'; '.join(others)}; the rest on {usual} thread{'s' * (usual != 1)}."]


def _protocol_note(protocol: str, rows: list[Row]) -> str:
    policies = ", ".join(sorted({row.get("tie_policy", "unknown") for row in rows}))
    described = names.PROTOCOL_NAMES.get(protocol, protocol)
    return f"Protocol {protocol} ({described}); test split; means over all users; tie policy: {policies}."


# ------------------------------------------------------------------------------------------------- Table 1

def dataset_table(results: ResultSet) -> Table | None:
    """Paper Table 1 from each dataset's ``dataset_info.stats`` (the first row that has them)."""
    stats = {}
    for row in results.rows:
        found = (row.get("dataset_info") or {}).get("stats")
        if isinstance(found, dict) and row.dataset not in stats:
            stats[row.dataset] = found
    datasets = names.order_datasets(results.values("dataset"))
    if not datasets:
        return None

    def number(value, pattern):
        return Cell() if value is None else Cell(text=pattern.format(value), value=float(value))

    rows = []
    for dataset in datasets:
        s = stats.get(dataset, {})
        density = s.get("density")
        rows.append([label(names.dataset_name(dataset)), number(s.get("users"), "{:,}"),
                     number(s.get("items"), "{:,}"), number(s.get("actions"), "{:,}"),
                     number(s.get("avg_length"), "{:.1f}"),
                     number(None if density is None else 100 * density, "{:.2f}%")])
    return Table("table1_datasets", "Statistics of the prepared datasets",
                 ["Dataset", "#users", "#items", "#actions", "Avg. length", "Density"], rows,
                 notes=["Computed on the whole prepared sequences (training, validation and test items); "
                        "density = actions / (users × items)."], paper="Table 1")


# ------------------------------------------------------------------------------------------------- Table 2

def paired_test(per_user: PerUser, cells: dict[str, Cell], seeds: dict[str, list[Row]], metric: str):
    """BERT4Rec tested against the best baseline (else the best model against the runner-up): ``(pair, test)``;
    None when there is no pair to test, False when a test was wanted but per-user values were missing."""
    ranked = sorted((m for m in cells if cells[m].value is not None), key=lambda m: -cells[m].value)
    baselines = [m for m in ranked if m not in names.BERT4REC_FAMILY]
    if names.BERT4REC in ranked and baselines:
        pair = (names.BERT4REC, baselines[0])
    elif len(ranked) >= 2:
        pair = (ranked[0], ranked[1])
    else:
        return None
    test = per_user.compare(seeds[pair[0]], seeds[pair[1]], metric)
    return False if test is None else (pair, test)


def mark_significance(tests: list[tuple[dict, tuple, PairedTest]], alpha: float) -> None:
    """Mark each ``(cells, pair, test)`` of one table on the better cell of its pair, its p-values Holm-adjusted
    over all the table's tests (one family per kind of test), so the table's chance of any false mark is ≤ α."""
    adjusted = holm_tests([test for _, _, test in tests])
    for (cells, pair, _), test in zip(tests, adjusted):
        better = max(pair, key=lambda m: cells[m].value)
        cells[better].marks = _marks(test, alpha)


def _marks(test: PairedTest, alpha: float) -> str:
    """† where the (adjusted) t-test, ‡ where the Wilcoxon test is below ``alpha``."""
    return (T_MARK if test.t_pvalue < alpha else "") + (W_MARK if test.wilcoxon_pvalue < alpha else "")


def significance_note(alpha: float, comparisons: int, between: str, marked_on: str = "the better of the two") -> str:
    if not comparisons:  # e.g. rows restored without their per-user files: say so, not "0 comparisons"
        return f"No {T_MARK} or {W_MARK} marks: no paired test between {between} could be run here."
    return (f"{T_MARK}: paired t-test, {W_MARK}: Wilcoxon signed-rank test (two-sided, paired over users) between "
            f"{between}, marked on {marked_on} where p < {alpha:g} after Holm's correction for the "
            f"{comparisons} comparison{'s' if comparisons != 1 else ''} of this table: the two trained models differ "
            f"on these users, which says nothing of how far another seed would move them. With several seeds each "
            f"user's values are averaged over seeds before pairing.")


def improvement(cells: dict[str, Cell]) -> Cell:
    """BERT4Rec's relative improvement over the best baseline, in percent."""
    bert = cells.get(names.BERT4REC)
    baselines = [c.value for m, c in cells.items() if m not in names.BERT4REC_FAMILY and c.value is not None]
    if bert is None or bert.value is None or not baselines or max(baselines) == 0:
        return Cell()
    change = 100 * (bert.value - max(baselines)) / max(baselines)
    return Cell(text=f"{change:+.2f}%", value=change)


def main_table(results: ResultSet, protocol: str, per_user: PerUser, alpha: float = 0.01) -> Table | None:
    """Paper Table 2 for one protocol: one row per (dataset, metric), one column per model."""
    rows = results.select(study="main", task=RANKING, protocol=protocol)
    if not rows:
        return None
    models = names.order_models(results.values("model", rows))
    cells_by_key = group(rows, "dataset", "model")
    datasets = names.order_datasets(results.values("dataset", rows))
    # An improvement measured after smoke training says nothing about the models: none is given for a dataset
    # with any smoke-profile result, and the column is left out when no dataset has a result to give.
    smoke_datasets = {r.dataset for r in rows if results.is_smoke(r)}
    # The Improv. column needs BERT4Rec and at least one baseline to compare it with.
    against_baseline = names.BERT4REC in models and any(m not in names.BERT4REC_FAMILY for m in models)
    with_improvement = against_baseline and any(d not in smoke_datasets for d in datasets)
    header = ["Dataset", "Metric", *map(names.model_name, models)] + (["Improv."] if with_improvement else [])
    table_rows, breaks, summaries = [], set(), []
    untested, tests = set(), []
    for dataset in datasets:
        dataset_rows = [r for r in rows if r.dataset == dataset]
        metrics = names.accuracy_metrics(m for r in dataset_rows for m in r.metrics)
        breaks.add(len(table_rows))
        for metric in metrics:
            seeds = {m: cells_by_key.get((dataset, m), []) for m in models}
            found = {m: summarize(seeds[m], metric) for m in models}
            summaries += [s for s in found.values() if s is not None]
            cells = {m: value_cell(found[m]) for m in models}
            mark_best(list(cells.values()))
            tested = paired_test(per_user, cells, seeds, metric)
            if tested is False:
                untested.add(names.dataset_name(dataset))
            elif tested:
                tests.append((cells, *tested))
            line = [label(names.dataset_name(dataset)), label(metric), *(cells[m] for m in models)]
            if with_improvement:
                line.append(Cell() if dataset in smoke_datasets else improvement(cells))
            table_rows.append(line)
    smoke_title, smoke_notes = smoke_label(results, rows)
    notes = [*smoke_notes, _protocol_note(protocol, rows),
             "Bold: best; underlined: second best (per row, across models)."]
    notes += _seed_notes(summaries) + device_note(rows, lambda row: f"{names.model_name(row.model)} on "
                                                                    f"{names.dataset_name(row.dataset)}")
    if with_improvement:
        notes.append("Improv.: relative improvement of BERT4Rec over the best baseline "
                     "(BERT4Rec variants are not baselines)"
                     + ("; not given for smoke-profile results." if smoke_datasets else "."))
    mark_significance(tests, alpha)
    pair = "BERT4Rec and the best baseline" if against_baseline else "the best model and the runner-up"
    notes.append(significance_note(alpha, len(tests), pair))
    if untested:
        notes.append(f"Not tested (per-user files missing): {', '.join(sorted(untested))}.")
    return Table(f"table2_{protocol}", f"Performance of all models, protocol {protocol}{smoke_title}",
                 header, table_rows, notes=notes, breaks=breaks, paper="Table 2")


# ------------------------------------------------------------------------------------- published comparison

def _hidden(row: Row):
    return (row.get("hyperparameters") or {}).get("hidden")


def published_anchor(row: Row) -> tuple[str, str, str | None] | None:
    """The published row a result of ours is held against, as (table, model, variant), or None where the paper
    reports none at its setting:

    - a Cloze-study row at d = 256: Table 3's row of its model (either 1-mask reading: "BERT4Rec (1 mask)");
    - a BERT4Rec ablation row at d = 64: Table 5's row of its label;
    - a BERT4Rec N-sweep row at d = 64: Table 4's column of its N;
    - a row whose settings came from tuning (``tuned_from``): Table 2, each model at its best settings;
    - a main-grid BERT4Rec row at d = 64 (the authors' public configs): Table 5's default row; at d = 256 (the
      paper's best), Table 2; a 1-mask row at d = 256: Table 3;
    - any other main-grid row: Table 2, the only published row of the baselines (tuned there, as configured here).
    """
    model, hidden = row.model, _hidden(row)
    one_mask = model.startswith("bert4rec-1mask")
    if row.study == "cloze":
        return ("Table 3", "bert4rec-1mask" if one_mask else model, None) if hidden == 256 else None
    if model != names.BERT4REC and row.study in ("ablation", "sensitivity"):
        return None
    if row.study == "ablation":
        return ("Table 5", model, names.canonical_variant(row.variant or "")) if hidden == 64 else None
    if row.study == "sensitivity":
        return ("Table 4", model, f"N={row.sweep_value}") if row.sweep_param == "max_len" and hidden == 64 else None
    if row.get("tuned_from"):
        return "Table 2", model, None
    if model == names.BERT4REC:
        return {64: ("Table 5", model, "default"), 256: ("Table 2", model, None)}.get(hidden)
    if one_mask:
        return ("Table 3", "bert4rec-1mask", None) if hidden == 256 else None
    return "Table 2", model, None


def _our_row_label(row: Row) -> str:
    """How the comparison names our row: model, study and variant, d, and the tuning it came from."""
    parts = [names.model_name(row.model), row.study if row.study != "main" else "main grid"]
    if row.variant and row.study != "cloze":
        parts.append(row.variant)
    if _hidden(row) is not None:
        parts.append(f"d = {_hidden(row)}")
    if row.get("tuned_from"):
        parts.append(f"tuned by {row.get('tuned_from')}")
    return ", ".join(parts)


def _published_matches(results: ResultSet, by_row: dict) -> tuple[dict, dict]:
    """Our pop100 rows by the published row each is held against, keyed (table, dataset, published model, variant,
    our label), and for a key that compares only some of its published row's metrics, those metrics: a row held
    against Table 5's default row also against Table 4's column of the same configuration, for what Table 5 lacks."""
    matched, only = defaultdict(list), {}
    for row in results.select(task=RANKING, protocol=PUBLISHED_PROTOCOL):
        anchor = None if results.is_smoke(row) else published_anchor(row)
        if anchor is not None and (anchor[0], row.dataset, *anchor[1:]) in by_row:
            matched[(anchor[0], row.dataset, *anchor[1:], _our_row_label(row))].append(row)
        column = default_column(row.dataset)
        if anchor is not None and (anchor[0], anchor[2]) == ("Table 5", "default") and column:
            # Table 5 gives NDCG@10 only; Table 4's column at the dataset's N is the same configuration
            key = ("Table 4", row.dataset, anchor[1], column)
            given = {e.metric for e in by_row.get(("Table 5", row.dataset, anchor[1], "default"), [])}
            lacking = {e.metric for e in by_row.get(key, []) if e.metric != "samples/s"} - given
            if lacking:
                matched[(*key, _our_row_label(row))].append(row)
                only[(*key, _our_row_label(row))] = lacking
    return matched, only


def published_table(results: ResultSet, published: list[Published], source: str) -> Table | None:
    """Our pop100 values beside the published row each is held against (:func:`published_anchor`), with absolute
    and relative differences; a row held against Table 5's default row also against Table 4's column of the same
    configuration, for the metrics Table 5 lacks (HR@10). None when no result of ours (smoke-profile results left
    out) has one."""
    by_row = defaultdict(list)
    for entry in published:
        by_row[(entry.table, entry.dataset, entry.model, entry.variant)].append(entry)
    matched, only = _published_matches(results, by_row)
    datasets = names.order_datasets({key[1] for key in matched})
    models = names.order_models({key[2] for key in matched})
    variants = names.order_variants({key[3] for key in matched if key[3] and not key[3].startswith("N=")})

    def order(key: tuple) -> tuple:
        variant = key[3] or ""
        within = int(variant[2:]) if variant.startswith("N=") else variants.index(variant) if variant else -1
        return key[0], datasets.index(key[1]), models.index(key[2]), within, key[4]

    table_rows, breaks, last_group = [], set(), None
    for key in sorted(matched, key=order):
        table_name, dataset, model, variant, ours = key
        entries = by_row[(table_name, dataset, model, variant)]
        for entry in sorted(entries, key=lambda e: names.order_metrics([x.metric for x in entries]).index(e.metric)):
            summary = summarize(matched[key], entry.metric)
            if summary is None or entry.metric not in only.get(key, {entry.metric}):
                continue
            if (table_name, dataset) != last_group:
                breaks.add(len(table_rows))
                last_group = (table_name, dataset)
            delta = summary.mean - entry.value
            paper_row = " ".join(filter(None, [names.model_name(model), variant]))
            table_rows.append([label(f"{table_name} ({TABLE_SETTINGS.get(table_name, '')})"), label(paper_row),
                               label(names.dataset_name(dataset)), label(ours), label(entry.metric),
                               value_cell(summary, 0 if entry.value >= 100 else 4),
                               Cell(fmt(entry.value, 0 if entry.value >= 100 else 4), entry.value),
                               Cell(f"{delta:+.4f}" if abs(entry.value) < 100 else f"{delta:+.0f}", delta),
                               Cell(f"{100 * delta / entry.value:+.1f}%", delta / entry.value)])
    if not table_rows:
        return None
    notes = [f"Source: {source}",
             f"Only our {PUBLISHED_PROTOCOL} results are compared (the paper's protocol), each with the published "
             f"row at its setting: a Cloze-study row with Table 3 (d = 256); an ablation row and a main-grid "
             f"BERT4Rec row at d = 64 (the authors' public configs) with Table 5 (d = 64), and a default row's HR@10, "
             f"which Table 5 does not give, with Table 4's column at the dataset's N, the same configuration; an "
             f"N-sweep row with Table 4; a row whose settings came from tuning with Table 2 (each model at its best "
             f"settings), as are the baselines, for which the paper publishes no other row. Both readings of '1 "
             f"mask' are held against Table 3's one row. Δ = ours − paper; Δ% relative to the paper."]
    if any(row[4].text == "samples/s" for row in table_rows):
        notes.append("samples/s: training samples per second, the paper's on the authors' GPU, ours on the device "
                     "each row records.")
    return Table("published_comparison", "Our results against the published values (Sun et al., 2019)",
                 ["Paper table", "Paper row", "Dataset", "Our row", "Metric", "Ours", "Paper", "Δ", "Δ%"],
                 table_rows, notes=notes, align="lllllrrrr", breaks=breaks)


# ------------------------------------------------------------------------------------------ ratios to the paper

RATIO_METRICS = ("NDCG@10", "HR@10")  # the paper's headline metrics, each as ours, the paper's and their ratio


def paper_value(row: Row, published: list[Published], metric: str) -> tuple[float | None, str]:
    """The published value ``row`` is held against (:func:`published_anchor`) and the paper's table and row that
    hold it; "not in the paper" for a model the paper has no row of (LSTM, SASRec-CE), so that it is not labelled
    Table 2. A row held against Table 5's default row takes the metrics that row lacks (HR@10) from Table 4's column
    of the same configuration (:func:`reports.published.default_row`)."""
    anchor = published_anchor(row)
    if anchor is None:
        return None, ""
    table, model, variant = anchor
    if (table, variant) == ("Table 5", "default"):
        return default_row(published, row.dataset, model, metric)
    entries = [entry for entry in published if (entry.table, entry.model, entry.variant) == anchor]
    if not entries:
        return None, "not in the paper"
    value = next((entry.value for entry in entries if (entry.dataset, entry.metric) == (row.dataset, metric)), None)
    return value, f"{table}{f' ({variant})' if variant else ''}"


def model_groups(results: ResultSet) -> list[tuple[str, list[Row]]]:
    """The main grid's rows under the paper's protocol, smoke-profile results left out, one group per dataset and
    model in the paper's order, each named by its model."""
    rows = [r for r in results.select(study="main", task=RANKING, protocol=PUBLISHED_PROTOCOL)
            if not results.is_smoke(r)]
    found = group(rows, "dataset", "model")
    return [(names.model_name(model), found[(dataset, model)])
            for dataset in names.order_datasets(results.values("dataset", rows))
            for model in names.order_models(results.values("model", rows)) if (dataset, model) in found]


def ratio_table(groups: list[tuple[str, list[Row]]], published: list[Published]) -> Table | None:
    """Ours against the paper with their ratio, one line per group (a label and the pop100 rows of one model on one
    dataset, one per seed): NDCG@10 and HR@10, ours (mean ± std over seeds), the published value each
    is held against and ours / the paper's. None where no group has a published value."""
    table_rows, breaks, sources, last = [], set(), {}, None
    for name, rows in groups:
        if rows[0].dataset != last:
            breaks.add(len(table_rows))
            last = rows[0].dataset
        cells = [label(names.dataset_name(rows[0].dataset)), label(name), Cell(str(len(rows)), len(rows))]
        for metric in RATIO_METRICS:
            ours, (paper, where) = summarize(rows, metric), paper_value(rows[0], published, metric)
            ratio = ours.mean / paper if ours is not None and paper else None
            sources.setdefault(where or "not in the paper", []).append(names.model_name(rows[0].model))
            cells += [value_cell(ours), Cell(fmt(paper), paper), Cell(fmt(ratio, 2), ratio)]
        table_rows.append(cells)
    if not any(row[4].value for row in table_rows):
        return None
    held = "; ".join(f"{where}: {', '.join(dict.fromkeys(which))}" for where, which in sources.items())
    notes = [f"Protocol {PUBLISHED_PROTOCOL} (100 negatives sampled by popularity, the paper's), test split; ours: "
             f"mean ± sample standard deviation over the seeds; paper: Sun et al. (2019), the published row each of "
             f"ours is held against ({held}); ratio: ours / paper; –: no published value."]
    notes += _setting_notes(groups, published)
    if any(where.startswith("Table 4") for where in sources):
        notes.append("Table 5's default row (BERT4Rec at d = 64) gives NDCG@10 only; HR@10 comes from Table 4's column "
                     "at the dataset's N, the same configuration.")
    return Table("paper_ratios", "Ours against the paper", ["Dataset", "Model", "Seeds",
                                                            *(f"{m} {w}" for m in RATIO_METRICS
                                                              for w in ("ours", "paper", "ratio"))],
                 table_rows, notes=notes, align="llr" + "r" * 3 * len(RATIO_METRICS), breaks=breaks)


def _setting_notes(groups: list[tuple[str, list[Row]]], published: list[Published]) -> list[str]:
    """Where a row of ours is held against a published row of another configuration, say so: Table 2 gives each
    model at its best setting, which the paper states only where Table 2's row equals Table 3's (d = 256)."""
    at_256, unstated = {}, {}
    for _, rows in groups:
        row = rows[0]
        if (published_anchor(row) or ("",))[0] != "Table 2":
            continue
        table2 = {(e.dataset, e.metric): e.value for e in published
                  if (e.table, e.model, e.variant) == ("Table 2", row.model, None)}
        table3 = {(e.dataset, e.metric): e.value for e in published
                  if (e.table, e.model, e.variant) == ("Table 3", row.model, None)}
        same = [key for key in table3 if table2.get(key) == table3[key]]
        settings = row.get("hyperparameters") or {}
        hidden = settings.get("hidden", settings.get("factors"))  # NCF names its embedding size "factors"
        if not table2 or hidden is None:  # not in the paper, or a model without a size (POP)
            continue
        if same and hidden != 256:
            at_256.setdefault(names.model_name(row.model), set()).add(hidden)
        elif not same:
            unstated.setdefault(hidden, []).append(names.model_name(row.model))
    notes = [f"{model}: Table 2's row equals Table 3's, at d = 256, and ours runs at d = "
             f"{', '.join(map(str, sorted(sizes, key=str)))}; the paper publishes no {model} row at our size, so its "
             f"ratio sets two sizes side by side." for model, sizes in at_256.items()]
    for hidden, models in unstated.items():
        notes.append(f"{', '.join(dict.fromkeys(models))}: Table 2 gives each at its best setting, which the paper "
                     f"does not state; ours run at d = {hidden}.")
    return notes


# ------------------------------------------------------------------------------------------------- Table 3

def cloze_table(results: ResultSet, protocol: str) -> Table | None:
    """Paper Table 3: rows of the Cloze study, or the main grid where a model has no Cloze row.

    Built only when there is something beyond Table 2 to show: a Cloze row or a 1-mask result."""
    cloze = results.select(study="cloze", task=RANKING, protocol=protocol, model=CLOZE_MODELS)
    main = results.select(study="main", task=RANKING, protocol=protocol, model=CLOZE_MODELS)
    if not cloze and not {"bert4rec-1mask", "bert4rec-1mask-random"} & results.values("model", main):
        return None
    chosen = group(main, "dataset", "model")
    chosen.update(group(cloze, "dataset", "model"))  # the study's own rows win
    models = [m for m in CLOZE_MODELS if any(key[1] == m for key in chosen)]
    datasets = names.order_datasets(key[0] for key in chosen)
    columns = [(d, m) for d in datasets for m in CLOZE_METRICS]
    found = {model: [summarize(chosen.get((d, model), []), metric) for d, metric in columns] for model in models}
    grid = {model: [value_cell(summary) for summary in found[model]] for model in models}
    for index in range(len(columns)):
        mark_best([grid[model][index] for model in models])
    used = [r for rows in chosen.values() for r in rows]
    smoke_title, smoke_notes = smoke_label(results, used)
    notes = [*smoke_notes, _protocol_note(protocol, used), "Bold: best; underlined: second best (per column).",
             "Rows of the Cloze study where present, else the main grid's rows of the same model."]
    if {"bert4rec-1mask", "bert4rec-1mask-random"} & set(models):
        notes.append("The paper's \"BERT4Rec (1 mask)\" in two readings: last = only each sequence's last item "
                     "masked; random = one random item per training copy (the authors' generator with one "
                     "prediction per sequence).")
    sizes = sorted({_hidden(r) for r in used if _hidden(r) is not None})
    if sizes:
        notes.append(f"d = {', '.join(map(str, sizes))}" + ("." if sizes == [256] else "; the paper's Table 3 is at "
                                                              "d = 256."))
    notes += _seed_notes([s for summaries in found.values() for s in summaries if s is not None])
    return Table(f"table3_cloze_{protocol}",
                 f"Cloze objective and bidirectionality, protocol {protocol}{smoke_title}",
                 ["Model", *(f"{names.dataset_name(d)} {m}" for d, m in columns)],
                 [[label(names.model_name(model)), *grid[model]] for model in models], notes=notes, paper="Table 3")


# ------------------------------------------------------------------------------------------------- Table 5

def _ablation_cell(summary: Summary | None, default: Summary | None) -> Cell:
    """A variant's value with its relative change against ``default`` (None in the default row itself), and ↓
    for a drop of more than :data:`ABLATION_DROP`, as the paper marks it."""
    cell = value_cell(summary)
    if summary is not None and default is not None and default.mean > 0:
        change = (summary.mean - default.mean) / default.mean
        cell.text += f" ({100 * change:+.1f}%)".replace("-", "−") + (" ↓" if -change > ABLATION_DROP else "")
    return cell


def ablation_table(results: ResultSet, protocol: str, metric: str = ABLATION_METRIC,
                   published: list[Published] = (), per_user: PerUser | None = None,
                   alpha: float = 0.01) -> Table | None:
    """Paper Table 5: one row per variant, one column per dataset (and per model when several were ablated).

    Under the paper's protocol, a column whose rows all have a Table 5 row at their setting (BERT4Rec at d = 64,
    smoke-profile rows left out, as :func:`published_table` holds them) gets the paper's column beside it, so that
    the relative drops can be read side by side. With ``per_user``, each variant is tested against its column's
    default, paired over users (:func:`_ablation_tests`)."""
    rows = [r for r in results.select(study="ablation", task=RANKING, protocol=protocol) if r.variant]
    if not rows:
        return None
    by_column = group(rows, "model", "dataset")
    models = names.order_models(model for model, _ in by_column)
    datasets = names.order_datasets(results.values("dataset", rows))
    columns = [(m, d) for m in models for d in datasets if (m, d) in by_column]

    def variant_rows(column: tuple, variant: str) -> list[Row]:
        return [r for r in by_column[column] if names.canonical_variant(r.variant) == variant]

    ours, fallback, column_rows, defaults = {}, [], dict(by_column), {}
    variants = names.order_variants(["default", *(r.variant for r in rows)])
    for column in columns:
        default = defaults[column] = variant_rows(column, "default")
        if not default:  # the main grid trains the same default configuration: its rows at the ablation's d and profile
            like = {(_hidden(r), r.get("profile")) for r in by_column[column]}
            default = defaults[column] = [r for r in results.select(study="main", task=RANKING, protocol=protocol,
                                                                    model=column[0], dataset=column[1])
                                          if (_hidden(r), r.get("profile")) in like]
            fallback += [column] if default else []
            column_rows[column] = by_column[column] + default
        ours[column] = {v: summarize(default if v == "default" else variant_rows(column, v), metric) for v in variants}
    used = [r for found in column_rows.values() for r in found]
    paper = _table5_columns(results, protocol, metric, published, column_rows)
    sources = [values for column in columns for values in (ours[column], *([paper[column]] if column in paper else []))]
    table_rows = [[label(variant), *(_ablation_cell(values.get(variant), None if variant == "default" else
                                                    values.get("default")) for values in sources)]
                  for variant in variants]
    summaries = [summary for values in ours.values() for summary in values.values() if summary is not None]
    several = len(models) > 1
    place = {column: 1 + sum(1 + (c in paper) for c in columns[:i]) for i, column in enumerate(columns)}
    tested = [(v, table_rows[i][place[c]], variant_rows(c, v), defaults[c]) for i, v in enumerate(variants)
              if v != "default" for c in columns]
    model_text = names.model_name(models[0]) if not several else "each model"
    smoke_title, smoke_notes = smoke_label(results, used)
    notes = [*smoke_notes, _protocol_note(protocol, rows),
             f"{metric} of {model_text}; in brackets the change against the default; ↓: a drop of more than "
             f"{ABLATION_DROP:.0%}."]
    if paper:
        notes.append(f"(paper): Table 5 of Sun et al. (2019), d = 64, {PUBLISHED_PROTOCOL}; a gap where it has no "
                     f"such row.")
    notes += _removed_notes(models, variants)
    if fallback:
        notes.append("Default taken from the main grid for: "
                     + ", ".join(f"{names.model_name(m)} {names.dataset_name(d)}" for m, d in fallback) + ".")
    notes += _seed_notes(summaries) + device_note(used, lambda row: names.canonical_variant(row.variant or "default"))
    notes += _ablation_tests(tested, per_user, metric, alpha) if per_user is not None else []
    return Table(f"table5_ablation_{protocol}", f"Ablation ({metric}), protocol {protocol}{smoke_title}",
                 _ablation_header(columns, paper, several), table_rows, notes=notes, paper="Table 5")


def _ablation_header(columns: list[tuple], paper: dict, several: bool) -> list[str]:
    """Table 5's header: a column per (model, dataset), each followed by the paper's where it has one."""
    header = ["Architecture"]
    for m, d in columns:
        header.append(f"{names.model_name(m)} {names.dataset_name(d)}" if several else names.dataset_name(d))
        if (m, d) in paper:
            header.append(f"{header[-1]} (paper)")
    return header


def _ablation_tests(tested: list[tuple[str, Cell, list[Row], list[Row]]], per_user: PerUser, metric: str,
                    alpha: float) -> list[str]:
    """Mark each variant's cell of ``tested`` (its name, cell, rows and its default's rows) where the variant
    differs from its default, paired over users, Holm-adjusted over the table's tests; the note that says so.
    Nothing when the table has no variant beside a default. A pair without its per-user files is named in the note,
    and where the default's are the ones missing, the note says so once instead of naming every variant."""
    made, untested, default_missing = [], [], False
    for name, cell, variant, default in tested:
        test = per_user.compare(variant, default, metric) if variant and default else None
        if test is not None:
            made.append((cell, test))
        elif variant and default and per_user.averaged(default, metric) is None:
            default_missing = True
        elif variant and default:
            untested.append(name)
    for (cell, _), test in zip(made, holm_tests([test for _, test in made])):
        cell.marks = _marks(test, alpha)
    if not made and not untested and not default_missing:
        return []
    notes = [significance_note(alpha, len(made), "each variant and its default", "the variant")]
    if default_missing:
        notes.append("Not tested: the default's per-user files are missing (rows restored from a reference file "
                     "without them), so no variant could be paired with it.")
    if untested:
        notes.append(f"Not tested (per-user files missing): {', '.join(dict.fromkeys(untested))}.")
    return notes


def _removed_notes(models: list[str], variants: list[str]) -> list[str]:
    """A note saying what each variant removes, as the model code does it (per model where models differ)."""
    removed = []
    for variant in variants:
        texts = {names.model_name(m): text for m in models if (text := names.ablation_removes(m, variant))}
        if len(set(texts.values())) == 1:
            removed.append(f"{variant}: {next(iter(texts.values()))}")
        elif texts:
            removed.append(f"{variant}: " + ", ".join(f"{name} {text}" for name, text in texts.items()))
    return ["What a row removes, as the model code does it: " + "; ".join(removed) + "."] if removed else []


def _table5_columns(results: ResultSet, protocol: str, metric: str, published: list[Published],
                    column_rows: dict[tuple, list[Row]]) -> dict[tuple, dict[str, Summary]]:
    """The paper's Table 5 values (as one-seed summaries, by variant) for each (model, dataset) column of ours
    whose every row, its default's included, is held against Table 5 (:func:`published_anchor`)."""
    if protocol != PUBLISHED_PROTOCOL:
        return {}
    out = {}
    for (model, dataset), rows in column_rows.items():
        anchors = [None if results.is_smoke(r) else published_anchor(r) for r in rows]
        if not all(anchor and anchor[0] == "Table 5" for anchor in anchors):
            continue
        values = {e.variant: Summary(e.value, None, 1) for e in published
                  if (e.table, e.dataset, e.model, e.metric) == ("Table 5", dataset, model, metric)}
        if "default" in values:
            out[(model, dataset)] = values
    return out


# ---------------------------------------------------------------------------------------------- relevance

def relevance_table(results: ResultSet, protocol: str) -> Table | None:
    """Relevance prediction: one row per (dataset, model); best per dataset bold, second underlined."""
    rows = results.select(task="relevance", protocol=protocol, study="main")
    if not rows:
        return None
    known = list(names.RELEVANCE_METRICS)
    present = {m for r in rows for m in r.metrics}
    metrics = [m for m in known if m in present] + sorted(present - set(known))
    by_key = group(rows, "dataset", "model")
    table_rows, breaks, summaries = [], set(), []
    for dataset in names.order_datasets(results.values("dataset", rows)):
        breaks.add(len(table_rows))
        models = names.order_models(m for d, m in by_key if d == dataset)
        found = {m: [summarize(by_key[(dataset, m)], metric) for metric in metrics] for m in models}
        cells = {m: [value_cell(s) for s in found[m]] for m in models}
        for index, metric in enumerate(metrics):
            mark_best([cells[m][index] for m in models], lower_is_better=metric in names.LOWER_IS_BETTER)
        for m in models:
            summaries += [s for s in found[m] if s]
            table_rows.append([label(names.dataset_name(dataset)), label(names.model_name(m)), *cells[m]])
    smoke_title, smoke_notes = smoke_label(results, rows)
    notes = [*smoke_notes,
             f"Relevance prediction (protocol {protocol}): one positive and one sampled negative candidate per "
             f"user; accuracy at threshold 0.5.",
             "Bold: best; underlined: second best per dataset (log-loss: lower is better)."]
    notes += _seed_notes(summaries)
    return Table(f"relevance_{protocol}", f"Relevance prediction, protocol {protocol}{smoke_title}",
                 ["Dataset", "Model", *map(names.metric_name, metrics)], table_rows, notes=notes, breaks=breaks)
