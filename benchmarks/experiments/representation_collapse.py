"""Whether a trained sequential model still tells its users apart, or gives every user one list (popularity).

A run whose validation NDCG@10 stays at its first epoch's level (Table 5's w/o RC on ML-1m: about .02 under full
ranking for epoch after epoch, training loss flat) may be learning slowly or may have collapsed: every user's
query vector pointing the same way, so that every user gets the same top 10. This script reads the checkpoints
of a results folder's running or interrupted jobs (``FOLDER/checkpoints/*.pt``, whose settings ``config.json``
holds) and measures, on the validation input ``s[:-2]`` of a fixed sample of users:

- the mean cosine similarity between two users' query vectors (the factors of their scores, e.g. BERT4Rec's
  ``gelu(h W^P + b^P)`` at the appended [MASK]); 1 means one query for everyone;
- the share of users whose top-1 item is the sample's most common top-1, and how many distinct top-1 items
  there are;
- the mean overlap of each user's top 10 with the 10 most popular training items;
- the evaluator's full-ranking NDCG@10, Coverage@10 and Personalization@10 of the same users' validation lists
  (history excluded, as a row measures them), beside POP's on the same users: a model that ranks every user by one
  order lists, as POP does, the same items for everyone but the ones each has seen.

With ``--init`` each configuration is also measured at initialisation (the job's seed), where it started from.

    python -m benchmarks.experiments.representation_collapse results/ablation-ml-1m-dropout --data-dir DIR --init
    python -m benchmarks.experiments.representation_collapse FOLDER --checkpoints A.pt B.pt --data-dir DIR

``--checkpoints`` names copies of checkpoint files (a job deletes its own when it finishes); each is matched to
its job by the key prefix that ends its name. The figures go to
``results/reference/representation-collapse-FOLDER.json`` with the command, commit, each checkpoint's epoch and its
run's curve so far (training loss and validation metric by epoch).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.provenance import git_commit
from recbench.benchmarks.store import write_atomic
from recbench.datasets import LeaveOneOutSplit, load_dataset
from recbench.models import model_class
from recbench.models.pop import Pop

ROOT = Path(__file__).resolve().parents[2]
TOP = 10
LISTS = ("NDCG@10", "Coverage@10", "Personalization@10")  # of the validation lists under full ranking


def list_metrics(model, evaluator: Evaluator, users: np.ndarray) -> dict:
    """The evaluator's ``LISTS`` for ``users``' validation targets, ranked among every item but their history."""
    found = evaluator.evaluate(model, "valid", "full", users=users, metrics=LISTS).metrics
    return {f"validation_{name}": round(value, 4) for name, value in found.items()}


def measure(model, valid, users: np.ndarray, popular: torch.Tensor, evaluator: Evaluator) -> dict:
    """The collapse figures of ``model`` (eval mode, no gradients) on the validation input of ``users``."""
    model.eval()
    histories = torch.as_tensor(valid.padded(users, model.history_length))
    with torch.no_grad():
        factors = model.score_factors(torch.as_tensor(valid.users[users]), histories)
        if factors is None:
            raise ValueError(f"{model.name}'s scores are no product of user queries and item factors: there is "
                             f"no query vector to compare")
        queries = F.normalize(factors.queries.float(), dim=1)
        scores = factors.full()[:, 1:]  # item ids 1..n; column 0 is padding
    pairs = queries @ queries.T
    off_diagonal = pairs[~torch.eye(len(users), dtype=torch.bool)]
    top = scores.topk(TOP, dim=1).indices + 1
    first, counts = torch.unique(top[:, 0], return_counts=True)
    overlap = torch.isin(top, popular).float().sum(1).mean() / TOP
    return {"mean_cosine_between_users": round(float(off_diagonal.mean()), 4),
            "share_with_the_most_common_top1": round(float(counts.max()) / len(users), 4),
            "distinct_top1_items": int(len(first)),
            "top10_overlap_with_the_10_most_popular": round(float(overlap), 4),
            **list_metrics(model, evaluator, users)}


def build(job: dict, n_users: int, n_items: int):
    cls = model_class(job["model"])
    torch.manual_seed(job["seed"])
    return cls(n_users, n_items, cls.Config(**job["hyperparameters"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a results folder with config.json (and checkpoints/)")
    parser.add_argument("--checkpoints", nargs="+", type=Path,
                        help="checkpoint files to read (default: every FOLDER/checkpoints/*.pt)")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--cache-dir")
    parser.add_argument("--users", type=int, default=1000, help="users sampled (default 1000)")
    parser.add_argument("--init", action="store_true", help="also measure each configuration at initialisation")
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "reference")
    args = parser.parse_args(argv)
    config_path = args.folder / "config.json"
    if not config_path.exists():
        sys.exit(f"{config_path}: not found; name a results folder written by run_all.py or benchmarks.studies")
    jobs = {job["key"][:12]: job for job in json.loads(config_path.read_text())["jobs"]}
    paths = args.checkpoints or sorted((args.folder / "checkpoints").glob("*.pt"))
    if not paths:
        sys.exit(f"{args.folder / 'checkpoints'}: no checkpoint (*.pt); a finished job deletes its own, so pass "
                 f"copies with --checkpoints")
    chosen = []
    for path in paths:
        job = jobs.get(path.stem.rsplit("__", 1)[-1])
        if job is None:
            sys.exit(f"{path}: its name ends in no job key of {config_path}")
        chosen.append((path, job))
    datasets = {job["dataset"] for _, job in chosen}
    if len(datasets) != 1:
        sys.exit(f"the checkpoints are of several datasets ({', '.join(sorted(datasets))}); name one's files")
    data = load_dataset(datasets.pop(), data_dir=args.data_dir, cache_dir=args.cache_dir, download=False,
                        progress=False)
    split = LeaveOneOutSplit(data)
    valid = split.valid()
    users = np.sort(np.random.default_rng(0).choice(data.n_users, min(args.users, data.n_users), replace=False))
    train_counts = np.bincount(split.train().items, minlength=data.n_items + 1)
    popular = torch.as_tensor(np.argsort(-train_counts[1:], kind="stable")[:TOP] + 1)
    evaluator = Evaluator(split, seed=0)  # full ranking draws no negatives
    pop = Pop(data.n_users, data.n_items)
    pop.fit(split.train())
    runs = []
    for path, job in chosen:
        model = build(job, data.n_users, data.n_items)
        entry = {"run_id": job["run_id"], "key": job["key"], "checkpoint": path.name}
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        try:
            if args.init:
                entry["at_initialisation"] = measure(model, valid, users, popular, evaluator)
            model.load_state_dict(checkpoint["model"])
            entry["trained"] = measure(model, valid, users, popular, evaluator)
        except ValueError as error:
            sys.exit(f"{job['run_id']}: {error}")
        state = checkpoint["state"]
        valid_key = f"valid_{job.get('train_settings', {}).get('valid_metric', 'NDCG@10')}"
        entry.update(epoch=state["epoch"], best_epoch=state["best_epoch"], best_validation=state["best_metric"],
                     curve=[{"epoch": point["epoch"], "loss": round(point["loss"], 4),
                             valid_key: round(point[valid_key], 4)}
                            for point in state.get("history", []) if valid_key in point])
        runs.append(entry)
        described = ", ".join(f"{name} {value}" for name, value in entry["trained"].items())
        print(f"{job['run_id']} at epoch {entry['epoch']}: {described}")
    path = args.output / f"representation-collapse-{args.folder.name}.json"
    command = " ".join(["python -m benchmarks.experiments.representation_collapse", str(args.folder),
                        *(["--checkpoints", *map(str, args.checkpoints)] if args.checkpoints else []),
                        "--data-dir DIR", f"--users {args.users}", *(["--init"] if args.init else [])])
    write_atomic(path, json.dumps({"description": __doc__.split("\n\n")[0], "commit": git_commit(),
                                   "command": command, "dataset": data.name, "users": len(users),
                                   "pop": list_metrics(pop, evaluator, users), "runs": runs}, indent=1) + "\n")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
