"""Seed aggregation and paired significance tests over users.

Across seeds a cell shows the mean and the sample standard deviation (ddof=1) of the per-seed means.

Significance tests pair users. With several seeds, each user's per-seed values are **averaged** before pairing
(over the users present in every seed), rather than concatenated: the users are the independent units, and
concatenating seeds would count each user once per seed and make p-values too small.
Per-user values are recomputed from the stored rank counts with the shared evaluator, never re-derived here.
A table that marks several comparisons corrects their p-values for their number (:func:`holm`), so that a table
of many cells does not mark differences by chance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from recbench.benchmarks.metrics import RankCounts, per_user_metrics
from recbench.reports.results import Row


@dataclass(frozen=True)
class Summary:
    """One metric of one table cell over its seeds."""

    mean: float
    std: float | None  # None with a single seed
    n: int


# Measures a row records outside ``metrics``, by the name tables give them (paper Table 4's samples/s).
ROW_MEASURES = {"samples/s": "train_samples_per_s"}


def measure(row: Row, metric: str) -> float | None:
    """``metric`` of ``row``: one of its metrics, or a measure of :data:`ROW_MEASURES`; None when absent."""
    if metric in ROW_MEASURES:
        value = row.get(ROW_MEASURES[metric])
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return row.metrics.get(metric)


def summarize(rows: list[Row], metric: str) -> Summary | None:
    """Mean ± std of ``metric`` (:func:`measure`) over the rows (one per seed); None when no row has it."""
    values = [value for row in rows if (value := measure(row, metric)) is not None]
    return seed_summary(values) if values else None


def seed_summary(values: list[float]) -> Summary:
    """Mean and sample standard deviation (ddof=1) of one metric's per-seed ``values``; no std for one seed."""
    std = float(np.std(values, ddof=1)) if len(values) > 1 else None
    return Summary(float(np.mean(values)), std, len(values))


@dataclass(frozen=True)
class PairedTest:
    """Two-sided paired tests over the users two results share."""

    n_users: int
    t_pvalue: float
    wilcoxon_pvalue: float


class PerUser:
    """Per-user metric values behind result rows, read from ``per_user/*.npz`` once and cached.

    Problems (no file recorded, file missing or unreadable) are collected in ``problems`` for the report
    instead of stopping it: a missing per-user file only costs the significance mark.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._counts: dict[Path, RankCounts | None] = {}
        self.problems: set[str] = set()

    def _load(self, row: Row) -> RankCounts | None:
        name = row.get("per_user_file")
        if not name:
            self.problems.add(f"{row.dataset}/{row.model}/seed{row.seed} ({row.protocol}): no per_user_file")
            return None
        path = self.folder / name
        if path not in self._counts:
            try:
                self._counts[path] = RankCounts.load(path)
            except FileNotFoundError:
                self.problems.add(f"{name}: file missing")
                self._counts[path] = None
            except (OSError, KeyError, ValueError) as error:
                self.problems.add(f"{name}: unreadable ({error})")
                self._counts[path] = None
        return self._counts[path]

    def counts(self, row: Row) -> RankCounts | None:
        """The rank counts stored for one result row (None, with the problem noted, where unavailable)."""
        return self._load(row)

    def values(self, row: Row, metric: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(users, value of ``metric`` per user) for one result row, under the row's tie policy."""
        counts = self._load(row)
        if counts is None:
            return None
        try:
            per_user = per_user_metrics(counts.greater, counts.ties, metrics=(metric,),
                                        tie_policy=row.get("tie_policy", "expected"))
        except ValueError as error:  # a metric or tie policy the evaluator does not know
            self.problems.add(f"{row.dataset}/{row.model}/seed{row.seed} ({row.protocol}): {error}")
            return None
        return np.asarray(counts.users), per_user[metric]

    def averaged(self, rows: list[Row], metric: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Each user's value averaged over the rows (seeds), on the users every row evaluated."""
        users, total = None, None
        for row in sorted(rows, key=lambda r: r.seed):
            found = self.values(row, metric)
            if found is None:
                return None
            if users is None:
                users, total = found[0], found[1].astype(np.float64)
                continue
            users, left, right = np.intersect1d(users, found[0], assume_unique=True, return_indices=True)
            total = total[left] + found[1][right]
        if users is None:
            return None
        return users, total / len(rows)

    def compare(self, rows_a: list[Row], rows_b: list[Row], metric: str) -> PairedTest | None:
        """Paired t-test and Wilcoxon signed-rank test of ``metric`` between two models' results."""
        return paired_test(self.averaged(rows_a, metric), self.averaged(rows_b, metric))


def paired_test(a: tuple[np.ndarray, np.ndarray] | None,
                b: tuple[np.ndarray, np.ndarray] | None) -> PairedTest | None:
    """Paired t-test and Wilcoxon signed-rank test between two sets of per-user values, each (users, values) as
    :meth:`PerUser.averaged` gives them, on the users both hold; None when either is missing or fewer than two
    users are shared."""
    if a is None or b is None:
        return None
    users, left, right = np.intersect1d(a[0], b[0], assume_unique=True, return_indices=True)
    if len(users) < 2:
        return None
    x, y = a[1][left], b[1][right]
    if np.array_equal(x, y):  # identical results: no evidence of a difference (the tests are undefined)
        return PairedTest(len(users), 1.0, 1.0)
    t_p = float(stats.ttest_rel(x, y).pvalue)
    w_p = float(stats.wilcoxon(x, y).pvalue)
    return PairedTest(len(users), t_p if not math.isnan(t_p) else 1.0, w_p if not math.isnan(w_p) else 1.0)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment (Holm, Scand. J. Statist. 1979) of ``m`` p-values, in their order: the i-th
    smallest becomes max over j <= i of min(1, (m - j + 1)·p_(j)). A difference is significant at level α when
    its adjusted p-value is below α; the family-wise error rate of the whole table is then at most α."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [1.0] * len(pvalues), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


def holm_tests(tests: list[PairedTest | None]) -> list[PairedTest | None]:
    """The tests with each kind's p-values (t-test, Wilcoxon) Holm-adjusted over the tests that were made."""
    made = [test for test in tests if test is not None]
    t_adjusted = iter(holm([test.t_pvalue for test in made]))
    w_adjusted = iter(holm([test.wilcoxon_pvalue for test in made]))
    return [None if test is None else PairedTest(test.n_users, next(t_adjusted), next(w_adjusted)) for test in tests]
