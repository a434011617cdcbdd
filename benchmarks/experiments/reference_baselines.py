"""Reference numbers for the baselines under a fixed CPU budget: POP, BPR-MF, NCF, FPMC, GRU4Rec, GRU4Rec+,
Caser and LSTM (plus SASRec and SASRec-CE when registered), paper profile, tested under ``full`` and ``pop100``.

    python -m benchmarks.experiments.reference_baselines --datasets ml-1m --budget-min 5 --data-dir DIR

Every model trains through :func:`benchmarks.grid.run_jobs` (one job at a time) with its paper profile and a
wall-clock cap of ``--budget-min`` minutes (validation included); early stopping may end it sooner. The grid's
own folder (``results/reference-runs/<dataset>/``: results.jsonl, per-user counts, checkpoints; not in git) lets
an interrupted run continue with ``--resume``, and a later call with ``--models`` reruns just those models. The
small summary of every model run so far for the dataset goes to
``results/reference/baselines-<dataset>.json`` and ``.csv``: per model and protocol the test metrics, epochs,
training seconds, seconds per epoch, full-ranking evaluation seconds and peak memory, with the BERT4Rec paper's
Table 2 values beside the ``pop100`` rows (the only protocol the paper used).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.jobs import Job
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.store import read_results, write_json
from recbench.models import model_names
from recbench.reports.published import PUBLISHED_PROTOCOL, load_published

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ("pop", "bprmf", "ncf", "fpmc", "gru4rec", "gru4rec+", "caser", "lstm")
OPTIONAL = ("sasrec", "sasrec-ce")  # the Transformer baselines, when they are registered
COMPARED = ("HR@10", "NDCG@10", "MRR")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["ml-1m", "beauty"], metavar="NAME")
    parser.add_argument("--models", nargs="+", default=None, metavar="NAME",
                        help=f"default: {', '.join(BASELINES)} and those of {', '.join(OPTIONAL)} that exist")
    parser.add_argument("--budget-min", type=float, default=5.0,
                        help="wall-clock training budget per model in minutes, validation included (default 5)")
    parser.add_argument("--protocols", nargs="+", default=["full", "pop100"], metavar="NAME")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu (default, the budget is a CPU budget), auto or cuda")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice); on a CPU shared with other jobs, 1 "
                             "thread can be many times faster than threads that spin against each other")
    parser.add_argument("--data-dir", default=None, help="folder with the dataset files (else $RECBENCH_DATA_DIR)")
    parser.add_argument("--cache-dir", default=None, help="prepared datasets and negatives (the grid's default)")
    parser.add_argument("--runs-dir", default=str(ROOT / "results" / "reference-runs"),
                        help="the grid's output folders, one per dataset (not kept in git)")
    parser.add_argument("--output", default=str(ROOT / "results" / "reference"),
                        help="where the JSON/CSV summaries go")
    parser.add_argument("--resume", action="store_true", help="skip finished models, continue interrupted ones")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    registered = model_names()
    if args.models is None:
        args.models = list(BASELINES) + [name for name in OPTIONAL if name in registered]
    unknown = [name for name in args.models if name not in registered]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; registered: {', '.join(registered)}")
    if args.budget_min <= 0:
        parser.error("--budget-min must be positive")
    return args


def summarize(rows: list[dict]) -> list[dict]:
    """One flat record per (model, protocol): our test metrics and costs, and the paper's values."""
    published, _ = load_published()
    paper = {(p.dataset, p.model, p.metric): p.value for p in published if p.table == "Table 2"}
    eval_full = {row["model"]: row["eval_seconds"] for row in rows if row["protocol"] == "full"}
    records = []
    for row in rows:
        epochs = row["epochs_run"]
        record = {
            "dataset": row["dataset"], "model": row["model"], "protocol": row["protocol"],
            **{metric: round(value, 4) for metric, value in row["metrics"].items()},
            "epochs": epochs, "best_epoch": row["best_epoch"],
            "train_seconds": round(row["train_seconds"], 1),
            "seconds_per_epoch": round(row["train_seconds"] / epochs, 1) if epochs else None,
            "budget_seconds": (row["train_settings"] or {}).get("time_budget_s"),
            "eval_seconds": round(row["eval_seconds"], 1),
            "full_eval_seconds": round(eval_full[row["model"]], 1) if row["model"] in eval_full else None,
            "peak_memory_mb": round(row["peak_memory_mb"]),
            "valid_metric": row["valid_metric"], "best_valid": row["best_valid"],
            "device": row["device"], "commit": row["commit"],
        }
        for metric in COMPARED:
            value = paper.get((row["dataset"], row["model"], metric))
            record[f"paper_{metric}"] = value if row["protocol"] == PUBLISHED_PROTOCOL else None
        records.append(record)
    return records


def write_summary(records: list[dict], folder: Path, dataset: str, args) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"baselines-{dataset}"
    write_json(stem.with_suffix(".json"), {
        "dataset": dataset, "profile": "paper", "seed": args.seed, "protocols": args.protocols,
        "last_command": "python -m benchmarks.experiments.reference_baselines " + " ".join(sys.argv[1:]),
        "notes": "budget_seconds = the wall-clock training cap of that model's run; seconds_per_epoch = "
                 "train_seconds / epochs (validation included); full_eval_seconds = the test pass under the full "
                 "protocol; device names the thread count; paper_* = BERT4Rec Table 2 (pop100 rows only)",
        "rows": records})
    columns = list(records[0]) if records else []
    with open(stem.with_suffix(".csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(records)
    return stem


def print_comparison(records: list[dict]) -> None:
    header = ["model", "protocol", *COMPARED, *(f"paper {m}" for m in COMPARED), "epochs", "train s", "s/epoch",
              "full eval s", "peak MB"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in records:
        paper = [f"{r[f'paper_{m}']:.4f}" if r[f"paper_{m}"] is not None else "" for m in COMPARED]
        cells = [r["model"], r["protocol"], *(f"{r[m]:.4f}" for m in COMPARED), *paper, str(r["epochs"]),
                 f"{r['train_seconds']:.0f}", str(r["seconds_per_epoch"] or ""), str(r["full_eval_seconds"] or ""),
                 str(r["peak_memory_mb"])]
        print("| " + " | ".join(cells) + " |")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    budget_s = args.budget_min * 60
    for dataset in args.datasets:
        jobs = [Job(dataset, model, args.seed, overrides=(f"time_budget_s={budget_s}",)) for model in args.models]
        runs = Path(args.runs_dir) / dataset
        run_jobs(jobs, RunOptions(output=runs, protocols=args.protocols, profile="paper", device=args.device,
                                  data_dir=args.data_dir, cache_dir=args.cache_dir, resume=args.resume,
                                  progress=not args.quiet))
        # Every model run so far for this dataset (a later call with --models reruns only those), in table order;
        # of a model run with several settings (several keys), the newest row, which is last in the file.
        order = {name: rank for rank, name in enumerate((*BASELINES, *OPTIONAL))}
        newest = {(r["model"], r["protocol"]): r for r in read_results(runs / "results.jsonl")}
        rows = sorted(newest.values(), key=lambda r: (order.get(r["model"], len(order)), r["model"], r["protocol"]))
        records = summarize(rows)
        stem = write_summary(records, Path(args.output), dataset, args)
        print(f"\n{dataset}: {stem}.json, {stem}.csv")
        print_comparison(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
