"""Why GRU4Rec's full-ranking validation NDCG@10 on ml-100k peaks early and then falls while its training loss
keeps falling (issue 13): per epoch, beside the loss and validation NDCG@10 under ``full`` and ``pop100``, where the
top-10 items of the full ranking sit in item popularity (the median training count of the recommended items and the
share with at most 5 training interactions).

GRU4Rec's negatives are the other examples' targets, drawn in proportion to popularity. An item that is rarely a
target is rarely a negative, so nothing pushes its score down; if the top of the full ranking drifts to rare items
while ``pop100`` (whose candidates are popular) keeps improving, that drift is the cause. Additional samples drawn
∝ supp^α with α < 1 (GRU4Rec+) reach the rare items.

A variant is ``NAME: FIELD=VALUE; ...`` as ``--set`` takes them, with ``model=NAME`` to pick the model (default
gru4rec); every variant runs ``--epochs`` epochs without early stopping (``--profile paper`` otherwise).

    python -m benchmarks.experiments.gru4rec_collapse --dataset ml-100k --epochs 20 --data-dir DIR \\
        --variant "paper:" --variant "plus: model=gru4rec+" --output results/reference/gru4rec-collapse-ml-100k.json
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.experiments.baseline_gaps import parse_variant
from benchmarks.experiments.speed_transformers import load_average
from recbench.benchmarks.config import resolve
from recbench.benchmarks.evaluator import Evaluator, evaluation_mode, history_batches
from recbench.benchmarks.provenance import describe_device, git_commit
from recbench.benchmarks.store import write_json
from recbench.benchmarks.trainer import Trainer, TrainRun
from recbench.datasets import load_dataset, resolve_cache_dir
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.models import model_class


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument("--variant", dest="variants", action="append", required=True, metavar="NAME: F=V; F=V")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--output", required=True)
    return parser.parse_args(argv)


def top10_popularity(model, evaluator: Evaluator, counts: np.ndarray) -> dict:
    """Training counts of the top-10 items of every validation user's full ranking (history items excluded)."""
    view = evaluator.view("valid")
    found = []
    with evaluation_mode(model):
        for _, chunk, users, histories in history_batches(model, view, np.arange(len(view)), 256):
            scores = model.score(users, histories, None).float()
            scores[:, 0] = -torch.inf
            rows, items = view.flat(chunk)
            scores[torch.from_numpy(rows), torch.from_numpy(items)] = -torch.inf
            found.append(counts[scores.topk(10, 1).indices.numpy()])
    found = np.concatenate(found)
    return {"top10_median_count": float(np.median(found)),
            "top10_share_count_le5": round(float((found <= 5).mean()), 4)}


def main(argv=None) -> int:
    args = parse_args(argv)
    cache = resolve_cache_dir(args.cache_dir)
    data = load_dataset(args.dataset, data_dir=args.data_dir, cache_dir=cache)
    split = LeaveOneOutSplit(data)
    train = split.train()
    counts = np.bincount(train.items, minlength=data.n_items + 1)
    evaluator = Evaluator(split, seed=args.seed, cache_dir=cache / "negatives")
    summary = {"command": "python -m benchmarks.experiments.gru4rec_collapse " + " ".join(
                   f'"{a}"' if (" " in a or ";" in a) else a for a in (argv if argv is not None else sys.argv[1:])),
               "dataset": args.dataset, "dataset_sha256": data.content_sha256(), "epochs": args.epochs,
               "seed": args.seed, "threads": torch.get_num_threads(),
               "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "device": describe_device(torch.device("cpu")),
               "commit": git_commit(), "train_item_counts": {"median": float(np.median(counts[1:])),
                                                             "share_le5": round(float((counts[1:] <= 5).mean()), 4)},
               "variants": []}
    for text in args.variants:
        name, overrides = parse_variant(text)
        model_name = next((o.split("=", 1)[1] for o in overrides if o.startswith("model=")), "gru4rec")
        overrides = [o for o in overrides if not o.startswith("model=")]
        config = resolve(model_name, data.name, "paper",
                         [*overrides, f"max_epochs={args.epochs}", f"patience={args.epochs + 1}"])
        settings = dataclasses.replace(config.train, time_budget_s=None)
        torch.manual_seed(args.seed)
        model = model_class(model_name)(data.n_users, data.n_items, config.model)

        def validate(current):
            metrics = {"NDCG@10": evaluator.evaluate(current, "valid", "full", model_name).metrics["NDCG@10"],
                       "pop100_NDCG@10": evaluator.evaluate(current, "valid", "pop100", model_name).metrics["NDCG@10"]}
            return {**metrics, **top10_popularity(current, evaluator, counts)}

        started = time.perf_counter()
        load_before = load_average()
        fit = Trainer(settings, TrainRun(seed=args.seed, progress=False)).fit(model, train, validate)
        curve = [{"epoch": r["epoch"], "loss": round(r["loss"], 4),
                  **{k[len("valid_"):]: (round(v, 4) if isinstance(v, float) else v)
                     for k, v in r.items() if k.startswith("valid_")}} for r in fit.curve]
        summary["variants"].append({"name": name, "model": model_name, "set": overrides,
                                    "hyperparameters": dataclasses.asdict(config.model),
                                    "optimizer": settings.optimizer, "lr": settings.lr,
                                    "batch_size": settings.batch_size, "curve": curve,
                                    "seconds": round(time.perf_counter() - started, 1),
                                    "load_before": load_before, "load_after": load_average()})
        for r in curve:
            print(f"{name:>24} epoch {r['epoch']:>3}: loss {r['loss']:.4f}  full {r['NDCG@10']:.4f}  pop100 "
                  f"{r['pop100_NDCG@10']:.4f}  top-10 median count {r['top10_median_count']:.0f}  "
                  f"share <=5 {r['top10_share_count_le5']:.3f}", flush=True)
        write_json(Path(args.output), summary)
    print(f"written: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
