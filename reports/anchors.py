"""Ours against the best published figures of other implementations (``reports/anchors.csv``), chosen on validation.

Each candidate is one configuration of the suite (a model of the converge profile, a setting chosen on validation, a
loss of the losses study) with its rows, one per seed. On each dataset the candidate with the highest mean best
validation value (every candidate selected on the same metric and protocol) is the suite's answer; its test figures
are held against the highest published figure on that dataset, protocol and metric. A test figure never picks the
candidate, so the comparison is one a paper could report. A figure counts as reached only when the chosen candidate's
mean over at least :data:`MIN_SEEDS` seeds, each ended by early stopping, is at or above the published one.
"""
from __future__ import annotations

import numpy as np

from recbench.reports import names
from recbench.reports.render import Cell, Table, fmt
from recbench.reports.results import Row
from recbench.reports.stats import summarize
from recbench.reports.tables import label, value_cell
from recbench.reports.time_to_quality import Anchor, load_anchors

METRIC = "NDCG@10"
PROTOCOLS = ("pop100", "full")
MIN_SEEDS = 2
CONVERGED = "early stopping"


def best_valid(rows: list[Row]) -> float | None:
    """The mean over seeds of each run's best validation value; None when a run records none."""
    values = [row.get("best_valid") for row in rows]
    return float(np.mean(values)) if rows and all(isinstance(v, (int, float)) for v in values) else None


def selected_on(rows: list[Row]) -> str | None:
    """The metric and protocol the rows were selected on ("NDCG@10 under full"), when all say the same."""
    found = {str(row.get("valid_metric")) for row in rows}
    return found.pop() if len(found) == 1 else None


def ranked(candidates: dict[str, dict[str, list[Row]]]) -> list[tuple[str, dict[str, list[Row]], float, bool]]:
    """(label, {protocol: rows}, mean best validation, selected on the metric most candidates share) per candidate,
    those on the shared metric first, each part by mean best validation, highest first; candidates whose runs
    record no best validation (POP) are left out."""
    scored = [(label_, by_protocol, best_valid(by_protocol.get("full", [])), selected_on(by_protocol.get("full", [])))
              for label_, by_protocol in candidates.items()]
    scored = [entry for entry in scored if entry[2] is not None]
    metrics = [entry[3] for entry in scored]
    common = max(set(metrics), key=metrics.count) if metrics else None
    return [(label_, by_protocol, valid, on == common)
            for label_, by_protocol, valid, on in sorted(scored, key=lambda e: (e[3] != common, -e[2]))]


def target(anchors: list[Anchor], dataset: str, protocol: str, metric: str = METRIC) -> Anchor | None:
    """The highest published figure for ``dataset``, ``protocol`` and ``metric``."""
    found = [a for a in anchors if (a.dataset, a.protocol, a.metric) == (dataset, protocol, metric)]
    return max(found, key=lambda a: a.value) if found else None


def _hours(rows: list[Row]) -> Cell:
    seconds = [row.get("train_seconds") for row in rows if row.get("train_seconds") is not None]
    return Cell(f"{np.mean(seconds) / 3600:.1f}", float(np.mean(seconds))) if seconds else Cell()


def _verdict(rows: list[Row], value: float | None, published: float) -> str:
    if value is None:
        return "no row"
    ended = {str(row.get("stopped_by")) for row in rows}
    if ended != {CONVERGED}:
        return "not converged (" + ", ".join(sorted(ended)) + ")"
    if value < published:
        return "below"
    return "reached" if len(rows) >= MIN_SEEDS else f"above on one seed; {MIN_SEEDS} needed"


def anchor_table(candidates: dict[str, dict[str, list[Row]]], anchors: list[Anchor] | None = None,
                 metric: str = METRIC) -> Table | None:
    """Per dataset and protocol: the best published figure, the candidate chosen on validation and how far it
    stands. ``candidates``: {dataset: {label: {protocol: rows}}}, rows one per seed."""
    anchors = load_anchors() if anchors is None else anchors
    table_rows, breaks, used, devices = [], set(), [], set()
    for dataset in names.order_datasets(candidates):
        order = ranked(candidates[dataset])
        pick = order[0] if order and order[0][3] else None
        for protocol in PROTOCOLS:
            published = target(anchors, dataset, protocol, metric)
            if published is None:
                continue
            if not table_rows or table_rows[-1][0].text != names.dataset_name(dataset):
                breaks.add(len(table_rows))
            used.append(published)
            rows = pick[1].get(protocol, []) if pick else []
            summary = summarize(rows, metric) if rows else None
            gap = 100 * (summary.mean / published.value - 1) if summary else None
            devices |= {names.device_name(row.get("device")) for row in rows}
            table_rows.append([
                label(names.dataset_name(dataset)), label(protocol), label(published.source),
                Cell(fmt(published.value), published.value), label(pick[0] if pick else "–"),
                Cell(str(len(rows)), len(rows)), value_cell(summary),
                Cell("–" if gap is None else f"{gap:+.1f}%", gap), _hours(rows),
                label(_verdict(rows, summary.mean if summary else None, published.value))])
    if not table_rows:
        return None
    notes = [f"Ours: the configuration with the highest mean best validation {metric} (full ranking) over its seeds "
             "among the candidates below, its test figures mean ± sample standard deviation over the seeds; a test "
             "figure never chose it. Published: the highest figure of another implementation on the dataset and "
             f"protocol (reports/anchors.csv). Reached: at or above it over at least {MIN_SEEDS} seeds, each ended "
             "by early stopping. h: mean training hours a seed on " + " and ".join(sorted(devices)) + "."]
    notes += [f"{a.source} on {names.dataset_name(a.dataset)} ({a.protocol} {a.metric} {fmt(a.value)}): {a.note}."
              for a in dict.fromkeys(used)]
    return Table("anchors", f"Ours against the best published figures ({metric})",
                 ["Dataset", "Protocol", "Published by", metric, "Ours, chosen on validation", "Seeds", metric,
                  "Δ", "h", "Verdict"], table_rows, notes=notes, align="lllrlrrrrl", breaks=breaks)


def candidate_table(candidates: dict[str, dict[str, list[Row]]], metric: str = METRIC) -> Table | None:
    """What was tried: every candidate per dataset, by mean best validation value, with its test figures; a
    candidate selected on another validation metric than the dataset's others comes last, its metric named."""
    table_rows, breaks, others = [], set(), []
    for dataset in names.order_datasets(candidates):
        breaks.add(len(table_rows))
        for label_, by_protocol, valid, common in ranked(candidates[dataset]):
            full = by_protocol.get("full", [])
            if not common:
                others.append(f"{label_} on {names.dataset_name(dataset)}: {selected_on(full)}")
            table_rows.append([label(names.dataset_name(dataset)), label(label_), Cell(str(len(full)), len(full)),
                               Cell(fmt(valid) + ("" if common else " *"), valid),
                               *(value_cell(summarize(by_protocol.get(p, []), metric)) for p in PROTOCOLS),
                               _hours(full), label(", ".join(sorted({str(r.get("stopped_by")) for r in full})))])
    if not table_rows:
        return None
    notes = ["Every configuration the reproduction trained on the dataset, ordered by its mean best validation "
             f"{metric} under full ranking over its seeds; test figures mean ± sample standard deviation over the "
             "seeds; h: mean training hours a seed."]
    if others:
        notes.append("*: selected on another validation measure, not comparable and never chosen ("
                     + "; ".join(others) + ").")
    return Table("anchor_candidates", "The candidates, by validation",
                 ["Dataset", "Configuration", "Seeds", f"Validation {metric} (full)",
                  *(f"Test {metric} {p}" for p in PROTOCOLS), "h", "Ended by"], table_rows, notes=notes,
                 align="llrrrrrl", breaks=breaks)
