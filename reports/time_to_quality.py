"""Time to quality: from each training run's validation curve, the training seconds it took to reach 90%, 95% and
100% of its own best validation value, and to reach the published figures of other implementations
(``reports/anchors.csv``) where the curve measures what they measured.

A curve's seconds are the run's training time on its device (validation included, time the process stood stopped
left out), so the table names each run's device; seconds on one device say nothing of another. An anchor is a test
figure and the curve is validation (the item one step before the test item): the seconds say when the run's
validation first stood at the anchor's level, a guide to the cost of a quality, not a test result.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from recbench.reports import names
from recbench.reports.render import Cell, Table, fmt
from recbench.reports.results import ResultSet, Row

ANCHORS_FILE = Path(__file__).resolve().parent / "anchors.csv"
FRACTIONS = (0.9, 0.95, 1.0)
RANKING = "next-item"


@dataclass(frozen=True)
class Anchor:
    """A published figure of another implementation: who, on which dataset, protocol and metric, and its value."""

    source: str
    model: str | None  # None: held against every model's curve
    dataset: str
    protocol: str
    metric: str
    value: float
    note: str


def load_anchors(path: Path = ANCHORS_FILE) -> list[Anchor]:
    with open(path, newline="") as file:
        return [Anchor(r["source"], r["model"] or None, r["dataset"], r["protocol"], r["metric"], float(r["value"]),
                       r["note"]) for r in csv.DictReader(file)]


def validation_curve(row: Row) -> tuple[str, str, list[tuple[float, float]]] | None:
    """The run's selection metric, its protocol and its (training seconds, value) points, or None without one."""
    settings = row.get("train_settings") or {}
    metric, protocol = settings.get("valid_metric"), settings.get("valid_protocol")
    if not (metric and protocol) and " under " in str(row.get("valid_metric")):  # the row's "NDCG@10 under full"
        metric, protocol = str(row.get("valid_metric")).split(" under ", 1)
    points = [(record["seconds"], record[f"valid_{metric}"]) for record in row.get("curve") or []
              if f"valid_{metric}" in record and "seconds" in record]
    return (metric, protocol, points) if metric and points else None


def seconds_to_reach(points: list[tuple[float, float]], level: float) -> float | None:
    """The training seconds at the first validation whose value is at least ``level``; None: never reached."""
    return next((seconds for seconds, value in points if value >= level), None)


def _runs(results: ResultSet) -> list[Row]:
    """One row per training run (a job's rows share its curve), in dataset, model, variant and seed order."""
    runs = {}
    for row in results.select(task=RANKING):
        if validation_curve(row) is not None:
            runs.setdefault(row.get("key") or row.key, row)
    datasets = names.order_datasets({row.dataset for row in runs.values()})
    models = names.order_models({row.model for row in runs.values()})
    return sorted(runs.values(), key=lambda r: (datasets.index(r.dataset), r.study, models.index(r.model),
                                                str(r.variant or ""), r.seed))


def time_to_quality_table(results: ResultSet, anchors: list[Anchor] | None = None) -> Table | None:
    """The report's time-to-quality table (module docstring); None where no run has a validated curve."""
    anchors = load_anchors() if anchors is None else anchors
    table_rows, breaks, last, used = [], set(), None, []
    for row in _runs(results):
        metric, protocol, points = validation_curve(row)
        best = max(value for _, value in points)
        if row.dataset != last:
            breaks.add(len(table_rows))
            last = row.dataset
        what = names.model_name(row.model) + (f" ({row.variant})" if row.variant else "")
        cells = [Cell(names.dataset_name(row.dataset)), Cell(what), Cell(str(row.seed), row.seed),
                 Cell(names.device_name(row.get("device"))), Cell(f"{metric} {protocol}"), Cell(fmt(best), best)]
        for fraction in FRACTIONS:
            seconds = seconds_to_reach(points, fraction * best)
            cells.append(Cell(seconds_text(seconds), seconds))
        reached = []
        for anchor in anchors:
            if (anchor.dataset, anchor.protocol, anchor.metric) == (row.dataset, protocol, metric) and \
                    anchor.model in (None, row.model):
                seconds = seconds_to_reach(points, anchor.value)
                reached.append(f"{anchor.source} {fmt(anchor.value)}: {seconds_text(seconds, 'not reached')}")
                used.append(anchor)
        cells.append(Cell("; ".join(reached) or "–"))
        table_rows.append(cells)
    if not table_rows:
        return None
    notes = ["Training seconds (validation included) on the run's own device until its validation curve first "
             "reached 90%, 95% and 100% of its best value, and until it reached each published figure of another "
             "implementation on the same dataset, protocol and metric (reports/anchors.csv). The published figures "
             "are test values and the curve is validation, so a reached figure is a guide to cost, not a result."]
    notes += [f"{a.source} on {names.dataset_name(a.dataset)} ({a.protocol} {a.metric} {fmt(a.value)}): {a.note}."
              for a in dict.fromkeys(used)]
    header = ["Dataset", "Model", "Seed", "Device", "Selected on", "Best validation",
              *(f"s to {round(100 * f)}%" for f in FRACTIONS), "s to published figures"]
    return Table("time_to_quality", "Time to quality", header, table_rows, notes=notes, align="llrllr" + "rrr" + "l",
                 breaks=breaks)


def seconds_text(seconds: float | None, missing: str = "–") -> str:
    """Training seconds as the tables print them (``1,234``), or ``missing``."""
    return missing if seconds is None else f"{seconds:,.0f}"
