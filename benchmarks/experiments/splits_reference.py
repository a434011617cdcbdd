"""Issue 30's reference files: every model under leave-one-out and under the global temporal split, with the
commands that wrote the rows, the orderings, their agreement and the popularity of each model's lists.

    python -m benchmarks.experiments.splits_reference results/splits-ml-100k results/splits-ml-latest-small

Each results folder holds one dataset's main grid under both splits (``run_all.py --split leave-one-out`` and
``--split temporal`` into the same ``--output``). For each it writes ``results/reference/splits-<dataset>.json``:
every invocation of ``manifest.jsonl`` that trained one of its jobs (time, command, commit), per split the models
in their order by test NDCG@10 (full ranking) with HR@10, NDCG@10 and the beyond-accuracy metrics of their top 10,
Kendall's τ between the two orderings, the split's own counts (cut times, users skipped, candidates taken out) and
the rows themselves. Under ``results/reference/splits/`` it writes the report's tables of the section "Under both
splits: order and popularity" per dataset (``<dataset>_<table>.{md,tex}``, paired tests from the folder's per-user
files) and one figure of NDCG@10 against ARP@10 over all the folders (``accuracy_vs_popularity.{png,pdf}``).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.experiments.converge_reference import invocations
from recbench.benchmarks.store import write_atomic
from recbench.reports import figures, names
from recbench.reports.render import write_table
from recbench.reports.results import ResultSet, load_results
from recbench.reports.splits import (
    BEYOND_ACCURACY,
    ORDER_METRIC,
    SIDE_BY_SIDE_METRICS,
    kendall_table,
    section_rows,
    split_tables,
)
from recbench.reports.stats import PerUser, summarize

ROOT = Path(__file__).resolve().parents[2]
METRICS = (*SIDE_BY_SIDE_METRICS, *BEYOND_ACCURACY)


def split_summary(result: ResultSet, split: str) -> dict:
    """One split of one folder: the models in their order by test NDCG@10 and what the split kept and dropped."""
    rows = [row for row in section_rows(result) if row.split == split]
    models = []
    for model in names.order_models({row.model for row in rows}):
        chosen = [row for row in rows if row.model == model]
        entry = {"model": model, "seeds": sorted(row.seed for row in chosen),
                 "users_evaluated": sorted({row.get("users_evaluated") for row in chosen}),
                 "stopped_by": sorted({str(row.get("stopped_by")) for row in chosen})}
        for metric in METRICS:
            found = summarize(chosen, metric)
            entry[metric] = None if found is None else round(found.mean, 4 if not metric.startswith("ARP") else 1)
        models.append(entry)
    models.sort(key=lambda entry: -(entry[ORDER_METRIC] or 0.0))
    facts = next((row.get("temporal_split") for row in rows if row.get("temporal_split")), None)
    return {"split": split, "order_by": f"test {ORDER_METRIC}, full ranking", "models": models,
            "temporal_split": facts}


def kendall(result: ResultSet) -> list[dict]:
    """Kendall's τ between the two splits' orderings, as the report's table gives it."""
    table = kendall_table(result)
    if table is None:
        return []
    return [{"metric": row[1].text, "models": int(row[2].value), "tau": row[3].value, "p": row[4].value}
            for row in table.rows]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path,
                        help="results folders, each one dataset's run_all.py rows under both --split values")
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "reference")
    args = parser.parse_args(argv)
    command = f"python -m benchmarks.experiments.splits_reference {' '.join(map(str, args.folders))}"
    merged = []
    for folder in args.folders:
        result = load_results(folder)
        datasets, splits = result.values("dataset"), names.order_splits(result.values("split"))
        if len(datasets) != 1 or len(splits) != 2:
            sys.exit(f"{folder}: expected the rows of one dataset under both splits, found datasets "
                     f"{sorted(datasets)} and splits {splits}; run run_all.py with --split leave-one-out and "
                     f"--split temporal into this folder")
        dataset = datasets.pop()
        per_user = PerUser(folder)
        tables, notes = split_tables(result, per_user)
        for table in tables:
            md, tex = write_table(replace(table, name=f"{dataset}_{table.name}"), args.output / "splits")
            print(f"written: {md}, {tex}")
        keys = {row.get("key") for row in result.rows}
        write_atomic(args.output / f"splits-{dataset}.json", json.dumps({
            "dataset": dataset, "folder": str(folder), "command": command,
            "invocations": invocations(folder, keys), "splits": [split_summary(result, s) for s in splits],
            "kendall": kendall(result), "notes": notes + sorted(per_user.problems),
            "rows": [row.raw for row in result.rows]}, indent=1) + "\n")
        print(f"written: {args.output / f'splits-{dataset}.json'}")
        merged += result.rows
    with figures.house_style():
        drawn = figures.popularity_figures(ResultSet(args.output, merged), args.output / "splits")
    for figure in drawn.figures:
        print(f"written: {', '.join(map(str, figure.paths))}")
    for note in drawn.notes:
        print(note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
