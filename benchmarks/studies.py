"""BERT4Rec's studies as job lists for :func:`benchmarks.grid.run_jobs`: the ablation (Table 5), the
sensitivity sweeps (Fig. 3–5, Table 4) and the Cloze study (Table 3).

Every variant is the registered model with ``--set``-style overrides (``use_position=false``), never a copied
model, so its rows land in ``results.jsonl`` beside the main grid with ``study``, ``variant`` and ``sweep`` set.

    python -m benchmarks.studies ablation --datasets ml-1m --models bert4rec sasrec --profile smoke
    python -m benchmarks.studies sensitivity --datasets ml-1m --param hidden --values 16 32 64 128 256
    python -m benchmarks.studies cloze --datasets ml-1m beauty
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from recbench.benchmarks.config import check_overrides, parse_override
from recbench.benchmarks.jobs import Job
from recbench.benchmarks.trainer import TrainSettings
from recbench.models import model_class

TRAIN_FIELDS = {f.name for f in dataclasses.fields(TrainSettings)}

# Table 5's rows: label → overrides of the default configuration.
ABLATIONS: dict[str, tuple[str, ...]] = {
    "default": (),
    "w/o PE": ("use_position=false",),
    "w/o PFFN": ("use_ffn=false",),
    "w/o LN": ("use_layernorm=false",),
    "w/o RC": ("use_residual=false",),
    "w/o Dropout": ("dropout=0.0", "attention_dropout=0.0"),
    "L=1": ("layers=1",),
    "L=3": ("layers=3",),
    "L=4": ("layers=4",),
    "h=1": ("heads=1",),
    "h=4": ("heads=4",),
    "h=8": ("heads=8",),
}

# The paper's sweeps (Fig. 3: d, Fig. 4: ρ, Table 4 / Fig. 5: N), by config field.
SWEEPS: dict[str, list] = {
    "hidden": [16, 32, 64, 128, 256],
    "mask_proportion": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
    "max_len": [10, 20, 30, 40, 50, 100, 200],
}
PARAM_ALIASES = {"d": "hidden", "rho": "mask_proportion", "ρ": "mask_proportion", "N": "max_len"}

# Table 3: left-to-right SASRec, bidirectional BERT4Rec trained only on the last item, and BERT4Rec.
CLOZE_MODELS = {"sasrec": "SASRec", "bert4rec-1mask": "BERT4Rec (1 mask)", "bert4rec": "BERT4Rec"}


def ablation_jobs(datasets, models, seeds=(0,), variants=None, overrides=()) -> list[Job]:
    """One job per (dataset, model, variant, seed); ``variants`` picks rows of :data:`ABLATIONS`."""
    chosen = list(ABLATIONS) if variants is None else list(variants)
    unknown = [name for name in chosen if name not in ABLATIONS]
    if unknown:
        raise ValueError(f"unknown ablation variant(s) {unknown}; valid: {list(ABLATIONS)}")
    check_overrides([*overrides, *(o for v in chosen for o in ABLATIONS[v])], list(models))
    return [Job(dataset, model, seed, study="ablation", variant=variant,
                overrides=(*overrides, *ABLATIONS[variant]))
            for dataset in datasets for model in models for variant in chosen for seed in seeds]


def sensitivity_jobs(datasets, models, param: str, values=None, seeds=(0,), overrides=()) -> list[Job]:
    """One job per value of ``param`` (any model or trainer field; default values for the paper's sweeps)."""
    param = PARAM_ALIASES.get(param, param)
    if values is None:
        if param not in SWEEPS:
            raise ValueError(f"no default values for {param!r}; pass --values (defaults exist for "
                             f"{list(SWEEPS)})")
        values = SWEEPS[param]
    for model in models:  # a field only some models have would silently repeat the others' default
        if param not in {f.name for f in dataclasses.fields(model_class(model).Config)} | TRAIN_FIELDS:
            raise ValueError(f"{model} has no field {param!r} to sweep")
    texts = [f"{param}={value}" for value in values]
    check_overrides([*overrides, *texts], list(models))
    jobs = []
    for text in texts:
        _, _, value = parse_override(text)
        jobs += [Job(dataset, model, seed, study="sensitivity", variant=text, sweep={"param": param, "value": value},
                     overrides=(*overrides, text))
                 for dataset in datasets for model in models for seed in seeds]
    return jobs


def cloze_jobs(datasets, seeds=(0,), models=tuple(CLOZE_MODELS), overrides=()) -> list[Job]:
    """Table 3: each model of :data:`CLOZE_MODELS` with its own configuration."""
    check_overrides(overrides, list(models))
    return [Job(dataset, model, seed, study="cloze", variant=CLOZE_MODELS.get(model, model), overrides=overrides)
            for dataset in datasets for model in models for seed in seeds]


def study_table(rows: list[dict], metric: str = "NDCG@10") -> str:
    """Variants × (dataset, model, protocol) of ``metric`` (mean over seeds); as Table 5, a drop of more than
    10% against the ``default`` row is marked ↓."""
    from tabulate import tabulate

    columns = list(dict.fromkeys((r["dataset"], r["model"], r["protocol"]) for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))

    def mean(variant, column):
        values = [r["metrics"][metric] for r in rows
                  if r["variant"] == variant and (r["dataset"], r["model"], r["protocol"]) == column]
        return float(np.mean(values)) if values else None

    table = []
    for variant in variants:
        cells = [variant]
        for column in columns:
            value, base = mean(variant, column), mean("default", column)
            mark = " ↓" if value is not None and base and value < 0.9 * base else ""
            cells.append("" if value is None else f"{value:.4f}{mark}")
        table.append(cells)
    headers = ["variant", *(f"{d} {m} ({p})" for d, m, p in columns)]
    return f"{metric}\n\n" + tabulate(table, headers=headers, tablefmt="github") + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    from recbench.benchmarks.cli import add_run_options
    from recbench.benchmarks.config import PROFILES
    from recbench.benchmarks.evaluator import PROTOCOLS

    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    studies = parser.add_subparsers(dest="study", required=True)

    def common(sub):
        sub.add_argument("--datasets", nargs="+", default=["ml-1m"], metavar="NAME")
        sub.add_argument("--seeds", nargs="+", type=int, default=[0], metavar="N")
        sub.add_argument("--profile", default="smoke", choices=PROFILES)
        sub.add_argument("--protocols", nargs="+", default=["full", "pop100"], choices=PROTOCOLS)
        sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="[MODEL:]FIELD=VALUE",
                         help="applied to every job before the study's own overrides (repeatable)")
        add_run_options(sub)  # --output defaults to results/study-<study>-<datasets>-<profile>
        return sub

    ablation = common(studies.add_parser("ablation", help="paper Table 5: remove one component at a time"))
    ablation.add_argument("--models", nargs="+", default=["bert4rec"], metavar="NAME")
    ablation.add_argument("--variants", nargs="+", default=None, metavar="LABEL",
                          help=f"rows to run (default: all of {list(ABLATIONS)})")
    sensitivity = common(studies.add_parser("sensitivity", help="paper Fig. 3–5: one field over a list of values"))
    sensitivity.add_argument("--models", nargs="+", default=["bert4rec"], metavar="NAME")
    sensitivity.add_argument("--param", required=True,
                             help=f"a model or trainer field (aliases {PARAM_ALIASES}); defaults exist for "
                                  f"{list(SWEEPS)}")
    sensitivity.add_argument("--values", nargs="+", default=None, metavar="V", help="read as TOML values")
    cloze = common(studies.add_parser("cloze", help="paper Table 3: SASRec vs BERT4Rec (1 mask) vs BERT4Rec"))
    cloze.add_argument("--models", nargs="+", default=list(CLOZE_MODELS), metavar="NAME")
    return parser.parse_args(argv)


def build_jobs(args: argparse.Namespace) -> list[Job]:
    overrides = tuple(args.overrides)
    if args.study == "ablation":
        return ablation_jobs(args.datasets, args.models, args.seeds, args.variants, overrides)
    if args.study == "sensitivity":
        return sensitivity_jobs(args.datasets, args.models, args.param, args.values, args.seeds, overrides)
    return cloze_jobs(args.datasets, args.seeds, args.models, overrides)


def main(argv=None) -> int:
    args = parse_args(argv)
    from recbench.benchmarks.cli import guard, run_grid, run_options

    def run() -> int:
        jobs = build_jobs(args)
        output = Path(args.output or Path("results") / f"study-{args.study}-{'-'.join(args.datasets)}-{args.profile}")
        print(f"{args.study}: {len(jobs)} job(s) -> {output}/")

        def table(rows: list[dict]) -> str:
            text = study_table(rows)
            print("\n" + text)
            return text

        options = run_options(args, protocols=args.protocols, profile=args.profile, output=output)
        return run_grid(args, jobs, options, table=table)

    return guard(run, args.debug)


if __name__ == "__main__":
    sys.exit(main())
