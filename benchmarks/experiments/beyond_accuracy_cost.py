"""What the beyond-accuracy metrics (PROTOCOL.md, "Beyond accuracy") add to a full-ranking test pass on ML-1m:
every test user evaluated with the row's ranking metrics alone and with the list metrics beside them, the two
interleaved (A B B A within each round, so that a drift of the machine's load falls on both), with the load average
and the process's CPU seconds recorded beside each timing.

    python -m benchmarks.experiments.beyond_accuracy_cost                   # ML-1m from $RECBENCH_DATA_DIR
    python -m benchmarks.experiments.beyond_accuracy_cost --rounds 5 --threads 2 --models pop sasrec

The models are untrained (POP fitted on the training view): what a pass costs depends on the model's shape, not its
weights. They cover both full-ranking paths: POP and GRU4Rec score the whole matrix, BPR-MF and SASRec are ranked
tile by tile (``benchmarks.evaluator_fast``). Each measurement builds a fresh evaluator, as a job does, with its
test view prepared before the clock starts; the training view's popularity is part of the measured cost. Run it
on a quiet machine: the load average says how quiet it was.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.experiments.speed_transformers import ROOT, load_average, write_report
from recbench.benchmarks.config import resolve
from recbench.benchmarks.device import resolve_device
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.metrics import DEFAULT_METRICS, list_metric_names
from recbench.benchmarks.provenance import describe_device, git_commit
from recbench.datasets import load_dataset
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.models import model_class

MODELS = ("pop", "gru4rec", "bprmf", "sasrec")
WITH_LISTS = (*DEFAULT_METRICS, *list_metric_names(DEFAULT_METRICS))  # what a full-ranking row holds


def timed_pass(split: LeaveOneOutSplit, model, name: str, metrics: tuple) -> dict:
    """One full-ranking test pass of every user with ``metrics``: wall and CPU seconds, load, the metrics."""
    evaluator = Evaluator(split, seed=0)
    evaluator.view("test")  # the split's test view is data preparation, not evaluation
    load = load_average()
    cpu, started = time.process_time(), time.perf_counter()
    evaluation = evaluator.evaluate(model, "test", "full", name, metrics=metrics)
    return {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu,
            "load_average": load, "metrics": evaluation.metrics}


def measure(split: LeaveOneOutSplit, name: str, dataset: str, device: torch.device, rounds: int) -> dict:
    """``rounds`` rounds of (without, with, with, without) passes of one model, after one untimed pass of each."""
    torch.manual_seed(0)
    config = resolve(name, dataset, "paper", ())
    model = model_class(name)(split.data.n_users, split.data.n_items, config.model)
    if isinstance(model, torch.nn.Module):
        model.to(device).eval()
    else:  # POP: its counts are its whole fit
        model.fit(split.train())
    passes = {"without": [], "with": []}
    for metrics in (DEFAULT_METRICS, WITH_LISTS):  # warm-up: allocator, kernels, page cache
        timed_pass(split, model, name, metrics)
    for _ in range(rounds):
        for kind in ("without", "with", "with", "without"):
            passes[kind].append(timed_pass(split, model, name, DEFAULT_METRICS if kind == "without" else WITH_LISTS))
    accuracy = [{m: p["metrics"][m] for m in DEFAULT_METRICS} for kind in passes for p in passes[kind]]
    assert all(values == accuracy[0] for values in accuracy), "the list metrics changed an accuracy metric"
    without, with_lists = (np.median([p["seconds"] for p in passes[kind]]) for kind in ("without", "with"))
    return {"model": name, "device": describe_device(device), "users": split.data.n_users,
            "items": split.data.n_items, "median_seconds_without": round(float(without), 3),
            "median_seconds_with": round(float(with_lists), 3),
            "median_added_seconds": round(float(with_lists - without), 3),
            "median_added_percent": round(float(100 * (with_lists - without) / without), 1),
            "list_metrics": {m: passes["with"][0]["metrics"][m] for m in WITH_LISTS if m not in DEFAULT_METRICS},
            "passes": {kind: [{key: (round(value, 3) if isinstance(value, float) else value)
                               for key, value in p.items() if key != "metrics"} for p in found]
                       for kind, found in passes.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="ml-1m")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (without, with, with, without) passes")
    parser.add_argument("--data-dir", default=None, help="folder with the dataset files (else $RECBENCH_DATA_DIR)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--output", default=str(ROOT / "results" / "reference" / "beyond-accuracy-cost-cpu.json"))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    data = load_dataset(args.dataset, data_dir=args.data_dir, download=False, progress=False)
    split = LeaveOneOutSplit(data)
    results = []
    for name in args.models:
        row = measure(split, name, args.dataset, device, args.rounds)
        results.append(row)
        print(f"{name:>8}: {row['median_seconds_without']:7.2f} s without, {row['median_seconds_with']:7.2f} s with "
              f"the list metrics ({row['median_added_percent']:+.1f}%; load {load_average()})", flush=True)
    write_report(args.output, "beyond_accuracy_cost", argv, args.threads, results, dataset=args.dataset,
                 data_sha256=data.content_sha256(), rounds=args.rounds, commit=git_commit(),
                 description="Full-ranking test pass of every user with the ranking metrics alone and with the "
                             "beyond-accuracy metrics beside them (k = 1, 5, 10), interleaved; untrained models.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
