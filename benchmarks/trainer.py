"""The one training loop shared by every neural model (``architecture.md``; ``protocol.md`` "Model selection").

Adam or AdamW with linear warm-up then linear decay, gradient clipping, bf16 autocast on CUDA, early stopping
on a validation metric with a patience, an epoch cap and a wall-clock budget, restore of the best weights, and
a checkpoint after every validation so that an interrupted run resumes where it stopped.
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

from datasets.sequences import Histories
from models.base import NeuralRecommender, Recommender, Validator


OPTIMIZERS = ("adam", "adamw", "adagrad", "sgd")


class GRU4RecAdagrad(torch.optim.Optimizer):
    """Adagrad as GRU4Rec's authors' code computes it: G ← G + g², θ ← θ − lr · (g / √(G + ε) + λ θ), with
    ε = 1e-6 inside the root (``torch.optim.Adagrad`` adds its ε outside) and the L2 term λ θ outside the
    scaling. A parameter row whose gradient is zero keeps its G, as in the code's sparse updates of sampled rows."""

    def __init__(self, params, lr: float, weight_decay: float = 0.0, eps: float = 1e-6):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "eps": eps})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["sum"] = torch.zeros_like(p)
                state["sum"].addcmul_(p.grad, p.grad)
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                p.addcdiv_(p.grad, (state["sum"] + group["eps"]).sqrt_(), value=-group["lr"])


@dataclass
class TrainSettings:
    optimizer: str = "adam"  # "adam" (L2 folded into the gradient), "adamw" (decoupled weight decay), "adagrad"
    # (GRU4Rec's form, see GRU4RecAdagrad) or "sgd" (plain, as NCF fine-tunes a pre-trained NeuMF)
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    batch_size: int = 256
    max_epochs: int = 200
    patience: int = 10  # validations without improvement before stopping
    time_budget_s: float | None = None  # wall-clock cap on training (validation included)
    warmup_steps: int = 0
    decay: str = "none"  # "linear": to 0 at max_epochs * batches per epoch; "none": constant after warm-up
    clip_norm: float | None = 5.0
    valid_every: int = 1  # epochs between validations
    valid_metric: str = "NDCG@10"
    valid_protocol: str = "full"
    valid_users: int | None = None  # validate on a fixed random subset of this many users (None: all)
    amp: bool = True  # bf16 autocast, CUDA only
    progress: bool = True
    checkpoint: str | None = None  # path of the resumable checkpoint
    seed: int = 0  # shuffling, negatives and masks drawn during training

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.decay not in ("linear", "none"):
            raise ValueError(f"decay must be 'linear' or 'none', got {self.decay!r}")
        if self.batch_size < 1 or self.max_epochs < 1 or self.patience < 1 or self.valid_every < 1:
            raise ValueError("batch_size, max_epochs, patience and valid_every must all be >= 1")
        self.betas = tuple(self.betas)


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
        if s.optimizer == "adagrad":
            return GRU4RecAdagrad(groups, lr=s.lr, weight_decay=s.weight_decay)
        if s.optimizer == "sgd":
            return torch.optim.SGD(groups, lr=s.lr, weight_decay=s.weight_decay)
        kind = torch.optim.AdamW if s.optimizer == "adamw" else torch.optim.Adam
        return kind(groups, lr=s.lr, betas=s.betas, weight_decay=s.weight_decay, fused=model.device.type == "cuda")

    def _schedule(self, optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        warmup, linear = self.settings.warmup_steps, self.settings.decay == "linear"

        def factor(step: int) -> float:
            if warmup and step < warmup:
                return (step + 1) / warmup
            if linear:
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
        schedule = self._schedule(optimizer, s.max_epochs * batches_per_epoch)
        generator = torch.Generator(device=device).manual_seed(s.seed)
        use_amp = s.amp and device.type == "cuda"

        state = {"epoch": 0, "best_metric": -math.inf, "best_epoch": 0, "bad_validations": 0,
                 "history": [], "train_seconds": 0.0, "finished": False, "best_weights": None}
        checkpoint = Path(s.checkpoint) if s.checkpoint else None
        if checkpoint is not None and checkpoint.exists():
            saved = torch.load(checkpoint, map_location=device, weights_only=False)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            schedule.load_state_dict(saved["schedule"])
            generator.set_state(saved["generator"].cpu() if device.type == "cpu" else saved["generator"])
            state = saved["state"]

        started = time.perf_counter() - state["train_seconds"]
        bar = tqdm(total=s.max_epochs, initial=state["epoch"], desc=f"{model.name}", unit="epoch",
                   disable=not s.progress, dynamic_ncols=True, leave=False)
        while not state["finished"]:
            epoch = state["epoch"] + 1
            model.train()
            # Rows that are consecutive steps of one schedule (GRU4Rec's session-parallel mini-batches) keep order.
            order = (torch.arange(n_examples, device=device) if model.ordered_examples
                     else torch.randperm(n_examples, generator=generator, device=device))
            loss_sum, out_of_time = 0.0, False
            for b in range(batches_per_epoch):
                rows = order[b * s.batch_size:(b + 1) * s.batch_size]
                batch = {key: value[rows] for key, value in examples.items()}
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
                    loss = model.loss(batch, generator)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"{model.name}: training loss became {loss.item()} at epoch {epoch}, "
                                             f"batch {b}; lower the learning rate (now {s.lr})")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if s.clip_norm:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip_norm)
                optimizer.step()
                schedule.step()
                loss_sum += loss.item()
                if s.time_budget_s is not None and time.perf_counter() - started > s.time_budget_s:
                    out_of_time = True
                    break
            record = {"epoch": epoch, "loss": loss_sum / (b + 1), "seconds": time.perf_counter() - started}
            last_epoch = epoch >= s.max_epochs or out_of_time
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
            bar.update(1)
            best = f"{state['best_metric']:.4f}" if state["best_metric"] > -math.inf else "–"
            bar.set_postfix(loss=f"{record['loss']:.4f}", **({f"best {s.valid_metric}": best} if validate else {}))
            if checkpoint is not None:
                self._save(checkpoint, model, optimizer, schedule, generator, state)
        bar.close()
        if state["best_weights"] is not None:
            model.load_state_dict(state["best_weights"])
        return {"epochs_run": state["epoch"], "best_epoch": state["best_epoch"],
                "best_valid": state["best_metric"] if validate else None,
                "train_seconds": state["train_seconds"], "curve": state["history"],
                "settings": dataclasses.asdict(s)}

    @staticmethod
    def _save(path: Path, model, optimizer, schedule, generator, state) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(), "generator": generator.get_state(), "state": state}, tmp)
        tmp.replace(path)
