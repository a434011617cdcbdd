"""The report's section "Claims": for every comparison the tables make, whether the runs resolve it.

The comparisons: in the main grid, each model against its neighbour in the order of Table 2 and BERT4Rec against
every other model; in any other study, each row against its reference row: the row labelled ``default`` of its model
and dataset (Table 5's ablation), in the losses study the full softmax's row. Each is tested on NDCG@10 under every
protocol both sides have (full, pop100, uni100 and, from the full ranks, the expected uni100 value E[uni100] without
a draw's noise), for every seed they share and over the seeds averaged, under each split: a paired t-test and a
Wilcoxon signed-rank test over users, both Holm-corrected over all the section's tests (``reports.stats``). A cell
is significant where both adjusted p-values are below α.

Each protocol then holds the comparison one way (every cell significant with one sign), or does not resolve it.
The label: **robust** where every protocol holds it the same way; **protocol-dependent** where some protocol holds
it and another does not, or holds it the other way; **not resolved** where none does. A comparison with a
collapsed run (its training loss flat from the third epoch on, within 1%, and its test value within 5% of POP's
under the same protocol, split and seed) is labelled by that instead: it measures the collapse, not the change.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from recbench.benchmarks.store import LEAVE_ONE_OUT
from recbench.reports import figures, names
from recbench.reports.losses import REFERENCE_MODEL as LOSS_REFERENCE_MODEL
from recbench.reports.published import Published
from recbench.reports.render import Cell, Table
from recbench.reports.results import ResultSet, Row
from recbench.reports.sampled import CORRECTED_AT, Expectations, Section, configuration, render, row_label
from recbench.reports.stats import PairedTest, PerUser, holm_tests, paired_test
from recbench.reports.tables import PUBLISHED_PROTOCOL, paper_value

SECTION = "Claims"
RANKING = "next-item"
METRIC = "NDCG@10"
EXPECTED = f"E[uni{CORRECTED_AT}]"
PROTOCOL_ORDER = ("full", "pop100", "uni100", EXPECTED)
LABELS = ("robust", "protocol-dependent", "not resolved")
NOT_TESTED = "not tested"  # no per-user files on one side or both: no paired test could be run
PARTLY_TESTED = "tested on some seeds only"  # a seed both sides ran has no per-user files on a side
RESOLVED = "robust"  # the one label under which a comparison counts as resolved
FLAT_LOSS = 0.01  # a loss that moves less than this share of its mean from epoch 3 on is flat
POP_LIKE = 0.05  # a test value within this share of POP's is POP's


@dataclass
class Test:
    """One cell of a comparison: a protocol, a split and a seed (None: seeds averaged)."""

    protocol: str
    split: str
    seed: int | None
    difference: float  # mean over the shared users of first − second
    test: PairedTest | None
    significant: bool = False


@dataclass
class Comparison:
    dataset: str
    study: str
    kinds: list[str]
    first: dict  # (split, protocol) -> rows of the first configuration
    second: dict
    first_label: str
    second_label: str
    tests: list[Test] = field(default_factory=list)
    collapsed: list[str] = field(default_factory=list)
    untested_seeds: list[int] = field(default_factory=list)  # seeds both sides ran, one without per-user files

    def verdicts(self) -> dict[str, str]:
        """Per protocol: "+" (every cell significant, first better), "−" (every cell significant, second better)
        or "?" (not resolved)."""
        out = {}
        for protocol in PROTOCOL_ORDER:
            cells = [t for t in self.tests if t.protocol == protocol]
            if not cells:
                continue
            signs = {np.sign(t.difference) for t in cells}
            out[protocol] = ("+" if signs == {1} else "−") if all(t.significant for t in cells) and len(signs) == 1 \
                and 0 not in signs else "?"
        return out

    def label(self) -> str:
        if self.collapsed:
            return f"collapsed run: {', '.join(self.collapsed)}"
        if not self.tests:
            return NOT_TESTED
        if self.untested_seeds:  # the means over every seed are not what the tests of the others resolve
            return f"{PARTLY_TESTED}: seed {', '.join(map(str, self.untested_seeds))} lacks per-user files"
        held = set(self.verdicts().values())
        if held in ({"+"}, {"−"}):
            return "robust"
        return "not resolved" if held <= {"?"} else "protocol-dependent"


def _configurations(results: ResultSet) -> dict[tuple, dict[tuple[str, str], list[Row]]]:
    found: dict[tuple, dict] = {}
    for row in results.rows:
        if row.task == RANKING and METRIC in row.metrics:
            found.setdefault(configuration(row), {}).setdefault((row.split, row.protocol), []).append(row)
    return found


def _ordering_value(rows: dict) -> float:
    """The value a configuration is ordered by in its table: NDCG@10 under leave-one-out's full ranking, else its
    first protocol's."""
    key = (LEAVE_ONE_OUT, "full") if (LEAVE_ONE_OUT, "full") in rows else sorted(rows)[0]
    return float(np.mean([row.metrics[METRIC] for row in rows[key]]))


def comparisons(results: ResultSet) -> list[Comparison]:
    """Every comparison the tables make (module docstring), each pair once with the reasons it is made."""
    configs = _configurations(results)
    found: dict[tuple, Comparison] = {}

    def add(kind: str, first: tuple, second: tuple) -> None:
        key = (first, second)
        if key not in found:
            rows_a, rows_b = configs[first], configs[second]
            found[key] = Comparison(first[0], first[1], [], rows_a, rows_b, row_label(_any(rows_a)),
                                    row_label(_any(rows_b)))
        found[key].kinds.append(kind)

    for dataset in names.order_datasets({key[0] for key in configs}):
        main = sorted((key for key in configs if key[:2] == (dataset, "main")),
                      key=lambda key: -_ordering_value(configs[key]))
        for better, worse in zip(main, main[1:]):
            add("neighbours in Table 2", better, worse)
        for key in main:
            bert = next((k for k in main if k[2] == names.BERT4REC), None)
            if bert is not None and key != bert:
                add("BERT4Rec against each model", bert, key)
        studies = sorted({key[1] for key in configs if key[0] == dataset and key[1] != "main"})
        for study in studies:
            keys = sorted((k for k in configs if k[:2] == (dataset, study)), key=str)
            for key in keys:
                reference = _reference(key, keys)
                if reference is not None and key != reference:
                    add(f"{study} row against its reference row", key, reference)
    return list(found.values())


def _reference(key: tuple, keys: list[tuple]) -> tuple | None:
    """The row a study's row is held against: its model's row labelled ``default`` (Table 5's ablation), else in
    the losses study the full softmax's row (``reports.losses.REFERENCE_MODEL``); None where the study has none."""
    default = next((k for k in keys if k[2] == key[2] and k[3] is not None
                    and names.canonical_variant(k[3]) == "default"), None)
    if default is None and key[1] == "losses":
        default = next((k for k in keys if k[2] == LOSS_REFERENCE_MODEL), None)
    return default


def _any(rows: dict) -> Row:
    return next(iter(rows.values()))[0]


def collapsed(row: Row, pop: Row | None) -> bool:
    """Whether ``row`` is a collapsed run: its loss flat from the third epoch on and its value POP's (``pop``: POP's
    row of the same dataset, split, protocol and seed)."""
    losses = [point.get("loss") for point in row.get("curve") or []]
    losses = [loss for loss in losses if isinstance(loss, (int, float))][2:]
    if len(losses) < 2 or pop is None or METRIC not in pop.metrics or not pop.metrics[METRIC]:
        return False
    flat = max(losses) - min(losses) <= FLAT_LOSS * abs(float(np.mean(losses)))
    return flat and abs(row.metrics[METRIC] - pop.metrics[METRIC]) <= POP_LIKE * pop.metrics[METRIC]


def _pop_rows(results: ResultSet) -> dict[tuple, Row]:
    return {(row.dataset, row.split, row.protocol, row.seed): row for row in results.rows
            if row.task == RANKING and row.model == "pop"}


def _average(found: list[tuple[np.ndarray, np.ndarray] | None]):
    """Each user's value averaged over seeds, on the users every seed has (as ``PerUser.averaged``)."""
    if not found or any(f is None for f in found):
        return None
    users, total = found[0][0], found[0][1].astype(np.float64)
    for other_users, values in found[1:]:
        users, left, right = np.intersect1d(users, other_users, assume_unique=True, return_indices=True)
        total = total[left] + values[right]
    return users, total / len(found)


def _values(rows: list[Row], protocol: str, per_user: PerUser, expectations: Expectations):
    """Per-user NDCG@10 of ``rows`` (seeds averaged): stored, or expected under uni100 from the full ranks."""
    if protocol == EXPECTED:
        return _average([expectations.per_user_values(row, METRIC) for row in rows])
    return per_user.averaged(rows, METRIC)


def _cells(comparison: Comparison, per_user: PerUser, expectations: Expectations) -> tuple[list[Test], list[int]]:
    """The comparison's tests, and the seeds both sides ran that lack per-user files on a side."""
    cells, untested = [], set()
    keys = set(comparison.first) & set(comparison.second)
    sources = [(split, protocol, protocol) for split, protocol in keys]
    sources += [(split, "full", EXPECTED) for split, protocol in keys if protocol == "full" and split == LEAVE_ONE_OUT]
    for split, stored, protocol in sorted(sources):
        rows_a = {row.seed: row for row in comparison.first[(split, stored)]}
        rows_b = {row.seed: row for row in comparison.second[(split, stored)]}
        seeds = sorted(rows_a.keys() & rows_b.keys())
        groups = [(seed, [rows_a[seed]], [rows_b[seed]]) for seed in seeds]
        if len(seeds) > 1:
            groups.append((None, [rows_a[s] for s in seeds], [rows_b[s] for s in seeds]))
        for seed, a_rows, b_rows in groups:
            a = _values(a_rows, protocol, per_user, expectations)
            b = _values(b_rows, protocol, per_user, expectations)
            if a is None or b is None:
                if seed is not None and protocol == stored:  # its per-user file missing, not a derived value
                    untested.add(seed)
                continue
            shared, left, right = np.intersect1d(a[0], b[0], assume_unique=True, return_indices=True)
            if not len(shared):
                continue
            cells.append(Test(protocol, split, seed, float(a[1][left].mean() - b[1][right].mean()),
                              paired_test(a, b)))
    return cells, sorted(untested)


def judge(results: ResultSet, per_user: PerUser, expectations: Expectations, alpha: float,
          pops: ResultSet | None = None) -> list[Comparison]:
    """Every comparison with its tests, Holm-adjusted over the whole section, and its collapsed runs (held against
    POP's rows of ``results``, or of ``pops`` where POP was run elsewhere)."""
    found = comparisons(results)
    pops = _pop_rows(pops or results)
    for comparison in found:
        comparison.tests, comparison.untested_seeds = _cells(comparison, per_user, expectations)
        for side, label in ((comparison.first, comparison.first_label), (comparison.second, comparison.second_label)):
            if any(collapsed(row, pops.get((row.dataset, row.split, row.protocol, row.seed)))
                   for rows in side.values() for row in rows if row.model != "pop"):
                comparison.collapsed.append(label)
    return adjust(found, alpha)


def adjust(found: list[Comparison], alpha: float) -> list[Comparison]:
    """Mark each test significant where both its Holm-adjusted p-values, over every test of ``found``, are below
    ``alpha`` (comparisons judged apart are then corrected as one table)."""
    every = [test for comparison in found for test in comparison.tests]
    for test, adjusted in zip(every, holm_tests([test.test for test in every])):
        test.significant = (adjusted is not None and adjusted.t_pvalue < alpha and adjusted.wilcoxon_pvalue < alpha)
    return found


def _protocol_cell(comparison: Comparison, protocol: str) -> Cell:
    cells = [t for t in comparison.tests if t.protocol == protocol]
    if not cells:
        return Cell()
    averaged = [t for t in cells if t.seed is None] or cells
    difference = float(np.mean([t.difference for t in averaged]))
    significant = sum(t.significant for t in cells)
    verdict = comparison.verdicts()[protocol]
    return Cell(f"{difference:+.4f} ({significant}/{len(cells)}){' ' + verdict if verdict != '?' else ''}",
                difference)


def claims_table(found: list[Comparison], alpha: float) -> Table:
    protocols = [p for p in PROTOCOL_ORDER if any(t.protocol == p for c in found for t in c.tests)]
    rows, breaks, last = [], set(), None
    for comparison in found:
        if (comparison.dataset, comparison.study) != last:
            breaks.add(len(rows))
            last = (comparison.dataset, comparison.study)
        rows.append([Cell(names.dataset_name(comparison.dataset)), Cell(comparison.study),
                     Cell(f"{comparison.first_label} vs {comparison.second_label}"), Cell("; ".join(comparison.kinds)),
                     *(_protocol_cell(comparison, p) for p in protocols), Cell(comparison.label())])
    splits = sorted({t.split for c in found for t in c.tests})
    tests = sum(len(c.tests) for c in found)
    notes = [f"Each cell: the difference in {METRIC} (first − second; seeds averaged where they are several), and "
             f"how many of its tests (one per shared seed, one over the seeds averaged, under each split: "
             f"{', '.join(map(names.split_name, splits))}) are significant: paired t-test and Wilcoxon signed-rank "
             f"test over users both below {alpha:g} after Holm's correction over all {tests} "
             f"tests of this table. + or − after it: every test significant, the first or the second better. "
             f"{EXPECTED}: the expected uni{CORRECTED_AT} value of each user from the full ranks, without a draw's "
             f"noise (section \"Sampled against full\").",
             "Robust: every protocol holds it the same way; protocol-dependent: some protocol holds it and another "
             "does not or holds it the other way; not resolved: no protocol holds it. A collapsed run: training "
             f"loss flat from the third epoch on (within {FLAT_LOSS:.0%}) and a test value within {POP_LIKE:.0%} of "
             f"POP's; its comparisons measure the collapse."]
    return Table("claims", f"Which comparisons the runs resolve ({METRIC})",
                 ["Dataset", "Rows", "Comparison", "Made by", *protocols, "Label"], rows, notes=notes,
                 align="llll" + "r" * len(protocols) + "l", breaks=breaks)


def _differences(comparison: Comparison, published: list[Published]) -> tuple[float | None, float | None]:
    """(ours, the paper's) difference first − second in NDCG@10 under the paper's protocol: ours from the rows' means
    over seeds, the paper's from the published rows each side is held against (None where either lacks one)."""
    ours, paper = [], []
    for side in (comparison.first, comparison.second):
        rows = side.get((LEAVE_ONE_OUT, PUBLISHED_PROTOCOL), [])
        ours.append(float(np.mean([row.metrics[METRIC] for row in rows])) if rows else None)
        paper.append(paper_value(rows[0], published, METRIC)[0] if rows else None)
    return tuple(None if a is None or b is None else a - b for a, b in (ours, paper))


def agrees(comparison: Comparison, published: list[Published]) -> bool | None:
    """Whether our difference has the paper's sign; None where the paper makes no such comparison."""
    ours, paper = _differences(comparison, published)
    return None if ours is None or paper is None or paper == 0 else (ours > 0) == (paper > 0)


def ledger_table(found: list[Comparison], published: list[Published], alpha: float) -> Table:
    """Every comparison a reproduced table makes, its difference beside the paper's, whether it goes the paper's
    way, and its label: a comparison counts as agreeing with the paper only where it goes the paper's way and is
    robust; one without per-user files is not tested."""
    rows, breaks, last = [], set(), None
    for comparison in found:
        if (comparison.dataset, comparison.study) != last:
            breaks.add(len(rows))
            last = (comparison.dataset, comparison.study)
        ours, paper = _differences(comparison, published)
        way = agrees(comparison, published)
        rows.append([Cell(names.dataset_name(comparison.dataset)), Cell(comparison.study),
                     Cell(f"{comparison.first_label} vs {comparison.second_label}"), Cell("; ".join(comparison.kinds)),
                     Cell("–" if ours is None else f"{ours:+.4f}", ours),
                     Cell("–" if paper is None else f"{paper:+.4f}", paper),
                     Cell("–" if way is None else "yes" if way else "no"), Cell(comparison.label())])
    notes = [f"Δ: first − second in {METRIC} under {PUBLISHED_PROTOCOL}, ours the means over seeds, the paper's from "
             "the published row each side is held against (README's comparison); –: the paper has no such pair. "
             "Paper's way: the same sign. Label: as the report's claims section gives it, from paired t-tests and "
             f"Wilcoxon signed-rank tests over users (α = {alpha:g}, Holm over the table's tests) under every "
             f"protocol both sides have; {NOT_TESTED}: a side has no per-user files, so no paired test was run; "
             f"{PARTLY_TESTED}: a seed both sides ran lacks them on a side, so the tests of the other seeds do not "
             "judge the means over all of them. "
             f"A comparison agrees with the paper only where it goes the paper's way and is {RESOLVED}."]
    return Table("ledger", f"Which comparisons hold ({METRIC})",
                 ["Dataset", "Rows", "Comparison", "Made by", "Δ ours", "Δ paper", "Paper's way", "Label"], rows,
                 notes=notes, align="llllrrll", breaks=breaks)


def agreement_counts(found: list[Comparison], published: list[Published]) -> dict[str, int]:
    """Among the comparisons the paper also makes: how many there are, go its way (a collapsed run's never does),
    go its way resolved (robust) or resolved the other way, are not tested, not resolved, protocol-dependent, or
    hold a collapsed run."""
    made = [c for c in found if agrees(c, published) is not None]
    labels = [c.label() for c in made]
    return {"made": len(made), "its way": sum(agrees(c, published) and not c.collapsed for c in made),
            "resolved its way": sum(agrees(c, published) and c.label() == RESOLVED for c in made),
            "resolved the other way": sum(not agrees(c, published) and c.label() == RESOLVED for c in made),
            NOT_TESTED: labels.count(NOT_TESTED),
            PARTLY_TESTED: sum(label.startswith(PARTLY_TESTED) for label in labels),
            "not resolved": labels.count("not resolved"),
            "protocol-dependent": labels.count("protocol-dependent"),
            "collapsed": sum(label.startswith("collapsed") for label in labels)}


VERDICT_COLOURS = {"+": "#2ca02c", "−": "#d62728", "?": "#d9d9d9"}


def claims_figure(found: list[Comparison], folder: Path) -> figures.Figure:
    """One row per comparison, one column per protocol: green where the first is better in every test, red where
    the second is, grey where the protocol does not resolve it, blank where it was not measured."""
    protocols = [p for p in PROTOCOL_ORDER if any(t.protocol == p for c in found for t in c.tests)]
    height = 0.6 + 0.32 * len(found)
    with figures.house_style():
        fig, ax = plt.subplots(figsize=(2.2 + 1.3 * len(protocols) + 3.5, height), layout="constrained")
        for y, comparison in enumerate(found):
            verdicts = comparison.verdicts()
            for x, protocol in enumerate(protocols):
                if protocol in verdicts:
                    ax.add_patch(plt.Rectangle((x, y), 0.95, 0.9, color=VERDICT_COLOURS[verdicts[protocol]]))
            ax.text(len(protocols) + 0.1, y + 0.45, comparison.label(), va="center", fontsize=8)
        ax.set_xlim(0, len(protocols) + 2.6)
        ax.set_ylim(len(found), 0)
        ax.set_xticks(np.arange(len(protocols)) + 0.475, protocols, fontsize=8)
        ax.set_yticks(np.arange(len(found)) + 0.45,
                      [f"{names.dataset_name(c.dataset)}: {c.first_label} vs {c.second_label}" for c in found],
                      fontsize=8)
        ax.grid(False)
        ax.set_title(f"{METRIC}: green, first better; red, second better; grey, not resolved", fontsize=9)
        return figures._save(fig, folder, "claims", "Which comparisons each protocol resolves, and each one's label")


def section(results: ResultSet, table_dir: Path, figure_dir: Path, alpha: float,
            expectations: Expectations | None = None) -> Section:
    """The section's lines, table and figure; nothing (and a note) without two configurations to compare."""
    expectations = expectations or Expectations(PerUser(results.folder))
    per_user = expectations.per_user
    found = [c for c in judge(results, per_user, expectations, alpha) if c.tests]
    if not found:
        return Section(notes=[f"\"{SECTION}\" skipped: no comparison with per-user files on both sides."])
    counts = {label: sum(c.label() == label for c in found) for label in LABELS}
    collapsed_count = sum(bool(c.collapsed) for c in found)
    intro = [f"Every comparison the tables make, tested under each protocol, seed and split (module "
             f"`reports/claims.py`): {len(found)} comparisons, "
             + ", ".join(f"{count} {label}" for label, count in counts.items())
             + (f", {collapsed_count} with a collapsed run" if collapsed_count else "") + "."]
    built = render(SECTION, intro, [claims_table(found, alpha)], table_dir, [claims_figure(found, figure_dir)])
    if per_user.problems:
        built.notes = [f"\"{SECTION}\": per-user values unavailable for {len(per_user.problems)} row(s) (listed "
                       f"under the tables' significance note); their cells are left out."]
    return built
