"""What a model loses because the protocol (``PROTOCOL.md``, "Split") never trains it on the validation item.

The protocol trains on ``s[:-2]`` and tests on ``s[:-1] -> s[-1]``. A sequential model still reads ``s[-2]`` in
its test input; a user-factor model (BPR-MF, NCF) knows a user only through the items it was trained on, so
its user vector never sees the user's most recent item. The BERT4Rec authors' code has no validation split and
trains BERT4Rec on ``s[:-1]`` (their baselines' code is not public). This script measures the difference for the
models named:

1. under the protocol: train on ``s[:-2]``, select on validation NDCG@10, test;
2. refitted: train the same configuration from scratch on ``s[:-1]`` for the epoch count selected in 1 (no
   validation is possible then), test on the same candidates.

The test item is never trained on in either. The second number breaks ``PROTOCOL.md`` (the validation target
becomes training data), so it is evidence for a closing note, never a row of a results table.

    python -m benchmarks.experiments.refit_gap --dataset ml-1m --models bprmf ncf --data-dir DIR
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from recbench.benchmarks.config import resolve
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.provenance import ROOT, describe_device, git_commit
from recbench.benchmarks.store import write_json
from recbench.benchmarks.trainer import Trainer, TrainRun
from recbench.benchmarks.worker import validation_users
from recbench.datasets import load_dataset, resolve_cache_dir
from recbench.datasets.sequences import Histories, LeaveOneOutSplit
from recbench.models import model_class


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="ml-1m")
    parser.add_argument("--models", nargs="+", default=["bprmf"])
    parser.add_argument("--protocols", nargs="+", default=["pop100", "full"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="[MODEL:]FIELD=VALUE")
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--output", default=str(ROOT / "results" / "reference"))
    return parser.parse_args(argv)


def train_and_test(name, data, config, train: Histories, settings, validate, evaluator: Evaluator,
                   protocols) -> dict:
    torch.manual_seed(evaluator.seed)
    model = model_class(name)(data.n_users, data.n_items, config)
    fit = Trainer(settings, TrainRun(seed=evaluator.seed)).fit(model, train, validate)
    metrics = {protocol: evaluator.evaluate(model, "test", protocol, name).metrics for protocol in protocols}
    return {"epochs_run": fit.epochs_run, "best_epoch": fit.best_epoch,
            "train_seconds": round(fit.train_seconds, 1), "metrics": metrics}


def main(argv=None) -> int:
    args = parse_args(argv)
    cache = resolve_cache_dir(args.cache_dir)
    data = load_dataset(args.dataset, data_dir=args.data_dir, cache_dir=cache)
    split = LeaveOneOutSplit(data)
    evaluator = Evaluator(split, seed=args.seed, cache_dir=cache / "negatives")
    test = split.test()
    train_with_valid_item = Histories(test.items, test.offsets, test.users)  # s[:-1]: no target attached
    rows = []
    for name in args.models:
        config = resolve(name, data.name, "paper", args.overrides)
        settings = config.train
        valid_users = validation_users(settings.valid_users, data.n_users, args.seed)  # as the worker selects

        def validate(model):
            return evaluator.evaluate(model, "valid", settings.valid_protocol, name, valid_users).metrics

        started = time.perf_counter()
        protocol_run = train_and_test(name, data, config.model, split.train(), settings, validate, evaluator,
                                      args.protocols)
        refit_settings = dataclasses.replace(settings, max_epochs=max(1, protocol_run["best_epoch"]),
                                             time_budget_s=None)
        refit_run = train_and_test(name, data, config.model, train_with_valid_item, refit_settings, None, evaluator,
                                   args.protocols)
        rows.append({"model": name, "protocol_run": protocol_run, "refit_on_s[:-1]": refit_run,
                     "seconds": round(time.perf_counter() - started, 1)})
        for protocol in args.protocols:
            ours, refit = protocol_run["metrics"][protocol], refit_run["metrics"][protocol]
            print(f"{name:>8} {protocol:>6}: NDCG@10 {ours['NDCG@10']:.4f} (s[:-2], protocol) -> "
                  f"{refit['NDCG@10']:.4f} (refit on s[:-1], {refit_run['epochs_run']} epochs)  "
                  f"HR@10 {ours['HR@10']:.4f} -> {refit['HR@10']:.4f}")
    path = Path(args.output) / f"refit-gap-{args.dataset}.json"
    write_json(path, {"command": "python -m benchmarks.experiments.refit_gap " + " ".join(sys.argv[1:]),
                      "dataset": args.dataset, "dataset_sha256": data.content_sha256(), "seed": args.seed,
                      "device": describe_device(torch.device("cpu")), "commit": git_commit(),
                      "note": "refit_on_s[:-1] trains on the validation item: outside PROTOCOL.md, evidence only",
                      "rows": rows})
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
