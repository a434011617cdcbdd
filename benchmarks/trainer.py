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
autocast when asked for on a device with native bf16 (:mod:`benchmarks.precision`), early stopping on a validation
metric with a patience (or none), an epoch cap, a step cap, a wall-clock budget and a CPU-seconds budget. The
checkpoint's format is :mod:`benchmarks.checkpoint`'s, what a run shows while it runs
:mod:`benchmarks.training_progress`'s, the device :mod:`benchmarks.device`'s.

On a GPU the loop itself never makes the host wait for the device between steps: the running loss stays on the
device and is checked for NaN/inf every ``FINITE_CHECK_STEPS`` batches and at the epoch's end (the model's own
loss may still wait, e.g. for data-dependent shapes).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from recbench.benchmarks.checkpoint import TrainState, restore_checkpoint, save_checkpoint
from recbench.benchmarks.clock import RunClock
from recbench.benchmarks.evaluator import PROTOCOLS
from recbench.benchmarks.metrics import check_metric_name
from recbench.benchmarks.optim import build_optimizer, lr_schedule
from recbench.benchmarks.precision import Bf16Watch, no_bf16_operation, uses_bf16
from recbench.benchmarks.relevance import SELECTION_METRICS
from recbench.benchmarks.training_progress import TrainingProgress
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
    loss: float | None = None  # the epoch's mean training loss (what a tracker logs beside the metrics)


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


def improves(value: float, best: float) -> bool:
    """Early stopping's test of a validation: a new best only when strictly greater, so a tie keeps the earlier,
    shorter run."""
    return value > best


def patience_spent(bad_validations: int, patience: int | None) -> bool:
    """Early stopping's end: ``patience`` validations in a row without a new best (``None``: never)."""
    return patience is not None and bad_validations >= patience


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
        progress = TrainingProgress(self.settings, self.run, model.name, session.batches_per_epoch,
                                    validating=validate is not None)
        with RunClock() as session.clock, progress.bar(state) as bar:
            session.started = session.clock.now() - state.train_seconds
            session.cpu_started = time.process_time() - state.cpu_seconds
            while state.stopped_by is None:
                cut_short = self._train_epoch(session, state, bar)
                self._validate_and_decide(session, state, validate, cut_short)
                state.train_seconds = session.clock.now() - session.started
                state.paused_seconds = paused_before + session.clock.paused
                state.cpu_seconds = time.process_time() - session.cpu_started
                progress.show(bar, state)
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
        optimizer = build_optimizer(s, model)
        schedule = lr_schedule(s, optimizer, s.max_steps or s.max_epochs * batches_per_epoch)
        generator = torch.Generator(device=device).manual_seed(self.run.seed)
        loss_of = torch.compile(model.loss) if self.run.compile else model.loss
        return _Session(model, examples, n_examples, batches_per_epoch, optimizer, schedule, generator, loss_of,
                        uses_bf16(s, model))

    def _check_bf16_ran(self, session: _Session, seen: bool) -> None:
        """After the first step under bf16 autocast: if no operation of it ran in bf16 (autocast casts matrix
        products and convolutions; BPR-MF's scores are elementwise), the run is fp32 in fact, and says so in one
        line, and its rows record fp32 (the computation is the same without autocast). Not checked under
        ``--compile``, where watching every torch function would break the compiled graph."""
        session.bf16_checked = True
        if seen:
            return
        session.use_amp = False
        no_bf16_operation(session.model)

    def _restore(self, session: _Session) -> tuple[TrainState, int | None]:
        """The checkpoint's state, weights, optimiser, schedule and random state, if a checkpoint exists."""
        path = self.run.checkpoint
        if path is None or not Path(path).exists():
            return TrainState(), None
        state = restore_checkpoint(path, session.model, session.optimizer, session.schedule, session.generator,
                                   self.run.seed)
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
                with Bf16Watch() as watch:
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
                                                         improved, state.history[-1]["loss"]))
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
        if self.run.checkpoint is not None:
            save_checkpoint(self.run.checkpoint, session.model, session.optimizer, session.schedule,
                            session.generator, state)

    def _report(self, session: _Session, state: TrainState, validate: Validator | None,
                resumed_from: int | None) -> FitReport:
        return FitReport(
            epochs_run=state.epoch, steps_run=state.step, best_epoch=state.best_epoch, best_step=state.best_step,
            best_valid=state.best_metric if validate else None, stopped_by=state.stopped_by,
            train_seconds=state.train_seconds, curve=state.history, resumed_from_epoch=resumed_from,
            settings=dataclasses.asdict(self.settings), precision="bf16" if session.use_amp else "fp32",
            samples_per_s=state.samples / state.batch_seconds if state.batch_seconds > 0 else None,
            cpu_seconds=state.cpu_seconds, paused_seconds=state.paused_seconds)

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
