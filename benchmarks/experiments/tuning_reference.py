"""The measurements behind README "Tuning" (issue 21) on ML-100k, each search its own ``python -m benchmarks.tune``
process on one thread (``--threads 1``, ``OMP_NUM_THREADS=1``):

    python -m benchmarks.experiments.tuning_reference pruning --data-dir DIR   # SASRec: median pruning against none
    python -m benchmarks.experiments.tuning_reference models --data-dir DIR    # BPR-MF, NCF, FPMC, SASRec: tuned
    python -m benchmarks.experiments.tuning_reference models --models bprmf --data-dir DIR   # one of them

``pruning`` runs the same 20-trial TPE search (same sampler seed, trial seed and per-trial budget) without pruning
and with the median pruner, and records for each the best validation NDCG@10 and the CPU-seconds: the process's
and its children's (``resource.getrusage(RUSAGE_CHILDREN)``), and the trials' own sum. The machine is shared, so
CPU-seconds count, not wall time. ``models`` tunes each model (20 trials, median pruning; SASRec's study is the
pruned one of ``pruning`` when it is in the same folder), tests the chosen and the default settings over two
seeds, and sets them beside the paper's Table 2. Table 2 is on ML-1m: ML-100k's numbers are not comparable with it
in level, only in direction (does tuning move a model towards or away from the paper's ranking).

The figures go to ``results/reference/tuning-pruning-ml-100k.json`` and ``tuning-models-ml-100k.json``; each
search's folder (with its report) stays under ``--work``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.experiments.speed_transformers import load_average
from recbench.benchmarks.provenance import ROOT, git_commit
from recbench.benchmarks.store import read_results, write_json
from recbench.reports.published import load_published

DATASET = "ml-100k"
TRIALS = "20"
SASREC_BUDGET = ["--budget-epochs", "60"]  # SASRec's trials: at most 60 epochs (its default run stops at ~130)
# Per model: the per-trial budget (none: the paper profile's own cap and early stopping).
# NCF: 5 epochs a trial. Its trials with 64 factors and 10 negatives cost about 190 CPU-seconds an epoch here, so
# 20-epoch trials made the search about 2.5 hours on one core.
MODELS = {"bprmf": [], "fpmc": [], "ncf": ["--budget-epochs", "5"], "sasrec": SASREC_BUDGET}
SEEDS = ["0", "1"]  # of the final runs (trials train with seed 0)


def tune(argv: list[str], output: Path, data_dir: str, jobs: int = 1) -> dict:
    """One search as its own process (``jobs`` trials at once, one thread each); its command, exit code,
    CPU-seconds (with its children) and wall seconds."""
    command = [sys.executable, "-m", "benchmarks.tune", "--datasets", DATASET, "--profile", "paper",
               "--trials", TRIALS, "--threads", "1", "--jobs", str(jobs), "--quiet", "--data-dir", data_dir,
               "--output", str(output), *argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(output.with_suffix(".log"), "a") as log:
        code = subprocess.run(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log,
                              stderr=subprocess.STDOUT).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    shown = ["python", "-m", "benchmarks.tune", *command[3:]]
    return {"command": shlex.join(shown), "exit": code, "cpu_seconds": round(cpu, 1),
            "wall_seconds": round(time.perf_counter() - started, 1), "load_average_after": load_average()}


def study(output: Path, model: str) -> dict:
    """A study of ``output/tuning.json``, summarised."""
    found = next(s for s in json.loads((output / "tuning.json").read_text())["studies"] if s["model"] == model)
    states = [trial["state"] for trial in found["trials"]]
    return {"study": found["study"], "objective": found["objective"], "budget": found["budget"],
            "best_valid": (found["best"] or {}).get("value"), "best_trial": (found["best"] or {}).get("number"),
            "best_params": (found["best"] or {}).get("params"), "trials": len(states),
            "complete": states.count("complete"), "pruned": states.count("pruned"), "failed": states.count("fail"),
            "trial_cpu_seconds": round(found["cpu_seconds"], 1), "importances": found["importances"]}


def pruning(work: Path, data_dir: str) -> dict:
    runs = {}
    for pruner, folder in (("none", work / "pruning-none"), ("median", work / "models")):
        folder.mkdir(parents=True, exist_ok=True)
        process = tune(["--models", "sasrec", "--pruner", pruner, "--no-final", *SASREC_BUDGET, "--resume"],
                       folder, data_dir)
        runs[pruner] = {**process, **study(folder, "sasrec")}
    none, median = runs["none"], runs["median"]
    return {"what": "SASRec on ML-100k, 20 TPE trials (sampler seed 0, trial seed 0, at most 60 epochs each), "
                    "without pruning and with the median pruner; CPU-seconds of the whole tune process and its "
                    "children, and the trials' own sum",
            "commit": git_commit(), "runs": runs,
            "best_valid_ratio_median_to_none": median["best_valid"] / none["best_valid"],
            "cpu_ratio_median_to_none": median["cpu_seconds"] / none["cpu_seconds"]}


def finals(output: Path, model: str) -> dict:
    """Test NDCG@10 (mean over the seeds) of the default and the tuned settings under each protocol."""
    rows = [r for r in read_results(output / "results.jsonl") if r["model"] == model and r["study"] == "tuning"]
    found = {}
    for row in rows:
        found.setdefault(f"{row['variant']} {row['protocol']}", []).append(row["metrics"]["NDCG@10"])
    return {name: round(sum(values) / len(values), 4) for name, values in sorted(found.items())}


def models(work: Path, data_dir: str, chosen: list[str], jobs: int = 1) -> dict:
    published, _ = load_published()
    table2 = {e.model: e.value for e in published if e.table == "Table 2" and e.dataset == "ml-1m"
              and e.metric == "NDCG@10" and e.variant is None}
    folder = work / "models"
    folder.mkdir(parents=True, exist_ok=True)
    results = {}
    for model in chosen:
        budget = MODELS[model]
        process = tune(["--models", model, *budget, "--seeds", *SEEDS, "--resume"], folder, data_dir, jobs)
        results[model] = {**process, **study(folder, model), "test_NDCG@10": finals(folder, model),
                          "table2_ml-1m_pop100_NDCG@10": table2.get(model)}
    return {"what": "BPR-MF, NCF, FPMC and SASRec tuned on ML-100k validation (20 TPE trials, median pruning), then "
                    "the chosen and the default settings tested over seeds 0 and 1 under the same per-trial budget. "
                    "Table 2 is the paper's ML-1m: comparable in direction only, not in level",
            "commit": git_commit(), "models": results}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("pruning", "models"))
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--work", default="results/tuning-reference", help="the searches' folders")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS),
                        help="models: which of the four to tune (their results join those already in the file)")
    parser.add_argument("--jobs", type=int, default=1, help="trials at once in each search (models only)")
    args = parser.parse_args(argv)
    work = Path(args.work).resolve()
    path = ROOT / "results" / "reference" / f"tuning-{args.part}-{DATASET}.json"
    if args.part == "pruning":
        found = pruning(work, args.data_dir)
    else:
        found = models(work, args.data_dir, args.models, args.jobs)
        if path.exists():  # models tuned by an earlier invocation (on another core) stay in the file
            found["models"] = {**json.loads(path.read_text())["models"], **found["models"]}
    write_json(path, found)
    print(json.dumps(found, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
