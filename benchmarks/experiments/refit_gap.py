"""What a model loses because the protocol (``PROTOCOL.md``, "Split") never trains it on the validation item.

The protocol trains on ``s[:-2]`` and tests on ``s[:-1] -> s[-1]``. A sequential model still reads ``s[-2]`` in
its test input; a user-factor model (BPR-MF, NCF) knows a user only through the items it was trained on, so
its user vector never sees the user's most recent item. The BERT4Rec authors' code has no validation split and
trains BERT4Rec on ``s[:-1]`` (their baselines' code is not public). This script measures the difference for the
models named:

1. under the protocol: train on ``s[:-2]``, select on validation NDCG@10, test; or, with ``--protocol-results``,
   take that run's row from a finished ``results.jsonl`` (its settings must be the ones resolved here);
2. refitted: train the same configuration from scratch on ``s[:-1]`` for the epoch count selected in 1 (no
   validation is possible then), test on the same candidates.

The test item is never trained on in either. The second number breaks ``PROTOCOL.md`` (the validation target
becomes training data), so it is evidence for a closing note, never a row of a results table. With
``--checkpoint-dir`` each training run keeps a checkpoint after every epoch and a rerun resumes from it.

    python -m benchmarks.experiments.refit_gap --dataset ml-1m --models bprmf ncf --data-dir DIR
    python -m benchmarks.experiments.refit_gap --dataset ml-1m --models bert4rec --profile converge \\
        --protocol-results results/converge-ml-1m/results.jsonl --checkpoint-dir results/refit --data-dir DIR
    python -m benchmarks.experiments.refit_gap --dataset beauty --models sasrec --profile converge --seeds 0 1 \\
        --protocol-results results/converge-beauty/results.jsonl --checkpoint-dir results/refit --data-dir DIR

Each seed's refit is tested on that seed's sampled negatives, as its protocol row was; the file,
``refit-gap-DATASET-PROFILE-MODELS.json``, holds one row per model and seed, and names the models so that refits of
other models on the same dataset sit beside it.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path

import torch

from recbench.benchmarks.config import resolve
from recbench.benchmarks.device import resolve_device
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.provenance import ROOT, describe_device, git_commit
from recbench.benchmarks.store import read_results, write_json
from recbench.benchmarks.trainer import Trainer, TrainRun
from recbench.benchmarks.worker import validation_users
from recbench.datasets import load_dataset, resolve_cache_dir
from recbench.datasets.sequences import Histories, LeaveOneOutSplit
from recbench.models import model_class
from recbench.reports.results import settings_differing


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="ml-1m")
    parser.add_argument("--models", nargs="+", default=["bprmf"])
    parser.add_argument("--profile", default="paper", help="the settings' profile (default: paper)")
    parser.add_argument("--protocols", nargs="+", default=["pop100", "full"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="one protocol run and one refit each")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="[MODEL:]FIELD=VALUE")
    parser.add_argument("--protocol-results", metavar="RESULTS_JSONL",
                        help="take the protocol runs from this finished results.jsonl instead of training them")
    parser.add_argument("--checkpoint-dir", help="keep a checkpoint per training run here; a rerun resumes")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, help="torch threads on the CPU (default: torch's)")
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--output", default=str(ROOT / "results" / "reference"))
    return parser.parse_args(argv)


def finished_protocol_run(rows: list[dict], name: str, dataset: str, seed: int, profile: str, config,
                          protocols, source: str) -> dict:
    """The protocol run of ``name`` in ``rows`` (one row per protocol), refused in one line unless it was trained
    with exactly the settings resolved here: the refit would otherwise repeat another configuration's epochs."""
    mine = {row["protocol"]: row for row in rows
            if row["model"] == name and row["dataset"] == dataset and row["seed"] == seed
            and row.get("study", "main") == "main" and row.get("split_scheme", "leave-one-out") == "leave-one-out"}
    missing = [protocol for protocol in protocols if protocol not in mine]
    if missing:
        raise SystemExit(f"{source}: no {name} row of {dataset}, seed {seed}, under {', '.join(missing)}; "
                         f"train it first or leave out --protocol-results")
    for protocol in protocols:
        row = mine[protocol]
        differing = (["profile"] if row["profile"] != profile else []) + settings_differing(row, config)
        if differing:
            raise SystemExit(f"{source}: the {name} row ({protocol}) differs from --profile {profile} and --set in "
                             f"{', '.join(differing)}; pass the profile and --set values it ran with")
    first = mine[protocols[0]]
    return {"epochs_run": first["epochs_run"], "best_epoch": first["best_epoch"],
            "train_seconds": round(first["train_seconds"], 1), "stopped_by": first["stopped_by"],
            "from": f"{source} (key {first['key'][:12]})",
            "metrics": {protocol: mine[protocol]["metrics"] for protocol in protocols}}


def train_and_test(name, data, config, train: Histories, settings, validate, evaluator: Evaluator,
                   protocols, device: torch.device, checkpoint: Path | None) -> dict:
    torch.manual_seed(evaluator.seed)
    model = model_class(name)(data.n_users, data.n_items, config)
    if isinstance(model, torch.nn.Module):
        model.to(device)
    fit = Trainer(settings, TrainRun(seed=evaluator.seed, checkpoint=checkpoint)).fit(model, train, validate)
    metrics = {protocol: evaluator.evaluate(model, "test", protocol, name).metrics for protocol in protocols}
    return {"epochs_run": fit.epochs_run, "best_epoch": fit.best_epoch, "train_seconds": round(fit.train_seconds, 1),
            "stopped_by": fit.stopped_by, "precision": fit.precision, "metrics": metrics}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    cache = resolve_cache_dir(args.cache_dir)
    data = load_dataset(args.dataset, data_dir=args.data_dir, cache_dir=cache)
    split = LeaveOneOutSplit(data)
    test = split.test()
    train_with_valid_item = Histories(test.items, test.offsets, test.users)  # s[:-1]: no target attached
    finished = read_results(Path(args.protocol_results)) if args.protocol_results else None
    checkpoints = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    if checkpoints:
        checkpoints.mkdir(parents=True, exist_ok=True)

    def checkpoint(name: str, seed: int, run: str) -> Path | None:
        if checkpoints is None:
            return None
        return checkpoints / f"{args.dataset}__{name}__seed{seed}__{args.profile}__{run}.pt"

    configs = {name: resolve(name, data.name, args.profile, args.overrides) for name in args.models}
    # one per seed, kept across models (it keeps its views, negatives and exclusions): each seed's negatives, as the
    # worker tests that seed's protocol row
    evaluators = {seed: Evaluator(split, seed=seed, cache_dir=cache / "negatives") for seed in args.seeds}
    rows = []
    for name, seed in itertools.product(args.models, args.seeds):
        config, evaluator = configs[name], evaluators[seed]
        settings = config.train
        started = time.perf_counter()
        if finished is not None:
            protocol_run = finished_protocol_run(finished, name, data.name, seed, args.profile, config,
                                                 args.protocols, args.protocol_results)
        else:
            valid_users = validation_users(settings.valid_users, data.n_users, seed)  # as the worker selects

            def validate(model):
                return evaluator.evaluate(model, "valid", settings.valid_protocol, name, valid_users).metrics

            protocol_run = train_and_test(name, data, config.model, split.train(), settings, validate, evaluator,
                                          args.protocols, device, checkpoint(name, seed, "protocol"))
        refit_settings = dataclasses.replace(settings, max_epochs=max(1, protocol_run["best_epoch"]),
                                             max_steps=None, time_budget_s=None, cpu_budget_s=None)
        refit_run = train_and_test(name, data, config.model, train_with_valid_item, refit_settings, None, evaluator,
                                   args.protocols, device, checkpoint(name, seed, "refit"))
        rows.append({"model": name, "seed": seed, "protocol_run": protocol_run, "refit_on_s[:-1]": refit_run,
                     "seconds": round(time.perf_counter() - started, 1)})
        for protocol in args.protocols:
            ours, refit = protocol_run["metrics"][protocol], refit_run["metrics"][protocol]
            print(f"{name:>8} seed {seed} {protocol:>6}: NDCG@10 {ours['NDCG@10']:.4f} (s[:-2], protocol) -> "
                  f"{refit['NDCG@10']:.4f} (refit on s[:-1], {refit_run['epochs_run']} epochs)  "
                  f"HR@10 {ours['HR@10']:.4f} -> {refit['HR@10']:.4f}")
    path = Path(args.output) / f"refit-gap-{args.dataset}-{args.profile}-{'-'.join(args.models)}.json"
    write_json(path, {"command": "python -m benchmarks.experiments.refit_gap " + " ".join(argv),
                      "dataset": args.dataset, "dataset_sha256": data.content_sha256(), "profile": args.profile,
                      "seeds": args.seeds, "device": describe_device(device), "commit": git_commit(),
                      "note": "refit_on_s[:-1] trains on the validation item: outside PROTOCOL.md, evidence only",
                      "rows": rows})
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
