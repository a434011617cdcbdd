"""How much faster a grid runs with ``--jobs 2`` than with ``--jobs 1`` (one torch thread per job), on this machine.

    python -m benchmarks.experiments.parallel_grid                    # 8 smoke jobs, 2 repetitions
    python -m benchmarks.experiments.parallel_grid --repeats 3 --models pop bprmf fpmc sasrec
    python -m benchmarks.experiments.parallel_grid --models pop bprmf sasrec bert4rec --seeds 0 1   # 8 jobs

Each grid is ``python run_all.py`` in a fresh process with a fresh output folder, on the built-in synthetic data
with the smoke profile and no wall-clock budget (``time_budget_s=none``), so both modes do exactly the same
work. A warm-up run prepares the data and the sampled negatives first, so that no timed run pays for them. The
modes alternate (1, 2, 1, 2, ...) so that a change of machine load hits both alike; the load average is recorded
before and after every run. The script also checks that both modes wrote identical metrics, and records each job's
training seconds of the first ``--jobs 1`` run: no schedule on 2 workers ends before the longest job does. The
figures go to ``results/reference/parallel-grid.json``.
"""
from __future__ import annotations

import argparse
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


def grid(models, seeds, jobs: int, output: Path, cache: Path) -> float:
    """Seconds of one ``run_all.py`` grid."""
    command = [sys.executable, "run_all.py", "--models", *models, "--seeds", *map(str, seeds),
               "--set", "time_budget_s=none", "--jobs", str(jobs),
               "--threads", "1", "--output", str(output), "--cache-dir", str(cache), "--quiet", "--no-report"]
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - started


def metrics(output: Path) -> dict:
    return {f"{row['model']}/seed{row['seed']}/{row['protocol']}": row["metrics"]
            for row in read_results(output / "results.jsonl")}


def train_seconds(output: Path) -> dict:
    return {f"{row['model']}/seed{row['seed']}": round(row.get("train_seconds") or 0.0, 2)
            for row in read_results(output / "results.jsonl")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "results" / "reference" / "parallel-grid.json"))
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        grid(args.models, args.seeds, 1, scratch / "warm-up", scratch / "cache")
        reference = metrics(scratch / "warm-up")
        for repeat in range(args.repeats):
            for jobs in (1, 2):
                output = scratch / f"jobs{jobs}-{repeat}"
                before = load_average()
                seconds = grid(args.models, args.seeds, jobs, output, scratch / "cache")
                if jobs == 1 and repeat == 0:
                    job_seconds = train_seconds(output)
                same = metrics(output) == reference
                runs.append({"jobs": jobs, "repeat": repeat, "seconds": round(seconds, 2),
                             "load_before": before, "load_after": load_average(), "metrics_identical": same})
                print(f"--jobs {jobs}: {seconds:6.1f} s  (load {before[0]:.2f} -> {runs[-1]['load_after'][0]:.2f})"
                      f"{'' if same else '  METRICS DIFFER'}")
    serial = statistics.median(r["seconds"] for r in runs if r["jobs"] == 1)
    parallel = statistics.median(r["seconds"] for r in runs if r["jobs"] == 2)
    summary = {
        "command": "python -m benchmarks.experiments.parallel_grid " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": git_commit(), "cpu_threads": len(os.sched_getaffinity(0)), "models": args.models,
        "seeds": args.seeds, "jobs_in_grid": len(args.models) * len(args.seeds),
        "train_seconds_per_job_jobs1": job_seconds, "longest_job_train_seconds": max(job_seconds.values()),
        "median_seconds_jobs1": round(serial, 2), "median_seconds_jobs2": round(parallel, 2),
        "speedup": round(serial / parallel, 3),
        "metrics_identical": all(r["metrics_identical"] for r in runs), "runs": runs,
    }
    write_json(Path(args.output), summary)
    print(f"speed-up of --jobs 2 over --jobs 1: {summary['speedup']:.2f}x "
          f"(median {serial:.1f} s vs {parallel:.1f} s); metrics identical: {summary['metrics_identical']}")
    print(f"written: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
