"""bf16 against fp32 in quality: the same models and seeds trained once in each precision, test metrics side by side.

    python -m benchmarks.experiments.precision_quality results/converge-ml-1m results/converge-ml-1m-bf16

The first folder holds fp32 runs, the second the same jobs run with ``--set precision=bf16`` (a folder shows one row
per model and seed, hence two folders). For every model both hold, on the seeds both hold, per protocol (pop100,
full) and metric (NDCG@10, HR@10): each seed's test value in each precision, the means, the difference of the means
(bf16 − fp32), the seeds' spread (the larger of the two precisions' ranges over the seeds) and whether the
difference lies within it, which is the test the reproduction issue sets for making bf16 a default; beside it a
paired t-test and Wilcoxon test over users (each user's value averaged over the seeds, ``reports.stats``), which
sees smaller differences than the seeds can. Then how each run trained: epochs, best epoch, wall-clock and CPU
seconds per step. These runs shared the cores with others, so their seconds are no speed measurement: the
interleaved one is ``results/reference/precision-speed-cpu*.json``.

The two folders must differ in precision only: a row of the bf16 folder that trained in fp32 (a CPU without native
bf16 falls back, and a model that autocast leaves in fp32 records fp32) or a job whose other settings differ is
refused in one line. Writes
``results/reference/precision-quality-<dataset>.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from recbench.benchmarks.provenance import git_commit
from recbench.benchmarks.store import write_atomic
from recbench.reports import names
from recbench.reports.results import ResultsError, Row, load_results
from recbench.reports.stats import PerUser, measure, paired_test

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = ("pop100", "full")
METRICS = ("NDCG@10", "HR@10")
PRECISIONS = ("fp32", "bf16")


def _settings(row: Row) -> dict:
    """What a job was asked to do, precision aside: its split, hyper-parameters and trainer settings, flat."""
    return {"split": row.split,
            **{f"hyperparameters.{name}": value for name, value in (row.get("hyperparameters") or {}).items()},
            **{f"train_settings.{name}": value for name, value in (row.get("train_settings") or {}).items()
               if name != "precision"}}


def _check(rows: dict[str, dict[int, dict[str, Row]]], model: str, folders: dict[str, Path]) -> None:
    """Exit in one line unless every run of ``model`` trained in its folder's precision, and the two precisions'
    runs of a seed were asked for the same settings otherwise."""
    for precision, by_seed in rows.items():
        for seed, by_protocol in by_seed.items():
            used = by_protocol["full"].get("precision")
            if used != precision:
                sys.exit(f"{folders[precision]}: {model} seed {seed} trained in {used}, not {precision}"
                         + (" (this CPU has no native bf16, or autocast runs nothing of the model in bf16: its log"
                            " says which; for the first, rerun on a CPU with AMX or AVX512-BF16)"
                            if precision == "bf16" else "") + ": nothing to compare")
    for seed in rows["fp32"]:
        fp32, bf16 = (_settings(rows[precision][seed]["full"]) for precision in PRECISIONS)
        differing = sorted(name for name in fp32.keys() | bf16.keys() if fp32.get(name) != bf16.get(name))
        if differing:
            sys.exit(f"{model} seed {seed}: the fp32 and bf16 runs differ in {', '.join(differing)}, not only in "
                     f"precision: rerun one of them with the other's settings")


def compare_model(model: str, rows: dict[str, dict[int, dict[str, Row]]], per_user: dict[str, PerUser]) -> dict:
    """One model over the seeds both precisions hold: quality per protocol and metric, and how each run trained."""
    seeds = sorted(rows["fp32"])
    quality = []
    for protocol in PROTOCOLS:
        for metric in METRICS:
            values = {precision: [measure(rows[precision][seed][protocol], metric) for seed in seeds]
                      for precision in PRECISIONS}
            means = {precision: float(np.mean(values[precision])) for precision in PRECISIONS}
            spread = max(float(np.ptp(values[precision])) for precision in PRECISIONS) if len(seeds) > 1 else None
            difference = means["bf16"] - means["fp32"]
            test = paired_test(*(per_user[precision].averaged([rows[precision][seed][protocol] for seed in seeds],
                                                              metric) for precision in PRECISIONS))
            quality.append({
                "protocol": protocol, "metric": metric,
                **{f"{precision}_per_seed": values[precision] for precision in PRECISIONS},
                **{f"{precision}_mean": means[precision] for precision in PRECISIONS},
                "difference": difference, "relative_difference": difference / means["fp32"] if means["fp32"] else None,
                "seeds_spread": spread,
                "within_spread": None if spread is None else abs(difference) <= spread,
                "paired_test": None if test is None else {"users": test.n_users, "t_pvalue": test.t_pvalue,
                                                          "wilcoxon_pvalue": test.wilcoxon_pvalue}})
    training = {}
    for precision in PRECISIONS:
        runs = {seed: rows[precision][seed]["full"] for seed in seeds}
        training[precision] = {str(seed): {
            "epochs_run": row.get("epochs_run"), "best_epoch": row.get("best_epoch"),
            "stopped_by": row.get("stopped_by"), "steps_run": row.get("steps_run"),
            "wall_seconds_per_step": row.get("train_seconds") / row.get("steps_run") if row.get("steps_run") else None,
            "cpu_seconds_per_step": (row.get("train_cpu_seconds") / row.get("steps_run")
                                     if row.get("steps_run") and row.get("train_cpu_seconds") else None),
            "commit": row.get("commit")} for seed, row in runs.items()}
    ndcg = [entry for entry in quality if entry["metric"] == "NDCG@10"]
    return {"model": model, "seeds": seeds, "quality": quality, "training": training,
            # the rule: test NDCG@10's difference within the seeds' spread, under both protocols
            "as_good": None if len(seeds) < 2 else all(entry["within_spread"] for entry in ndcg)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fp32_folder", type=Path, help="results folder of the fp32 runs")
    parser.add_argument("bf16_folder", type=Path, help="results folder of the same jobs with --set precision=bf16")
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "reference")
    args = parser.parse_args(argv)
    folders = dict(zip(PRECISIONS, (args.fp32_folder, args.bf16_folder)))
    try:
        results = {precision: load_results(folder) for precision, folder in folders.items()}
    except ResultsError as error:  # a folder that is none, or a row it cannot read: one line, no traceback
        sys.exit(str(error))
    datasets = set.union(*(result.values("dataset") for result in results.values()))
    if len(datasets) != 1:
        sys.exit(f"expected the rows of one dataset in both folders, found {sorted(datasets)}")
    per_user = {precision: PerUser(folder) for precision, folder in folders.items()}
    models = []
    for model in names.order_models(set.intersection(*(result.values("model") for result in results.values()))):
        rows = {precision: {} for precision in PRECISIONS}
        for precision, result in results.items():
            for row in result.select(model=model, study="main"):
                rows[precision].setdefault(row.seed, {})[row.protocol] = row
        seeds = {seed for seed, by_protocol in rows["fp32"].items() if set(PROTOCOLS) <= set(by_protocol)} & {
            seed for seed, by_protocol in rows["bf16"].items() if set(PROTOCOLS) <= set(by_protocol)}
        if not seeds or rows["fp32"][min(seeds)]["full"].get("precision") is None:  # POP: no training to compare
            continue
        rows = {precision: {seed: rows[precision][seed] for seed in sorted(seeds)} for precision in PRECISIONS}
        _check(rows, model, folders)
        models.append(compare_model(model, rows, per_user))
    if not models:
        sys.exit(f"{args.fp32_folder} and {args.bf16_folder} share no trained model with every protocol of "
                 f"{', '.join(PROTOCOLS)} in a common seed")
    problems = sorted(set.union(*(users.problems for users in per_user.values())))
    dataset = datasets.pop()
    path = args.output / f"precision-quality-{dataset}.json"
    write_atomic(path, json.dumps({
        "description": __doc__.split("\n\n")[0],
        "dataset": dataset, "commit": git_commit(),
        "command": f"python -m benchmarks.experiments.precision_quality {args.fp32_folder} {args.bf16_folder}",
        "folders": {precision: str(folder) for precision, folder in folders.items()},
        "rule": "bf16 is as good as fp32 for a model when, under pop100 and under full, the difference of the "
                "seeds' mean test NDCG@10 is no larger than the larger of the two precisions' ranges over the seeds",
        "models": models, "per_user_problems": problems}, indent=1) + "\n")
    for entry in models:
        print(f"{entry['model']} (seeds {', '.join(map(str, entry['seeds']))}): as good: {entry['as_good']}")
        for line in entry["quality"]:
            test = line["paired_test"]
            print(f"  {line['protocol']:>6} {line['metric']:<7} fp32 {line['fp32_mean']:.4f}"
                  f"  bf16 {line['bf16_mean']:.4f}  difference {line['difference']:+.4f}  spread "
                  + (f"{line['seeds_spread']:.4f}" if line["seeds_spread"] is not None else "–")
                  + (f"  paired t p = {test['t_pvalue']:.3g}" if test else ""))
    for problem in problems:
        print(f"per-user file: {problem}")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
