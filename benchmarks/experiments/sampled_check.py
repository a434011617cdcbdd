"""Expected sampled metrics against realised draws: the analytic uniform and popularity expectations of
``benchmarks.sampled_metrics`` held against the evaluator's own ``uni100`` and ``pop100`` sampling, redrawn with
many seeds.

The script trains a few models through the API (one seed, one thread, protocols full, uni100 and pop100, their
weights kept), rebuilds each from its weights, scores every candidate of every test user once, and then ranks the
targets through :class:`benchmarks.evaluator.Evaluator` with sampling seeds 0..D−1, each a fresh draw of the
negatives (the stored negatives of the runs are not reused). Beside the mean and spread of those draws it sets the
exact uniform expectation and draw standard deviation computed from the full ranking's per-user file alone, and the
popularity approximation computed from the items each model ranks above the target:

    python -m benchmarks.experiments.sampled_check --data-dir DIR --models pop bprmf sasrec --draws 100

Runs go to ``OUTPUT`` (default ``results/sampled-check-<dataset>/``; a rerun resumes there), the figures to
``results/reference/sampled-check-<dataset>.json`` with the command and commit.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from recbench.benchmarks.api import run
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.metrics import RankCounts
from recbench.benchmarks.provenance import git_commit
from recbench.benchmarks.sampled_metrics import (
    expected_popularity,
    expected_uniform,
    inclusion_probabilities,
)
from recbench.benchmarks.store import read_results, write_atomic
from recbench.datasets import LeaveOneOutSplit, load_dataset
from recbench.models import model_class
from recbench.models.base import Recommender

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("NDCG@10", "HR@10", "HR@1", "MRR")
SAMPLED = 100  # negatives of uni100 and pop100


class StoredScores(Recommender):
    """A model's full score matrix of the test users, scored once, served to the evaluator as a model."""

    name = "stored scores"
    Config = type(None)

    def __init__(self, scores: torch.Tensor):
        self.scores = scores

    def score(self, users, histories, candidates):
        rows = self.scores[users]
        return rows if candidates is None else rows.gather(1, candidates)


def full_scores(model: Recommender, split: LeaveOneOutSplit, batch: int = 256) -> torch.Tensor:
    """``(users, n_items + 1)``: the model's scores of every item for each test user (float32)."""
    view = split.test()
    out = torch.empty(len(view), split.n_items + 1)
    length = max(model.history_length, 1)
    if isinstance(model, torch.nn.Module):
        model.eval()
    with torch.inference_mode():
        for start in range(0, len(view), batch):
            rows = np.arange(start, min(start + batch, len(view)))
            out[rows] = model.score(torch.from_numpy(view.users[rows]), torch.from_numpy(view.padded(rows, length)),
                                    None).float()
    return out


def rebuild(row: dict, folder: Path, data, split) -> Recommender:
    """The model of a result row from its kept weights (POP: fitted again on the training view)."""
    cls = model_class(row["model"])
    model = cls(data.n_users, data.n_items, cls.Config(**row["hyperparameters"]))
    if isinstance(model, torch.nn.Module):
        stem = Path(row["per_user_file"]).name.rsplit("__", 1)[0]
        model.load_state_dict(torch.load(folder / "weights" / f"{stem}.pt", map_location="cpu"))
    else:
        model.fit(split.train())
    return model


def popularity_expectation(scores: torch.Tensor, split: LeaveOneOutSplit, chunk: int = 512) -> dict[str, np.ndarray]:
    """Per test user, each metric's approximate expectation under ``pop100``, from Rosén's inclusion probabilities
    of the items the model ranks above the target and of those it ties with it
    (:func:`benchmarks.sampled_metrics.expected_popularity`)."""
    data, view = split.data, split.test()
    weights = split.popularity("test").astype(np.float64)
    found = {metric: np.zeros(len(view)) for metric in METRICS}
    for start in range(0, len(view), chunk):
        rows = np.arange(start, min(start + chunk, len(view)))
        allowed = np.ones((len(rows), split.n_items + 1), dtype=bool)
        allowed[:, 0] = False
        for position, user in enumerate(view.users[rows]):  # the user's whole sequence is never a negative
            allowed[position, data.items[data.offsets[user]:data.offsets[user + 1]]] = False
        allowed &= weights[None, :] > 0
        pi = inclusion_probabilities(weights, allowed, SAMPLED)
        block = scores[rows].numpy()
        target = block[np.arange(len(rows)), view.targets[rows]][:, None]
        expected = expected_popularity(pi * (allowed & (block > target)), pi * (allowed & (block == target)),
                                       SAMPLED, METRICS)
        for metric in METRICS:
            found[metric][rows] = expected[metric]
    return found


def realised(scores: torch.Tensor, split: LeaveOneOutSplit, protocol: str, draws: int) -> list[dict[str, float]]:
    """The metrics of ``draws`` fresh draws of ``protocol``'s negatives (sampling seeds 0..draws−1), ranked by the
    evaluator."""
    model = StoredScores(scores)
    return [Evaluator(split, seed=seed, metrics=METRICS).evaluate(model, "test", protocol, progress=False).metrics
            for seed in range(draws)]


def summary(values: list[float]) -> dict:
    array = np.asarray(values)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)), "min": float(array.min()),
            "max": float(array.max())}


def check_model(row: dict, folder: Path, data, split, draws: int, pop_draws: int) -> dict:
    started = time.perf_counter()
    counts = RankCounts.load(folder / row["per_user_file"])
    scores = full_scores(rebuild(row, folder, data, split), split)
    uniform = expected_uniform(counts, SAMPLED, METRICS)
    uni = realised(scores, split, "uni100", draws)
    entry = {"model": row["model"], "run_id": row["run_id"], "full": {m: row["metrics"][m] for m in METRICS},
             "uni100": {}, "pop100": {}}
    for metric in METRICS:
        values = summary([draw[metric] for draw in uni])
        gap = uniform.mean[metric] - values["mean"]
        entry["uni100"][metric] = {"expected": uniform.mean[metric], "expected_draw_std": uniform.std[metric],
                                   "realised": values, "expected_minus_realised_mean": gap,
                                   "gap_in_standard_errors": gap / (uniform.std[metric] / np.sqrt(draws))}
    approximate = popularity_expectation(scores, split)
    pop = realised(scores, split, "pop100", pop_draws)
    for metric in METRICS:
        values = summary([draw[metric] for draw in pop])
        entry["pop100"][metric] = {"approximation": float(approximate[metric].mean()), "realised": values,
                                   "approximation_minus_realised_mean": float(approximate[metric].mean())
                                   - values["mean"]}
    entry["seconds"] = round(time.perf_counter() - started, 1)
    return entry


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="ml-1m")
    parser.add_argument("--data-dir", required=True, help="the folder with the dataset's file")
    parser.add_argument("--models", nargs="+", default=["pop", "bprmf", "sasrec"])
    parser.add_argument("--draws", type=int, default=100, help="uni100 draws per model (default 100)")
    parser.add_argument("--pop-draws", type=int, default=20, help="pop100 draws per model (default 20)")
    parser.add_argument("--set", dest="settings", nargs="*", default=[],
                        help="--set strings for the training runs, e.g. sasrec:max_epochs=2")
    parser.add_argument("--output", type=Path, help="the runs' results folder (default "
                                                    "results/sampled-check-<dataset>)")
    parser.add_argument("--reference", type=Path, default=ROOT / "results" / "reference")
    args = parser.parse_args(argv)
    if args.draws < 2 or args.pop_draws < 2:
        sys.exit("--draws and --pop-draws must be at least 2 (a spread needs two draws)")
    torch.set_num_threads(1)
    folder = args.output or ROOT / "results" / f"sampled-check-{args.dataset}"
    run(args.dataset, args.models, seeds=(0,), profile="smoke", protocols=("full", "uni100", "pop100"),
        settings=args.settings, data_dir=args.data_dir, output=folder, resume=True, threads=1, n_jobs=1,
        keep_checkpoints=True, progress=False)
    data = load_dataset(args.dataset, data_dir=args.data_dir, download=False, progress=False)
    split = LeaveOneOutSplit(data)
    rows = {row["model"]: row for row in read_results(folder / "results.jsonl")
            if row["protocol"] == "full" and row["model"] in args.models}
    models = []
    for name in args.models:
        entry = check_model(rows[name], folder, data, split, args.draws, args.pop_draws)
        uni, pop = entry["uni100"]["NDCG@10"], entry["pop100"]["NDCG@10"]
        print(f"{name}: uni100 NDCG@10 expected {uni['expected']:.5f} (draw std {uni['expected_draw_std']:.5f}), "
              f"mean of {args.draws} draws {uni['realised']['mean']:.5f}, "
              f"gap {uni['expected_minus_realised_mean']:+.5f}; pop100 approximation {pop['approximation']:.5f}, "
              f"mean of {args.pop_draws} draws {pop['realised']['mean']:.5f}", flush=True)
        models.append(entry)
    command = " ".join(["python -m benchmarks.experiments.sampled_check", "--dataset", args.dataset,
                        "--data-dir DIR", "--models", *args.models, "--draws", str(args.draws), "--pop-draws",
                        str(args.pop_draws), *(["--set", *args.settings] if args.settings else [])])
    path = args.reference / f"sampled-check-{args.dataset}.json"
    write_atomic(path, json.dumps({"description": __doc__.split("\n\n")[0], "commit": git_commit(),
                                   "command": command, "dataset": data.name, "users": len(split.test()),
                                   "profile": "smoke", "seed": 0, "threads": 1, "models": models}, indent=1) + "\n")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
