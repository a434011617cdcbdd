"""Scale on the CPU (issue 12): SASRec-CE and BERT4Rec on ``synthetic-ml-20m`` (138,493 users, 26,744 items,
144 items per user) and ``synthetic-steam`` (281,428 users, 13,044 items, 12 per user): seconds per training
epoch (a few timed batches, projected), full-ranking evaluation of all users, peak memory.

    python -m benchmarks.experiments.scale --threads 1                 # the measurement: hours on a quiet CPU
    python -m benchmarks.experiments.scale --users 2000 --batches 2 --output results/scale-check.json

Each (dataset, model) is :func:`benchmarks.experiments.speed_transformers.measure` in a fresh process (so its
peak resident memory is its own: data, model, training and evaluation), with the configuration of the paper
profile for the real dataset each synthetic one stands for (ML-20m: N = 200; Steam: N = 50) in the speed
benchmark's shape (d = 64, L = 2, h = 2, batch 256). An epoch is one pass over every training window; for
BERT4Rec that is one Cloze draw per window, and ``paper_epoch_seconds`` multiplies it by the paper's copies per
window (``dupe_factor`` masked copies plus the last-item copy). ``--users N`` measures on N randomly chosen
users and projects to all of them (evaluation and epochs in proportion to users; peak memory is the sample's).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.experiments.speed_transformers import load_average, measure_in_fresh_process, write_report
from recbench.benchmarks.config import resolve
from recbench.benchmarks.provenance import git_commit

ROOT = Path(__file__).resolve().parents[2]
DATASETS = {"synthetic-ml-20m": "ml-20m", "synthetic-steam": "steam"}  # each with the configuration it stands for
MODELS = ("sasrec-ce", "bert4rec")


def copies_per_window(model: str, config_dataset: str) -> int:
    """Training rows per window in one paper-profile epoch (BERT4Rec: dupe_factor + mask_last)."""
    config = resolve(model, config_dataset, "paper", ()).model
    return getattr(config, "dupe_factor", 0) + int(getattr(config, "mask_last", False)) or 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--batches", type=int, default=5, help="timed training batches per model")
    parser.add_argument("--users", type=int, default=None, help="measure on this many users and project")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--cache-dir", default=None, help="where the generated data is cached")
    parser.add_argument("--output", default=str(ROOT / "results" / "reference" / "scale-cpu.json"))
    args = parser.parse_args(argv)
    results = []
    for dataset, config_dataset in DATASETS.items():
        if dataset not in args.datasets:
            continue
        for model in args.models:
            row = measure_in_fresh_process(model, dataset, args.batches, "cpu", None, generated=False,
                                           threads=args.threads, cache_dir=args.cache_dir,
                                           config_dataset=config_dataset, users=args.users)
            row["configuration_of"] = config_dataset
            row["paper_copies_per_window"] = copies_per_window(model, config_dataset)
            row["paper_epoch_seconds"] = round(row["epoch_rows_seconds"] * row["paper_copies_per_window"], 1)
            results.append(row)
            projected = (f" (projected from {row['measured_users']:,} users)"
                         if row["measured_users"] < row["users"] else "")
            print(f"{dataset} {model}: {row['train_steps_per_s']} steps/s, epoch of {row['epoch_rows']:,} windows "
                  f"{row['epoch_rows_seconds']} s (paper epoch {row['paper_epoch_seconds']} s), full-ranking "
                  f"evaluation of all {row['users']:,} users {row['full_eval_seconds_all_users']} s{projected}, "
                  f"peak {row['peak_memory_mb']} MB (load {row['load_average']})", flush=True)
    write_report(args.output, "scale", argv, args.threads, results, commit=git_commit(),
                 load_average_at_end=load_average())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
