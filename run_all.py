#!/usr/bin/env python
"""Train and evaluate sequential recommenders the way the BERT4Rec paper did, and write paper-style tables.

    python run_all.py                                   # offline smoke run on the built-in synthetic data
    python run_all.py --datasets ml-1m beauty --models pop bprmf --data-dir DIR
    python run_all.py --datasets ml-1m beauty --models table2 --profile converge --resume   # the paper's Table 2
    python run_all.py --datasets ml-1m --profile paper --seeds 0 1 2 --jobs 3 --resume
    python run_all.py --task relevance --datasets ml-1m --models pop lstm-rel bert4rec-rel --data-dir DIR
    python run_all.py --datasets ml-100k ml-latest-small --split temporal --data-dir DIR    # a global temporal split
    python run_all.py --datasets clicks.csv --columns user=uid item=iid time=ts --models pop mypkg.mymodel:MyRec

Results go to ``results/<name>/`` (see results/README.md for the schema).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recbench.benchmarks.commands.api import default_output
from recbench.benchmarks.commands.cli import add_run_options, choose_threads, guard, run_grid, run_options
from recbench.benchmarks.config import PROFILES
from recbench.benchmarks.evaluator import PROTOCOLS
from recbench.benchmarks.jobs import TASKS, Job
from recbench.benchmarks.negatives import PAIRS
from recbench.datasets import DATASET_NAMES, log_entries, log_format
from recbench.datasets.errors import unknown
from recbench.models import model_class, model_names
from recbench.reports.console import main_tables

DEFAULT_MODELS = ("pop", "bprmf", "sasrec", "bert4rec")
DEFAULT_RELEVANCE_MODELS = ("pop", "bprmf", "lstm-rel", "bert4rec-rel")
# Named sets of models for --models: the paper's Table 2 (its rows, in its order).
MODEL_SETS = {"table2": ("pop", "bprmf", "ncf", "fpmc", "gru4rec", "gru4rec+", "caser", "sasrec", "bert4rec")}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="next-item", choices=TASKS,
                        help="next-item: rank the held-out item (default); relevance: judge one positive and one "
                             "sampled negative candidate per user (accuracy, AUC, log-loss); models not trained for "
                             "relevance are calibrated on the validation pairs")
    parser.add_argument("--datasets", nargs="+", default=["synthetic"], metavar="NAME",
                        help=f"datasets to run (default: synthetic); one of: {', '.join(DATASET_NAMES)}; or a "
                             f"CSV/TSV log of your own, PATH (named by its file's stem) or NAME=PATH (see --columns)")
    parser.add_argument("--columns", nargs="+", default=[], metavar="ROLE=COLUMN",
                        help="the columns of your logs: user=, item= (default: the columns named so), time= "
                             "(default: time or timestamp, else the rows' order), rating=; sep= (default: tab for "
                             ".tsv, else comma)")
    parser.add_argument("--filters", nargs="+", default=[], metavar="NAME=VALUE",
                        help="which rows of your logs count: min_rating= (default: every row), "
                             "min_item_interactions= (default 0), min_user_interactions= (default 5)")
    parser.add_argument("--models", nargs="+", default=None, metavar="NAME",
                        help=f"models to run (default: those of {', '.join(DEFAULT_MODELS)} that exist; with "
                             f"--task relevance {', '.join(DEFAULT_RELEVANCE_MODELS)}); "
                             f"one of: {', '.join(_known_models())}; or a model of your own, "
                             f"package.module:Class; or table2, the paper's Table 2 "
                             f"({', '.join(MODEL_SETS['table2'])})")
    parser.add_argument("--protocols", nargs="+", default=None, metavar="NAME",
                        help=f"candidate protocols for the test split of --task next-item (default: full pop100); "
                             f"any of: {', '.join(PROTOCOLS)}. The relevance task has its own: {PAIRS}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], metavar="N", help="seeds (default: 0)")
    parser.add_argument("--profile", default="smoke", choices=PROFILES,
                        help="smoke: seconds per model, checks that everything runs (default); "
                             "converge: the paper's models, data and evaluation trained on the schedule of the "
                             "published replications until early stopping ends each run, the numbers to report "
                             "(measured on ML-1m, one CPU thread, a run: BPR-MF 1-1.4 min, SASRec 0.7-1.2 h, "
                             "BERT4Rec 4.2-5.3 h; results/reference/converge-ml-1m.json); paper: the authors' own "
                             "schedule as well (BERT4Rec: 400,000 steps, about 4.4 days at the 1.05 steps/s of one "
                             "CPU thread, 1.0-1.2 h at the 93-115 steps/s of one H200; results/reference/"
                             "converge-ml-1m.json, rows-ablation-ml-1m-dropout.json)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="[MODEL:]FIELD=VALUE",
                        help="override a hyper-parameter or trainer setting, e.g. --set hidden=128 "
                             "--set sasrec:max_epochs=50 (repeatable)")
    parser.add_argument("--estimate", action="store_true",
                        help="time a few training steps of each job's model on its data, on this machine, and "
                             "print the training each job has left (with --resume: none for a job that is done, "
                             "the rest for one a checkpoint holds) and the total; with --dry-run only that, else "
                             "the run then states its time left from those figures")
    add_run_options(parser)
    args = parser.parse_args(argv)
    _check_data_and_models(parser, args)
    _check_protocols(parser, args)
    if args.output is None:
        args.output = str(default_output(args.datasets, args.task, {"split": args.split, "profile": args.profile}))
    return args


def _check_protocols(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--protocols`` (its default filled in for the task) are protocols the task evaluates; else a usage error."""
    relevance = args.task == "relevance"
    if relevance and args.protocols is not None:
        parser.error(f"--protocols applies to --task next-item; the relevance task is evaluated on its {PAIRS}")
    if args.protocols is None:
        args.protocols = [PAIRS] if relevance else ["full", "pop100"]
        return
    for name in args.protocols:
        if name not in PROTOCOLS:
            parser.error(str(unknown("protocol", name, PROTOCOLS)))


def _known_models() -> list[str]:
    """Every model name (the registered ones, then installed entry points); an entry point that collides with a
    registered name is a one-line error."""
    try:
        return model_names()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def _check_data_and_models(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--datasets`` as names and the logs of the user's own among them (``args.logs``); ``--models`` (their
    defaults filled in) each resolve to a model class. Any problem is a one-line usage error."""
    try:
        args.datasets, args.logs = log_entries(args.datasets, log_format(args.columns, args.filters))
    except ValueError as error:
        parser.error(str(error))
    if (args.columns or args.filters) and not args.logs:
        parser.error("--columns and --filters describe logs of your own: name one in --datasets (PATH or NAME=PATH)")
    if args.models is None:
        defaults = DEFAULT_RELEVANCE_MODELS if args.task == "relevance" else DEFAULT_MODELS
        args.models = [name for name in defaults if name in _known_models()]
    args.models = list(dict.fromkeys(model for name in args.models for model in MODEL_SETS.get(name, (name,))))
    if "all" in args.models:
        parser.error(f"--models all: the suite has no set of every model (they include variants and relevance "
                     f"models, which no one table compares); name the models, or a set: table2, the paper's Table 2 "
                     f"({' '.join(MODEL_SETS['table2'])})")
    for name in args.models:
        try:
            model_class(name)
        except ValueError as error:
            parser.error(str(error))


def main(argv=None) -> int:
    args = parse_args(argv)

    def table(rows: list[dict]) -> str:
        text = main_tables(rows)
        print("\n" + text)
        return text

    def run() -> int:
        jobs = [Job(dataset, model, seed, overrides=tuple(args.overrides), task=args.task)
                for dataset in args.datasets for model in args.models for seed in args.seeds]
        output = Path(args.output)
        threads = choose_threads(args)
        print(f"{len(jobs)} job(s): task {args.task}, datasets {args.datasets}, models {args.models}, "
              f"seeds {args.seeds}, profile {args.profile}, protocols {args.protocols}, split {args.split} "
              f"-> {output}/" + (f"; {threads}" if threads else ""))
        options = run_options(args, protocols=args.protocols, profile=args.profile, output=output, logs=args.logs)
        return run_grid(args, jobs, options, table=table, estimate=args.estimate)

    return guard(run, args.debug)


if __name__ == "__main__":
    sys.exit(main())
