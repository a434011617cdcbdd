"""The report's section "Sampled against full": what the sampled protocols would say of each full-ranking row without
the noise of one draw, how well Krichene & Rendle's corrections recover the full values from sampled ranks, and
whether the order of the models holds as the number of negatives shrinks (``benchmarks.sampled_metrics``).

Built from the leave-one-out full-ranking rows whose per-user files keep each user's number of candidates: under
leave-one-out's test view those candidates are exactly the pool ``uni100`` draws from, so the expectations are exact.
Rows are grouped by dataset and study; within a group each configuration (model, variant, sweep point) is one line,
its seeds averaged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recbench.benchmarks.metrics import RankCounts
from recbench.benchmarks.sampled_metrics import (
    BV_GAMMA,
    SAMPLE_SIZES,
    above_distribution,
    corrected_bv,
    corrected_mle,
    expected_uniform,
    kendall_tau,
    mean_pool,
    rank_histogram,
)
from recbench.benchmarks.store import LEAVE_ONE_OUT
from recbench.reports import names
from recbench.reports.render import Cell, Table, fmt, to_markdown, write_table
from recbench.reports.results import ResultSet, Row
from recbench.reports.stats import PerUser

SECTION = "Sampled against full"
RANKING = "next-item"
METRICS = ("NDCG@10", "HR@10")
CORRECTED_AT = 100  # the number of negatives of uni100, at which the corrections are shown
SAMPLED_PROTOCOLS = ("uni100", "pop100")


@dataclass
class Section:
    """A report section: its Markdown lines, the tables it wrote and notes for "Skipped or incomplete"."""

    lines: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def render(heading: str, intro: list[str], tables: list[Table], table_dir: Path, figures=()) -> Section:
    """A section's lines with its tables (written to ``table_dir``) and figures (``reports.figures.Figure``)."""
    lines = [f"## {heading}", "", *intro, ""]
    for table in tables:
        write_table(table, table_dir)
        lines += [f"### [{table.heading}](tables/{table.name}.md) ([LaTeX](tables/{table.name}.tex))", "",
                  to_markdown(table, title=False), ""]
    for figure in figures:
        lines += [f"- [{figure.name}](figures/{figure.name}.png) ([PDF](figures/{figure.name}.pdf)): "
                  f"{figure.caption}", "", f"  ![{figure.caption}](figures/{figure.name}.png)", ""]
    return Section(lines, list(tables))


def configuration(row: Row) -> tuple:
    """What one line of the section's tables is: (dataset, study, model, variant, sweep point)."""
    return row.dataset, row.study, row.model, row.variant, row.sweep_value


def row_label(row: Row) -> str:
    return " ".join(filter(None, [names.model_name(row.model), row.variant if row.study != "main" else None]))


class Expectations:
    """Expected uniform-sampled metrics of full-ranking rows, computed once per row and number of negatives."""

    def __init__(self, per_user: PerUser):
        self.per_user = per_user
        self._cache: dict[tuple, object] = {}
        self.lacking: set[str] = set()

    def counts(self, row: Row) -> RankCounts | None:
        """The row's full-ranking counts with candidates (None, noted, where the file lacks them)."""
        if row.protocol != "full" or row.split != LEAVE_ONE_OUT:
            return None
        counts = self.per_user.counts(row)
        if counts is not None and counts.candidates is None:
            self.lacking.add(row.get("per_user_file"))
            return None
        return counts

    def of(self, row: Row, n: int):
        """:class:`benchmarks.sampled_metrics.SampledExpectation` of ``row`` under ``n`` uniform negatives (the
        section's metrics and the claims' NDCG@10), or None."""
        key = ("expected", row.line, n)
        if key not in self._cache:
            counts = self.counts(row)
            self._cache[key] = None if counts is None else expected_uniform(counts, n, METRICS)
        return self._cache[key]

    def corrections(self, row: Row, realised: Row | None) -> dict[str, dict[str, float]]:
        """Krichene & Rendle's estimates of the full metrics of ``row`` at ``CORRECTED_AT`` negatives: from the
        expected sampled ranks (``bv``, ``mle``) and from the realised ranks of ``realised``, its uni100 row of the
        same seed (``bv_realised``, ``mle_realised``, where its per-user file is readable)."""
        key = ("corrected", row.line, None if realised is None else realised.line)
        if key not in self._cache:
            counts = self.counts(row)
            pool = mean_pool(counts)
            expected = rank_histogram(above_distribution(counts.greater, counts.ties, counts.candidates,
                                                         CORRECTED_AT), CORRECTED_AT)
            found = {"bv": corrected_bv(expected, pool, METRICS), "mle": corrected_mle(expected, pool, METRICS)}
            sampled = None if realised is None else self.per_user.counts(realised)
            if sampled is not None:
                drawn = rank_histogram((sampled.greater, sampled.ties), CORRECTED_AT)
                found.update(bv_realised=corrected_bv(drawn, pool, METRICS), mle_realised=corrected_mle(drawn, pool,
                                                                                                      METRICS))
            self._cache[key] = found
        return self._cache[key]

    def per_user_values(self, row: Row, metric: str, n: int = CORRECTED_AT) -> tuple[np.ndarray, np.ndarray] | None:
        """(users, each user's expected value of ``metric`` under ``n`` uniform negatives), as ``PerUser.values``."""
        found = self.of(row, n)
        return None if found is None else (np.asarray(self.counts(row).users), found.per_user[metric])


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


@dataclass
class Line:
    """One configuration of one group: its full rows (seeds) and the rows of the sampled protocols."""

    label: str
    full: list[Row]
    sampled: dict[str, list[Row]]


def _lines(results: ResultSet, expectations: Expectations) -> dict[tuple[str, str], list[Line]]:
    """Per (dataset, study): the configurations with full-ranking rows whose expectations can be computed."""
    ranking = [r for r in results.rows if r.task == RANKING and r.split == LEAVE_ONE_OUT]
    by_config: dict[tuple, dict[str, list[Row]]] = {}
    for row in ranking:
        by_config.setdefault(configuration(row), {}).setdefault(row.protocol, []).append(row)
    groups: dict[tuple[str, str], list[Line]] = {}
    datasets = names.order_datasets({key[0] for key in by_config})
    for key in sorted(by_config, key=lambda k: (datasets.index(k[0]), k[1] != "main", k[1], str(k[2:]))):
        rows = by_config[key]
        full = [row for row in rows.get("full", []) if expectations.counts(row) is not None]
        if not full:
            continue
        groups.setdefault(key[:2], []).append(Line(row_label(full[0]), sorted(full, key=lambda r: r.seed),
                                                   {p: rows.get(p, []) for p in SAMPLED_PROTOCOLS}))
    for lines in groups.values():
        order = names.order_models({line.full[0].model for line in lines})
        lines.sort(key=lambda line: (order.index(line.full[0].model), line.label))
    return groups


def _realised(rows: list[Row], metric: str) -> float | None:
    return _mean([row.metrics[metric] for row in rows if metric in row.metrics])


def _corrections(line: Line, expectations: Expectations, metric: str) -> dict[str, float | None]:
    """BV(γ) and MLE estimates of the full ``metric`` from the expected sampled ranks at ``CORRECTED_AT`` negatives,
    and from the realised uni100 rows where the folder has them (each averaged over seeds)."""
    realised = {row.seed: row for row in line.sampled["uni100"]}
    found = [expectations.corrections(row, realised.get(row.seed)) for row in line.full]
    return {name: _mean([f[name][metric] for f in found if name in f]) for name in
            ("bv", "mle", "bv_realised", "mle_realised")}


def _value(value: float | None) -> Cell:
    return Cell() if value is None else Cell(fmt(value), value)


def _expected_cell(line: Line, expectations: Expectations, metric: str, n: int) -> Cell:
    found = [expectations.of(row, n) for row in line.full]
    mean = _mean([f.mean[metric] for f in found])
    if n != CORRECTED_AT:
        return _value(mean)
    return Cell(f"{fmt(mean)} ± {fmt(_mean([f.std[metric] for f in found]))}", mean)


def _group_label(dataset: str, study: str) -> list[Cell]:
    return [Cell(names.dataset_name(dataset)), Cell(study)]


def _full_value(line, metric: str) -> Cell:
    """The line's full-ranking value of ``metric``, the mean over its seeds."""
    return _value(_mean([r.metrics.get(metric) for r in line.full if metric in r.metrics]))


def expected_table(groups, expectations: Expectations) -> Table:
    rows, breaks = [], set()
    for (dataset, study), lines in groups.items():
        breaks.add(len(rows))
        for metric in METRICS:
            for line in lines:
                rows.append([*_group_label(dataset, study), Cell(line.label), Cell(metric),
                             _full_value(line, metric),
                             *(_expected_cell(line, expectations, metric, n) for n in SAMPLE_SIZES),
                             *(_value(_realised(line.sampled[p], metric)) for p in SAMPLED_PROTOCOLS)])
    notes = ["Full: the rows' full-ranking value. E[N]: its exact expectation had each user's target been ranked "
             "among N negatives drawn uniformly without replacement from the items outside the user's sequence "
             "(the uni100 pool), computed from the stored full ranks: the sampled rank is 1 + a hypergeometric "
             f"count (benchmarks/sampled_metrics.py). E[{CORRECTED_AT}] ± the standard deviation of one draw's row "
             "value: how far a single uni100 draw can fall from its expectation. uni100, pop100: the realised draw's "
             "value where the folder has that row. Means over seeds."]
    return Table("sampled_expected", "Sampled metrics without sampling noise",
                 ["Dataset", "Rows", "Model", "Metric", "Full", *(f"E[N={n}]" for n in SAMPLE_SIZES),
                  *SAMPLED_PROTOCOLS], rows, notes=notes, align="llll" + "r" * (1 + len(SAMPLE_SIZES) + 2),
                 breaks=breaks)


def corrected_table(groups, expectations: Expectations) -> Table:
    rows, breaks = [], set()
    for (dataset, study), lines in groups.items():
        breaks.add(len(rows))
        for metric in METRICS:
            for line in lines:
                found = _corrections(line, expectations, metric)
                rows.append([*_group_label(dataset, study), Cell(line.label), Cell(metric),
                             _full_value(line, metric),
                             _value(_mean([expectations.of(r, CORRECTED_AT).mean[metric] for r in line.full])),
                             _value(found["bv"]), _value(found["mle"]),
                             _value(_realised(line.sampled["uni100"], metric)),
                             _value(found["bv_realised"]), _value(found["mle_realised"])])
    notes = [f"Krichene & Rendle's corrections (KDD 2020) estimate the full value from sampled ranks alone, at N = "
             f"{CORRECTED_AT} uniform negatives: BV({BV_GAMMA:g}) replaces the metric of a sampled rank by the value "
             f"that minimises bias² + {BV_GAMMA:g}·variance against the full metric over all full ranks; MLE "
             "estimates the distribution of full ranks that makes the sampled ranks most likely and averages the "
             "metric over it. From E: the corrections applied to the expected distribution of sampled ranks (no draw "
             "noise); from uni100: applied to the folder's realised uni100 ranks. The pool is the users' mean number "
             "of candidates. Full is the value the corrections aim at."]
    return Table("sampled_corrected", f"Full-ranking metrics estimated from {CORRECTED_AT} sampled negatives",
                 ["Dataset", "Rows", "Model", "Metric", "Full", f"E[N={CORRECTED_AT}]", "BV from E", "MLE from E",
                  "uni100", "BV from uni100", "MLE from uni100"], rows, notes=notes, align="llll" + "r" * 7,
                 breaks=breaks)


def orderings(line_values: dict[str, dict[str, float]]) -> list[tuple[str, float, list[tuple[str, str]]]]:
    """Per ordering other than ``full``: Kendall's τ with the full ordering and the pairs that flip."""
    full = line_values.get("full", {})
    return [(name, *kendall_tau(full, values)) for name, values in line_values.items() if name != "full"]


def ordering_table(groups, expectations: Expectations) -> Table | None:
    rows, breaks = [], set()
    for (dataset, study), lines in groups.items():
        if len(lines) < 2:
            continue
        breaks.add(len(rows))
        for metric in METRICS:
            values: dict[str, dict[str, float]] = {"full": {}}
            for line in lines:
                values["full"][line.label] = _mean([r.metrics[metric] for r in line.full])
                for n in SAMPLE_SIZES:
                    values.setdefault(f"E[N={n}]", {})[line.label] = _mean(
                        [expectations.of(r, n).mean[metric] for r in line.full])
                found = _corrections(line, expectations, metric)
                values.setdefault(f"BV from E[N={CORRECTED_AT}]", {})[line.label] = found["bv"]
                values.setdefault(f"MLE from E[N={CORRECTED_AT}]", {})[line.label] = found["mle"]
                for protocol in SAMPLED_PROTOCOLS:
                    realised = _realised(line.sampled[protocol], metric)
                    if realised is not None:
                        values.setdefault(f"{protocol} (one draw)", {})[line.label] = realised
            for name, tau, flips in orderings(values):
                compared = len(values[name].keys() & values["full"].keys())
                rows.append([*_group_label(dataset, study), Cell(metric), Cell(name), Cell(str(compared), compared),
                             _value(None if np.isnan(tau) else tau),
                             Cell("; ".join(f"{a} > {b}" for a, b in flips) if flips else "none", len(flips))])
    if not rows:
        return None
    notes = ["Each ordering of the group's configurations set against their order under full ranking: Kendall's τ "
             "(τ-b; 1: the same order) and the pairs it orders the other way round, each written as full ranking "
             "orders it (the better first). E[N]: ordered by the expected value with N uniform negatives, so a flip "
             "there is the sampling protocol's own, not a draw's; one draw: the folder's realised sampled rows."]
    return Table("sampled_orderings", "Orderings of the models by number of negatives, against full ranking",
                 ["Dataset", "Rows", "Metric", "Ordered by", "Configurations", "Kendall's τ", "Pairs that flip"],
                 rows, notes=notes, align="llllrrl", breaks=breaks)


def section(results: ResultSet, table_dir: Path, per_user: PerUser | None = None,
            expectations: Expectations | None = None) -> Section:
    """The section's lines and tables; nothing (and a note) when no full-ranking row has per-user candidates."""
    expectations = expectations or Expectations(per_user or PerUser(results.folder))
    groups = _lines(results, expectations)
    notes = []
    if expectations.lacking:
        listed = sorted(expectations.lacking)
        notes.append(f"\"{SECTION}\" leaves out {len(listed)} full-ranking row(s) whose per-user files predate the "
                     f"stored candidate counts (e.g. `{listed[0]}`); rerunning their jobs writes them.")
    if not groups:
        if not expectations.lacking:
            notes.append(f"\"{SECTION}\" skipped: no leave-one-out full-ranking row with a per-user file.")
        return Section(notes=notes)
    tables = [expected_table(groups, expectations), corrected_table(groups, expectations)]
    tables += [t for t in [ordering_table(groups, expectations)] if t is not None]
    intro = ["The sampled protocols rank each target among 100 drawn negatives, so one draw moves their values and "
             "can reorder models. From each user's full rank this section computes what they would give without the "
             "draw's noise, for several numbers of negatives, and how far Krichene & Rendle's corrections bring "
             "sampled ranks back to the full values (PROTOCOL.md, \"Sampled metrics from full ranks\")."]
    built = render(SECTION, intro, tables, table_dir)
    built.notes = notes
    return built
