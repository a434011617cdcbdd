"""Adam's step on the CPU, fused against PyTorch's per-tensor loop, interleaved:

    python -m benchmarks.experiments.adam_speed --data-dir DIR --threads 1 --rounds 3

PyTorch's Adam on the CPU defaults to its single-tensor loop, about ten elementwise passes over every parameter
per step; ``fused=True`` updates each tensor in one pass. Which matters where a step updates large embedding tables
whole (dense gradients, as the authors' Keras and TensorFlow code updates them): NCF, BPR-MF and FPMC keep a row
per user and per item, and Beauty has 40,226 users and 54,542 items. Each model of ``--models`` on each dataset,
built as the converge profile builds it, is timed over training steps (loss, backward, an Adam step:
``benchmarks.estimate.seconds_per_step``) with both implementations, the order alternating between rounds so that
both see the same load (recorded before and after). The figure is seconds per step and the ratio loop / fused
(above 1: fused is faster). ``update_difference`` checks that the two implementations train the same model: the
largest parameter difference after ``--steps`` real steps (the profile's learning rate) from the same weights on
the same batches.
"""
from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

import torch

from benchmarks.experiments.speed_transformers import interleaved_rounds, write_report
from recbench.benchmarks.config import resolve
from recbench.benchmarks.estimate import seconds_per_step
from recbench.benchmarks.provenance import git_commit
from recbench.datasets import load_dataset
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.models import model_class

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("ncf", "bprmf", "fpmc", "sasrec", "bert4rec")
DATASETS = ("ml-1m", "beauty")


def build(model_name: str, dataset: str, data, train, seed: int):
    """The model as the converge profile builds it, its training examples and the profile's train settings."""
    config = resolve(model_name, dataset, "converge")
    torch.manual_seed(seed)
    model = model_class(model_name)(data.n_users, data.n_items, config.model)
    return model, model.training_examples(train), config.train


def update_difference(model, examples: dict, train_settings, steps: int, seed: int) -> dict:
    """Largest absolute parameter difference, and the largest parameter, after ``steps`` steps of the loop and
    of the fused Adam from the same weights on the same batches (the profile's learning rate and betas)."""
    copies, n = {}, len(next(iter(examples.values())))
    for fused in (False, True):
        current = copy.deepcopy(model)
        optimizer = torch.optim.Adam(current.parameters(), lr=train_settings.lr, betas=train_settings.betas,
                                     eps=train_settings.eps, fused=fused)
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout draws from the global generator: the same masks for both
        current.train()
        for _ in range(steps):
            rows = torch.randint(n, (min(n, train_settings.batch_size),), generator=generator)
            loss = current.loss({key: value[rows] for key, value in examples.items()}, generator)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        copies[fused] = [parameter.detach() for parameter in current.parameters()]
    difference = max(float((a - b).abs().max()) for a, b in zip(copies[False], copies[True]))
    largest = max(float(p.abs().max()) for p in copies[False])
    return {"steps": steps, "max_abs_difference": difference, "max_abs_parameter": largest}


def rounds(args, dataset: str, data, train) -> list[dict]:
    results = []
    for model_name in args.models:
        model, examples, settings = build(model_name, dataset, data, train, args.seed)
        parameters = sum(p.numel() for p in model.parameters())
        timings = []
        def step_seconds(fused):  # called within this iteration: the closure sees this model
            return seconds_per_step(copy.deepcopy(model), examples, settings.batch_size, fused=fused)

        for number, order, seconds, before, after in interleaved_rounds(args.rounds, (False, True), step_seconds):
            timings.append({"round": number, "order": ["fused" if f else "loop" for f in order],
                            "loop_s": round(seconds[False], 5), "fused_s": round(seconds[True], 5),
                            "loop_over_fused": round(seconds[False] / seconds[True], 3),
                            "load_before": before, "load_after": after})
            print(f"{dataset:>6} {model_name:>8}: loop {seconds[False] * 1e3:8.2f} ms, fused {seconds[True] * 1e3:8.2f}"
                  f" ms a step, ratio {timings[-1]['loop_over_fused']:.2f} (load {before} -> {after})", flush=True)
        ratios = [t["loop_over_fused"] for t in timings]
        results.append({"dataset": dataset, "model": model_name, "parameters": parameters,
                        "batch_size": settings.batch_size, "rounds": timings,
                        "median_loop_over_fused": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                        "same_update": update_difference(model, examples, settings, args.steps, args.seed)})
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None, help="folder with the datasets (else $RECBENCH_DATA_DIR)")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="real steps of the same-update check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(ROOT / "results" / "reference" / "adam-fused-speed-cpu.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    for dataset in args.datasets:
        data = load_dataset(dataset, data_dir=args.data_dir, download=False, progress=False)
        results += rounds(args, dataset, data, LeaveOneOutSplit(data).train())
    write_report(args.output, "adam_speed", argv, args.threads, results, commit=git_commit())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
