"""How much the order of a user's interactions that share one timestamp moves leave-one-out results.

Leave-one-out tests each user's last interaction and validates on the one before it. Where several of a user's
interactions carry the same time (MovieLens users rate films in bursts, many within one second), which of them
comes last is decided by how the preparation broke the tie, not by the user: the suite's preparation keeps the
file's order (a stable sort), other pipelines sort by (time, item) or with an unstable sort. The paper's ML-1m file
was prepared by its authors from the same ratings; the copy here holds the same interactions, but its same-second
ratings are in the order of another pipeline's sort, and it has no times to tell which.

This script takes a dataset with times (ML-100k, ML-latest-small, the raw ML-1m), counts the users whose test and
validation targets a tie decides, re-breaks every tie in other orders (the file's, item ids ascending, the reverse of
the file's, random), and runs the same grid (models × seeds, converge profile) on each ordering through the API, so
that the spread between orderings can be set beside the spread between seeds:

    python -m benchmarks.experiments.timestamp_ties --dataset ml-100k --data-dir DIR --models pop sasrec --seeds 0 1

Each ordering's results go to ``OUTPUT/<ordering>/`` (default ``results/timestamp-ties-<dataset>/``; a rerun
resumes there), the figures to ``results/reference/timestamp-ties-<dataset>[-<tag>].json`` with the command and
commit.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from recbench.benchmarks.api import run
from recbench.benchmarks.provenance import git_commit
from recbench.benchmarks.store import write_atomic
from recbench.datasets import load_dataset
from recbench.datasets.sequences import SequenceData

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("NDCG@10", "HR@10")
PROTOCOLS = ("pop100", "full")


def tie_order(data: SequenceData, ordering: str) -> np.ndarray:
    """The positions of ``data.items`` with every run of one user's equal times re-ordered: ``file`` keeps the
    prepared order, ``item`` sorts a run by item id, ``reverse`` reverses it, ``random-S`` shuffles it (seed S)."""
    n, user = len(data.items), data.user_index()
    # A run: consecutive positions of one user with one time; its number orders the runs as they stand.
    starts = np.r_[True, (user[1:] != user[:-1]) | (data.times[1:] != data.times[:-1])]
    run_of = np.cumsum(starts) - 1
    if ordering == "file":
        within = np.arange(n)
    elif ordering == "item":
        within = data.items
    elif ordering == "reverse":
        within = -np.arange(n)
    elif ordering.startswith("random-") and ordering[len("random-"):].isdigit():
        within = np.random.default_rng(int(ordering[len("random-"):])).permutation(n)
    else:
        raise ValueError(f"unknown ordering {ordering!r}; expected file, item, reverse or random-S (S a seed)")
    return np.lexsort((within, run_of))


def target_positions(data: SequenceData) -> tuple[np.ndarray, np.ndarray]:
    """Each user's test target (last position) and validation target (second to last) in ``data.items``."""
    return data.offsets[1:] - 1, data.offsets[1:] - 2


def tie_counts(data: SequenceData) -> dict:
    """How many users' targets a tie decides: the share whose test target (last) or validation target (second to
    last) shares its time with another of the user's interactions, and the share of all interactions in a tie."""
    (last, before), in_tie = target_positions(data), data.tied_in_time()
    return {"users": len(last),
            "test_target_in_a_tie": round(float(in_tie[last].mean()), 4),
            "validation_target_in_a_tie": round(float(in_tie[before].mean()), 4),
            "interactions_in_a_tie": round(float(in_tie.mean()), 4)}


def as_log(data: SequenceData, order: np.ndarray) -> pd.DataFrame:
    """The data as a log in ``order`` (user row, item id, time), which the stable time sort keeps as it is."""
    user = data.user_index()
    return pd.DataFrame({"user": user[order], "item": data.items[order], "time": data.times[order]})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="a registry dataset with times (ml-100k, ml-latest-small)")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--cache-dir")
    parser.add_argument("--models", nargs="+", default=["pop", "sasrec"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--orderings", nargs="+", default=["file", "item", "reverse", "random-1"])
    parser.add_argument("--profile", default="converge")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", type=Path, help="results folders (default results/timestamp-ties-DATASET)")
    parser.add_argument("--reference", type=Path, default=ROOT / "results" / "reference")
    parser.add_argument("--tag", help="names the figures' file timestamp-ties-DATASET-TAG.json, e.g. for other "
                                      "models on the same orderings")
    args = parser.parse_args(argv)
    data = load_dataset(args.dataset, data_dir=args.data_dir, cache_dir=args.cache_dir, download=False,
                        progress=False)
    if data.times is None:
        sys.exit(f"{args.dataset}: its file has no interaction times, so no ties to re-break; name a dataset "
                 f"prepared from a raw file with times (ml-100k, ml-latest-small)")
    output = args.output or ROOT / "results" / f"timestamp-ties-{args.dataset}"
    orders = {ordering: tie_order(data, ordering) for ordering in args.orderings}  # every name checked first
    counts = tie_counts(data)
    print(f"{args.dataset}: {counts}")
    first_test, first_valid = target_positions(data)
    reference = orders.get("file", np.arange(len(data.items)))
    entries = []
    for ordering, order in orders.items():
        entry = {"ordering": ordering,
                 "test_targets_changed": round(float(np.mean(data.items[order[first_test]]
                                                             != data.items[reference[first_test]])), 4),
                 "validation_targets_changed": round(float(np.mean(data.items[order[first_valid]]
                                                                   != data.items[reference[first_valid]])), 4)}
        rows = run(datasets={f"{args.dataset}-ties-{ordering}": as_log(data, order)}, models=args.models,
                   seeds=args.seeds, log_format={"min_item_interactions": 0, "min_user_interactions": 0},
                   profile=args.profile, protocols=PROTOCOLS, output=output / ordering, data_dir=args.data_dir,
                   cache_dir=args.cache_dir, resume=True, n_jobs=1, threads=args.threads, progress=False)
        entry["models"] = {}
        for model, found in rows.groupby("model"):
            entry["models"][model] = {
                f"{protocol} {metric}": {str(seed): round(float(value), 4) for seed, value in
                                         zip(found.loc[found.protocol == protocol, "seed"],
                                             found.loc[found.protocol == protocol, metric])}
                for protocol in PROTOCOLS for metric in METRICS}
        print(f"{ordering}: test targets changed {entry['test_targets_changed']:.1%}, "
              + ", ".join(f"{model} pop100 NDCG@10 {values['pop100 NDCG@10']}"
                          for model, values in entry["models"].items()))
        entries.append(entry)
    path = args.reference / f"timestamp-ties-{args.dataset}{f'-{args.tag}' if args.tag else ''}.json"
    command = " ".join(["python -m benchmarks.experiments.timestamp_ties", f"--dataset {args.dataset}",
                        "--data-dir DIR", "--models", *args.models, "--seeds", *map(str, args.seeds),
                        "--orderings", *args.orderings, f"--profile {args.profile}",
                        *([f"--tag {args.tag}"] if args.tag else [])])
    write_atomic(path, json.dumps({"description": __doc__.split("\n\n")[0], "commit": git_commit(),
                                   "command": command, "dataset": args.dataset, "ties": counts,
                                   "orderings": entries}, indent=1) + "\n")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
