"""The one training loop shared by every neural model (``architecture.md``; ``protocol.md`` "Model selection").

Adam, AdamW or BERT's AdamWeightDecay (``benchmarks.optim``) with linear warm-up then linear or BERT's decay,
gradient clipping, bf16 autocast on CUDA, early stopping on a validation metric with a patience, an epoch cap, a
step cap and a wall-clock budget, restore of the best weights, and a checkpoint after every validation so that an
interrupted run resumes where it stopped.

On a GPU the loop itself never makes the host wait for the device between steps: the running loss stays on the
device and is checked for NaN/inf every ``FINITE_CHECK_STEPS`` batches and at the epoch's end (the model's own
loss may still wait, e.g. for data-dependent shapes). ``compile`` runs the model's loss through
``torch.compile``.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from recbench.benchmarks.evaluator import PROTOCOLS, check_metric_name
from recbench.benchmarks.optim import AdamWeightDecay, GRU4RecAdagrad, bert_schedule
from recbench.benchmarks.relevance import SELECTION_METRICS
from recbench.datasets.sequences import Histories
from recbench.models.base import NeuralRecommender, Recommender, Validator
from recbench.models.base import require as require_setting
from recbench.models.base import require_choice


FINITE_CHECK_STEPS = 50  # batches between two checks that the loss is finite (each check waits for the device)


OPTIMIZERS = ("adam", "adamw", "adam-weight-decay", "adagrad", "sgd")
DECAYS = ("none", "linear", "polynomial")
PRECISIONS = ("fp32", "bf16")


@dataclass
class TrainSettings:
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
    patience: int = 10  # validations without improvement before stopping
    time_budget_s: float | None = None  # wall-clock cap on training (validation included)
    warmup_steps: int = 0
    decay: str = "none"  # after warm-up: "none" constant; "linear" to 0 over the steps after warm-up;
    # "polynomial": BERT's create_optimizer, lr·(1 − s/T) over all T steps, warm-up lr·s/W (benchmarks.optim)
    clip_norm: float | None = 5.0
    valid_every: int = 1  # epochs between validations
    valid_metric: str = "NDCG@10"
    valid_protocol: str = "full"
    valid_users: int | None = None  # validate on a fixed random subset of this many users (0 or None: all)
    precision: str = "fp32"  # "fp32", as the authors' code trains; "bf16": bf16 autocast on CUDA (the CPU always
    # trains in fp32)
    compile: bool = False  # torch.compile the model's loss (a first step per new batch shape compiles)
    progress: bool = True
    checkpoint: str | None = None  # path of the resumable checkpoint
    seed: int = 0  # shuffling, negatives and masks drawn during training

    def __post_init__(self):
        def require(condition: bool, field: str, rule: str) -> None:
            require_setting(self, condition, field, rule)

        self.betas = tuple(self.betas)
        for field, choices in (("optimizer", OPTIMIZERS), ("decay", DECAYS), ("precision", PRECISIONS)):
            require_choice(self, field, choices)
        require(self.lr > 0, "lr", "be > 0")
        require(self.eps > 0, "eps", "be > 0")
        require(self.max_steps is None or self.max_steps >= 1, "max_steps", "be >= 1, or none (max_epochs decides)")
        require(self.weight_decay >= 0, "weight_decay", "be >= 0")
        require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", "be two numbers in [0, 1)")
        for field in ("batch_size", "max_epochs", "patience", "valid_every"):
            require(getattr(self, field) >= 1, field, "be >= 1")
        require(self.warmup_steps >= 0, "warmup_steps", "be >= 0")
        require(self.time_budget_s is None or self.time_budget_s > 0, "time_budget_s", "be > 0 seconds, or none")
        require(self.clip_norm is None or self.clip_norm >= 0, "clip_norm", "be >= 0 (0 or none: no clipping)")
        require(self.valid_users is None or self.valid_users >= 0, "valid_users", "be >= 0 (0 or none: all users)")
        require(self.valid_protocol in PROTOCOLS, "valid_protocol", f"be one of {', '.join(PROTOCOLS)}")
        require(self.valid_metric in SELECTION_METRICS or check_metric_name(self.valid_metric), "valid_metric",
                f"be HR@k, NDCG@k, MRR or one of {', '.join(SELECTION_METRICS)}")


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for ``cuda`` on a machine without it is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} was requested but torch sees no CUDA device "
                           f"(torch {torch.__version__}); use --device cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"unknown device {name!r}; expected auto, cpu or cuda[:N]")
    return torch.device(name)


def fit_model(model: Recommender, train: Histories, validate: Validator | None, settings: TrainSettings) -> dict:
    """The harness's one way to fit any model: a neural model by the shared :class:`Trainer`, any other (POP)
    by its own ``fit``. Returns the fit report (epochs run, best epoch, best validation value, curve, seconds)."""
    if isinstance(model, NeuralRecommender):
        return Trainer(settings).fit(model, train, validate)
    return model.fit(train)


class Trainer:
    def __init__(self, settings: TrainSettings):
        self.settings = settings

    def _optimizer(self, model: NeuralRecommender) -> torch.optim.Optimizer:
        s = self.settings
        # A model may split its parameters into groups with their own settings through an optional
        # ``parameter_groups()`` (BERT4Rec: no weight decay on biases and LayerNorm, as its official code).
        groups = model.parameter_groups() if hasattr(model, "parameter_groups") else model.parameters()
        if s.optimizer == "adam-weight-decay":
            return AdamWeightDecay(groups, lr=s.lr, betas=s.betas, eps=s.eps, weight_decay=s.weight_decay)
        if s.optimizer == "adagrad":
            return GRU4RecAdagrad(groups, lr=s.lr, weight_decay=s.weight_decay)
        if s.optimizer == "sgd":
            return torch.optim.SGD(groups, lr=s.lr, weight_decay=s.weight_decay)
        kind = torch.optim.AdamW if s.optimizer == "adamw" else torch.optim.Adam
        return kind(groups, lr=s.lr, betas=s.betas, eps=s.eps, weight_decay=s.weight_decay,
                    fused=model.device.type == "cuda")

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

    def fit(self, model: NeuralRecommender, train: Histories, validate: Validator | None) -> dict:
        s = self.settings
        device = model.device
        examples = {key: value.to(device) for key, value in model.training_examples(train).items()}
        n_examples = len(next(iter(examples.values())))
        if n_examples == 0:
            raise ValueError(f"{model.name}: the training view produced no training examples")
        batches_per_epoch = math.ceil(n_examples / s.batch_size)
        optimizer = self._optimizer(model)
        schedule = self._schedule(optimizer, s.max_steps or s.max_epochs * batches_per_epoch)
        generator = torch.Generator(device=device).manual_seed(s.seed)
        use_amp = s.precision == "bf16" and device.type == "cuda"
        loss_of = torch.compile(model.loss) if s.compile else model.loss

        state = {"epoch": 0, "best_metric": -math.inf, "best_epoch": 0, "bad_validations": 0,
                 "history": [], "train_seconds": 0.0, "finished": False, "best_weights": None}
        checkpoint = Path(s.checkpoint) if s.checkpoint else None
        if checkpoint is not None and checkpoint.exists():
            saved = torch.load(checkpoint, map_location=device, weights_only=False)
            model.load_state_dict(saved["model"])
            self._load_optimizer(optimizer, saved["optimizer"])
            schedule.load_state_dict(saved["schedule"])
            state = saved["state"]
            self._restore_generator(generator, saved, s.seed, state["epoch"])
        resumed_from_epoch = state["epoch"] if state["epoch"] else None

        started = time.perf_counter() - state["train_seconds"]
        bar = tqdm(total=s.max_epochs, initial=state["epoch"], desc=f"{model.name}", unit="epoch",
                   disable=not s.progress, dynamic_ncols=True, leave=False)
        while not state["finished"]:
            epoch = state["epoch"] + 1
            model.train()
            # Rows that are consecutive steps of one schedule (GRU4Rec's session-parallel mini-batches) keep order.
            order = (torch.arange(n_examples, device=device) if model.ordered_examples
                     else torch.randperm(n_examples, generator=generator, device=device))
            # The hot loop never waits for the device: losses stay there (their running sum in float64, the last
            # FINITE_CHECK_STEPS of them for the divergence check) until the check and the epoch's end.
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            recent = torch.zeros(FINITE_CHECK_STEPS, device=device)
            out_of_time = out_of_steps = False
            for b in range(batches_per_epoch):
                rows = order[b * s.batch_size:(b + 1) * s.batch_size]
                batch = {key: value[rows] for key, value in examples.items()}
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
                    loss = loss_of(batch, generator)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if s.clip_norm:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip_norm)
                optimizer.step()
                schedule.step()
                loss_sum += loss.detach()
                recent[b % FINITE_CHECK_STEPS] = loss.detach()
                out_of_time = s.time_budget_s is not None and time.perf_counter() - started > s.time_budget_s
                out_of_steps = s.max_steps is not None and schedule.last_epoch >= s.max_steps  # steps taken so far
                if (b + 1) % FINITE_CHECK_STEPS == 0 or out_of_time or out_of_steps or b + 1 == batches_per_epoch:
                    self._check_finite(model, recent, epoch, b)
                if out_of_time or out_of_steps:
                    break
            record = {"epoch": epoch, "loss": loss_sum.item() / (b + 1), "seconds": time.perf_counter() - started}
            last_epoch = epoch >= s.max_epochs or out_of_time or out_of_steps
            if validate is not None and (epoch % s.valid_every == 0 or last_epoch):
                metrics = validate(model)
                record.update({f"valid_{name}": value for name, value in metrics.items()})
                value = metrics[s.valid_metric]
                if value > state["best_metric"]:
                    state.update(best_metric=value, best_epoch=epoch, bad_validations=0,
                                 best_weights=copy.deepcopy(model.state_dict()))
                else:
                    state["bad_validations"] += 1
            elif validate is None:
                state.update(best_epoch=epoch, best_weights=None)
            state["history"].append(record)
            state["epoch"] = epoch
            state["train_seconds"] = time.perf_counter() - started
            state["finished"] = last_epoch or state["bad_validations"] >= s.patience
            if state["finished"]:
                state["stopped_by"] = ("max epochs" if epoch >= s.max_epochs else
                                       "time budget" if out_of_time else "max steps" if out_of_steps else
                                       "early stopping")
            bar.update(1)
            best = f"{state['best_metric']:.4f}" if state["best_metric"] > -math.inf else "–"
            bar.set_postfix(loss=f"{record['loss']:.4f}", **({f"best {s.valid_metric}": best} if validate else {}))
            if checkpoint is not None:
                self._save(checkpoint, model, optimizer, schedule, generator, state)
        stopped_by = state.get("stopped_by", "max epochs")
        if stopped_by == "time budget":
            # The bar stays on screen and says why it ended short of max_epochs.
            bar.set_description_str(f"{model.name}: stopped by the {s.time_budget_s:g} s time budget")
            bar.leave = True
        bar.close()
        if state["best_weights"] is not None:
            model.load_state_dict(state["best_weights"])
        return {"epochs_run": state["epoch"], "best_epoch": state["best_epoch"],
                "best_valid": state["best_metric"] if validate else None, "stopped_by": stopped_by,
                "train_seconds": state["train_seconds"], "curve": state["history"],
                "resumed_from_epoch": resumed_from_epoch, "settings": dataclasses.asdict(s)}

    def _check_finite(self, model: NeuralRecommender, recent: torch.Tensor, epoch: int, batch: int) -> None:
        """Raise if any of the losses since the last check (``recent``, a ring of the last FINITE_CHECK_STEPS
        batches' losses, the current one at ``batch``) is NaN or infinite, naming the first such batch. Weights
        stepped with it are never saved: the checkpoint is written after the epoch's final check."""
        steps = batch % FINITE_CHECK_STEPS + 1  # batches since the last check
        losses = recent[:steps].tolist()  # the one wait for the device per check
        for number, value in enumerate(losses, start=batch - steps + 1):
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

    @staticmethod
    def _restore_generator(generator: torch.Generator, saved: dict, seed: int, epoch: int) -> None:
        """The checkpoint's random state when it was written on this device type. CPU and CUDA generators have
        different states, so a checkpoint from the other type (a CUDA run resumed on the CPU) continues with a
        generator seeded by ``seed`` and the epoch: its remaining draws differ from an uninterrupted run's, but
        are still fixed by the seed."""
        if saved.get("generator_device", generator.device.type) == generator.device.type:
            generator.set_state(saved["generator"].cpu())
        else:
            generator.manual_seed(seed * 1_000_003 + epoch)

    @staticmethod
    def _save(path: Path, model, optimizer, schedule, generator, state) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(), "generator": generator.get_state(),
                    "generator_device": generator.device.type, "state": state}, tmp)
        tmp.replace(path)
