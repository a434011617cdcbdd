"""Each planned job's training time on this machine, estimated before anything trains: a few training steps of
every distinct (dataset, model, settings, precision) are timed on the real data, on the device, with the threads
and under the precision (bf16 autocast, as the trainer applies it) the job will get, and multiplied by the steps
the job will run.

A job without early stopping runs exactly its steps (``max_steps``, else ``max_epochs`` × its batches per epoch);
one that validation may stop earlier runs at most that many, so its figure is an upper bound; a time budget caps
either. Where a converged reference run of the same model on the same dataset and profile exists
(``results/reference/converge-<dataset>.json``, :func:`reference_stops`), an early-stopped job also gets an
expected figure: its steps up to the epoch at which early stopping ended that run (the latest over its seeds). A
plan's own jobs that have finished (rows written, or reused from another folder), and the other finished jobs of
its output folder, count before those files (:func:`finished_stops`): they share the settings the reference run may
not (a study's dropout, say). A job that a reference file holds already, same key, is expected to stop where that
row did (:func:`reference_job_stops`): a rerun of the reproduction's own commands.
Validation, the test pass and the one-off preparation of training examples are not included: mostly small, but a
model that scores each (user, item) pair through a network ranks slowly (NCF's full-ranking test pass on Beauty,
40,226 users against 54,542 items, takes over an hour on one thread).

    estimates = estimate_jobs(planned, datasets, device="auto", threads=1)
    print(estimates[job.key].describe())   # "≈ 11.6 days: 400,000 steps × 2.51 s (runs every step)"
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from recbench.benchmarks.checkpoint import TrainState
from recbench.benchmarks.device import fused_adam, resolve_device
from recbench.benchmarks.precision import trains_in_bf16
from recbench.benchmarks.provenance import PeakMemory
from recbench.models import model_class
from recbench.models.base import NeuralRecommender

MIN_TIMED_SECONDS = 1.0  # time steps until this much has passed...
MAX_TIMED_STEPS = 20  # ...or this many steps, after one untimed warm-up step
MIN_TIMED_STEPS = 2
REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"  # in a checkout of the suite


@dataclass(frozen=True)
class Estimate:
    """A job's estimated training time: ``seconds`` (None: the model does not train), the ``steps`` counted and the
    measured seconds per step; ``exact`` when the job runs every one of those steps, else an upper bound."""

    seconds: float | None
    steps: int = 0
    per_step: float = 0.0
    exact: bool = True
    budget: float | None = None  # the job's time budget, when it caps the estimate
    expected: float | None = None  # seconds up to where a converged reference run stopped (early-stopped jobs)
    expected_from: str = ""  # that run, in words
    memory_mb: float | None = None  # peak memory while its steps were timed: RAM (this process's) or GPU memory
    memory_kind: str = "RAM"  # "RAM" on the CPU, "GPU memory" on CUDA
    memory_limit_mb: float | None = None  # what the machine has of that kind

    @property
    def likely(self) -> float | None:
        """The expected seconds where known, else the figure itself (exact, capped or an upper bound)."""
        return self.seconds if self.expected is None else self.expected

    @property
    def bound_only(self) -> bool:
        """Whether all that is known is an upper bound: early stopping may end the job anywhere before its cap, and
        no converged run says where (neither exact, nor capped by a budget, nor expected)."""
        return not (self.seconds is None or self.exact or self.budget is not None or self.expected is not None)

    def after(self, state: TrainState) -> Estimate:
        """What is left of this estimate for a job an interrupted run left at ``state`` (its checkpoint's): the
        steps not trained yet (none once its training has ended), the budget not spent yet."""
        if self.seconds is None:
            return self
        if state.stopped_by is not None:
            return replace(self, seconds=0.0, steps=0, exact=True, budget=None, expected=None, expected_from="")
        steps = max(0, self.steps - state.step)
        if self.budget is not None:
            return replace(self, seconds=max(0.0, self.budget - state.train_seconds), steps=steps,
                           budget=max(0.0, self.budget - state.train_seconds))
        expected = None if self.expected is None else max(0.0, self.expected - state.step * self.per_step)
        return replace(self, seconds=steps * self.per_step, steps=steps, expected=expected)

    def describe(self) -> str:
        memory = f"; peak {self.memory_kind} ≈ {size(self.memory_mb)}" if self.memory_mb is not None else ""
        return self._time() + memory

    def _time(self) -> str:
        if self.seconds is None:
            return "no training"
        steps = f"{self.steps:,} steps × {self.per_step:.3g} s"
        if self.budget is not None:
            return f"{duration(self.seconds)}: capped by its time budget (else {steps})"
        if self.exact:
            return f"≈ {duration(self.seconds)}: {steps} (runs every step)"
        bound = f"≤ {duration(self.seconds)}: at most {steps}; early stopping may end it sooner"
        if self.expected is None:
            return bound
        return f"≈ {duration(self.expected)} if it stops where {self.expected_from}; {bound}"


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``7.2 h`` or ``11.6 days``."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size if unit == "days" else seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def size(mb: float) -> str:
    """``850 MiB`` or ``2.4 GiB``."""
    return f"{mb:.0f} MiB" if mb < 1024 else f"{mb / 1024:.1f} GiB"


def machine_memory_mb(device: torch.device) -> float | None:
    """The memory of ``device``: the GPU's, or this machine's RAM (None where the system does not say)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**20
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None


def memory_lines(estimates: dict, n_jobs: int = 1) -> list[str]:
    """The peak memory the timed steps took, the largest job's and ``n_jobs`` such jobs' at once, against what
    the machine has; a warning where that is more."""
    measured = [estimate for estimate in estimates.values() if estimate.memory_mb is not None]
    if not measured:
        return []
    largest = max(measured, key=lambda estimate: estimate.memory_mb)
    kind, limit = largest.memory_kind, largest.memory_limit_mb
    need = sum(sorted((estimate.memory_mb for estimate in measured), reverse=True)[:max(1, n_jobs)])
    at_once_text = f", ≈ {size(need)} for {n_jobs} jobs at once" if n_jobs > 1 else ""
    of = f", of the {size(limit)} this machine has" if limit else ""
    lines = [f"estimated peak {kind} while training: ≈ {size(largest.memory_mb)} for the largest job{at_once_text}"
             f"{of} (measured over its timed steps, this process's data included; validation and test passes "
             f"not included)"]
    if limit and need > limit:
        lines.append(f"warning: that is more {kind} than this machine has: run fewer jobs at once (--jobs) or "
                     f"smaller settings (batch_size, max_len), or expect swapping or an out-of-memory failure")
    return lines


def at_once(seconds: list[float], n_jobs: int) -> float:
    """Wall time of jobs of ``seconds`` each, ``n_jobs`` at a time: their sum shared out, but never less than the
    longest of them (each timed alone on its share of the cores, so concurrent jobs' contention is not in it)."""
    return max(sum(seconds) / n_jobs, max(seconds, default=0.0))


def total_lines(estimates: dict, n_jobs: int = 1) -> list[str]:
    """A plan's closing lines: the training of all ``estimates`` one job after another, and with ``n_jobs`` above
    1 also with that many jobs at once; the expected figure beside the cap where a finished run gave some job one
    (:func:`finished_stops`, :func:`reference_stops`)."""
    capped = [estimate.seconds or 0.0 for estimate in estimates.values()]
    if not any(estimate.expected is not None for estimate in estimates.values()):
        lines = [f"estimated training in all: {duration(sum(capped))} one job after another (validation and test "
                 f"passes not included; an early-stopped job's figure is an upper bound)"]
        if n_jobs > 1:
            lines.append(f"with {n_jobs} jobs at once: {duration(at_once(capped, n_jobs))}, each job timed alone on "
                         f"its share of the cores")
        return lines
    likely = [estimate.likely or 0.0 for estimate in estimates.values()]
    lines = [f"estimated training in all: ≈ {duration(sum(likely))} one job after another if each early-stopped job "
             f"stops where its reference did (the others at their figure); ≤ {duration(sum(capped))} "
             f"if every job runs to its cap (validation and test passes not included)"]
    if n_jobs > 1:
        lines.append(f"with {n_jobs} jobs at once: ≈ {duration(at_once(likely, n_jobs))} (≤ "
                     f"{duration(at_once(capped, n_jobs))}), each job timed alone on its share of the cores")
    return lines


def planned_steps(train, n_examples: int) -> tuple[int, bool]:
    """The optimiser steps a job with trainer settings ``train`` takes on ``n_examples`` training examples, and
    whether it takes all of them (no early stopping possible before the last validation)."""
    per_epoch = math.ceil(n_examples / train.batch_size)
    steps = train.max_epochs * per_epoch if train.max_steps is None else min(train.max_steps,
                                                                             train.max_epochs * per_epoch)
    validations = math.ceil(steps / per_epoch) // train.valid_every
    return steps, train.patience is None or train.patience >= validations


def reference_path(folder: Path, dataset: str) -> Path:
    """The converge reference file of ``dataset`` in ``folder``. The one place that names these files: the
    reproduction writes them (``benchmarks/experiments/converge_reference.py``) and the plans read every one."""
    return Path(folder) / f"converge-{dataset}.json"


def reference_paths(folder: Path = REFERENCE) -> dict[str, Path]:
    """{dataset: path} of every converge reference file in ``folder`` (see :func:`reference_path`)."""
    return {path.stem.removeprefix("converge-"): path
            for path in sorted(Path(folder).glob(reference_path("", "*").name))}


def reference_stops(folder: Path = REFERENCE) -> dict[tuple[str, str, str, int], tuple[int, str]]:
    """{(dataset, model, profile, patience): (epochs, source)} of the converged reference runs in ``folder``
    (``converge-<dataset>.json``, written by ``benchmarks/experiments/converge_reference.py``): the latest epoch at
    which early stopping ended one of a model's seeds with that patience (a longer patience stops later). Models
    some seed of which did not stop early are left out."""
    stops = {}
    for path in reference_paths(folder).values():
        reference = json.loads(path.read_text())
        if not isinstance(reference, dict) or not {"dataset", "profile", "summary"} <= reference.keys():
            raise ValueError(f"{path}: not a converge reference (it lacks dataset, profile or summary), and the plans "
                             f"read every converge-*.json there as one: rename it, or write it with python -m "
                             f"benchmarks.experiments.converge_reference")
        for summary in reference["summary"]:
            if not summary["converged"]:
                continue
            for patience in set(summary["patience"].values()):
                epochs = max(epochs for seed, epochs in summary["epochs_run"].items()
                             if summary["patience"][seed] == patience)
                stops[(reference["dataset"], summary["model"], reference["profile"], patience)] = (
                    epochs, f"the converged {summary['model']} run on {reference['dataset']} with patience "
                            f"{patience} did (epoch {epochs}, results/reference/{path.name})")
    return stops


def reference_job_stops(folder: Path = REFERENCE) -> dict[str, tuple[int, str]]:
    """{job key: (epochs, source)} of the reference rows in ``folder`` (every ``*.json`` holding ``rows``) that
    early stopping ended. A planned job of the same key is the same computation, so it is expected to stop where
    that row did; closer than its model's reference run, which another setting may part from it (Table 5's variants
    at dropout 0.1 stopped between epochs 45 and 191, the profile's BERT4Rec reference run at 146)."""
    stops = {}
    for path in sorted(Path(folder).glob("*.json")):
        content = json.loads(path.read_text())
        rows = content.get("rows") if isinstance(content, dict) else None
        for row in rows if isinstance(rows, list) else []:
            if not isinstance(row, dict) or row.get("stopped_by") != "early stopping" or not row.get("key"):
                continue
            if row["key"] not in stops or row["epochs_run"] > stops[row["key"]][0]:
                stops[row["key"]] = (row["epochs_run"], f"the same job did (epoch {row['epochs_run']}, "
                                                        f"results/reference/{path.name})")
    return stops


def finished_stops(runs) -> dict[tuple[str, str, str, int], tuple[int, str]]:
    """{(dataset, model, profile, patience): (epochs, source)}, as :func:`reference_stops` gives them, from a plan's
    finished jobs: ``runs`` holds (run id, one of its result rows, where) for each (a job's rows share its training,
    one per protocol), ``where`` saying where a row comes from when not from the plan's own jobs ("reused from
    FOLDER", or a row of the output folder outside the plan); the latest epoch at which early stopping ended one of
    them counts. A study's jobs share every setting but the one each varies, where the reference run may differ from
    all of them: Table 5's ablation at dropout 0.1 reuses a default row that stopped at epoch 185, while the
    profile's reference run at dropout 0.2 stopped at 146."""
    stops = {}
    for run_id, row, where in runs:
        patience = (row.get("train_settings") or {}).get("patience")
        if row.get("stopped_by") != "early stopping" or patience is None:  # a cap, or a row too old to say
            continue
        signature = (row["dataset"], row["model"], row.get("profile"), patience)
        if signature not in stops or row["epochs_run"] > stops[signature][0]:
            source = f", {where}" if where else ""
            stops[signature] = (row["epochs_run"], f"the finished {run_id} did (epoch {row['epochs_run']}{source})")
    return stops


def seconds_per_step(model: NeuralRecommender, examples: dict, batch_size: int, bf16: bool = False,
                     fused: bool | None = None) -> float:
    """Mean seconds of one training step (loss, backward, an Adam step) on batches of ``examples``, the loss
    under bf16 autocast where ``bf16`` (as the trainer's ``precision=bf16`` runs it), after one untimed warm-up
    step; consecutive rows for models that train on ordered rows (GRU4Rec). Adam is fused where the trainer fuses
    it (:func:`fused_adam`) unless ``fused`` says otherwise."""
    n = len(next(iter(examples.values())))
    fused = fused_adam(model.device) if fused is None else fused
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-9, fused=fused)  # the update's cost, not its effect
    generator = torch.Generator(device=model.device).manual_seed(0)
    model.train()
    timed, started = 0, None
    while timed < MIN_TIMED_STEPS or (timed < MAX_TIMED_STEPS and time.perf_counter() - started < MIN_TIMED_SECONDS):
        start = int(torch.randint(max(1, n - batch_size + 1), (), generator=generator, device=model.device))
        rows = (torch.arange(start, min(n, start + batch_size), device=model.device) if model.ordered_examples
                else torch.randint(n, (min(n, batch_size),), generator=generator, device=model.device))
        with torch.autocast(device_type=model.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model.loss({key: value[rows] for key, value in examples.items()}, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        if started is None:  # the warm-up step ends here
            started = time.perf_counter()
        else:
            timed += 1
    return (time.perf_counter() - started) / timed


def _training_examples(job, data, device: torch.device) -> tuple[NeuralRecommender, dict]:
    """A planned job's model, built on ``device``, and its training examples on ``data`` there."""
    model = model_class(job.job.model)(data.n_users, data.n_items, job.config.model).to(device)
    examples = model.training_examples(job.data_split(data).train())
    return model, {key: value.to(device) for key, value in examples.items()}


def training_example_count(job, data) -> int:
    """How many training examples a planned job's model has on ``data`` (an epoch's length, with its batch size),
    counted on the CPU; the global random state is left as it was (building a model draws from it)."""
    with torch.random.fork_rng(devices=[]):
        _, examples = _training_examples(job, data, torch.device("cpu"))
    return len(next(iter(examples.values())))


def _measure(job, data, device: torch.device) -> tuple[float, int, float]:
    """(seconds per step, training examples, peak memory in MiB) of one planned job's model on its data, in its
    precision: the memory is the process's peak RSS on the CPU (reset before, where Linux allows), the CUDA
    allocator's peak on a GPU (:class:`benchmarks.provenance.PeakMemory`, as rows record it)."""
    memory = PeakMemory(device)
    memory.reset()
    model, examples = _training_examples(job, data, device)
    per_step = seconds_per_step(model, examples, job.config.train.batch_size,
                                bf16=trains_in_bf16(job.config.train, device))
    return per_step, len(next(iter(examples.values()))), memory.peak_mb()


def estimate_jobs(planned: list, datasets: dict, device: str = "auto", threads: int | None = None,
                  n_jobs: int = 1, log=print, stops: dict | None = None) -> dict:
    """{job key: :class:`Estimate`} for ``planned`` jobs (:func:`benchmarks.planner.plan_grid`) on ``datasets``,
    timed on ``device`` with the CPU threads each job will get (``threads``, else the cores divided by ``n_jobs``).
    Jobs that differ only in seed or in trainer settings other than the precision they train in share one
    measurement. ``stops`` gives an early-stopped job its expected figure: by its key where a row of the same job
    stopped early (:func:`reference_job_stops`), else by its (dataset, model, profile, patience)
    (:func:`reference_stops`, :func:`finished_stops`), every variant and size of a model then assumed to stop
    where that run did."""
    device = resolve_device(device)
    previous_threads = torch.get_num_threads()
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // max(1, n_jobs)))
    torch.use_deterministic_algorithms(device.type == "cpu", warn_only=True)  # as the worker trains
    measured, estimates, limit, stops = {}, {}, machine_memory_mb(device), stops or {}
    try:
        for job in planned:
            if not issubclass(model_class(job.job.model), NeuralRecommender):
                estimates[job.key] = Estimate(None)
                continue
            signature = (job.job.dataset, job.job.model, repr(job.config.model), job.config.train.batch_size,
                         trains_in_bf16(job.config.train, device))
            if signature not in measured:
                log(f"  timing {job.job.model} on {job.job.dataset} ({len(measured) + 1})")
                torch.manual_seed(0)
                measured[signature] = _measure(job, datasets[job.job.dataset], device)
            per_step, n_examples, peak_mb = measured[signature]
            steps, exact = planned_steps(job.config.train, n_examples)
            seconds, budget = steps * per_step, job.config.train.time_budget_s
            capped = budget is not None and budget < seconds
            stop = stops.get(job.key) or stops.get((job.job.dataset, job.job.model, job.profile,
                                                    job.config.train.patience))
            expected = (min(steps, stop[0] * math.ceil(n_examples / job.config.train.batch_size)) * per_step
                        if stop and not exact and not capped else None)
            estimates[job.key] = Estimate(budget if capped else seconds, steps, per_step, exact,
                                          budget if capped else None, expected, stop[1] if expected else "",
                                          peak_mb, "GPU memory" if device.type == "cuda" else "RAM", limit)
    finally:
        torch.set_num_threads(previous_threads)
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
    return estimates
