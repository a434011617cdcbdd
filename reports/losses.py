"""The loss study (``python -m benchmarks.studies losses``): one table and two figures per results folder.

The table holds each loss's test NDCG@10 per dataset (mean ± std over seeds), its change against the full softmax
on the same network (SASRec-CE, the reference row), a paired test of that change over users (Holm over the
table's tests) and the training time it cost; BERT4Rec's Cloze rows beside them change the direction, once with
the same full softmax (BERT4Rec) and once with gBCE at the masked positions (gBERT4Rec), each tested against the
full softmax too. So it answers whether the bidirectional encoder or the loss carries the paper's ranking. The
figures put test NDCG@10 against training seconds, and each run's validation curve against training seconds.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatter

from recbench.reports import names
from recbench.reports.figures import MARKERS, Outcome, _curves_figure, _legend_right, _save, _slug, _valid_key
from recbench.reports.render import Cell, Table
from recbench.reports.results import ResultSet, Row
from recbench.reports.stats import PerUser, holm_tests, summarize
from recbench.reports.tables import _marks, _seed_notes, device_note, group, significance_note, smoke_label, value_cell
from recbench.reports.time_to_quality import seconds_text

STUDY = "losses"
REFERENCE_MODEL = "sasrec-ce"  # the full softmax on SASRec's network: every other loss is tested against it
METRIC = "NDCG@10"
RANKING = "next-item"


def _variants(rows: list[Row]) -> list[str]:
    """The study's variants, in the order of their models (:data:`names.MODELS`), then the reference, then
    BERT4Rec's Cloze rows (its family's models) last, as the study lists them."""
    models = names.order_models({r.model for r in rows})
    first = {}
    for row in rows:
        first.setdefault(row.variant, row.model)
    return sorted(first, key=lambda v: (first[v] in names.BERT4REC_FAMILY, first[v] == REFERENCE_MODEL,
                                        models.index(first[v]), v))


def loss_table(results: ResultSet, protocol: str, per_user: PerUser | None = None, alpha: float = 0.01,
               metric: str = METRIC) -> Table | None:
    """The loss study's table under ``protocol`` (module docstring); None without its rows."""
    rows = [r for r in results.select(study=STUDY, task=RANKING, protocol=protocol) if r.variant]
    if not rows:
        return None
    cells = group(rows, "variant", "dataset")
    datasets = names.order_datasets({r.dataset for r in rows})
    variants = _variants(rows)
    reference = {d: next((found for (v, ds), found in cells.items() if ds == d and found[0].model == REFERENCE_MODEL),
                         None) for d in datasets}
    table_rows, tested, summaries = [], [], []
    for variant in variants:
        line = [Cell(variant)]
        for dataset in datasets:
            found = cells.get((variant, dataset))
            summary = summarize(found, metric) if found else None
            base = summarize(reference[dataset], metric) if reference[dataset] else None
            cell = value_cell(summary)
            line.append(cell)
            change = 100 * (summary.mean / base.mean - 1) if summary and base and base.mean else None
            reference_row = bool(found) and found[0].model == REFERENCE_MODEL
            line.append(Cell("reference") if reference_row else Cell(_or_gap(change, lambda c: f"{c:+.1f}%"), change))
            seconds = [r.get("train_seconds") for r in found or [] if r.get("train_seconds") is not None]
            mean_seconds = float(np.mean(seconds)) if seconds else None
            line.append(Cell(seconds_text(mean_seconds), mean_seconds))
            if summary:
                summaries.append(summary)
            if found and reference[dataset] and found[0].model != REFERENCE_MODEL:
                tested.append((cell, found, reference[dataset]))
        table_rows.append(line)
    used = [r for found in cells.values() for r in found]
    smoke_title, notes = smoke_label(results, used)
    notes.append(f"Test {metric} under protocol {protocol} ({names.PROTOCOL_NAMES.get(protocol, protocol)}); "
                 f"Δ: the change against the full softmax ({names.model_name(REFERENCE_MODEL)}, the same network); "
                 f"s: mean training seconds on the runs' device.")
    notes += _seed_notes(summaries) + device_note(used, lambda row: row.variant)
    if per_user is not None:
        made = [(cell, per_user.compare(found, base, metric)) for cell, found, base in tested]
        made = [(cell, test) for cell, test in made if test is not None]
        for (cell, _), test in zip(made, holm_tests([test for _, test in made])):
            cell.marks = _marks(test, alpha)
        notes.append(significance_note(alpha, len(made), "each loss and the full softmax on its dataset",
                                       "the loss's cell"))
    header = ["Loss"] + [f"{names.dataset_name(d)} {what}" for d in datasets for what in (metric, "Δ", "s")]
    return Table(f"losses_{protocol}", f"The loss and the direction ({metric}), protocol {protocol}{smoke_title}",
                 header, table_rows, notes=notes, align="l" + "rrr" * len(datasets))


def _or_gap(value, show) -> str:
    return "–" if value is None else show(value)


def loss_figures(results: ResultSet, folder: Path, metric: str = METRIC) -> Outcome:
    """Test ``metric`` against training seconds per protocol, one point per run; and each dataset's validation
    curves against epochs and seconds, one line per loss and seed."""
    rows = [r for r in results.select(study=STUDY, task=RANKING)
            if r.variant and metric in r.metrics and r.get("train_seconds")]
    if not rows:
        return Outcome([], [])
    variants = _variants(rows)
    palette = sns.color_palette("tab10", len(variants))
    style = {v: (palette[i], MARKERS[i % len(MARKERS)]) for i, v in enumerate(variants)}
    figures = []
    for protocol in names.order_protocols({r.protocol for r in rows}):
        found = [r for r in rows if r.protocol == protocol]
        datasets = names.order_datasets({r.dataset for r in found})
        fig, axes = plt.subplots(1, len(datasets), figsize=(4 + 5 * len(datasets), 4.5), layout="constrained",
                                 squeeze=False)
        for ax, dataset in zip(axes[0], datasets):
            for row in (r for r in found if r.dataset == dataset):
                colour, marker = style[row.variant]
                ax.scatter(row.get("train_seconds"), row.metrics[metric], color=colour, marker=marker, s=60,
                           edgecolor="black", linewidth=0.5)
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))  # 10, 100 s, not 10^k
            ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
            ax.set_xlabel("training time (s, log scale)")
            ax.set_ylabel(f"test {metric} ({protocol})")
            ax.set_title(names.dataset_name(dataset))
        handles = [Line2D([], [], color=style[v][0], marker=style[v][1], linestyle="") for v in variants]
        _legend_right(fig, handles, variants, title="loss")
        fig.suptitle(f"The loss and the direction\ntest {metric} ({protocol}) against training time")
        figures.append(_save(fig, folder, f"losses_quality_vs_time_{protocol}",
                             f"Test {metric} against training seconds, one point per loss and seed (protocol "
                             f"{protocol})."))
    runs = {}
    for row in rows:
        if _valid_key(row):
            runs.setdefault((row.dataset, row.variant, row.seed), row)
    for dataset in names.order_datasets({key[0] for key in runs}):
        lines = [(row, variant) for (d, variant, _), row in sorted(runs.items(), key=lambda item: (
            variants.index(item[0][1]), item[0][2])) if d == dataset]
        figures.append(_curves_figure(
            folder, f"losses_curves_{_slug(dataset)}", lines, style, {v: v for v in variants}, "loss",
            f"The loss and the direction: validation curves on {names.dataset_name(dataset)}",
            f"of each loss on {names.dataset_name(dataset)} during training, against epochs and seconds."))
    return Outcome(figures, [])
