"""Speed of the attention models: training sequences per second, seconds per epoch, full-ranking evaluation of
every user, and peak memory, with the paper's ML-1m shape (N = 200, d = 64, L = 2, h = 2, batch 256) and
Beauty's (54,542 items, N = 50).

    python -m benchmarks.experiments.speed_transformers                          # real data from $RECBENCH_DATA_DIR
    python -m benchmarks.experiments.speed_transformers --data-dir DIR --datasets ml-1m --batches 20
    python -m benchmarks.experiments.speed_transformers --synthetic              # generated data of the same shape

Training is timed through the shared :class:`benchmarks.trainer.Trainer` on ``--batches`` batches of randomly
chosen users (after one warm-up batch); an epoch is one pass over every user's sequence (BERT4Rec: one Cloze
draw per window, no extra copies). Each (dataset, model) runs in a fresh process, so that its peak resident
memory (VmHWM: data, model, training and evaluation together) is its own. The machine's load average and the
process's CPU time are recorded next to the wall-clock numbers, since other processes on the same cores slow
everything down.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from recbench.benchmarks.config import resolve
from recbench.benchmarks.device import resolve_device
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.provenance import PeakMemory, describe_device, machine
from recbench.benchmarks.trainer import Trainer, TrainRun
from recbench.datasets import load_dataset
from recbench.datasets.sequences import LeaveOneOutSplit, SequenceData
from recbench.models import model_class

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("sasrec", "sasrec-ce", "bert4rec")
# The shape every model is timed with (the brief's ML-1m paper configuration); the rest is the model's config.
SHAPE = ("hidden=64", "layers=2", "heads=2", "batch_size=256")
SPEED_ONLY = {"bert4rec": ("dupe_factor=1", "mask_last=false")}  # an epoch = one Cloze draw per window
# Table 1 shapes for --synthetic: users, items, mean length, minimum length.
SHAPES = {"ml-1m": (6040, 3416, 165.5, 18), "beauty": (40226, 54542, 8.8, 5)}


def synthetic(name: str, seed: int = 0) -> SequenceData:
    """Random sequences with the dataset's users, items and a long-tailed length distribution of its mean."""
    users, items, mean, minimum = SHAPES[name]
    rng = np.random.default_rng(seed)
    lengths = minimum + rng.geometric(1.0 / (mean - minimum + 1), users) - 1
    popularity = 1.0 / np.arange(1, items + 1) ** 0.8  # Zipf-like, as real catalogues
    flat = rng.choice(np.arange(1, items + 1), size=int(lengths.sum()), p=popularity / popularity.sum())
    return SequenceData.from_sequences(f"synthetic-{name}", np.split(flat, np.cumsum(lengths)[:-1]), items)


def load_average() -> list[float]:
    """The machine's load over the last 1, 5 and 15 minutes, recorded beside every measurement of the lab."""
    return [round(x, 2) for x in os.getloadavg()]


def interleaved_rounds(rounds: int, modes: tuple, measure: Callable) -> Iterator[tuple]:
    """``rounds`` rounds of ``measure(mode)`` for each of ``modes``, the order reversed every other round, so that each
    mode goes first as often as the other and both see the same machine load. Yields per round its number (from 1),
    its order, the measurements by mode, and the load average before and after it."""
    for number in range(1, rounds + 1):
        order = tuple(modes) if number % 2 else tuple(modes)[::-1]
        before = load_average()
        measured = {mode: measure(mode) for mode in order}
        yield number, order, measured, before, load_average()


def user_sample(data: SequenceData, users: int, seed: int = 0) -> SequenceData:
    """``users`` randomly chosen users of ``data`` with their whole sequences, over the same items."""
    rows = np.sort(np.random.default_rng(seed).choice(data.n_users, users, replace=False))
    return SequenceData.from_sequences(f"{data.name} ({users} users)", [data.sequence(u) for u in rows], data.n_items)


def measure(model_name: str, dataset: str, batches: int, device: str, data_dir: str | None, generated: bool,
            threads: int | None, seed: int = 0, cache_dir: str | None = None, config_dataset: str | None = None,
            users: int | None = None, overrides: tuple = ()) -> dict:
    """One model on one dataset (a name of ``SHAPES`` with ``generated``, else any registry name), in the calling
    process (see :func:`main` for the fresh process). ``config_dataset``: whose per-dataset configuration to
    use (default ``dataset``). ``users``: measure on that many randomly chosen users; the epoch and evaluation
    figures are then projected to all users in proportion. ``overrides``: ``--set`` values applied last, e.g.
    ``precision=bf16`` (the row records the precision trained in)."""
    if threads:
        torch.set_num_threads(threads)
    device = torch.device(device)
    data = (synthetic(dataset) if generated else
            load_dataset(dataset, data_dir=data_dir, cache_dir=cache_dir, download=False, progress=False))
    all_users = data.n_users
    if users and users < data.n_users:
        data = user_sample(data, users, seed)
    scale = all_users / data.n_users  # measured users -> all users
    overrides = (*SHAPE, *SPEED_ONLY.get(model_name, ()), "max_epochs=1", "warmup_steps=0", *overrides)
    config = resolve(model_name, config_dataset or dataset, "paper", overrides)
    settings, run = config.train, TrainRun(seed=seed, progress=False)
    split = LeaveOneOutSplit(data)
    train = split.train()
    memory = PeakMemory(device)
    memory.reset()
    torch.manual_seed(seed)
    model = model_class(model_name)(data.n_users, data.n_items, config.model).to(device)
    rng = np.random.default_rng(seed)
    warm = train.subset(rng.choice(len(train), min(len(train), settings.batch_size), replace=False))
    Trainer(settings, run).fit(model, warm, None)  # one batch: allocator and kernel warm-up
    chosen = rng.choice(len(train), min(len(train), batches * settings.batch_size), replace=False)
    timed = train.subset(chosen)
    rows = len(next(iter(model.training_examples(timed).values())))
    cpu = time.process_time()
    report = Trainer(settings, run).fit(model, timed, None)
    cpu, seconds = time.process_time() - cpu, report.train_seconds
    all_rows = len(next(iter(model.training_examples(train).values())))
    evaluator = Evaluator(split, seed=seed)
    evaluator.view("test")  # the split's test view is data preparation, not evaluation
    started = time.perf_counter()
    evaluator.evaluate(model, "test", "full", model_name)
    evaluation = time.perf_counter() - started
    return {
        "dataset": dataset, "model": model_name, "device": describe_device(device),
        "data": data.name + (" (synthetic)" if generated else f", sha256 {data.content_sha256()[:12]}"),
        "hyperparameters": dataclasses.asdict(config.model), "batch_size": settings.batch_size,
        # bf16 autocast applies on CUDA only; the CPU trains in float32 whatever the setting says
        "precision": settings.precision, "bf16_autocast": settings.precision == "bf16" and device.type == "cuda",
        "timed_sequences": rows, "train_seconds": round(seconds, 2),
        "train_sequences_per_s": round(rows / seconds, 1), "train_cpu_seconds": round(cpu, 2),
        "train_steps_per_s": float(f"{math.ceil(rows / settings.batch_size) / seconds:.3g}"),
        "epoch_seconds": round(all_users / (rows / seconds), 1),  # one pass over every user's sequence
        "epoch_rows": round(all_rows * scale), "epoch_rows_seconds": round(all_rows * scale / (rows / seconds), 1),
        "full_eval_seconds_all_users": round(evaluation * scale, 2), "users": all_users, "items": data.n_items,
        "measured_users": data.n_users, "peak_memory_mb": round(memory.peak_mb(), 1), "load_average": load_average(),
    }


def measure_in_fresh_process(*args, **kwargs) -> dict:
    """:func:`measure` in a new spawned process, so that its peak memory and its torch threads are its own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
        return fresh.submit(measure, *args, **kwargs).result()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["ml-1m", "beauty"], choices=list(SHAPES))
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--batches", type=int, default=10, help="timed training batches per model")
    parser.add_argument("--data-dir", default=None, help="folder with the dataset files (else $RECBENCH_DATA_DIR)")
    parser.add_argument("--synthetic", action="store_true", help="generated data of each dataset's shape")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--output", default=str(ROOT / "results" / "reference" / "speed_transformers.json"))
    args = parser.parse_args(argv)
    device = str(resolve_device(args.device))
    results = []
    for dataset in args.datasets:
        for model_name in args.models:
            row = measure_in_fresh_process(model_name, dataset, args.batches, device, args.data_dir,
                                           generated=args.synthetic, threads=args.threads)
            results.append(row)
            print(f"{dataset:>7} {model_name:>9}: {row['train_sequences_per_s']:7.1f} seq/s, epoch of "
                  f"{row['users']:,} sequences {row['epoch_seconds']:7.1f} s, full-ranking eval of all users "
                  f"{row['full_eval_seconds_all_users']:6.2f} s, peak {row['peak_memory_mb']:7.1f} MB "
                  f"(load {row['load_average']})", flush=True)
    write_report(args.output, "speed_transformers", argv, args.threads, results)
    return 0


def write_report(output: str, script: str, argv, threads: int | None, results: list, **extra) -> None:
    """The JSON file of a speed script: its command, the machine, ``extra`` fields and one row per measurement."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        "command": " ".join([f"python -m benchmarks.experiments.{script}", *(sys.argv[1:] if argv is None else argv)]),
        **extra,
        "machine": machine(threads),
        "results": results}, indent=2) + "\n")
    print(f"written: {output}")


if __name__ == "__main__":
    raise SystemExit(main())
