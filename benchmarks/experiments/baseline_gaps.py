"""Variants of one baseline on one dataset, each trained for the same number of epochs with two or more seeds:
where a gap to the paper comes from (BPR-MF, NCF) and what each fidelity switch changes (``models/fidelity.md``).

Every variant is the model's ``--profile paper`` configuration plus its own ``--set`` overrides. A run trains on
``s[:-2]`` for ``--epochs`` epochs (``--patience`` validations without improvement stop it earlier), keeps the
epoch that is best on validation as the protocol selects it, and tests it on ``pop100`` and ``full``. With
``--merge-valid`` each variant is also retrained from scratch on ``s[:-1]``, the validation item merged into
training as the BERT4Rec authors' data pipeline does (``gen_data_fin.py``: "put validate into train"), for the
epoch count its protocol run selected; that number breaks ``PROTOCOL.md`` ("Split") and is evidence only.

A variant is ``NAME: FIELD=VALUE; FIELD=VALUE`` (model or trainer fields, as ``--set`` takes them). The pseudo
field ``pretrain=EPOCHS`` (NCF only) first trains GMF and MLP alone for that many epochs each and starts NeuMF
from them (``NCF.from_towers``, α = 0.5), the NCF paper's pre-training. ``score_max_len=N`` also tests the trained
model reading the last N history items (GRU4Rec: the code reads whole sessions). ``float32_dropout=1`` draws the
CPU dropout masks of SASRec and BERT4Rec from float32 uniforms, as the official TensorFlow code does, instead of
16-bit fractions (``models.transformer_fast.dropout_keep_mask``). The summary JSON is rewritten after
every run, so an interrupted sweep keeps what it finished.

    python -m benchmarks.experiments.baseline_gaps --model bprmf --epochs 60 --seeds 0 1 \\
        --variant "paper:" --variant "popularity negatives: sample_alpha=1.0" --data-dir DIR
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path
from unittest import mock

import torch

from benchmarks.experiments.speed_transformers import load_average
from recbench.benchmarks.config import resolve
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.provenance import describe_device, git_commit
from recbench.benchmarks.store import write_json
from recbench.benchmarks.trainer import Trainer, TrainRun
from recbench.benchmarks.worker import validation_users
from recbench.datasets import load_dataset, resolve_cache_dir
from recbench.datasets.sequences import Histories, LeaveOneOutSplit
from recbench.models import model_class, transformer_fast

PRETRAIN = "pretrain"
SCORE_MAX_LEN = "score_max_len"
FLOAT32_DROPOUT = "float32_dropout"
PSEUDO_FIELDS = (PRETRAIN, SCORE_MAX_LEN, FLOAT32_DROPOUT)  # read here, not passed to --set


def float32_keep_mask(shape: tuple, p: float, device: torch.device) -> torch.Tensor:
    """Keeps each entry where a float32 uniform draw is at least p, as TensorFlow's dropout."""
    return torch.rand(shape, device=device) >= p


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, body = text.partition(":")
    settings = [part.strip() for part in body.split(";") if part.strip()]
    return name.strip(), settings


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="ml-1m")
    parser.add_argument("--model", required=True)
    parser.add_argument("--variant", dest="variants", action="append", required=True, metavar="NAME: F=V; F=V")
    parser.add_argument("--epochs", type=int, required=True, help="training budget of every run, in epochs")
    parser.add_argument("--patience", type=int, default=1000, help="validations without improvement (default: "
                        "never stop early, so every run gets the same budget)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--merge-valid", action="store_true", help="also retrain on s[:-1] (evidence only)")
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--output", required=True, help="summary JSON (e.g. results/reference/NAME.json)")
    return parser.parse_args(argv)


class Runs:
    """Trains and tests the variants of one model on one dataset."""

    def __init__(self, args):
        self.args = args
        cache = resolve_cache_dir(args.cache_dir)
        self.data = load_dataset(args.dataset, data_dir=args.data_dir, cache_dir=cache)
        self.split = LeaveOneOutSplit(self.data)
        self.negatives_dir = cache / "negatives"
        test = self.split.test()
        self.train_with_valid_item = Histories(test.items, test.offsets, test.users)  # s[:-1], no target

    def config(self, overrides: list[str], seed: int):
        config = resolve(self.args.model, self.data.name, "paper",
                         [*overrides, f"max_epochs={self.args.epochs}", f"patience={self.args.patience}"])
        return config.model, dataclasses.replace(config.train, time_budget_s=None)

    def build(self, model_config, seed: int, pretrain_epochs: int, evaluator: Evaluator, settings):
        torch.manual_seed(seed)
        cls = model_class(self.args.model)
        if not pretrain_epochs:
            return cls(self.data.n_users, self.data.n_items, model_config)
        towers = {}
        for tower in ("gmf", "mlp"):  # each trained alone, with Adam, as the NCF paper pre-trains them
            torch.manual_seed(seed)
            towers[tower] = cls(self.data.n_users, self.data.n_items,
                                dataclasses.replace(model_config, towers=tower))
            Trainer(dataclasses.replace(settings, max_epochs=pretrain_epochs, optimizer="adam"), self.train_run).fit(
                towers[tower], self.split.train(), None)
        return cls.from_towers(towers["gmf"], towers["mlp"], alpha=0.5)

    def test(self, model, evaluator: Evaluator) -> dict:
        metrics = {}
        for protocol in ("pop100", "full"):
            m = evaluator.evaluate(model, "test", protocol, self.args.model).metrics
            metrics[protocol] = {name: round(value, 4) for name, value in m.items()}
        return metrics

    def run(self, model_config, settings, train: Histories, validate, evaluator, pretrain_epochs: int,
            score_max_len: int = 0) -> dict:
        started = time.perf_counter()
        model = self.build(model_config, self.train_run.seed, pretrain_epochs, evaluator, settings)
        fit = Trainer(settings, self.train_run).fit(model, train, validate)
        metrics = self.test(model, evaluator)
        longer = {}
        if score_max_len:
            model.config = dataclasses.replace(model.config, max_len=score_max_len)
            longer = {f"metrics_reading_{score_max_len}_items": self.test(model, evaluator)}
        curve = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()
                  if k in ("epoch", "loss", f"valid_{settings.valid_metric}")} for record in fit.curve]
        return {"epochs_run": fit.epochs_run, "best_epoch": fit.best_epoch,
                "train_seconds": round(fit.train_seconds, 1), "seconds": round(time.perf_counter() - started, 1),
                "metrics": metrics, **longer, "curve": curve}

    def variant(self, overrides: list[str], seed: int) -> dict:
        pseudo = {name: int(value) for name, _, value in (o.partition("=") for o in overrides)
                  if name in PSEUDO_FIELDS}
        overrides = [o for o in overrides if o.partition("=")[0] not in PSEUDO_FIELDS]
        pretrain_epochs = pseudo.get(PRETRAIN, 0)
        model_config, settings = self.config(overrides, seed)
        self.train_run = TrainRun(seed=seed, progress=False)
        evaluator = Evaluator(self.split, seed=seed, cache_dir=self.negatives_dir)
        valid_users = validation_users(settings.valid_users, self.data.n_users, seed)

        def validate(model):
            return evaluator.evaluate(model, "valid", settings.valid_protocol, self.args.model, valid_users).metrics

        masks = (mock.patch.object(transformer_fast, "dropout_keep_mask", float32_keep_mask)
                 if pseudo.get(FLOAT32_DROPOUT) else contextlib.nullcontext())
        row = {"seed": seed, "load_before": load_average(),
               "hyperparameters": dataclasses.asdict(model_config),
               "train_settings": dataclasses.asdict(settings)}
        with masks:
            row["protocol_run"] = self.run(model_config, settings, self.split.train(), validate, evaluator,
                                           pretrain_epochs, pseudo.get(SCORE_MAX_LEN, 0))
            if self.args.merge_valid:
                refit = dataclasses.replace(settings, max_epochs=max(1, row["protocol_run"]["best_epoch"]))
                row["merged_valid_run"] = self.run(model_config, refit, self.train_with_valid_item, None,
                                                   evaluator, pretrain_epochs)
        row["load_after"] = load_average()
        return row


def mean(values):
    return round(sum(values) / len(values), 4)


def main(argv=None) -> int:
    args = parse_args(argv)
    runs = Runs(args)
    summary = {"command": "python -m benchmarks.experiments.baseline_gaps " + " ".join(
                   f'"{a}"' if (" " in a or ";" in a) else a for a in (argv if argv is not None else sys.argv[1:])),
               "dataset": args.dataset, "dataset_sha256": runs.data.content_sha256(), "model": args.model,
               "epochs": args.epochs, "patience": args.patience, "seeds": args.seeds,
               "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
               "device": describe_device(torch.device("cpu")), "commit": git_commit(),
               "selection": "best validation epoch of the budget (PROTOCOL.md); merged_valid_run: retrained on "
                            "s[:-1] for that many epochs, outside PROTOCOL.md, evidence only",
               "variants": []}
    for text in args.variants:
        name, overrides = parse_variant(text)
        entry = {"name": name, "set": overrides, "runs": []}
        summary["variants"].append(entry)
        for seed in args.seeds:
            entry["runs"].append(runs.variant(overrides, seed))
            for kind in ("protocol_run", "merged_valid_run"):
                done = [r[kind] for r in entry["runs"] if kind in r]
                if done:
                    entry[f"mean_{kind}"] = {p: {"NDCG@10": mean([d["metrics"][p]["NDCG@10"] for d in done]),
                                                 "HR@10": mean([d["metrics"][p]["HR@10"] for d in done])}
                                             for p in ("pop100", "full")}
            last = entry["runs"][-1]["protocol_run"]
            merged = entry["runs"][-1].get("merged_valid_run")
            print(f"{name:>28} seed {seed}: pop100 NDCG@10 {last['metrics']['pop100']['NDCG@10']:.4f}  full "
                  f"{last['metrics']['full']['NDCG@10']:.4f}  best epoch {last['best_epoch']}/{last['epochs_run']}"
                  + (f"  | merged valid: pop100 {merged['metrics']['pop100']['NDCG@10']:.4f}"
                     if args.merge_valid else ""), flush=True)
            write_json(Path(args.output), summary)
    print(f"written: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
