"""Figures (PNG and PDF) from result rows: sensitivity sweeps, training curves (the main grid's and the ablation's),
quality against training time, accuracy against the popularity of the lists, attention heat maps and bar charts of
Table 2.

Every builder returns the figures it wrote and, when it had nothing to draw, a note saying why, so the report can
say what was skipped. Colours and markers are fixed per model across all figures.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: runs write files, nobody is watching a window
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import LogFormatter, MaxNLocator  # noqa: E402

from recbench.reports import names  # noqa: E402
from recbench.reports.published import PUBLISHED_PROTOCOL, load_published, sweep_points  # noqa: E402
from recbench.reports.results import SMOKE, SMOKE_LABEL, ResultSet, Row  # noqa: E402
from recbench.reports.stats import summarize  # noqa: E402
from recbench.reports.tables import RANKING, group, smoke_label  # noqa: E402
from recbench.reports.tuning import best_so_far  # noqa: E402

SENSITIVITY_METRICS = ("NDCG@10", "HR@10")  # paper Figs. 3-5
QUALITY_METRIC = "NDCG@10"
MARKERS = "osD^vP*Xhp<>"


@dataclass(frozen=True)
class Figure:
    """A written figure: its name (file stem), a one-line caption and its files."""

    name: str
    caption: str
    paths: tuple[Path, ...]


@dataclass
class Outcome:
    """What a figure builder produced, and why it skipped what it skipped."""

    figures: list[Figure]
    notes: list[str]


@contextmanager
def house_style():
    """The figures' look (light grid, readable fonts), applied only while drawing: the caller's own
    matplotlib settings stay untouched."""
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook"):
        yield


# Fixed colours: the two models the paper contrasts get the strongest hues, their variants the light shades.
MODEL_COLOURS = {
    "bert4rec": "#d62728", "bert4rec-1mask": "#ff9896", "bert4rec-1mask-random": "#e7969c", "sasrec": "#1f77b4",
    "sasrec-ce": "#9ecae1", "gsasrec": "#17becf", "sasrec-ss": "#aec7e8",
    "gru4rec": "#2ca02c", "gru4rec+": "#98df8a", "caser": "#9467bd", "fpmc": "#ff7f0e", "bprmf": "#8c564b",
    "ncf": "#e377c2", "pop": "#7f7f7f", "lstm": "#bcbd22", "lstm-rel": "#dbdb8d", "bert4rec-rel": "#ad494a",
    "gbert4rec": "#843c39",
}


def model_style(models: list[str]) -> dict[str, tuple]:
    """(colour, marker) per model: fixed for known models, a distinct palette for unknown ones."""
    known = list(names.MODELS)
    unknown = sorted(set(models) - set(known))
    extra = sns.color_palette("dark", max(len(unknown), 1))
    colours = {**MODEL_COLOURS, **dict(zip(unknown, extra))}
    return {m: (colours[m], MARKERS[i % len(MARKERS)]) for i, m in enumerate(known + unknown)}


def _save(fig, folder: Path, name: str, caption: str) -> Figure:
    """PNG (for the Markdown report) and PDF (for papers), each written to a temporary file then renamed."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix in ("png", "pdf"):
        path = folder / f"{name}.{suffix}"
        tmp = folder / f".{name}.{os.getpid()}.tmp.{suffix}"
        # no creation date in a PDF, so that drawing the same rows again writes the same file
        fig.savefig(tmp, format=suffix, dpi=150, metadata={"CreationDate": None} if suffix == "pdf" else None)
        os.replace(tmp, path)
        paths.append(path)
    plt.close(fig)
    return Figure(name, caption, tuple(paths))


def _legend_right(fig, handles, labels, title: str | None = None, where: str = "center") -> None:
    """A legend in its own space right of the axes (constrained layout makes room), never over the data."""
    fig.legend(handles, labels, title=title, loc=f"outside right {where}", frameon=False)


def _span(counts: set[int]) -> str:
    """``3`` or ``2–3``: how many seeds the shown spreads are over."""
    return str(min(counts)) if len(counts) == 1 else f"{min(counts)}–{max(counts)}"


def _smoke_title(results: ResultSet, rows: list[Row]) -> str:
    """A line for a figure's title when its results come (partly) from the smoke profile."""
    suffix, _ = smoke_label(results, rows)
    return f"\n{suffix.strip(' ()')}" if suffix else ""


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) for v in values)


# --------------------------------------------------------------------------------------------- sensitivity

def sensitivity_figures(results: ResultSet, folder: Path) -> Outcome:
    """Paper Figs. 3-5: NDCG@10 and HR@10 against each swept parameter, one line per model, per dataset."""
    rows = [r for r in results.select(study="sensitivity", task=RANKING) if r.sweep_param is not None]
    if not rows:
        return Outcome([], ["Sensitivity plots skipped: no rows with study == \"sensitivity\" and a sweep."])
    figures = []
    style = model_style(list(results.values("model")))
    published, _ = load_published()
    for (protocol, param), found in sorted(group(rows, "protocol", "sweep_param").items()):
        sources = set()
        datasets = names.order_datasets({r.dataset for r in found})
        models = names.order_models({r.model for r in found})
        fig, axes = plt.subplots(len(SENSITIVITY_METRICS), len(datasets), squeeze=False, sharex="col",
                                 layout="constrained",
                                 # wide enough for the title and the legend even with a single dataset
                                 figsize=(max(4.2 * len(datasets) + 2.0, 8.5), 3.2 * len(SENSITIVITY_METRICS)))
        categorical = not _numeric({r.sweep_value for r in found})
        seeds = set()
        for col, dataset in enumerate(datasets):
            for row_index, metric in enumerate(SENSITIVITY_METRICS):
                ax = axes[row_index, col]
                for model in models:
                    banded = _sweep_line(ax, [r for r in found if r.dataset == dataset and r.model == model],
                                         metric, style[model], categorical)
                    if banded is None:
                        continue
                    seeds |= banded
                    points = [] if categorical or protocol != PUBLISHED_PROTOCOL else \
                        sweep_points(published, param, dataset, model, metric)
                    if points:  # the paper's values: open markers, dotted where they form a line (Table 4)
                        colour, marker = style[model]
                        ax.plot([p[0] for p in points], [p[1] for p in points], linestyle=":" if len(points) > 2
                                else "none", marker=marker, markerfacecolor="white", color=colour, zorder=3)
                        sources |= {p[2] for p in points}
                values = [] if categorical else sorted({float(r.sweep_value) for r in found})
                if param in names.LOG_SWEEPS and values and values[0] > 0:  # sizes that double: log axis
                    ax.set_xscale("log", base=2)
                    ax.minorticks_off()
                if values:  # a tick at every swept value, as the paper's figures have
                    ax.set_xticks(values, [f"{v:g}" for v in values])
                ax.set_title(f"{names.dataset_name(dataset)}: {metric}")
                ax.set_ylabel(f"{metric} ({protocol})")
                if row_index == len(SENSITIVITY_METRICS) - 1:
                    ax.set_xlabel(names.sweep_label(param))
                    ax.tick_params(axis="x", labelrotation=45 if len(values) > 6 else 0)
        handles = [Line2D([], [], color=style[m][0], marker=style[m][1]) for m in models]
        labels = [names.model_name(m) for m in models]
        if sources:
            handles.append(Line2D([], [], color="grey", marker="o", markerfacecolor="white", linestyle="none"))
            labels.append("open: the paper")
        _legend_right(fig, handles, labels, title="model")
        fig.suptitle(f"Sensitivity to {names.sweep_label(param)}, protocol {protocol}"
                     f"{_smoke_title(results, found)}")
        band = f"band: ± std over {_span(seeds)} seeds" if seeds else "one seed, no band"
        paper = (f"; open markers: the paper's values ({', '.join(sorted(sources))}; the default row is Table 5's "
                 f"at d = 64 with the dataset's N and ρ, or Table 4's column at that N)" if sources else "")
        figures.append(_save(fig, folder, f"sensitivity_{_slug(param)}_{protocol}",
                             f"{', '.join(SENSITIVITY_METRICS)} against {names.sweep_label(param)} per dataset "
                             f"(protocol {protocol}; {band}{paper})."))
    return Outcome(figures, [])


def _sweep_line(ax, rows: list[Row], metric: str, style: tuple, categorical: bool) -> set[int] | None:
    """One model's mean ``metric`` against the swept value, with a band of ± std where every point has a spread;
    the seed counts behind a band (empty without one), or None when the model has no value to draw."""
    points = {key[0]: seeds for key, seeds in group(rows, "sweep_value").items()}
    kept = [(x, s) for x in sorted(points, key=str if categorical else float)
            if (s := summarize(points[x], metric)) is not None]
    if not kept:
        return None
    x = [str(v) if categorical else float(v) for v, _ in kept]
    mean = np.array([s.mean for _, s in kept])
    colour, marker = style
    ax.plot(x, mean, marker=marker, color=colour, label=names.model_name(rows[0].model))
    if not all(s.std is not None for _, s in kept):  # a band only where every point has a spread
        return set()
    std = np.array([s.std for _, s in kept])
    ax.fill_between(x, mean - std, mean + std, color=colour, alpha=0.15, linewidth=0)
    return {s.n for _, s in kept}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")


# ------------------------------------------------------------------------------------------- training curves

def _valid_key(row: Row) -> str | None:
    """The curve key of the validation metric used for model selection (any ``valid_*`` key otherwise).

    ``valid_metric`` reads like ``NDCG@10 under full``; the curve records it as ``valid_NDCG@10``."""
    keys = {k for record in row.get("curve", []) for k in record if k.startswith("valid_")}
    preferred = "valid_" + str(row.get("valid_metric")).split(" under ")[0]
    return preferred if preferred in keys else min(keys, default=None)


def curve_figures(results: ResultSet, folder: Path) -> Outcome:
    """Validation metric against epoch and against cumulative training seconds, one line per model and seed."""
    runs = {}
    for row in results.select(study="main", task=RANKING):  # one curve per training run, whatever the protocol
        if _valid_key(row):
            runs.setdefault((row.dataset, row.model, row.seed), row)
    if not runs:
        return Outcome([], ["Training curves skipped: no main-grid row has a validated curve."])
    style = model_style(list(results.values("model")))
    figures = []
    for dataset in names.order_datasets({d for d, _, _ in runs}):
        chosen = {key: row for key, row in runs.items() if key[0] == dataset}
        models = names.order_models({m for _, m, _ in chosen})
        lines = [(row, model) for (_, model, _), row in
                 sorted(chosen.items(), key=lambda item: (models.index(item[0][1]), item[0][2]))]
        figures.append(_curves_figure(
            folder, f"curves_{_slug(dataset)}", lines, style, {m: names.model_name(m) for m in models}, "model",
            f"Training curves on {names.dataset_name(dataset)} (one line per model and seed)"
            f"{_smoke_title(results, list(chosen.values()))}",
            f"during training on {names.dataset_name(dataset)}, against epochs and seconds."))
    return Outcome(figures, [])


def ablation_curve_figures(results: ResultSet, folder: Path) -> Outcome:
    """Table 5's runs as curves: validation metric against epoch and training seconds, one line per variant and
    seed, a figure per (dataset, model). Where a variant's row stands far from the paper's, its curve says why
    (it climbed later, or never left its first level before early stopping ended it). Nothing to say when the
    folder holds no ablation rows (Table 5's own note covers that)."""
    runs = {}
    for row in results.select(study="ablation", task=RANKING):
        if row.variant and _valid_key(row):
            runs.setdefault((row.dataset, row.model, names.canonical_variant(row.variant), row.seed), row)
    if not runs:
        return Outcome([], ["Ablation training curves skipped: no ablation row has a validated curve."]
                       if results.select(study="ablation", task=RANKING) else [])
    figures = []
    datasets = names.order_datasets({key[0] for key in runs})
    for dataset, model in sorted({key[:2] for key in runs}, key=lambda key: (datasets.index(key[0]), key[1])):
        chosen = {key[2:]: row for key, row in runs.items() if key[:2] == (dataset, model)}
        variants = names.order_variants({variant for variant, _ in chosen})
        pairs = sns.color_palette("tab20")  # ten hues, each dark then light: all ten dark ones come first
        palette = pairs[0::2] + pairs[1::2]
        style = {v: (palette[i], MARKERS[i % len(MARKERS)]) for i, v in enumerate(variants)}
        lines = [(row, variant) for (variant, _), row in
                 sorted(chosen.items(), key=lambda item: (variants.index(item[0][0]), item[0][1]))]
        where = f"{names.model_name(model)} on {names.dataset_name(dataset)}"
        figures.append(_curves_figure(
            folder, f"ablation_curves_{_slug(dataset)}_{_slug(model)}", lines, style, {v: v for v in variants},
            "variant", f"Ablation (Table 5): training curves of {where} (one line per variant and seed)"
            f"{_smoke_title(results, list(chosen.values()))}", f"of each ablation variant of {where} during "
            f"training, against epochs and seconds; each line ends where its training stopped."))
    return Outcome(figures, [])


DEVICE_LINESTYLES = ("-", "--", ":", "-.")


def _curves_figure(folder: Path, name: str, lines: list[tuple[Row, str]], style: dict[str, tuple],
                   labels: dict[str, str], legend_title: str, title: str, caption_tail: str) -> Figure:
    """Two panels, validation metric against epoch and against training seconds: one line per (row, group)
    of ``lines``, drawn in its group's (colour, marker) of ``style``, the legend naming ``labels``' groups.

    Seconds on one device are not seconds on another (an ablation's GPU rows trained in minutes what its CPU rows
    trained in hours), so where the rows come from more than one device each device gets a line style of its own,
    named in a second legend, and the time axis is logarithmic, so that the fast device's lines are not squeezed
    against zero."""
    metrics = sorted({str(row.get("valid_metric", _valid_key(row)[len("valid_"):])) for row, _ in lines})
    counts = Counter(names.device_name(row.get("device")) for row, _ in lines)
    devices = sorted(counts, key=lambda device: (-counts[device], device))
    several = len(devices) > 1
    dash = {device: DEVICE_LINESTYLES[i % len(DEVICE_LINESTYLES)] for i, device in enumerate(devices)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True, layout="constrained")
    for row, line_group in lines:
        key = _valid_key(row)
        points = [r for r in row.get("curve") if key in r]
        colour, marker = style[line_group]
        linestyle = dash[names.device_name(row.get("device"))]
        for ax, x_key in zip(axes, ("epoch", "seconds")):
            ax.plot([p[x_key] for p in points], [p[key] for p in points], color=colour, marker=marker,
                    markersize=4, alpha=0.85, linestyle=linestyle)
    axes[0].set_xlabel("epoch")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].set_xlabel("training time (s, log scale)" if several else "training time (s)")
    if several:
        axes[1].set_xscale("log")
        axes[1].xaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))  # 100, 1000 s, not 10^k
    else:  # five-digit seconds of hours-long runs run into each other at the default density
        axes[1].xaxis.set_major_locator(MaxNLocator(nbins=5))
    axes[0].set_ylabel(f"validation {' / '.join(metrics)}")
    axes[0].set_title("against epochs")
    axes[1].set_title("against wall-clock time")
    handles = [Line2D([], [], color=style[g][0], marker=style[g][1]) for g in labels]
    _legend_right(fig, handles, list(labels.values()), title=legend_title)
    if several:  # below the panels, one column per device: device names are long
        fig.legend([Line2D([], [], color="grey", linestyle=dash[d]) for d in devices], devices,
                   title="device (line style; each row's time is on its own device)", loc="outside lower center",
                   ncols=min(len(devices), 3), frameon=False)
    fig.suptitle(title)
    devices_note = (f" Rows from {len(devices)} devices, each drawn in its own line style; the time axis is "
                    f"logarithmic." if several else "")
    return _save(fig, folder, name, f"Validation {' / '.join(metrics)} {caption_tail}{devices_note}")


# ------------------------------------------------------------------------------------ quality against time

def _untrained(row: Row) -> bool:
    """A model without a training loop (POP): it ran no epoch (older rows: it recorded no training time)."""
    epochs = row.raw.get("epochs_run")
    return epochs == 0 if epochs is not None else not row.get("train_seconds")


def quality_time_figures(results: ResultSet, folder: Path, metric: str = QUALITY_METRIC) -> Outcome:
    """Test ``metric`` against training seconds (log axis), one point per trained (model, dataset), per
    protocol. A model without training (POP) has no time to place it at: it is a horizontal reference line."""
    rows = [r for r in results.select(study="main", task=RANKING)
            if metric in r.metrics and (_untrained(r) or r.get("train_seconds") is not None)]
    if not any(not _untrained(r) for r in rows):
        return Outcome([], [f"Quality-against-time plots skipped: no main-grid row of a trained model has "
                            f"{metric} and train_seconds."])
    style = model_style(list(results.values("model")))
    figures = []
    for protocol in names.order_protocols({r.protocol for r in rows}):
        found = [r for r in rows if r.protocol == protocol]
        cells = group(found, "model", "dataset")
        datasets = names.order_datasets({d for _, d in cells})
        dataset_marker = {d: MARKERS[i % len(MARKERS)] for i, d in enumerate(datasets)}
        untrained = {key for key, seeds in cells.items() if all(_untrained(r) for r in seeds)}
        fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
        for (model, dataset), seeds in cells.items():
            value = summarize(seeds, metric).mean
            colour = style[model][0]
            if (model, dataset) in untrained:
                ax.axhline(value, color=colour, linestyle="--", linewidth=1.5, zorder=1)
                # Words, not the dataset's marker, say whose line it is: a marker on a log time axis reads as a
                # point at some number of seconds (issue 29: POP "near 13 s").
                ax.annotate(f"{names.model_name(model)} on {names.dataset_name(dataset)}, no training",
                            (0.01, value), xycoords=ax.get_yaxis_transform(), xytext=(0, 3),
                            textcoords="offset points", color=colour, fontsize="small", va="bottom")
                continue
            seconds = float(np.mean([r.get("train_seconds") for r in seeds]))
            ax.scatter(seconds, value, s=70, color=colour, marker=dataset_marker[dataset], edgecolor="black",
                       linewidth=0.5, alpha=0.85, zorder=2)  # points of two datasets may overlap
        ax.set_xscale("log")
        # 1, 10, 100 s, not 10^k; over a narrow range matplotlib also labels some minor ticks: 20, 30 s, not 2×10^1
        ax.xaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ax.set_xlabel("training time (s, log scale)")
        ax.set_ylabel(f"test {metric} ({protocol})")
        ax.set_title(f"Test {metric} against training time, protocol {protocol}{_smoke_title(results, found)}")
        models = names.order_models({m for m, _ in cells})
        lines = {m for m, _ in untrained}
        model_handles = [Line2D([], [], color=style[m][0], linestyle="--") if m in lines
                         else Line2D([], [], color=style[m][0], marker="o", linestyle="") for m in models]
        model_labels = [names.model_name(m) + (" (no training)" if m in lines else "") for m in models]
        data_handles = [Line2D([], [], color="grey", marker=dataset_marker[d], linestyle="") for d in datasets]
        _legend_right(fig, model_handles, model_labels, title="model (colour)", where="upper")
        _legend_right(fig, data_handles, [names.dataset_name(d) for d in datasets], title="dataset (marker)",
                      where="lower")
        reference = (f"; {', '.join(sorted(names.model_name(m) for m in lines))}, without training, as a dashed "
                     f"line" if lines else "")
        figures.append(_save(fig, folder, f"quality_vs_time_{protocol}",
                             f"Test {metric} against training seconds, one point per model and dataset "
                             f"(protocol {protocol}, mean over seeds{reference})."))
    return Outcome(figures, [])


# ------------------------------------------------------------------------------ accuracy against popularity

POPULARITY_METRIC = "ARP@10"


def popularity_figures(results: ResultSet, folder: Path, metric: str = QUALITY_METRIC) -> Outcome:
    """Test ``metric`` against ARP@10, the mean training popularity of the listed items (``PROTOCOL.md``, "Beyond
    accuracy"), of the main grid's full-ranking rows: one panel per dataset (rows) and split (columns), one point
    per model at its mean over seeds, with ± std bars on both axes where there are several seeds."""
    rows = [r for r in results.select(study="main", task=RANKING, protocol="full")
            if metric in r.metrics and POPULARITY_METRIC in r.metrics]
    if not rows:
        return Outcome([], [f"Accuracy-against-popularity figure skipped: no main-grid full-ranking row has "
                            f"{metric} and {POPULARITY_METRIC}."])
    style = model_style(list(results.values("model")))
    datasets = names.order_datasets({r.dataset for r in rows})
    splits = names.order_splits({r.split for r in rows})
    models = names.order_models({r.model for r in rows})
    cells = group(rows, "dataset", "split", "model")
    # Panels of one dataset share their axes, so that a model's move from one split to the other reads directly.
    fig, axes = plt.subplots(len(datasets), len(splits), squeeze=False, sharex="row", sharey="row",
                             layout="constrained", figsize=(max(4.6 * len(splits) + 2.4, 8.5), 3.8 * len(datasets)))
    seeds = set()
    for row_index, dataset in enumerate(datasets):
        for column, split in enumerate(splits):
            ax = axes[row_index, column]
            shown = [m for m in models if (dataset, split, m) in cells]
            for model in shown:
                x, y = (summarize(cells[(dataset, split, model)], name) for name in (POPULARITY_METRIC, metric))
                colour, marker = style[model]
                ax.errorbar(x.mean, y.mean, xerr=x.std, yerr=y.std, fmt=marker, color=colour, markersize=8,
                            markeredgecolor="black", markeredgewidth=0.5, capsize=2, linewidth=1)
                seeds |= {s.n for s in (x, y) if s.std is not None}
            if not shown:
                ax.text(0.5, 0.5, "no rows", transform=ax.transAxes, ha="center", va="center", color="grey")
            ax.set_title(f"{names.dataset_name(dataset)}, {names.split_name(split)} split")
            ax.set_xlabel(f"{POPULARITY_METRIC}: mean training interactions of a listed item")
            ax.set_ylabel(f"test {metric} (full)")
    handles = [Line2D([], [], color=style[m][0], marker=style[m][1], linestyle="", markeredgecolor="black",
                      markeredgewidth=0.5) for m in models]
    _legend_right(fig, handles, [names.model_name(m) for m in models], title="model")
    bars = f"bars: ± std over {_span(seeds)} seeds" if seeds else "one seed, no bars"
    fig.suptitle(f"Accuracy against the popularity of the top 10 (protocol full; right: more popular items)"
                 f"{_smoke_title(results, rows)}")
    return Outcome([_save(fig, folder, "accuracy_vs_popularity",
                          f"Test {metric} against {POPULARITY_METRIC} (the mean number of training interactions of "
                          f"the items in each user's top 10), one point per model, per dataset (rows) and split "
                          f"(columns); protocol full, mean over seeds; {bars}.")], [])


# ---------------------------------------------------------------------------------------------- attention

def _attention_files(results: ResultSet) -> list[tuple[Row, Path]]:
    """(a row of the run, its attention map) of every run with a map, in the order to draw them: per (dataset,
    model) the main grid's run, else a study's run with the model's own settings (variant ``default``: the
    ablation's Table 5 row, tuning's default), else any study's run (a sweep's point, a Cloze row); then by seed.
    A smoke ablation trains no main-grid BERT4Rec, and its maps are the ones a reader of its report wants.

    A row names its run's map in ``attention_file`` (results/README.md); main-grid rows written before that key
    existed are matched by the names ``<dataset>__<model>__seed<seed>.npz`` (or ``..._seed<seed>.npz``), which
    no study run had."""
    folder = results.folder / "attention"
    found = {}
    for row in results.rows:
        named = row.get("attention_file")
        candidates = ([results.folder / named] if named else
                      [folder / f"{row.dataset}{sep}{row.model}{sep}seed{row.seed}.npz" for sep in ("__", "_")]
                      if row.study == "main" else [])
        path = next((path for path in candidates if path.is_file()), None)
        if path is not None:
            found.setdefault(path, row)

    def order(run: tuple[Row, Path]) -> tuple:
        row = run[0]
        own = 0 if row.study == "main" else 1 if row.variant == "default" else 2
        return row.dataset, row.model, own, row.study, str(row.variant), row.seed

    return sorted(((row, path) for path, row in found.items()), key=order)


def _run_title(results: ResultSet, row: Row) -> str:
    """Which run a figure shows, for its title: the seed, a study run's study and variant, the smoke label."""
    study = "" if row.study == "main" else f", {row.study}" + (f" run {row.variant!r}" if row.variant else "")
    return f"(seed {row.seed}{study}){_smoke_title(results, [row])}"


def attention_figures(results: ResultSet, folder: Path, user: int | None = None,
                      layer: int = -1) -> Outcome:
    """Paper Fig. 2: from an averaged file (``benchmarks.attention.average_attention``), the attention among the
    last positions averaged over the test users, one map per layer and head, as the paper drew it; with ``user``,
    that user's map (kept in the same file, or a single-user file of older runs), one per head of one layer (the
    last by default).

    BERT4Rec's maps are preferred; other models' maps are drawn only when BERT4Rec has none; one map per
    (dataset, model), the first readable one in :func:`_attention_files`'s order."""
    files = _attention_files(results)
    if any(row.model == names.BERT4REC for row, _ in files):
        files = [(row, path) for row, path in files if row.model == names.BERT4REC]
    if not files:
        return Outcome([], ["Attention heat maps skipped: no run in results.jsonl has an attention map "
                            "(attention_file)."])
    n_items = {}
    for row in results.rows:
        stats = (row.get("dataset_info") or {}).get("stats") or {}
        if "items" in stats:
            n_items.setdefault(row.dataset, stats["items"])
    figures, notes, drawn = [], [], set()
    for row, path in files:
        dataset, model = row.dataset, row.model
        if (dataset, model) in drawn:
            continue
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
        except (OSError, ValueError) as error:
            notes.append(f"{path.name}: unreadable as an attention map ({error}); skipped.")
            continue
        title = _run_title(results, row)
        if "offsets" in arrays and user is None:  # averaged over the test users
            problem = _average_problem(arrays)
            if problem:
                notes.append(f"{path.name}: {problem}; skipped.")
                continue
            drawn.add((dataset, model))
            figures.append(_average_attention_figure(folder, row, arrays, title))
            continue
        try:
            one = "user_" if "offsets" in arrays else ""  # an averaged file holds one user's map beside the mean
            weights, items, shown = arrays[f"{one}weights"], arrays[f"{one}items"], int(arrays["user"])
        except (KeyError, TypeError, ValueError) as error:
            notes.append(f"{path.name}: unreadable as an attention map ({error!r}); skipped.")
            continue
        if user is not None and shown != user:
            continue
        if weights.ndim != 4 or weights.shape[2:] != (len(items), len(items)):
            notes.append(f"{path.name}: weights of shape {weights.shape} do not match (layers, heads, T, T) "
                         f"with T = {len(items)}; skipped.")
            continue
        drawn.add((dataset, model))
        figures.append(_attention_figure(folder, row, shown, weights, items, layer, n_items.get(dataset), title))
    if user is not None and not figures:
        notes.append(f"Attention heat maps skipped: no attention file holds user {user}.")
    return Outcome(figures, notes)


def _average_problem(arrays: dict) -> str | None:
    """Why an averaged attention file cannot be drawn, or None."""
    needed = {"weights", "users", "offsets", "mask_last"} - set(arrays)
    if needed:
        return f"averaged map without {sorted(needed)}"
    k = len(arrays["offsets"])
    if arrays["weights"].ndim != 4 or arrays["weights"].shape[2:] != (k, k) or arrays["users"].shape != (k, k):
        return f"weights {arrays['weights'].shape} and users {arrays['users'].shape} do not match {k} positions"
    return None


def _average_attention_figure(folder, run: Row, arrays: dict, title: str) -> Figure:
    """One heat map per (layer, head): rows are layers, columns heads, as the paper's Fig. 2."""
    dataset, model = run.dataset, run.model
    weights, users, offsets = arrays["weights"], arrays["users"], arrays["offsets"]
    layers, heads = weights.shape[:2]
    labels = [str(int(offset)) for offset in offsets]
    if bool(arrays["mask_last"]):
        labels[-1] = MASK_LABEL
    fig, axes = plt.subplots(layers, heads, squeeze=False, layout="constrained",
                             figsize=(3.4 * heads + 1.4, 3.4 * layers + 0.8))
    top = max(float(np.nanmax(weights)), 1e-9) if np.isfinite(weights).any() else 1.0
    image = None
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer, head]
            image = ax.imshow(np.ma.masked_invalid(weights[layer, head]), cmap="viridis", vmin=0, vmax=top,
                              interpolation="nearest")
            ax.set_title(f"layer {layer + 1}, head {head + 1}")
            ax.grid(False)
            ax.set_xticks(range(len(labels)), labels, rotation=90)
            ax.set_yticks(range(len(labels)), labels)
            if head == 0:
                ax.set_ylabel("query position")
            else:
                ax.tick_params(labelleft=False)
            if layer == layers - 1:
                ax.set_xlabel("attended (key) position")
            else:
                ax.tick_params(labelbottom=False)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="mean attention weight")
    fewest, most = int(users[users > 0].min(initial=0)), int(users.max())
    fig.suptitle(f"{names.model_name(model)} attention averaged over {most:,} test users\nlast {len(labels)} "
                 f"positions, {names.dataset_name(dataset)} {title}")
    return _save(fig, folder, f"attention_{_slug(dataset)}_{_slug(model)}",
                 f"Attention weights among the last {len(labels)} positions of each test input (−1 = the last"
                 f"{', the [MASK]' if bool(arrays['mask_last']) else ''}), every layer and head of "
                 f"{names.model_name(model)} on {names.dataset_name(dataset)}, averaged over the users that have "
                 f"both positions of a cell ({fewest:,}–{most:,} users; inputs aligned at their end, weights not "
                 f"renormalised within the window).")


MASK_LABEL = "[MASK]"


def _position_ticks(labels: list[str]) -> list[int]:
    """Ticks at every k-th position (1-based: k, 2k, 3k, ...; k the smallest of 1, 2, 5, 10, 20, 25, 50, ...
    that leaves at most ten) and at every [MASK]; a number closer than k/2 to a [MASK] is dropped so that the
    labels never overlap."""
    length = len(labels)
    step = next(s for s in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 10**9) if length / s <= 10)
    masks = [i for i, text in enumerate(labels) if text == MASK_LABEL]
    numbers = [i for i in range(step - 1, length, step)
               if step == 1 or all(abs(i - m) >= step / 2 for m in masks)]
    return sorted(set(numbers) | set(masks))


def _attention_figure(folder, run: Row, user, weights, items, layer, n_items, title: str) -> Figure:
    dataset, model = run.dataset, run.model
    layers, heads = weights.shape[:2]
    layer_index = layer % layers
    keep = np.flatnonzero(items != 0)  # padding positions carry no attention worth showing
    maps = weights[layer_index][:, keep][:, :, keep]
    # The mask token's id is the first one past the item ids.
    labels = [MASK_LABEL if n_items is not None and item > n_items else str(i + 1)
              for i, item in enumerate(items[keep])]
    columns = min(heads, 4)
    grid_rows = -(-heads // columns)
    fig, axes = plt.subplots(grid_rows, columns, squeeze=False, layout="constrained",
                             figsize=(3.6 * columns + 1.4, 3.6 * grid_rows + 0.6))
    ticks = _position_ticks(labels)
    image = None
    for head in range(grid_rows * columns):
        ax = axes[head // columns, head % columns]
        if head >= heads:
            ax.axis("off")
            continue
        image = ax.imshow(maps[head], cmap="viridis", vmin=0, vmax=max(float(maps.max()), 1e-9),
                          interpolation="nearest")
        ax.set_title(f"head {head + 1}")
        ax.grid(False)
        ax.set_xticks(ticks, [labels[t] for t in ticks])
        for text in ax.get_xticklabels():  # numbers read across; the wide [MASK] label stands upright
            text.set_rotation(90 if text.get_text() == MASK_LABEL else 0)
        ax.set_yticks(ticks, [labels[t] for t in ticks])
        # Labels only on the outer maps: every head shares the same positions.
        if head % columns == 0:
            ax.set_ylabel("query position")
        else:
            ax.tick_params(labelleft=False)
        if head + columns >= heads:
            ax.set_xlabel("attended (key) position")
        else:
            ax.tick_params(labelbottom=False)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight (probability)")
    fig.suptitle(f"{names.model_name(model)} attention, layer {layer_index + 1} of {layers}, "
                 f"{names.dataset_name(dataset)}, user {user} {title}")
    return _save(fig, folder, f"attention_{_slug(dataset)}_{_slug(model)}",
                 f"Attention weights of each head of layer {layer_index + 1}/{layers} of "
                 f"{names.model_name(model)} for user {user} on {names.dataset_name(dataset)} "
                 f"(positions 1 = oldest item).")


# ---------------------------------------------------------------------------------------------- bar charts

def bar_figures(results: ResultSet, folder: Path, protocols: list[str]) -> Outcome:
    """Table 2 as grouped bars: one panel per dataset, metrics on the x axis, one bar per model."""
    figures, notes = [], []
    style = model_style(list(results.values("model")))
    for protocol in protocols:
        rows = results.select(study="main", task=RANKING, protocol=protocol)
        if not rows:
            notes.append(f"Bar chart skipped for protocol {protocol}: no main-grid results.")
            continue
        datasets = names.order_datasets({r.dataset for r in rows})
        models = names.order_models({r.model for r in rows})
        cells = group(rows, "dataset", "model")
        fig, axes = plt.subplots(len(datasets), 1, squeeze=False, figsize=(11, 3.4 * len(datasets)),
                                 layout="constrained")
        width = 0.8 / len(models)
        seeds = set()
        for ax, dataset in zip(axes[:, 0], datasets):
            metrics = names.accuracy_metrics(m for r in rows if r.dataset == dataset for m in r.metrics)
            for i, model in enumerate(models):
                stats = [summarize(cells.get((dataset, model), []), metric) for metric in metrics]
                x = np.arange(len(metrics)) + (i - (len(models) - 1) / 2) * width
                ax.bar(x, [s.mean if s else np.nan for s in stats], width,
                       color=style[model][0], label=names.model_name(model))
                # An error bar only where there is a spread to show: a std over two or more seeds.
                spread = [(x[k], s) for k, s in enumerate(stats) if s is not None and s.std is not None]
                if spread:
                    ax.errorbar([p for p, _ in spread], [s.mean for _, s in spread],
                                yerr=[s.std for _, s in spread], fmt="none", ecolor="black", capsize=2,
                                linewidth=1)
                    seeds |= {s.n for _, s in spread}
            ax.set_xticks(np.arange(len(metrics)), metrics)
            ax.set_ylabel(f"metric value ({protocol})")
            ax.set_title(names.dataset_name(dataset))
        axes[-1, 0].set_xlabel("metric (test split)")
        handles, labels = axes[0, 0].get_legend_handles_labels()
        _legend_right(fig, handles, labels, title="model", where="upper")
        errors = f"error bars: std over {_span(seeds)} seeds" if seeds else "one seed, no error bars"
        fig.suptitle(f"Table 2 as bars, protocol {protocol} ({errors}){_smoke_title(results, rows)}")
        figures.append(_save(fig, folder, f"bars_{protocol}",
                             f"Table 2 ({protocol}) as grouped bars per dataset; {errors}."))
    return Outcome(figures, notes)


# ------------------------------------------------------------------------------------------------- tuning

def tuning_figures(studies: list[dict], folder: Path) -> Outcome:
    """The best validation value found against the trials, one line per tuning study (``tuning.json``,
    :mod:`reports.tuning`), and each finished trial's value as a point; trials by the study's own numbers, as the
    tuning tables and ``tuned.toml`` name them (the first is 0)."""
    if not studies:
        return Outcome([], [])
    style = model_style([study["model"] for study in studies])
    fig, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
    handles, labels = [], []
    for study in studies:
        colour, marker = style[study["model"]]
        finished = [t for t in study["trials"] if t["state"] == "complete" and t["value"] is not None]
        ax.plot([t["number"] for t in finished], [t["value"] for t in finished], marker, color=colour, alpha=0.5,
                markersize=4, linestyle="")
        best = best_so_far(study)
        ax.step([number for number, _ in best], [value for _, value in best], where="post", color=colour)
        handles.append(Line2D([], [], color=colour, marker=marker))
        labels.append(f"{names.model_name(study['model'])} on {names.dataset_name(study['dataset'])}")
    ax.set_xlabel("trial (its number in the tuning tables)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    objectives = sorted({study["objective"] for study in studies})
    ax.set_ylabel(f"validation {' / '.join(objectives)}")
    _legend_right(fig, handles, labels, title="study")
    smoke = sum(study.get("profile") == SMOKE for study in studies)
    fig.suptitle("Best validation value against trials (line: best so far; points: finished trials)"
                 + (f"\n{'' if smoke == len(studies) else 'partly '}{SMOKE_LABEL}" if smoke else ""))
    return Outcome([_save(fig, folder, "tuning_best_so_far", "Best validation value found against the number of "
                          "trials, per tuning study.")], [])
