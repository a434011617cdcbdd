"""BERT4Rec's studies as job lists for :func:`benchmarks.grid.run_jobs`, built as the paper ran them: the ablation
(Table 5), the sensitivity sweeps (Fig. 3: d, Fig. 4: ρ, Table 4: N) and the Cloze study (Table 3); and the study
the field asked next, of the loss and the direction (:data:`LOSS_VARIANTS`): SASRec's network at one size trained with
each loss the field moved to, beside BERT4Rec's bidirectional Cloze objective with the same full softmax, so that one
table says whether the encoder's direction or the loss explains the paper's ranking, and what each loss costs.

Every variant is the registered model with ``--set``-style overrides (``use_position=false``), never a copied
model, so its rows land in ``results.jsonl`` beside the main grid with ``study``, ``variant`` and ``sweep`` set.
Settings the paper ties to a swept value follow it; they are part of each job's overrides and of its ``sweep``
record (``{"param", "value", "tied"}``), so the plan and every row show them:

- d (Fig. 3) and the Cloze study's d = 256: BERT4Rec's heads h = max(1, d/32) (§4.3: 32 dimensions per head, one
  head below d = 32), and under the paper and converge profiles its dropouts and FFN size those of the authors'
  ``bert_config_<data>_<d>.json`` where they differ from the d = 64 file (:data:`AUTHORS_CONFIGS`). SASRec keeps
  its authors' single head. Otherwise the FFN's inner size follows d in the model code (BERT4Rec 4d, eq. 3;
  SASRec d, as its authors' code).
- ρ (Fig. 4) and N (Table 4): BERT4Rec's cap on masked items per sequence is ⌈ρ·N⌉, so that its Cloze copies mask
  ρ of their items (§4.6: ρ = 0.6 on ML-1m predicts about 98 items per sequence); outside a sweep the authors'
  cap stays (40 on ML-1m). The 1-mask variants mask one item whatever ρ and keep theirs.
A ``--set`` naming a tied field wins over the tie.

Without ``--profile`` a study runs the converge profile (the paper's models and data, trained on the schedule of
the published replications until early stopping: hours per BERT4Rec job on a CPU, not the paper profile's days),
and its plan states each job's estimated training time on this machine (:mod:`benchmarks.estimate`) before anything
trains; ``--profile paper`` runs the authors' 400,000-step schedule.

    python -m benchmarks.studies ablation --datasets ml-1m
    python -m benchmarks.studies sensitivity --datasets ml-1m beauty --param d
    python -m benchmarks.studies sensitivity --datasets ml-1m beauty --param N
    python -m benchmarks.studies cloze --datasets ml-1m beauty
    python -m benchmarks.studies losses --datasets ml-1m beauty --seeds 0 1
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
from tabulate import tabulate

from recbench.benchmarks.commands.cli import add_run_options, guard, print_plan, run_grid, run_options, training_left
from recbench.benchmarks.config import PROFILES, check_overrides, fields_of, parse_override, resolve
from recbench.benchmarks.estimate import total_lines
from recbench.benchmarks.evaluator import PROTOCOLS
from recbench.benchmarks.grid import interrupted, progress_text
from recbench.benchmarks.jobs import GridError, Job
from recbench.benchmarks.options import output_suffix
from recbench.benchmarks.planner import plan_grid
from recbench.benchmarks.reuse import reusable_twins
from recbench.benchmarks.store import ResultStore
from recbench.benchmarks.tuning.space import HEAD_SIZE, cloze_cap, paper_heads
from recbench.models import model_class
from recbench.models.base import show
from recbench.models.bert4rec import BERT4RecConfig
from recbench.reports import names

# Table 5's rows, and §4.8's "w/o RC" with L = 4: label → overrides of the default configuration.
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
    "w/o RC, L=4": ("use_residual=false", "layers=4"),
}

# The paper's sweeps (Fig. 3: d, Fig. 4: ρ), by config field; N (Table 4) has values per dataset.
SWEEPS: dict[str, list] = {
    "hidden": [16, 32, 64, 128, 256],
    "mask_proportion": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
}
# Table 4's N per dataset. Datasets it does not report take the list of the one with the same kind of N in
# Table 1: Beauty's where BERT4Rec's configured N is at most 50 (Steam: 50), ML-1m's otherwise (ML-20m: 200).
N_SWEEPS = {"beauty": [10, 20, 30, 40, 50], "ml-1m": [10, 50, 100, 200, 400]}
PARAM_ALIASES = {"d": "hidden", "rho": "mask_proportion", "ρ": "mask_proportion", "N": "max_len"}
# Fig. 3's models, the paper's neural sequential models; the other sweeps are BERT4Rec's.
SWEEP_MODELS = {"hidden": ["gru4rec", "gru4rec+", "caser", "sasrec", "bert4rec"]}
# The authors' bert_config_<data>_<d>.json where it differs from bert_config_<data>_64.json (bert4rec.toml):
# hidden_dropout_prob, attention_probs_dropout_prob and intermediate_size. Beauty and ML-20m use the same dropouts
# at every d.
AUTHORS_CONFIGS = {
    ("ml-1m", 128): {"dropout": 0.5},  # bert_config_ml-1m_128.json: hidden 0.5, attention 0.2
    ("ml-1m", 256): {"dropout": 0.5, "ffn_inner": 512},  # bert_config_ml-1m_256.json: hidden 0.5, attention 0.2,
    # intermediate_size 512 (every other authors' configuration has 4d)
    ("steam", 256): {"dropout": 0.2, "attention_dropout": 0.2},  # bert_config_steam_256.json
}

# Table 3: left-to-right SASRec, bidirectional BERT4Rec trained with one item masked (both readings of "1 mask"),
# and BERT4Rec; at d = 256.
CLOZE_MODELS = {"sasrec": "SASRec", "bert4rec-1mask": "BERT4Rec (1 mask: last)",
                "bert4rec-1mask-random": "BERT4Rec (1 mask: random)", "bert4rec": "BERT4Rec"}
CLOZE_HIDDEN = 256  # Table 3's caption: d = 256


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


# The loss study: label → (model, overrides). One backbone, SASRec's network with its settings per dataset at the
# suite's d = 64, scoring with the shared item embedding; only the objective changes (models/sasrec_losses.py), and
# BERT4Rec's Cloze rows change the direction, with the same full softmax and with gBCE at the masked positions
# (models/bert4rec_losses.py). The full softmax is the reference row.
LOSS_REFERENCE = "full softmax (SASRec-CE)"
LOSS_VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "BCE, 1 negative (SASRec)": ("sasrec", ()),
    "BCE, 256 negatives": ("gsasrec", ("loss=\"bce\"", "shared_output=true")),
    "gBCE, 256 negatives, t = 0.75 (gSASRec)": ("gsasrec", ("shared_output=true",)),
    "sampled softmax, 256 uniform": ("sasrec-ss", ("negatives=256",)),
    "sampled softmax, 256 popularity": ("sasrec-ss", ("negatives=256", "sampler=\"popularity\"")),
    "sampled softmax, 256 popularity, logQ": ("sasrec-ss", ("negatives=256", "sampler=\"popularity\"",
                                                             "logq=true")),
    "sampled softmax, 3,000 uniform": ("sasrec-ss", ()),
    LOSS_REFERENCE: ("sasrec-ce", ()),
    "Cloze, full softmax (BERT4Rec)": ("bert4rec", ()),
    "Cloze, gBCE, 256 negatives, t = 0.75 (gBERT4Rec)": ("gbert4rec", ()),
}


def loss_jobs(datasets, seeds=(0,), variants=None, overrides=()) -> list[Job]:
    """One job per (dataset, variant of :data:`LOSS_VARIANTS`, seed), seeds innermost so that a dataset's first
    seed of every variant comes before its second; ``variants`` picks labels."""
    chosen = list(LOSS_VARIANTS) if variants is None else list(variants)
    unknown = [name for name in chosen if name not in LOSS_VARIANTS]
    if unknown:
        raise ValueError(f"unknown loss variant(s) {unknown}; valid: {list(LOSS_VARIANTS)}")
    check_overrides([*overrides, *(o for v in chosen for o in LOSS_VARIANTS[v][1])],
                    list(dict.fromkeys(LOSS_VARIANTS[v][0] for v in chosen)))
    return [Job(dataset, LOSS_VARIANTS[variant][0], seed, study="losses", variant=variant,
                overrides=(*overrides, *LOSS_VARIANTS[variant][1]))
            for dataset in datasets for seed in seeds for variant in chosen]


# ------------------------------------------------------------------------------------------- tied settings

def named_fields(overrides, model: str) -> set[str]:
    """The fields a ``--set`` names for ``model`` (unprefixed, or with its prefix)."""
    fields = set()
    for text in overrides:
        target, field, _ = parse_override(text)
        if target in (None, model):
            fields.add(field)
    return fields


def cloze_cap_follows(model: str) -> bool:
    """Whether ``model``'s Cloze copies mask a proportion ρ of their items (BERT4Rec), so that its cap follows
    ρ·N in a sweep; the 1-mask variants (no Cloze copies, or one prediction per copy) mask one item whatever ρ."""
    defaults = {f.name: f.default for f in dataclasses.fields(model_class(model).Config)}
    return "mask_proportion" in defaults and defaults.get("dupe_factor", 0) > 0 and defaults["max_predictions"] > 1


def heads_for(hidden: int) -> int:
    """§4.3's heads for d = ``hidden`` (:func:`benchmarks.tuning.space.paper_heads`), which must divide d."""
    heads = paper_heads(hidden)
    if hidden % heads:
        raise ValueError(f"d={hidden}: the paper's rule h = d/{HEAD_SIZE} gives {heads} heads, which do not divide "
                         f"d; pick a d that is a multiple of {HEAD_SIZE}, or --set heads=H explicitly")
    return heads


def tied_settings(model: str, dataset: str, profile: str, changes: dict, overrides=()) -> dict:
    """The settings the paper ties to the values ``changes`` sets (``{"hidden": 256}``, ``{"max_len": 400}``) for
    ``model`` on ``dataset`` (module docstring), less those a ``--set`` in ``overrides`` names."""
    is_bert4rec = issubclass(model_class(model).Config, BERT4RecConfig)
    named = named_fields(overrides, model)
    tied = {}
    if isinstance(changes.get("hidden"), int) and is_bert4rec:  # another type fails in the plan, one line
        if "heads" not in named:
            tied["heads"] = heads_for(changes["hidden"])
        if profile != "smoke":
            tied.update(AUTHORS_CONFIGS.get((dataset, changes["hidden"]), {}))
    if {"mask_proportion", "max_len"} & set(changes) and cloze_cap_follows(model):
        config = resolve(model, dataset, profile, (*overrides, *as_overrides(changes))).model
        tied["max_predictions"] = cloze_cap(config.mask_proportion, config.max_len)
    return {field: value for field, value in tied.items() if field not in named}


def as_overrides(values: dict) -> tuple[str, ...]:
    return tuple(f"{field}={show(value)}" for field, value in values.items())


# ------------------------------------------------------------------------------------------- sensitivity

def sweep_values(param: str, dataset: str, profile: str = "converge") -> list:
    """The paper's values of ``param`` on ``dataset``: :data:`SWEEPS`, or Table 4's N (:data:`N_SWEEPS`)."""
    if param != "max_len":
        return SWEEPS[param]
    if dataset in N_SWEEPS:
        return N_SWEEPS[dataset]
    return N_SWEEPS["beauty" if resolve("bert4rec", dataset, profile).model.max_len <= 50 else "ml-1m"]


def _check_sweep(param: str, models, values, overrides) -> None:
    """One-line errors before any job is built: a parameter some model lacks, heads that do not divide a d."""
    if values is None and param not in (*SWEEPS, "max_len"):
        raise ValueError(f"no default values for {param!r}; pass --values (the paper's sweeps: d, rho, N)")
    for model in models:  # a field only some models have would silently repeat the others' default
        if param not in set().union(*fields_of(model)):
            raise ValueError(f"unknown sweep parameter {param!r} for {model}: it is no field of {model} and no "
                             f"trainer setting (the paper's sweeps: d, rho, N)")
    if param != "hidden":
        return
    hidden = [parse_override(f"hidden={v}")[2] for v in values] if values is not None else SWEEPS["hidden"]
    for text in overrides:
        target, field, heads = parse_override(text)
        if field != "heads" or not (target is None or target in models) or not isinstance(heads, int) or heads < 1:
            continue
        wrong = [d for d in hidden if isinstance(d, int) and d % heads]
        if wrong:
            raise ValueError(f"--set {text}: {heads} heads do not divide d={wrong[0]} of the d sweep; leave heads "
                             f"unset (the paper's h = max(1, d/{HEAD_SIZE})) or pick one that divides every d")


def sensitivity_jobs(datasets, models=None, param: str = "hidden", values=None, seeds=(0,), overrides=(),
                     profile: str = "converge") -> list[Job]:
    """One job per (dataset, value of ``param``, model, seed): any model or trainer field, with the paper's values
    by default (:func:`sweep_values`); ``models`` defaults to the paper's for that sweep (:data:`SWEEP_MODELS`)."""
    param = PARAM_ALIASES.get(param, param)
    models = list(models or SWEEP_MODELS.get(param, ["bert4rec"]))
    _check_sweep(param, models, values, overrides)
    check_overrides([*overrides, *(f"{param}={value}" for value in values or ())], models)
    jobs = []
    for dataset in datasets:
        for raw in values if values is not None else sweep_values(param, dataset, profile):
            text = f"{param}={raw}"
            _, _, value = parse_override(text)
            for model in models:
                tied = tied_settings(model, dataset, profile, {param: value}, overrides)
                sweep = {"param": param, "value": value, **({"tied": tied} if tied else {})}
                jobs += [Job(dataset, model, seed, study="sensitivity", variant=text, sweep=sweep,
                             overrides=(*overrides, text, *as_overrides(tied))) for seed in seeds]
    return jobs


# ---------------------------------------------------------------------------------------------- Cloze

def cloze_jobs(datasets, seeds=(0,), models=tuple(CLOZE_MODELS), overrides=(), profile: str = "converge",
               hidden: int = CLOZE_HIDDEN) -> list[Job]:
    """Table 3 at d = ``hidden`` (256, the paper's), each model of :data:`CLOZE_MODELS` with its own configuration
    and the settings tied to d (module docstring); a ``--set hidden=`` wins, and the ties follow it."""
    check_overrides(overrides, list(models))
    jobs = []
    for dataset in datasets:
        for model in models:
            study = {} if "hidden" in named_fields(overrides, model) else {"hidden": hidden}
            d = resolve(model, dataset, profile, (*overrides, *as_overrides(study))).model.hidden
            tied = tied_settings(model, dataset, profile, {"hidden": d}, overrides)
            jobs += [Job(dataset, model, seed, study="cloze", variant=CLOZE_MODELS.get(model, model),
                         overrides=(*overrides, *as_overrides(study), *as_overrides(tied))) for seed in seeds]
    return jobs


# ---------------------------------------------------------------------------------------------- output

def study_table(rows: list[dict], metric: str = "NDCG@10", base: str = "default", by_model: bool = True) -> str:
    """Variants × (dataset, model, protocol) of ``metric`` (mean over seeds; without ``by_model`` the columns are
    (dataset, protocol), for a study whose variants are models of their own); as Table 5, a drop of more than 10%
    against the ``base`` row is marked ↓."""
    def column_of(row):
        return (row["dataset"], row["model"], row["protocol"]) if by_model else (row["dataset"], row["protocol"])

    columns = list(dict.fromkeys(column_of(r) for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))

    def mean(variant, column):
        values = [r["metrics"][metric] for r in rows if r["variant"] == variant and column_of(r) == column]
        return float(np.mean(values)) if values else None

    table = []
    for variant in variants:
        cells = [variant]
        for column in columns:
            value, reference = mean(variant, column), mean(base, column)
            mark = " ↓" if value is not None and reference and value < 0.9 * reference else ""
            cells.append("" if value is None else f"{value:.4f}{mark}")
        table.append(cells)
    headers = ["variant", *(" ".join(column[:-1]) + f" ({column[-1]})" for column in columns)]
    return f"{metric}\n\n" + tabulate(table, headers=headers, tablefmt="github") + "\n"


def study_notes(job) -> list[str]:
    """The plan's lines on what the study does to one planned job: the settings it sets, the values tied to a
    swept one, and what an ablation row removes."""
    spec, lines = job.job, []
    if spec.overrides:
        lines.append(f"    sets: {' '.join(spec.overrides)}")
    tied = (spec.sweep or {}).get("tied")
    if tied:
        lines.append(f"    tied to {spec.sweep['param']}={spec.sweep['value']}: {' '.join(as_overrides(tied))}")
    removes = names.ablation_removes(spec.model, spec.variant) if spec.study == "ablation" else None
    if removes:
        lines.append(f"    removes: {removes}")
    return lines


def plan_lines(planned: list, estimates: dict | None = None, n_jobs: int = 1, twins: dict | None = None,
               done: frozenset = frozenset(), states: dict | None = None) -> list[str]:
    """The study's plan, one entry per job: what the study sets (its overrides, the tied values among them), what
    an ablation row removes, where its rows are reused from (``twins``, :func:`benchmarks.reuse.reusable_twins`:
    no training, no estimate), and the estimated training time (:mod:`benchmarks.estimate`) when given; with
    ``n_jobs`` above 1 also the time with that many jobs at once. A resumed study also names the jobs whose rows
    are ``done`` (keys) and where each interrupted one stands (``states``, :func:`benchmarks.grid.interrupted`);
    their ``estimates`` are then the training left (:func:`benchmarks.commands.cli.training_left`)."""
    lines = []
    for number, job in enumerate(planned, start=1):
        lines.append(f"[{number}/{len(planned)}] {job.job.run_id}  profile {job.profile}")
        lines.extend(study_notes(job))
        if job.key in (twins or {}):
            lines.append(f"    reused: the same job's rows in {twins[job.key].where}, not trained again")
            continue
        if job.key in done:
            lines.append("    done: its rows are in results.jsonl, skipped (--resume)")
            continue
        if job.key in (states or {}):
            lines.append(f"    resumes from {progress_text(job, states[job.key])}")
        if estimates is not None and job.key in estimates:
            left = " left" if job.key in (states or {}) else ""
            lines.append(f"    estimated training{left}: {estimates[job.key].describe()}")
    if estimates:
        lines.extend(total_lines(estimates, n_jobs))
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    studies = parser.add_subparsers(dest="study", required=True)

    def common(sub):
        sub.add_argument("--datasets", nargs="+", default=["ml-1m"], metavar="NAME")
        sub.add_argument("--seeds", nargs="+", type=int, default=[0], metavar="N")
        sub.add_argument("--profile", default="converge", choices=PROFILES,
                         help="converge (default): the paper's models on the replications' schedule, early "
                              "stopping, hours per BERT4Rec job on a CPU; paper: the authors' schedule, GPU days "
                              "per BERT4Rec job; smoke: an installation check")
        sub.add_argument("--protocols", nargs="+", default=["full", "pop100"], choices=PROTOCOLS)
        sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="[MODEL:]FIELD=VALUE",
                         help="applied to every job before the study's own overrides (repeatable); a field the "
                              "study ties to its swept value is left as set here")
        sub.add_argument("--reuse", action="append", default=[], metavar="FOLDER",
                         help="a results folder of run_all.py or of this study: a study job that is the same "
                              "computation as a job there (same model, data, settings, seed and profile; the "
                              "ablation's default row, say, or a variant trained on another machine) takes that "
                              "job's rows, labelled reused_from, instead of training again (repeatable)")
        sub.add_argument("--no-estimate", dest="estimate", action="store_false",
                         help="skip timing a few training steps per job for the plan's time estimates")
        add_run_options(sub)  # --output defaults to results/study-<study>-<datasets>-<profile>
        return sub

    ablation = common(studies.add_parser("ablation", help="paper Table 5: remove one component at a time"))
    ablation.add_argument("--models", nargs="+", default=["bert4rec"], metavar="NAME")
    ablation.add_argument("--variants", nargs="+", default=None, metavar="LABEL",
                          help=f"rows to run (default: all of {list(ABLATIONS)})")
    sensitivity = common(studies.add_parser("sensitivity", help="paper Fig. 3, Fig. 4, Table 4: one field over "
                                                                "a list of values"))
    sensitivity.add_argument("--models", nargs="+", default=None, metavar="NAME",
                             help=f"default: the paper's for the sweep ({SWEEP_MODELS}; else bert4rec)")
    sensitivity.add_argument("--param", required=True,
                             help=f"a model or trainer field (aliases {PARAM_ALIASES}); the paper's values exist "
                                  f"for d, rho and N (Table 4's per dataset)")
    sensitivity.add_argument("--values", nargs="+", default=None, metavar="V", help="read as TOML values")
    cloze = common(studies.add_parser("cloze", help="paper Table 3 (d = 256): SASRec vs BERT4Rec with one item "
                                                    "masked (both readings) vs BERT4Rec"))
    cloze.add_argument("--models", nargs="+", default=list(CLOZE_MODELS), metavar="NAME")
    cloze.add_argument("--hidden", type=int, default=CLOZE_HIDDEN, metavar="D",
                       help=f"d of every model (default {CLOZE_HIDDEN}, the paper's); heads follow for BERT4Rec")
    losses = common(studies.add_parser("losses", help="the loss and the direction: SASRec's network with BCE, gBCE, "
                                                      "sampled and full softmax, beside BERT4Rec's Cloze"))
    losses.add_argument("--variants", nargs="+", default=None, metavar="LABEL",
                        help=f"rows to run (default: all of {list(LOSS_VARIANTS)})")
    return parser.parse_args(argv)


def build_jobs(args: argparse.Namespace) -> list[Job]:
    overrides = tuple(args.overrides)
    if args.study == "ablation":
        return ablation_jobs(args.datasets, args.models, args.seeds, args.variants, overrides)
    if args.study == "losses":
        return loss_jobs(args.datasets, args.seeds, args.variants, overrides)
    if args.study == "sensitivity":
        return sensitivity_jobs(args.datasets, args.models, args.param, args.values, args.seeds, overrides,
                                args.profile)
    return cloze_jobs(args.datasets, args.seeds, args.models, overrides, args.profile, args.hidden)


def main(argv=None) -> int:
    args = parse_args(argv)

    def run() -> int:
        jobs = build_jobs(args)
        output = Path(args.output or Path("results") / (f"study-{args.study}-{'-'.join(args.datasets)}-{args.profile}"
                                                        f"{output_suffix(args.split)}"))
        print(f"{args.study}: {len(jobs)} job(s), profile {args.profile}, split {args.split} -> {output}/")
        options = run_options(args, protocols=args.protocols, profile=args.profile, output=output)
        reuse = [Path(folder) for folder in args.reuse]
        problems = [f"--reuse {folder}: no results.jsonl there (expected a results folder of run_all.py or of a "
                    f"study)" for folder in reuse if not (folder / "results.jsonl").is_file()]
        problems += [f"--reuse {folder}: this is the study's own --output, whose finished jobs --resume skips; name "
                     f"another folder" for folder in reuse if folder.resolve() == output.resolve()]
        if problems:
            raise GridError("\n".join(problems))
        planned, datasets = plan_grid(jobs, options)
        twins = reusable_twins(planned, reuse)
        trained = [job for job in planned if job.key not in twins]
        store = ResultStore(output)

        def table(rows: list[dict]) -> str:
            text = study_table(rows, base=LOSS_REFERENCE, by_model=False) if args.study == "losses" else \
                study_table(rows)
            print("\n" + text)
            return text

        # Read once, and only for a plan that shows them: a checkpoint holds the weights too (hundreds of MB).
        states = interrupted(trained, store) if args.resume or args.dry_run else {}
        resumed = states if args.resume else {}
        estimates = training_left(planned, datasets, store, args, resumed, twins) if args.estimate else None
        if args.dry_run:  # run_all's plan (keys, every resolved setting), with the study's lines under each job
            print_plan(planned, store, args.resume, states, twins, estimates, args.jobs,
                       {job.key: study_notes(job) for job in planned})
            return 0
        done = store.finished(trained) if args.resume else frozenset()
        print(*plan_lines(planned, estimates, args.jobs, twins, done, resumed), sep="\n")
        return run_grid(args, jobs, options, table=table, plan=(planned, datasets), twins=twins, estimates=estimates)

    return guard(run, args.debug)


if __name__ == "__main__":
    sys.exit(main())
