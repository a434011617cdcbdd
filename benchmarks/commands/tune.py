"""Tune models on the validation split as the paper did (every model "under its optimal hyper-parameter settings",
BERT4Rec §4.3), then test the chosen settings once against the defaults. See benchmarks/tuning/ for how.

    python -m benchmarks.tune --datasets ml-1m --models sasrec bprmf --trials 40 --jobs 2
    python -m benchmarks.tune --datasets synthetic --models bprmf --trials 3 --output DIR   # seconds; then --resume
    python -m benchmarks.tune --datasets ml-1m --models bprmf --sampler grid --space lr=none --space sample_alpha=none
    python -m benchmarks.tune --datasets ml-100k --models sasrec --budget-cpu 120 --space 'hidden=[32, 64]'
    python -m benchmarks.tune --datasets ml-100k --models sasrec --trials 10 --split temporal

Writes into the output folder: tuning.db (the studies; --storage URL for several machines), tuned.toml (the chosen
settings, for --config), tuning.json (every trial, for the report), and the final runs' results.jsonl.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recbench.benchmarks.commands.cli import (
    EXIT_FAILED_JOBS,
    EXIT_INTERRUPTED,
    add_run_options,
    guard,
    run_options,
)
from recbench.benchmarks.config import PROFILES, toml_value
from recbench.benchmarks.evaluator import PROTOCOLS
from recbench.benchmarks.jobs import GridInterrupted
from recbench.benchmarks.options import output_suffix
from recbench.benchmarks.tuning.study import (
    BUDGETS,
    PRUNERS,
    SAMPLERS,
    SearchSettings,
    check_search,
    default_values,
    run_search,
    search_base,
)
from recbench.datasets import DATASET_NAMES
from recbench.datasets.errors import unknown
from recbench.models import model_class, model_names
from recbench.reports import generate_report
from recbench.reports.tuning import tuning_console


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["synthetic"], metavar="NAME",
                        help=f"datasets (default: synthetic); one of: {', '.join(DATASET_NAMES)}")
    parser.add_argument("--models", nargs="+", required=True, metavar="NAME",
                        help=f"one of: {', '.join(model_names())}")
    _add_search_options(parser)
    add_run_options(parser)
    args = parser.parse_args(argv)
    for name in args.datasets:
        if name not in DATASET_NAMES:
            parser.error(str(unknown("dataset", name, DATASET_NAMES)))
    for name in args.models:
        try:
            model_class(name)  # a registered name, or whatever else the registry resolves
        except ValueError as error:
            parser.error(str(error))
    if args.output is None:
        args.output = str(Path("results") / f"tune-{'-'.join(args.datasets)}-{args.profile}{output_suffix(args.split)}")
    return args


def _add_search_options(parser: argparse.ArgumentParser) -> None:
    """What the search does: trials, sampler and pruner, spaces, the per-trial budget, the objective, the final
    runs and the studies' database."""
    parser.add_argument("--trials", type=int, default=None, metavar="N",
                        help="trials per (dataset, model), finished or pruned (default: 20; the grid sampler: every "
                             "point of the grid), besides the trial of the model's own settings that every study "
                             "runs to its end and counts among the candidates")
    parser.add_argument("--sampler", default="tpe", choices=SAMPLERS,
                        help="tpe (default), grid (every point of the space, to the end) or random")
    parser.add_argument("--pruner", default="median", choices=PRUNERS,
                        help="stop a trial from its validation curve: median (default), hyperband or none")
    parser.add_argument("--sampler-seed", type=int, default=0, metavar="N", help="seed of the sampler (default 0)")
    parser.add_argument("--space", dest="spaces", action="append", default=[], metavar="[MODEL:]FIELD=VALUES",
                        help="narrow or extend a model's search space: a TOML list or range, e.g. 'hidden=[32, 64]', "
                             "'lr={low=1e-4, high=1e-2, log=true}'; FIELD=none leaves the field out (repeatable; "
                             "[MODEL.search] tables in a --config file do the same)")
    budget = parser.add_argument_group("per-trial budget (part of every trial's settings and of the chosen ones)")
    budget.add_argument("--budget-epochs", type=int, default=None, metavar="N", help="at most N epochs per trial")
    budget.add_argument("--budget-steps", type=int, default=None, metavar="N", help="at most N optimiser steps")
    budget.add_argument("--budget-cpu", type=float, default=None, metavar="SECONDS",
                        help="at most this many CPU-seconds of training per trial (all threads, validation included)")
    parser.add_argument("--metric", default=None, help="the objective and selection metric on validation, e.g. "
                                                       "NDCG@10 (default: each model's valid_metric, NDCG@10)")
    parser.add_argument("--valid-protocol", default=None, choices=PROTOCOLS,
                        help="candidates of the validation ranking (default: each model's valid_protocol, full)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], metavar="N",
                        help="trials train with the first seed; the final runs with every one (default: 0)")
    parser.add_argument("--profile", default="smoke", choices=PROFILES,
                        help="the profile every trial and final run trains under, and so what the chosen settings "
                             "are tuned for: smoke (default: seconds per trial, settings best for that short "
                             "budget only) or paper (the paper's budget)")
    parser.add_argument("--protocols", nargs="+", default=["full", "pop100"], choices=PROTOCOLS,
                        help="test protocols of the final runs (default: full pop100)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="[MODEL:]FIELD=VALUE",
                        help="fix a setting in every trial and final run (repeatable)")
    parser.add_argument("--storage", default=None, metavar="URL",
                        help="the studies' database (default: sqlite:///OUTPUT/tuning.db); for several machines an "
                             "RDB URL that every one reaches, e.g. postgresql://user:password@host/db")
    parser.add_argument("--study-prefix", default="tune", help="studies are named PREFIX-DATASET-MODEL")
    parser.add_argument("--no-final", action="store_true", help="stop after the search (no test runs)")


def search_settings(args: argparse.Namespace) -> SearchSettings:
    given = {"epochs": args.budget_epochs, "steps": args.budget_steps, "cpu": args.budget_cpu}
    budget = tuple(f"{BUDGETS[name]}={toml_value(value)}" for name, value in given.items() if value is not None)
    objective = tuple(f"{name}={toml_value(value)}" for name, value in
                      (("valid_metric", args.metric), ("valid_protocol", args.valid_protocol)) if value is not None)
    return SearchSettings(trials=args.trials, sampler=args.sampler, pruner=args.pruner, sampler_seed=args.sampler_seed,
                          storage=args.storage, study_prefix=args.study_prefix, budget=budget, objective=objective,
                          spaces=tuple(args.spaces), overrides=tuple(args.overrides), seeds=tuple(args.seeds),
                          final=not args.no_final)


def dry_run(pairs: list, options, settings) -> int:
    """Check everything and print each study's space, budget, objective and defaults; no trial runs."""
    _, overlays, spaces = check_search(pairs, options, settings)
    budget = " ".join(settings.budget) or "the profile's own"
    for (dataset, model), space in spaces.items():
        print(f"{settings.study_prefix}-{dataset}-{model}: {settings.sampler}, pruner {settings.pruner}, "
              f"budget {budget}")
        for dimension in space.dimensions.values():
            print(f"    {dimension.text}    ({dimension.origin})")
        for target, rule in space.tied.items():
            print(f"    {target} = {rule}    (tied)")
        defaults = default_values(space, search_base(model, dataset, options, settings, overlays))
        print("    and the defaults' trial:", *(f"{name}={toml_value(value)}" for name, value in defaults.items()))
    print(f"{len(spaces)} stud(ies); nothing was run (--dry-run)")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)

    def run() -> int:
        pairs = [(dataset, model) for dataset in args.datasets for model in args.models]
        options = run_options(args, protocols=args.protocols, profile=args.profile, output=Path(args.output))
        options.command = ["python", "-m", "benchmarks.tune", *(sys.argv[1:] if argv is None else argv)]
        settings = search_settings(args)
        print(tuned_for(args.profile, settings.budget))
        try:
            if args.dry_run:
                return dry_run(pairs, options, settings)
            result = run_search(pairs, options, settings)
        except GridInterrupted:  # a GridError (bad settings, one per line) is guard's to print
            print(f"\ninterrupted: finished trials are in the study; rerun the same command with --resume to "
                  f"continue ({args.output}/)", file=sys.stderr)
            return EXIT_INTERRUPTED
        return finish(args, result)

    return guard(run, args.debug)


def tuned_for(profile: str, budget: tuple) -> str:
    """What the search tunes for, said before it starts: the settings it chooses are the best for one budget."""
    spent = f"the {profile} profile's settings" + (f" with {' '.join(budget)}" if budget else "")
    other = "; --profile paper tunes for the paper's budget" if profile == "smoke" else ""
    return (f"profile {profile}: every trial and final run trains under {spent}, so the chosen settings are the best "
            f"for that budget (tuned.toml says so){other}")


def finish(args: argparse.Namespace, result) -> int:
    """The final runs' table and the report; exit 1 when a final run failed."""
    output = Path(args.output)
    text = tuning_console(output)
    if text:
        print("\n" + text)
        (output / "table.md").write_text(text)
    if not args.no_report and (output / "results.jsonl").exists():
        print(f"report: {generate_report(output)}")
    failed = [outcome for grid in result.finals for outcome in grid.failed]
    for outcome in failed:
        print(f"  FAILED {outcome.run_id} (key {outcome.key[:12]}): {outcome.error}", file=sys.stderr)
    return EXIT_FAILED_JOBS if failed else 0


if __name__ == "__main__":
    sys.exit(main())
