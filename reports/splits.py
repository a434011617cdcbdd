"""Beyond the paper's protocol: do the models keep their order under a global temporal split, and which of them
recommend the most popular items? (issue 30; ``PROTOCOL.md``, "Beyond accuracy").

From the main grid's full-ranking rows, grouped by their split scheme (``Row.split``, from ``split_scheme``):

- the models side by side under both splits: HR@10 and NDCG@10, each model's place in each split's ordering, and
  paired tests between neighbours of one ordering, Holm-corrected over the table;
- Kendall's τ between the two orderings of each dataset's models;
- the beyond-accuracy metrics of every model's top 10 under each split (:func:`beyond_accuracy_table`, which the
  report sets beneath Table 2: the lists' table of every run, whatever its splits).

With rows of one split only, the side-by-side tables are skipped with a note. The figure of NDCG@10 against ARP@10
is :func:`reports.figures.popularity_figures`.
"""
from __future__ import annotations

import math

from scipy import stats

from recbench.benchmarks.metrics import LIST_CUTOFF, LIST_METRICS, parse_list_metric
from recbench.reports import names
from recbench.reports.render import Cell, Table, fmt
from recbench.reports.results import ResultSet, Row
from recbench.reports.stats import PerUser, summarize
from recbench.reports.tables import (
    RANKING,
    group,
    label,
    mark_best,
    mark_significance,
    significance_note,
    smoke_label,
    value_cell,
)

SIDE_BY_SIDE_METRICS = ("HR@10", "NDCG@10")
ORDER_METRIC = "NDCG@10"  # what orders the models of a split
PROTOCOL = "full"  # the lists, and a ranking that every split can give, come from full ranking
BEYOND_ACCURACY = tuple(f"{kind}@{LIST_CUTOFF}" for kind in LIST_METRICS)
# What each beyond-accuracy column measures, for the table's notes.
MEANINGS = {
    "Coverage": "share of the catalogue in at least one user's list",
    "Gini": "Gini index of how often each item is listed (0: evenly, near 1: a few items fill every list)",
    "ARP": "mean training interactions of a listed item",
    "APLT": "share of a list from the long tail (outside the 20% most interacted-with items)",
    "Novelty": "mean self-information −log2 (share of training users with the item), in bits",
    "Personalization": "1 − the mean share of two users' lists in common (0: one list for everyone)",
}


# Below this many evaluated users a hit rate moves in steps above 0.01 (one user is 1/n of it): differences between
# models smaller than a step or two are a user's hit, not a model's (a temporal split of ML-latest-small: 21 users).
FEW_USERS = 100
# Kendall's τ is said in words where scipy's test of τ = 0 rejects at this level, else as no evidence either way.
TAU_ALPHA = 0.05


def coarse_steps(dataset: str, split: str, users: int) -> str | None:
    """One sentence when ``users`` evaluated users are too few for fine differences (:data:`FEW_USERS`)."""
    if users >= FEW_USERS:
        return None
    return (f"{names.dataset_name(dataset)}, {names.split_name(split)} split: only {users:,} users evaluated, so a hit "
            f"rate moves in steps of 1/{users} = {1 / users:.3f}; a difference of a step or two is one or two users' "
            f"hits, not a finding.")


def tau_verdict(tau: float, pvalue: float, models: int) -> str:
    """Kendall's τ between two orderings of ``models`` models, in words."""
    if models < 3 or math.isnan(tau):
        return f"{models} model(s) with a result under both splits: too few to compare their orderings"
    if tau == 1:
        return "both splits rank the models in the same order"
    if tau == -1:
        return "the second split reverses the first split's order"
    figures = f"τ = {tau:+.2f}, p = {pvalue:.3f}, {models} models"
    if pvalue < TAU_ALPHA:
        return f"the orderings {'agree' if tau > 0 else 'disagree'} beyond chance ({figures})"
    return (f"no evidence either way: the orderings are as alike as chance would make them ({figures}); more models "
            f"or more users would tell")


def section_rows(results: ResultSet) -> list[Row]:
    """The rows this section reads: the main grid's next-item results under full ranking, of every split."""
    return results.select(study="main", task=RANKING, protocol=PROTOCOL)


def _split_note(splits: list[str], rows: list[Row]) -> str:
    """What the values are, with the users each dataset's split evaluated: a split that leaves few users (a
    temporal split of a small log) shows it where its values are read."""
    shown = " and ".join(names.split_name(s) for s in splits)
    counts = []
    for dataset in names.order_datasets({r.dataset for r in rows}):
        found = []
        for split in splits:
            users = sorted({r.get("users_evaluated") for r in rows
                            if (r.dataset, r.split) == (dataset, split) and r.get("users_evaluated") is not None})
            if users:
                span = f"{users[0]:,}" if len(users) == 1 else f"{users[0]:,}–{users[-1]:,}"
                found.append(f"{names.split_name(split)} {span}")
        if found:
            counts.append(f"{names.dataset_name(dataset)}: {', '.join(found)}")
    evaluated = f" (users evaluated, {'; '.join(counts)})" if counts else ""
    coarse = [sentence for dataset, split in sorted({(r.dataset, r.split) for r in rows if r.split in splits})
              if (users := min((r.get("users_evaluated") for r in rows if (r.dataset, r.split) == (dataset, split)
                                and r.get("users_evaluated") is not None), default=None)) is not None
              and (sentence := coarse_steps(dataset, split, users))]
    return (f"Protocol {PROTOCOL} (each target ranked among all its candidate items); the test targets of the {shown} "
            f"split{'s' if len(splits) > 1 else ''}; means over the evaluated users{evaluated}."
            + "".join(f" {sentence}" for sentence in coarse))


def _orderings(cells: dict[str, Cell]) -> list[str]:
    """The models with a value, best first."""
    return sorted((m for m in cells if cells[m].value is not None), key=lambda m: -cells[m].value)


def _places(cells: dict[str, Cell]) -> dict[str, Cell]:
    """Each model's place in the ordering of ``cells`` (1: best; equal values share the better place)."""
    ranked = _orderings(cells)
    places = {m: 1 + sum(cells[other].value > cells[m].value for other in ranked) for m in ranked}
    return {m: Cell(text=str(places[m]), value=float(places[m])) if m in places else Cell() for m in cells}


def side_by_side_table(results: ResultSet, per_user: PerUser, alpha: float = 0.01) -> Table | None:
    """The models of each dataset under every split: HR@10 and NDCG@10, each model's place in its split's ordering
    by NDCG@10, and paired tests between each model and the next one down the same column; None with fewer than
    two splits."""
    rows = section_rows(results)
    splits = names.order_splits({r.split for r in rows})
    if len(splits) < 2:
        return None
    by_key = group(rows, "dataset", "split", "model")
    header = ["Dataset", "Model"] + [f"{metric} ({names.split_name(split)})" for split in splits
                                     for metric in (*SIDE_BY_SIDE_METRICS, "place")]
    table_rows, breaks, tests, summaries, untested = [], set(), [], [], set()
    for dataset in names.order_datasets({r.dataset for r in rows}):
        models = names.order_models({r.model for r in rows if r.dataset == dataset})
        columns = []
        for split in splits:
            for metric in SIDE_BY_SIDE_METRICS:
                seeds = {m: by_key.get((dataset, split, m), []) for m in models}
                found = {m: summarize(seeds[m], metric) for m in models}
                summaries += [s for s in found.values() if s is not None]
                cells = {m: value_cell(found[m]) for m in models}
                mark_best(list(cells.values()))
                ranked = _orderings(cells)
                for upper, lower in zip(ranked, ranked[1:]):  # neighbours in this split's ordering
                    test = per_user.compare(seeds[upper], seeds[lower], metric)
                    if test is None:
                        untested.add(f"{names.dataset_name(dataset)} ({names.split_name(split)})")
                    else:
                        tests.append((cells, (upper, lower), test))
                columns.append(cells)
                if metric == ORDER_METRIC:
                    columns.append(_places(cells))
        breaks.add(len(table_rows))
        table_rows += [[label(names.dataset_name(dataset)), label(names.model_name(m)), *(c[m] for c in columns)]
                       for m in models]
    mark_significance(tests, alpha)
    smoke_title, smoke_notes = smoke_label(results, rows)
    notes = [*smoke_notes, _split_note(splits, rows),
             f"place: the model's place among the dataset's models under that split, by {ORDER_METRIC} (1: best).",
             "Bold: best; underlined: second best (per dataset and column).",
             significance_note(alpha, len(tests), "each model and the next one below it in the same column")]
    counts = sorted({s.n for s in summaries})
    if counts and counts[-1] > 1:
        notes.append("Mean ± sample standard deviation (ddof=1) over the seeds; a value without ± is one seed.")
    if untested:
        notes.append(f"Not tested (per-user files missing): {', '.join(sorted(untested))}.")
    return Table("splits_side_by_side", f"The models under each split, protocol {PROTOCOL}{smoke_title}", header,
                 table_rows, notes=notes, breaks=breaks)


def kendall_table(results: ResultSet) -> Table | None:
    """Kendall's τ (τ-b, scipy) between the orderings of each dataset's models under the first two splits, by
    HR@10 and by NDCG@10, over the models with a result under both; None with fewer than two splits."""
    rows = section_rows(results)
    splits = names.order_splits({r.split for r in rows})
    if len(splits) < 2:
        return None
    first, second = splits[:2]
    by_key = group(rows, "dataset", "split", "model")
    table_rows, verdicts = [], []
    for dataset in names.order_datasets({r.dataset for r in rows}):
        models = names.order_models({r.model for r in rows if r.dataset == dataset})
        for metric in SIDE_BY_SIDE_METRICS:
            means = {split: {m: s.mean for m in models if (s := summarize(by_key.get((dataset, split, m), []),
                                                                          metric)) is not None}
                     for split in (first, second)}
            shared = [m for m in models if m in means[first] and m in means[second]]
            tau = pvalue = math.nan
            if len(shared) >= 2:
                tau, pvalue = stats.kendalltau([means[first][m] for m in shared], [means[second][m] for m in shared])
            verdicts.append(f"{names.dataset_name(dataset)}, {metric}: {tau_verdict(tau, pvalue, len(shared))}.")
            table_rows.append([label(names.dataset_name(dataset)), label(metric),
                               Cell(text=str(len(shared)), value=float(len(shared))),
                               Cell() if math.isnan(tau) else Cell(text=f"{tau:+.3f}", value=float(tau)),
                               Cell() if math.isnan(pvalue) else Cell(text=fmt(pvalue, 3), value=float(pvalue))])
    smoke_title, smoke_notes = smoke_label(results, rows)
    return Table("splits_kendall", f"Agreement of the {names.split_name(first)} and {names.split_name(second)} "
                 f"orderings, protocol {PROTOCOL}{smoke_title}", ["Dataset", "Metric", "Models", "Kendall's τ", "p"],
                 table_rows, notes=[*smoke_notes, _split_note([first, second], rows),
                                    "Kendall's τ-b between the two orderings of the models with a result under both "
                                    "splits (means over seeds): +1 the same order, −1 reversed; p: scipy's two-sided "
                                    "test of τ = 0 (exact for few models without ties). –: fewer than two models.",
                                    *verdicts])


def beyond_accuracy_table(results: ResultSet) -> Table | None:
    """NDCG@10 and the beyond-accuracy metrics of the top 10 per (dataset, split, model); None without rows."""
    rows = section_rows(results)
    if not rows:
        return None
    by_key = group(rows, "dataset", "split", "model")
    # A metric no row holds (added after the rows were written) gets a note, not a column of dashes.
    absent_everywhere = [metric for metric in BEYOND_ACCURACY if summarize(rows, metric) is None]
    metrics = (ORDER_METRIC, *(metric for metric in BEYOND_ACCURACY if metric not in absent_everywhere))
    splits = names.order_splits({r.split for r in rows})
    table_rows, breaks, summaries, missing = [], set(), [], {}
    for dataset in names.order_datasets({r.dataset for r in rows}):
        for split in splits:
            models = names.order_models({m for d, s, m in by_key if (d, s) == (dataset, split)})
            if models:
                breaks.add(len(table_rows))
            for model in models:
                found = [summarize(by_key[(dataset, split, model)], metric) for metric in metrics]
                summaries += [s for s in found if s is not None]
                absent = tuple(metric for metric, s in zip(metrics[1:], found[1:]) if s is None)
                if absent:
                    missing.setdefault(absent, []).append(f"{names.model_name(model)} on "
                                                          f"{names.dataset_name(dataset)} ({names.split_name(split)})")
                table_rows.append([label(names.dataset_name(dataset)), label(names.split_name(split)),
                                   label(names.model_name(model)),
                                   *(value_cell(s, digits=1 if metric.startswith("ARP") else 4)
                                     for metric, s in zip(metrics, found))])
    smoke_title, smoke_notes = smoke_label(results, rows)
    notes = [*smoke_notes, _split_note(splits, rows),
             f"Each user's top {LIST_CUTOFF} among the same candidates as its target, ties across the list's end "
             f"shared (PROTOCOL.md, \"Beyond accuracy\"); popularity from the training interactions only."]
    notes += [f"{kind}@{LIST_CUTOFF}: {MEANINGS[kind]}." for kind in LIST_METRICS
              if f"{kind}@{LIST_CUTOFF}" in metrics]
    counts = sorted({s.n for s in summaries})
    if counts and counts[-1] > 1:
        notes.append("Mean ± sample standard deviation (ddof=1) over the seeds; a value without ± is one seed.")
    if len(metrics) == 1:
        notes.append("No row here holds beyond-accuracy metrics: the rows were written before the metrics existed; "
                     "run those jobs again to fill the table.")
    elif absent_everywhere:
        notes.append(f"Not in any row here, which were written before {' and '.join(absent_everywhere)} existed "
                     f"(PROTOCOL.md, \"Beyond accuracy\"): " + "; ".join(
                         f"{metric}: {MEANINGS[parse_list_metric(metric)[0]]}" for metric in absent_everywhere) + ".")
    for absent, where in missing.items():
        what = "beyond-accuracy metrics" if len(absent) == len(metrics) - 1 else " and ".join(absent)
        notes.append(f"No {what} in the rows of {', '.join(sorted(where))}: they were written before "
                     f"{'the metrics' if len(absent) > 1 else 'it'} existed; run those jobs again to fill the gaps.")
    return Table("beyond_accuracy", f"What the top {LIST_CUTOFF} lists show, protocol {PROTOCOL}{smoke_title}",
                 ["Dataset", "Split", "Model", *metrics], table_rows, notes=notes, breaks=breaks)


def split_tables(results: ResultSet, per_user: PerUser, alpha: float = 0.01) -> tuple[list[Table], list[str]]:
    """The section's tables and its notes (which splits have no rows, what was skipped)."""
    rows = section_rows(results)
    if not rows:
        return [], [f"No main-grid row under protocol {PROTOCOL}: nothing to set side by side."]
    present = names.order_splits({r.split for r in rows})
    notes = []
    absent = [s for s in names.SPLITS if s not in present]
    if absent:
        notes.append(f"The {' and '.join(map(names.split_name, absent))} split has no rows here, so the models are not "
                     f"set side by side and no Kendall's τ is given (a run with `--split "
                     f"{absent[0]}` adds them).")
    # the beyond-accuracy table stands beneath Table 2 (reports.report), not in this section
    built = [side_by_side_table(results, per_user, alpha), kendall_table(results)]
    return [table for table in built if table is not None], notes
