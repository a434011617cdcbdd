"""How much faster a grid runs with ``--jobs 2`` (one torch thread per job) than one job at a time with both threads.

    python -m benchmarks.experiments.parallel_grid                    # 8 smoke jobs, 2 repetitions
    python -m benchmarks.experiments.parallel_grid --repeats 3 --models pop bprmf fpmc sasrec
    python -m benchmarks.experiments.parallel_grid --models pop bprmf sasrec bert4rec --seeds 0 1   # 8 jobs
    python -m benchmarks.experiments.parallel_grid --dataset ml-1m --data-dir DIR --profile converge \
        --models bert4rec --seeds 0 1 --set max_steps=300    # two real jobs, the same 300 steps each

The question is how to spend the cores: ``--jobs 1 --threads 2`` (the serial mode, ``--serial-threads``) against
``--jobs 2 --threads 1`` (the parallel mode), the same cores either way; ``--serial-threads 1`` measures the serial
mode with one core left idle, as the first two reference files did. Each grid is ``python run_all.py`` in a fresh
process with a fresh output folder, by default on the built-in synthetic data with the smoke profile, always with no
wall-clock budget (``time_budget_s=none``), so both modes do exactly the same work. A warm-up run prepares the data
and the sampled negatives first, so that no timed run pays for them. The modes alternate (serial, parallel, ...) so
that a change of machine load hits both alike; the load average is recorded before and after every run. The script
checks that the runs of one mode wrote identical metrics (a different thread count may change the last bits: torch
sums in another order), records the largest difference between the modes, and each job's training seconds in
both: no schedule on 2 workers ends before the longest job does. The figures go to
``results/reference/parallel-grid.json``.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.experiments.speed_transformers import load_average
from recbench.benchmarks.provenance import ROOT, git_commit
from recbench.benchmarks.store import read_results, write_json

MODELS = ("pop", "bprmf", "fpmc", "gru4rec", "caser", "lstm", "sasrec", "bert4rec")


def grid(args, jobs: int, threads: int, output: Path, cache: Path) -> float:
    """Seconds of one ``run_all.py`` grid."""
    data = ["--datasets", args.dataset, "--data-dir", args.data_dir] if args.dataset else []
    command = [sys.executable, "run_all.py", *data, "--models", *args.models, "--seeds", *map(str, args.seeds),
               "--profile", args.profile, "--set", "time_budget_s=none",
               *[part for setting in args.set for part in ("--set", setting)], "--jobs", str(jobs),
               "--threads", str(threads), "--output", str(output), "--cache-dir", str(cache), "--quiet",
               "--no-report"]
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - started


def metrics(output: Path) -> dict:
    return {f"{row['model']}/seed{row['seed']}/{row['protocol']}": row["metrics"]
            for row in read_results(output / "results.jsonl")}


def largest_difference(first: dict, second: dict) -> float:
    """The largest absolute difference between two runs' metrics, row by row and metric by metric."""
    return max((abs(first[row][name] - second[row][name]) for row in first for name in first[row]
                if isinstance(first[row][name], float) and not math.isnan(first[row][name])), default=0.0)


def train_seconds(output: Path) -> dict:
    return {f"{row['model']}/seed{row['seed']}": round(row.get("train_seconds") or 0.0, 2)
            for row in read_results(output / "results.jsonl")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--dataset", help="a registry dataset (default: the built-in synthetic data)")
    parser.add_argument("--data-dir", help="folder with the dataset's file, with --dataset")
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--set", action="append", default=[], metavar="[MODEL:]FIELD=VALUE",
                        help="passed to every grid, e.g. max_steps=300 to time real jobs on a fixed amount of work")
    parser.add_argument("--serial-threads", type=int, default=2,
                        help="torch threads of the --jobs 1 grid (default 2: the cores the two parallel jobs use)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "results" / "reference" / "parallel-grid.json"))
    args = parser.parse_args(argv)
    if args.dataset and not args.data_dir:
        parser.error("--dataset needs --data-dir: the grids run offline")
    modes = {1: args.serial_threads, 2: 1}  # jobs -> threads per job
    runs, seconds_per_job, reference = [], {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        grid(args, 1, modes[1], scratch / "warm-up", scratch / "cache")
        reference[1] = metrics(scratch / "warm-up")
        for repeat in range(args.repeats):
            for jobs, threads in modes.items():
                output = scratch / f"jobs{jobs}-{repeat}"
                before = load_average()
                seconds = grid(args, jobs, threads, output, scratch / "cache")
                if repeat == 0:
                    seconds_per_job[f"jobs{jobs}"] = train_seconds(output)
                found = metrics(output)
                same = found == reference.setdefault(jobs, found)
                runs.append({"jobs": jobs, "threads_per_job": threads, "repeat": repeat,
                             "seconds": round(seconds, 2), "load_before": before, "load_after": load_average(),
                             "metrics_identical_within_mode": same})
                print(f"--jobs {jobs} --threads {threads}: {seconds:6.1f} s  (load {before[0]:.2f} -> "
                      f"{runs[-1]['load_after'][0]:.2f}){'' if same else '  METRICS DIFFER WITHIN THE MODE'}")
    serial = statistics.median(r["seconds"] for r in runs if r["jobs"] == 1)
    parallel = statistics.median(r["seconds"] for r in runs if r["jobs"] == 2)
    summary = {
        "command": "python -m benchmarks.experiments.parallel_grid " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": git_commit(), "cpu_threads": len(os.sched_getaffinity(0)), "models": args.models,
        "seeds": args.seeds, "dataset": args.dataset or "synthetic", "profile": args.profile, "settings": args.set,
        "jobs_in_grid": len(args.models) * len(args.seeds), "serial_threads": args.serial_threads,
        "train_seconds_per_job": seconds_per_job,
        "longest_job_train_seconds": {mode: max(found.values()) for mode, found in seconds_per_job.items()},
        "median_seconds_jobs1": round(serial, 2), "median_seconds_jobs2": round(parallel, 2),
        "speedup": round(serial / parallel, 3),
        "metrics_identical_within_modes": all(r["metrics_identical_within_mode"] for r in runs),
        "largest_metric_difference_between_modes": largest_difference(reference[1], reference[2]), "runs": runs,
    }
    write_json(Path(args.output), summary)
    print(f"speed-up of --jobs 2 --threads 1 over --jobs 1 --threads {args.serial_threads}: {summary['speedup']:.2f}x "
          f"(median {serial:.1f} s vs {parallel:.1f} s); metrics identical within each mode: "
          f"{summary['metrics_identical_within_modes']}, largest difference between the modes "
          f"{summary['largest_metric_difference_between_modes']:.2e}")
    print(f"written: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
