"""The one training loop shared by every neural model (``ARCHITECTURE.md``; ``PROTOCOL.md``, "Model selection").

:class:`TrainSettings` is what a run computes (optimiser, schedule, stopping rules, validation, precision): every
field enters the job's key. :class:`TrainRun` is how it runs (seed, checkpoint path, progress bar,
``torch.compile``, a callback at each validation): none of it changes what a run computes, except that the
callback may stop the run (tuning prunes through it); a compiled step rounds differently and draws other dropout
masks, another sample of the same computation, as another device's run is.

:meth:`Trainer.fit` is a few named steps over a small :class:`TrainState`: restore a checkpoint, train one
epoch, validate and decide, save a checkpoint; at the end the best-on-validation weights are put back (the
protocol's rule: the checkpoint that validation selects is the one tested). Adam, AdamW or BERT's
AdamWeightDecay (``benchmarks.optim``), linear warm-up then linear or BERT's decay, gradient clipping, bf16
autocast when asked for on a device with native bf16 (:func:`native_bf16`), early stopping on a validation
metric with a patience (or none), an epoch cap, a step cap, a wall-clock budget and a CPU-seconds budget.

On a GPU the loop itself never makes the host wait for the device between steps: the running loss stays on the
device and is checked for NaN/inf every ``FINITE_CHECK_STEPS`` batches and at the epoch's end (the model's own
loss may still wait, e.g. for data-dependent shapes).
"""
from __future__ import annotations

import copy
import dataclasses
import io
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from recbench.benchmarks.clock import RunClock
from recbench.benchmarks.evaluator import PROTOCOLS
from recbench.benchmarks.metrics import check_metric_name
from recbench.benchmarks.optim import AdamWeightDecay, GRU4RecAdagrad, bert_schedule
from recbench.benchmarks.provenance import BF16_CPU_FLAGS, bf16_units
from recbench.benchmarks.relevance import SELECTION_METRICS
from recbench.benchmarks.store import write_atomic
from recbench.datasets.errors import unknown
from recbench.datasets.progress import bars_redraw_in_place
from recbench.datasets.sequences import Histories
from recbench.models.base import (
    FitReport,
    InterfaceError,
    NeuralRecommender,
    Recommender,
    Validator,
    require as require_setting,
    require_choice,
    wrong_return,
)

FINITE_CHECK_STEPS = 50  # batches between two checks that the loss is finite (each check waits for the device)
CHECKPOINT_VERSION = 2  # the layout of a training checkpoint (TrainState's fields)

OPTIMIZERS = ("adam", "adamw", "adam-weight-decay", "adagrad", "sgd")
DECAYS = ("none", "linear", "polynomial")
PRECISIONS = ("fp32", "bf16")


@dataclass
class TrainSettings:
    """What a training run computes; every field is part of a job's key."""

    optimizer: str = "adam"  # "adam" (L2 folded into the gradient), "adamw" (decoupled weight decay),
    # "adam-weight-decay" (BERT's AdamWeightDecayOptimizer: decoupled weight decay, no bias correction), "adagrad"
    # (GRU4Rec's form, see benchmarks.optim.GRU4RecAdagrad) or "sgd" (plain, as NCF fine-tunes a pre-trained NeuMF)
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8  # Adam's ε (BERT's optimizer: 1e-6)
    batch_size: int = 256
    max_epochs: int = 200
    max_steps: int | None = None  # stop after this many optimiser steps, and the decay's horizon (else max_epochs)
    patience: int | None = 10  # validations without improvement before stopping; none: never stop early
    time_budget_s: float | None = None  # wall-clock cap on training (validation included, stopped time not)
    cpu_budget_s: float | None = None  # cap on the CPU-seconds of the training process (all its threads, validation
    # included): a budget that a loaded, shared machine does not shrink, as wall-clock time does (tuning's budget)
    warmup_steps: int = 0
    decay: str = "none"  # after warm-up: "none" constant; "linear" to 0 over the steps after warm-up;
    # "polynomial": BERT's create_optimizer, lr·(1 − s/T) over all T steps, warm-up lr·s/W (benchmarks.optim)
    clip_norm: float | None = 5.0
    valid_every: int = 1  # epochs between validations
    valid_metric: str = "NDCG@10"
    valid_protocol: str = "full"
    valid_users: int | None = None  # validate on a fixed random subset of this many users (0 or None: all)
    precision: str = "fp32"  # "fp32", as the authors' code trains; "bf16": bf16 autocast where the device computes
    # bf16 natively (native_bf16), fp32 elsewhere; losses and metrics stay fp32. A row records what was used.

    def __post_init__(self):
        def require(condition: bool, field: str, rule: str) -> None:
            require_setting(self, condition, field, rule)

        self.betas = tuple(self.betas)
        for field_name, choices in (("optimizer", OPTIMIZERS), ("decay", DECAYS), ("precision", PRECISIONS),
                                    ("valid_protocol", PROTOCOLS)):
            require_choice(self, field_name, choices)
        require(self.lr > 0, "lr", "be > 0")
        require(self.eps > 0, "eps", "be > 0")
        require(self.max_steps is None or self.max_steps >= 1, "max_steps", "be >= 1, or none (max_epochs decides)")
        require(self.weight_decay >= 0, "weight_decay", "be >= 0")
        require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", "be two numbers in [0, 1)")
        for name in ("batch_size", "max_epochs", "valid_every"):
            require(getattr(self, name) >= 1, name, "be >= 1")
        require(self.patience is None or self.patience >= 1, "patience", "be >= 1, or none (no early stopping)")
        require(self.warmup_steps >= 0, "warmup_steps", "be >= 0")
        require(self.max_steps is None or self.warmup_steps <= self.max_steps, "warmup_steps",
                f"be at most max_steps={self.max_steps} (else the learning rate never reaches lr)")
        require(self.time_budget_s is None or self.time_budget_s > 0, "time_budget_s", "be > 0 seconds, or none")
        require(self.cpu_budget_s is None or self.cpu_budget_s > 0, "cpu_budget_s", "be > 0 CPU-seconds, or none")
        require(self.clip_norm is None or self.clip_norm >= 0, "clip_norm", "be >= 0 (0 or none: no clipping)")
        require(self.valid_users is None or self.valid_users >= 0, "valid_users", "be >= 0 (0 or none: all users)")
        require(self.valid_metric in SELECTION_METRICS or check_metric_name(self.valid_metric), "valid_metric",
                f"be HR@k, NDCG@k, MRR or one of {', '.join(SELECTION_METRICS)}")


@dataclass
class Validation:
    """What :attr:`TrainRun.on_validation` is shown after each validation."""

    epoch: int
    step: int  # optimiser steps taken so far
    metrics: dict  # every validation metric of this pass
    value: float  # the selection metric's value
    best: float  # the best value so far, this one included
    improved: bool


@dataclass
class TrainRun:
    """How one training run executes, apart from what it computes: nothing here enters a job's key."""

    seed: int = 0  # shuffling, negatives and masks drawn during training (the job's seed)
    checkpoint: str | Path | None = None  # where the resumable state is written after every epoch
    progress: bool = True  # a bar where it redraws in place (a terminal, a notebook), else a line an epoch
    bars: bool = True  # False: a line an epoch even on a terminal (parallel workers' bars would overwrite each other)
    label: str | None = None  # what each epoch line starts with (default: the model's name; parallel jobs: run ids)
    compile: bool = False  # torch.compile the model's loss (its first steps compile; slower on the CPU)
    # Called after every validation; returning a reason (e.g. "pruned") ends the run with it as its stop reason.
    on_validation: Callable[[Validation], str | None] | None = None


@dataclass
class TrainState:
    """Where a run stands; written with every checkpoint, so an interrupted run resumes from it."""

    epoch: int = 0
    step: int = 0
    samples: int = 0  # training examples processed
    batch_seconds: float = 0.0  # time in the batch loop (validation excluded)
    train_seconds: float = 0.0  # time since the start, validation included, pauses not (benchmarks.clock)
    paused_seconds: float = 0.0  # time the process stood stopped while training (kill -STOP, a paused virtual machine)
    cpu_seconds: float = 0.0  # CPU time of the process since the start (all threads), validation included
    best_metric: float = -math.inf
    best_epoch: int = 0
    best_step: int = 0
    bad_validations: int = 0
    history: list = field(default_factory=list)  # one record per epoch: loss, seconds, validation metrics
    stopped_by: str | None = None  # why training ended: "max epochs", "max steps", "time budget", ...
    best_weights: dict | None = None


@dataclass
class _Session:
    """What one call of :meth:`Trainer.fit` works with besides its state."""

    model: NeuralRecommender
    examples: dict
    n_examples: int
    batches_per_epoch: int
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    generator: torch.Generator
    loss_of: Callable
    use_amp: bool
    bf16_checked: bool = False  # whether a step has shown that autocast runs some operation of the model in bf16
    clock: RunClock | None = None  # wall-clock time without the pauses
    started: float = 0.0  # clock.now() at the run's start, earlier sessions' time included
    cpu_started: float = 0.0  # process_time() at the run's start, earlier sessions' CPU time included


class _Bf16Watch(torch.overrides.TorchFunctionMode):
    """While active, notes whether any torch function returned a bf16 tensor: under bf16 autocast, whether
    autocast ran some operation in bf16."""

    seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.seen:
            self.seen = any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
                            for t in (out if isinstance(out, (tuple, list)) else (out,)))
        return out


def improves(value: float, best: float) -> bool:
    """Early stopping's test of a validation: a new best only when strictly greater, so a tie keeps the earlier,
    shorter run."""
    return value > best


def patience_spent(bad_validations: int, patience: int | None) -> bool:
    """Early stopping's end: ``patience`` validations in a row without a new best (``None``: never)."""
    return patience is not None and bad_validations >= patience


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for ``cuda`` on a machine without it is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} was requested but torch sees no CUDA device "
                           f"(torch {torch.__version__}); use --device cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise unknown("device", name, ["auto", "cpu", "cuda", "cuda:N"])
    return torch.device(name)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 matrix products natively: a CUDA GPU that supports bf16, or a CPU with
    one of :data:`BF16_CPU_FLAGS` (the units a CPU row's device names)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(bf16_units())


def fused_adam(device: torch.device) -> bool:
    """Whether Adam runs fused on ``device``: one pass over each tensor that reads the gradient and moments once,
    instead of about ten elementwise passes, the same update up to rounding. On the CPU it matters where the
    embedding tables are large and a step touches all of them (NCF, BPR-MF, FPMC; ``experiments/adam_speed.py``)."""
    return device.type in ("cuda", "cpu")


def trains_in_bf16(settings: TrainSettings, device: torch.device) -> bool:
    """Whether training with ``settings`` on ``device`` runs under bf16 autocast: asked for, and native there."""
    return settings.precision == "bf16" and native_bf16(device)


def fit_model(model: Recommender, train: Histories, validate: Validator | None, settings: TrainSettings,
              run: TrainRun | None = None) -> FitReport:
    """The harness's one way to fit any model: a neural model by the shared :class:`Trainer`, any other (POP)
    by its own ``fit``."""
    if isinstance(model, NeuralRecommender):
        return Trainer(settings, run).fit(model, train, validate)
    report = model.fit(train)
    if not isinstance(report, FitReport):
        raise wrong_return(model, "fit(train)", report, "a FitReport (recbench.models.base.FitReport(train_seconds="
                                                        "...), as models/pop.py does)")
    return report


def global_generators(device: torch.device) -> dict:
    """The states of PyTorch's global generators, which dropout draws from (the CPU one, and the device's on
    CUDA): kept in every checkpoint, so that a resumed run draws the masks an uninterrupted run would have drawn.
    Without them a run resumed at epoch 24 left the uninterrupted run's path at epoch 25 (ML-1m BERT4Rec)."""
    states = {"cpu": torch.random.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def restore_global_generators(states: dict, device: torch.device) -> None:
    """Put back what :func:`global_generators` kept. Both setters take a CPU byte tensor, and a checkpoint is loaded
    onto the model's device, so the states come back to the CPU first (as :meth:`Trainer._restore_generator`'s)."""
    torch.random.set_rng_state(states["cpu"].cpu())
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"].cpu(), device)


def saved_progress(path: str | Path) -> TrainState | None:
    """Where the training checkpoint at ``path`` stands (its :class:`TrainState` without the weights), or None
    where there is none or it is of an older layout: what a plan shows of an interrupted run before resuming it."""
    if not Path(path).exists():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved.get("version") != CHECKPOINT_VERSION:
        return None
    return TrainState(**{**saved["state"], "best_weights": None})


def training_examples(model: NeuralRecommender, train: Histories) -> dict[str, torch.Tensor]:
    """``model.training_examples(train)``, refused in one line unless it is what the trainer slices batches
    from: a dict of tensors with the same number of rows."""
    examples = model.training_examples(train)
    expected = "a dict of tensors with one row per training example, the same number of rows in each"
    if not (isinstance(examples, dict) and examples
            and all(isinstance(value, torch.Tensor) and value.dim() > 0 for value in examples.values())):
        raise wrong_return(model, "training_examples(train)", examples, expected)
    if len({len(value) for value in examples.values()}) > 1:
        shapes = ", ".join(f"{key!r}: {tuple(value.shape)}" for key, value in examples.items())
        raise InterfaceError(f"{model.name}.training_examples(train) returned tensors of {shapes}; return {expected}")
    return examples


class Trainer:
    def __init__(self, settings: TrainSettings, run: TrainRun | None = None):
        self.settings = settings
        self.run = run or TrainRun()

    def fit(self, model: NeuralRecommender, train: Histories, validate: Validator | None) -> FitReport:
        """Train ``model`` until a stopping rule ends the run, keep its best-on-validation weights (the last ones
        without a validator) and report what happened."""
        session = self._start(model, train)
        state, resumed_from = self._restore(session)
        paused_before = state.paused_seconds
        with RunClock() as session.clock, self._progress_bar(session, state, validate) as bar:
            session.started = session.clock.now() - state.train_seconds
            session.cpu_started = time.process_time() - state.cpu_seconds
            while state.stopped_by is None:
                cut_short = self._train_epoch(session, state, bar)
                self._validate_and_decide(session, state, validate, cut_short)
                state.train_seconds = session.clock.now() - session.started
                state.paused_seconds = paused_before + session.clock.paused
                state.cpu_seconds = time.process_time() - session.cpu_started
                self._show(bar, session, state, validate)
                self._save(session, state)
        if state.best_weights is not None:
            model.load_state_dict(state.best_weights)
        return self._report(session, state, validate, resumed_from)

    # ------------------------------------------------------------------------------------------ the steps

    def _start(self, model: NeuralRecommender, train: Histories) -> _Session:
        s, device = self.settings, model.device
        examples = {key: value.to(device) for key, value in training_examples(model, train).items()}
        n_examples = len(next(iter(examples.values())))
        if n_examples == 0:
            raise ValueError(f"{model.name}: the training view produced no training examples")
        batches_per_epoch = math.ceil(n_examples / s.batch_size)
        optimizer = self._optimizer(model)
        schedule = self._schedule(optimizer, s.max_steps or s.max_epochs * batches_per_epoch)
        generator = torch.Generator(device=device).manual_seed(self.run.seed)
        loss_of = torch.compile(model.loss) if self.run.compile else model.loss
        return _Session(model, examples, n_examples, batches_per_epoch, optimizer, schedule, generator, loss_of,
                        self._uses_bf16(model))

    def _uses_bf16(self, model: NeuralRecommender) -> bool:
        """Whether this run trains under bf16 autocast: asked for and native on the model's device; else one line
        says that it trains in fp32 (and its rows record fp32)."""
        if trains_in_bf16(self.settings, model.device):
            return True
        if self.settings.precision != "bf16":
            return False
        tqdm.write(f"{model.name}: precision=bf16 asked for, but {model.device.type} has no native bf16 "
                   f"({' or '.join(BF16_CPU_FLAGS)} on a CPU), so it trains in fp32 and its rows say fp32",
                   file=sys.stderr)
        return False

    def _check_bf16_ran(self, session: _Session, seen: bool) -> None:
        """After the first step under bf16 autocast: if no operation of it ran in bf16 (autocast casts matrix
        products and convolutions; BPR-MF's scores are elementwise), the run is fp32 in fact, and says so in one
        line, and its rows record fp32 (the computation is the same without autocast). Not checked under
        ``--compile``, where watching every torch function would break the compiled graph."""
        session.bf16_checked = True
        if seen:
            return
        session.use_amp = False
        tqdm.write(f"{session.model.name}: precision=bf16 asked for, but no operation of its training step runs in "
                   f"bf16 under autocast (autocast casts matrix products, not elementwise scores), so it trains in "
                   f"fp32 and its rows say fp32", file=sys.stderr)

    def _restore(self, session: _Session) -> tuple[TrainState, int | None]:
        """The checkpoint's state, weights, optimiser, schedule and random state, if a checkpoint exists."""
        path = self.run.checkpoint
        if path is None or not Path(path).exists():
            return TrainState(), None
        saved = torch.load(path, map_location=session.model.device, weights_only=False)
        if saved.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"{path}: a training checkpoint of an older version of the suite; delete it to "
                             f"train afresh")
        session.model.load_state_dict(saved["model"])
        self._load_optimizer(session.optimizer, saved["optimizer"])
        session.schedule.load_state_dict(saved["schedule"])
        state = TrainState(**saved["state"])
        self._restore_generator(session.generator, saved, state.epoch)
        if "global_generators" in saved:  # checkpoints written before it was kept continue from the seed's state
            restore_global_generators(saved["global_generators"], session.model.device)
        return state, state.epoch or None

    def _train_epoch(self, session: _Session, state: TrainState, bar) -> str | None:
        """One pass over the shuffled examples (stopping early at the step cap or the time budget); returns
        "max steps", "time budget" or "cpu budget" when one of them cut the epoch short, else None."""
        s, device, model = self.settings, session.model.device, session.model
        epoch, epoch_started = state.epoch + 1, session.clock.now()
        model.train()
        # Rows that are consecutive steps of one schedule (GRU4Rec's session-parallel mini-batches) keep order.
        order = (torch.arange(session.n_examples, device=device) if model.ordered_examples
                 else torch.randperm(session.n_examples, generator=session.generator, device=device))
        # The hot loop never waits for the device: losses stay there (their running sum in float64, the last
        # FINITE_CHECK_STEPS of them for the divergence check) until the check and the epoch's end.
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        recent = torch.zeros(FINITE_CHECK_STEPS, device=device)
        cut_short, samples = None, 0
        for b in range(session.batches_per_epoch):
            rows = order[b * s.batch_size:(b + 1) * s.batch_size]
            loss = self._step(session, {key: value[rows] for key, value in session.examples.items()})
            loss_sum += loss
            recent[b % FINITE_CHECK_STEPS] = loss
            samples += len(rows)
            if s.time_budget_s is not None and session.clock.now() - session.started > s.time_budget_s:
                cut_short = "time budget"
            elif s.cpu_budget_s is not None and time.process_time() - session.cpu_started > s.cpu_budget_s:
                cut_short = "cpu budget"
            elif s.max_steps is not None and session.schedule.last_epoch >= s.max_steps:  # steps taken so far
                cut_short = "max steps"
            if (b + 1) % FINITE_CHECK_STEPS == 0 or cut_short or b + 1 == session.batches_per_epoch:
                self._check_finite(model, recent, epoch, b)
            bar.update(1)
            if cut_short:
                break
        mean_loss = loss_sum.item() / (b + 1)
        state.batch_seconds += session.clock.now() - epoch_started
        state.samples += samples
        state.step = session.schedule.last_epoch
        state.epoch = epoch
        state.history.append({"epoch": epoch, "loss": mean_loss, "seconds": session.clock.now() - session.started})
        return cut_short

    def _step(self, session: _Session, batch: dict) -> torch.Tensor:
        """One optimiser step on ``batch``; returns its loss, detached, on the device."""
        s = self.settings
        with torch.autocast(device_type=session.model.device.type, dtype=torch.bfloat16, enabled=session.use_amp):
            if session.use_amp and not session.bf16_checked and not self.run.compile:
                with _Bf16Watch() as watch:
                    loss = session.loss_of(batch, session.generator)
                self._check_bf16_ran(session, watch.seen)
            else:
                loss = session.loss_of(batch, session.generator)
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
            raise wrong_return(session.model, "loss(batch, generator)", loss, "the batch's loss as a scalar tensor "
                                                                              "(e.g. the mean over its examples)")
        session.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if s.clip_norm:
            torch.nn.utils.clip_grad_norm_(session.model.parameters(), s.clip_norm)
        session.optimizer.step()
        session.schedule.step()
        return loss.detach()

    def _validate_and_decide(self, session: _Session, state: TrainState, validate: Validator | None,
                             cut_short: str | None) -> None:
        """Validate when due, keep the best weights, and set ``state.stopped_by`` when a rule ends the run."""
        s, epoch = self.settings, state.epoch
        last_epoch = epoch >= s.max_epochs or cut_short is not None
        stop = None
        if validate is not None and (epoch % s.valid_every == 0 or last_epoch):
            metrics = validate(session.model)
            state.history[-1].update({f"valid_{name}": value for name, value in metrics.items()})
            value = metrics[s.valid_metric]
            improved = improves(value, state.best_metric)
            if improved:
                state.best_metric, state.best_epoch, state.best_step = value, epoch, state.step
                state.bad_validations = 0
                state.best_weights = copy.deepcopy(session.model.state_dict())
            else:
                state.bad_validations += 1
            if self.run.on_validation is not None:
                stop = self.run.on_validation(Validation(epoch, state.step, metrics, value, state.best_metric,
                                                         improved))
        elif validate is None:
            state.best_epoch, state.best_step, state.best_weights = epoch, state.step, None
        if epoch >= s.max_epochs:
            state.stopped_by = "max epochs"
        elif cut_short is not None:
            state.stopped_by = cut_short
        elif stop:
            state.stopped_by = stop
        elif patience_spent(state.bad_validations, s.patience):
            state.stopped_by = "early stopping"

    def _save(self, session: _Session, state: TrainState) -> None:
        if self.run.checkpoint is None:
            return
        buffer = io.BytesIO()
        torch.save({"version": CHECKPOINT_VERSION, "model": session.model.state_dict(),
                    "optimizer": session.optimizer.state_dict(), "schedule": session.schedule.state_dict(),
                    "generator": session.generator.get_state(), "generator_device": session.generator.device.type,
                    "global_generators": global_generators(session.model.device), "state": dict(vars(state))}, buffer)
        write_atomic(Path(self.run.checkpoint), buffer.getvalue())

    def _report(self, session: _Session, state: TrainState, validate: Validator | None,
                resumed_from: int | None) -> FitReport:
        return FitReport(
            epochs_run=state.epoch, steps_run=state.step, best_epoch=state.best_epoch, best_step=state.best_step,
            best_valid=state.best_metric if validate else None, stopped_by=state.stopped_by,
            train_seconds=state.train_seconds, curve=state.history, resumed_from_epoch=resumed_from,
            settings=dataclasses.asdict(self.settings), precision="bf16" if session.use_amp else "fp32",
            samples_per_s=state.samples / state.batch_seconds if state.batch_seconds > 0 else None,
            cpu_seconds=state.cpu_seconds, paused_seconds=state.paused_seconds)

    # ------------------------------------------------------------------------------------- the progress bar

    def _caps(self, session: _Session) -> tuple[int, int]:
        """(steps, epochs) after which the run ends unless something ends it sooner: the step cap or the epoch
        cap, whichever comes first (a smoke profile keeps the authors' 400,000 steps and ends after 15 epochs)."""
        s = self.settings
        steps = min(s.max_steps or math.inf, s.max_epochs * session.batches_per_epoch)
        return steps, math.ceil(steps / session.batches_per_epoch)

    def _early_stopping_can_end(self, session: _Session, validate: Validator | None) -> bool:
        """Whether early stopping can end the run before its caps. The first validation always improves, so it
        takes ``patience`` more, and a stop at the last validation is the cap's: with at most patience + 1
        validations the caps decide (BERT4Rec's smoke profile: patience 20, 15 epochs)."""
        s = self.settings
        if validate is None or s.patience is None:
            return False
        return math.ceil(self._caps(session)[1] / s.valid_every) > s.patience + 1

    def _end_known(self, session: _Session, validate: Validator | None) -> bool:
        """Whether the caps end the run: no early stopping, pruning callback or budget can end it sooner."""
        s = self.settings
        prunable = validate is not None and self.run.on_validation is not None
        return not (self._early_stopping_can_end(session, validate) or prunable or s.time_budget_s is not None
                    or s.cpu_budget_s is not None)

    def _progress_bar(self, session: _Session, state: TrainState, validate: Validator | None) -> tqdm:
        """Counts steps. When the caps end the run, the bar runs to that step and its time left is the run's, at
        the run's average speed so far, validation included (``smoothing=0``: a validation pause then neither
        hides in nor swamps the estimate). When early stopping, a pruner or a budget may end it, nobody knows
        when: the bar shows the steps done, the speed and (:meth:`_show`) the epoch against its cap and how close
        early stopping is, and no time left, since a time to the cap would promise hours for a run that early
        stopping ends in minutes. Where bars cannot redraw in place (stderr is a log file) there is no bar but a
        line an epoch (:meth:`_show`)."""
        steps, _ = self._caps(session)
        known = self._end_known(session, validate)
        drawn = self.run.progress and self.run.bars and bars_redraw_in_place()
        return tqdm(total=steps if known else None, initial=state.step, desc=session.model.name, unit="step",
                    smoothing=0, disable=not drawn, dynamic_ncols=True, leave=False,
                    bar_format=None if known else "{desc}: {n_fmt} steps [{elapsed}, {rate_fmt}{postfix}]")

    def _show(self, bar: tqdm, session: _Session, state: TrainState, validate: Validator | None) -> None:
        """The epoch against its cap, the loss, the best validation value and, with early stopping, how many of
        the validations it waits for have passed without a better value, and the budgets that may end the run;
        a bar ended by the time budget stays on screen and says so. In a log file, the same as a line."""
        s, (_, epochs) = self.settings, self._caps(session)
        known = self._end_known(session, validate)
        shown = [f"epoch {state.epoch}/{epochs}" if known else f"epoch {state.epoch} of at most {epochs}",
                 f"loss {state.history[-1]['loss']:.4f}"]
        if validate is not None:
            best = f"{state.best_metric:.4f}" if state.best_metric > -math.inf else "–"
            shown.append(f"best {s.valid_metric} {best}")
            if self._early_stopping_can_end(session, validate):
                shown.append(f"no better for {state.bad_validations}/{s.patience} validations")
        shown += [f"{name} {value:g} s" for name, value in (("time budget", s.time_budget_s),
                                                             ("CPU budget", s.cpu_budget_s)) if value is not None]
        bar.set_postfix_str(", ".join(shown))
        if state.stopped_by == "time budget" and not bar.disable:  # a disabled bar has no description
            bar.set_description_str(f"{bar.desc}: stopped by the {self.settings.time_budget_s:g} s time budget")
            bar.leave = True
        if self.run.progress and bar.disable:
            tqdm.write(self._epoch_line(session, state, shown, known), file=sys.stderr)

    def _epoch_line(self, session: _Session, state: TrainState, shown: list[str], known: bool) -> str:
        """What the bar shows, as one line of a log: the steps (against the run's end when the caps decide it),
        the epoch, the loss, this epoch's validation value and the best, the time trained with the speed, and the
        time left or what ended the run, e.g. ``bert4rec: step 7,254/16,744, epoch 44/104, loss 5.5740, 1:01:21
        trained (1.97 steps/s), 1:20:17 left``."""
        s, (steps, _) = self.settings, self._caps(session)
        rate = state.step / state.train_seconds if state.train_seconds > 0 else 0.0
        validated = state.history[-1].get(f"valid_{s.valid_metric}")
        parts = [f"step {state.step:,}/{steps:,}" if known else f"step {state.step:,}", *shown[:2],
                 *([f"{s.valid_metric} {validated:.4f}"] if validated is not None else []), *shown[2:],
                 f"{tqdm.format_interval(state.train_seconds)} trained ({rate:.2f} steps/s)"]
        if state.stopped_by == "time budget":
            parts.append(f"stopped by the {s.time_budget_s:g} s time budget")
        elif state.stopped_by is not None:
            parts.append(f"stopped: {state.stopped_by}")
        elif known and rate > 0:
            parts.append(f"{tqdm.format_interval((steps - state.step) / rate)} left")
        return f"{self.run.label or session.model.name}: " + ", ".join(parts)

    # ----------------------------------------------------------------------------------------------- parts

    def _optimizer(self, model: NeuralRecommender) -> torch.optim.Optimizer:
        s = self.settings
        groups = model.parameter_groups()
        if s.optimizer == "adam-weight-decay":
            return AdamWeightDecay(groups, lr=s.lr, betas=s.betas, eps=s.eps, weight_decay=s.weight_decay)
        if s.optimizer == "adagrad":
            return GRU4RecAdagrad(groups, lr=s.lr, weight_decay=s.weight_decay)
        if s.optimizer == "sgd":
            return torch.optim.SGD(groups, lr=s.lr, weight_decay=s.weight_decay)
        kind = torch.optim.AdamW if s.optimizer == "adamw" else torch.optim.Adam
        return kind(groups, lr=s.lr, betas=s.betas, eps=s.eps, weight_decay=s.weight_decay,
                    fused=fused_adam(model.device))

    def _schedule(self, optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        """The learning rate's factor at each step (0-based) of ``total_steps``."""
        warmup, decay = self.settings.warmup_steps, self.settings.decay

        def factor(step: int) -> float:
            if decay == "polynomial":
                return bert_schedule(step, warmup, total_steps)
            if warmup and step < warmup:
                return (step + 1) / warmup
            if decay == "linear":
                return max(0.0, (total_steps - step) / max(1, total_steps - warmup))
            return 1.0

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def _check_finite(self, model: NeuralRecommender, recent: torch.Tensor, epoch: int, batch: int) -> None:
        """Raise if any of the losses since the last check (``recent``, a ring of the last FINITE_CHECK_STEPS
        batches' losses, the current one at ``batch``) is NaN or infinite, naming the first such batch. Weights
        stepped with it are never saved: the checkpoint is written after the epoch's final check."""
        steps = batch % FINITE_CHECK_STEPS + 1  # batches since the last check
        losses = recent[:steps].tolist()  # the one wait for the device per check
        for number, value in enumerate(losses, start=batch - steps + 1):
            if not math.isfinite(value) and epoch == 1 and number == 0:  # before any step: not the learning rate
                raise FloatingPointError(f"{model.name}: training loss is {value} from the first batch, before any "
                                         f"optimiser step: loss() itself gives {value} on the initial weights; look "
                                         f"for a log of 0, a division by 0 or a NaN input in it")
            if not math.isfinite(value):
                raise FloatingPointError(f"{model.name}: training loss became {value} at epoch {epoch}, batch "
                                         f"{number}; lower the learning rate (now {self.settings.lr})")

    @staticmethod
    def _load_optimizer(optimizer: torch.optim.Optimizer, saved: dict) -> None:
        """The checkpoint's optimizer state, keeping the implementation chosen for this device (a fused CUDA
        Adam's checkpoint resumed on the CPU continues with the CPU's implementation)."""
        chosen = [{key: group[key] for key in ("fused", "foreach", "capturable") if key in group}
                  for group in optimizer.param_groups]
        optimizer.load_state_dict(saved)
        for group, implementation in zip(optimizer.param_groups, chosen):
            group.update(implementation)

    def _restore_generator(self, generator: torch.Generator, saved: dict, epoch: int) -> None:
        """The checkpoint's random state when it was written on this device type. CPU and CUDA generators have
        different states, so a checkpoint from the other type (a CUDA run resumed on the CPU) continues with a
        generator seeded by the seed and the epoch: its remaining draws differ from an uninterrupted run's, but
        are still fixed by the seed."""
        if saved.get("generator_device", generator.device.type) == generator.device.type:
            generator.set_state(saved["generator"].cpu())
        else:
            generator.manual_seed(self.run.seed * 1_000_003 + epoch)
