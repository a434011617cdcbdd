"""The one interface every model implements (``ARCHITECTURE.md``, "The model interface").

A model is built from its hyper-parameters (a dataclass ``Config``) and the dataset's sizes, fitted on the
training view, and scores batches of histories against all items or against given candidate lists. The harness
fits it (``benchmarks.trainer.fit_model``): a neural model through the shared trainer, which validates it through
a callback that never exposes the test split; any other model through its own ``fit``. Models never read files,
never compute metrics and never import the harness.

Conventions for :meth:`Recommender.score`:
- ``users``: ``(B,)`` user rows; ``histories``: ``(B, history_length)`` item ids, *left*-padded with 0 so the
  most recent item is in the last column; ``candidates``: ``None`` or ``(B, C)`` item ids.
- returns ``(B, n_items + 1)`` scores indexed by item id (column 0, padding, is ignored by the evaluator) when
  ``candidates`` is ``None``, else ``(B, C)`` scores aligned with ``candidates``. Higher is better.

Optional hooks, declared below with their defaults, so that the harness never asks whether a model has them:

- ``score_factors(users, histories)``: a model whose full score matrix is a product, score(u, i) = q_u · e_i +
  b_i (SASRec, BERT4Rec, BPR-MF, Caser), returns its :class:`ScoreFactors` and builds its full scores from them
  (:meth:`ScoreFactors.full`); the evaluator then ranks all items on the CPU without holding the
  ``(B, n_items + 1)`` matrix. Default: None (no such product).
- ``attention_weights(histories)``: an attention model's scored inputs and every layer's and head's attention
  weights among them, for the report's heat maps (paper Fig. 2). Default: None (no attention).
- ``training_report()``: facts about the training data the model built, recorded in every result row (BERT4Rec:
  the proportion of items its Cloze copies mask). Default: nothing.
- ``predict_proba(users, histories, candidates)``: probabilities, for a model trained for relevance prediction
  (``models.relevance.RelevanceModel``). Default: an error saying that a ranker is calibrated first.
- ``parameter_groups()`` (neural models): parameter groups with their own optimiser settings (BERT4Rec: no
  weight decay on biases and LayerNorm). Default: one group of every parameter.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar, NamedTuple

import torch
from torch import nn

from recbench.datasets.sequences import Histories

Validator = Callable[["Recommender"], dict]


class ScoreFactors(NamedTuple):
    """The factors of a product score matrix: ``queries`` (B, d), ``items`` (n_items + 1, d) indexed by item id,
    ``bias`` (n_items + 1,) or None."""

    queries: torch.Tensor
    items: torch.Tensor
    bias: torch.Tensor | None

    def full(self) -> torch.Tensor:
        """The ``(B, n_items + 1)`` scores q_u · e_i + b_i."""
        scores = self.queries @ self.items.T
        return scores if self.bias is None else scores + self.bias


def show(value) -> str:
    """A setting's value as a user would type it after ``--set field=``: ``true``, ``0.001``, ``'abc'``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return repr(value)


class SettingError(ValueError):
    """A setting's value breaks a rule, in the one shape ``heads=3 must divide hidden=64``."""


def setting_error(field: str, value, rule: str) -> SettingError:
    """The one shape of a setting's error, to raise: ``heads=3 must divide hidden=64``. The harness prefixes the
    model (``sasrec: heads=3 must divide hidden=64``)."""
    return SettingError(f"{field}={show(value)} must {rule}")


def require(settings, condition: bool, field: str, rule: str) -> None:
    """:func:`setting_error` unless ``condition`` holds, for the ``__post_init__`` of every config dataclass
    (model configs and the trainer's settings)."""
    if not condition:
        raise setting_error(field, getattr(settings, field), rule)


def require_choice(settings, field: str, choices) -> None:
    """``require`` for a setting that takes one of a few names: ``loss='xyz' must be one of top1, bpr``."""
    require(settings, getattr(settings, field) in choices, field, f"be one of {', '.join(map(str, choices))}")


class InterfaceError(TypeError):
    """A model's method returned what the harness cannot use; the message, one line, says what to return."""


def wrong_return(model, call: str, value, expected: str) -> InterfaceError:
    """The one shape of such an error, to raise: ``MyRec.fit(train) returned a dict; return a FitReport ...``."""
    return InterfaceError(f"{getattr(model, 'name', type(model).__name__)}.{call} returned {described(value)}; "
                          f"return {expected}")


def described(value) -> str:
    """What a returned value is, for :func:`wrong_return`: ``a tensor of shape (32,)``, ``a dict``, ``None``."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return f"a tuple of {len(value)} ({', '.join(described(part) for part in value)})"
    return f"a {type(value).__name__}"


@dataclass
class FitReport:
    """How a model was fitted: what the trainer reports for a neural model, what ``fit`` returns for any other."""

    train_seconds: float
    epochs_run: int = 0
    steps_run: int = 0  # optimiser steps
    best_epoch: int = 0  # the epoch whose weights were kept (selected on validation)
    best_step: int = 0
    best_valid: float | None = None  # the selection metric's value there (None: not validated)
    stopped_by: str | None = None  # what ended training: "max epochs", "max steps", "time budget", ...
    curve: list = field(default_factory=list)  # per epoch: loss, seconds, validation metrics
    resumed_from_epoch: int | None = None
    settings: dict | None = None  # the trainer's settings (None: no gradient training)
    precision: str | None = None  # "fp32" or "bf16" (None: no gradient training)
    samples_per_s: float | None = None  # training examples per second of the batch loop
    cpu_seconds: float | None = None  # process CPU time of training, all threads, over every resumed session
    paused_seconds: float | None = None  # wall-clock time the process stood stopped, left out of train_seconds


class Recommender(ABC):
    """Base of all models, neural or not. A model without gradient training (POP) also defines
    ``fit(train) -> FitReport``."""

    name: ClassVar[str]  # how messages and progress bars call the model; its class name unless it says
    Config: ClassVar[type]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" not in vars(cls):
            cls.name = cls.__name__

    def __init__(self, n_users: int, n_items: int, config):
        if not dataclasses.is_dataclass(config):
            raise TypeError(f"{type(self).__name__} expects a {self.Config.__name__} dataclass, got {type(config)}")
        self.n_users = n_users
        self.n_items = n_items
        self.config = config

    @property
    def history_length(self) -> int:
        """How many of the most recent history items :meth:`score` reads (0: it needs none)."""
        return 0

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @abstractmethod
    def score(self, users: torch.Tensor, histories: torch.Tensor,
              candidates: torch.Tensor | None) -> torch.Tensor:
        """Scores as described in the module docstring."""

    def hyperparameters(self) -> dict:
        return dataclasses.asdict(self.config)

    def score_factors(self, users: torch.Tensor, histories: torch.Tensor) -> ScoreFactors | None:
        """The factors of a product score matrix (module docstring), or None: the scores are no such product."""
        return None

    def attention_weights(self, histories: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The inputs the model scores, ``(B, T)`` item ids (a model may append a [MASK] position), and their
        attention weights ``(B, layers, heads, T, T)``, each query's row summing to 1; or None: no attention."""
        return None

    def training_report(self) -> dict:
        """Facts about the training data this model built, recorded in its result rows (none by default)."""
        return {}

    def predict_proba(self, users: torch.Tensor, histories: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Probabilities that each candidate is relevant; only a model trained for relevance gives them."""
        raise TypeError(f"model {self.name!r} has no predict_proba: it is a ranker, so calibrate it on the "
                        f"validation pairs first (benchmarks.relevance.calibrate)")


def gather_candidates(all_scores: torch.Tensor, candidates: torch.Tensor | None) -> torch.Tensor:
    """Scores of ``candidates`` from a full ``(B, n_items + 1)`` score matrix (or all of it)."""
    return all_scores if candidates is None else all_scores.gather(1, candidates)


class NeuralRecommender(nn.Module, Recommender):
    """A model trained by the shared :class:`benchmarks.trainer.Trainer`.

    A subclass says only how to lay out its training examples (:meth:`training_examples`, built once and kept
    on the device), how a batch of them becomes a loss (:meth:`loss`) and how histories become scores.
    """

    def __init__(self, n_users: int, n_items: int, config):
        nn.Module.__init__(self)
        Recommender.__init__(self, n_users, n_items, config)

    @property
    def device(self) -> torch.device:
        parameter = next(self.parameters(), None)
        return parameter.device if parameter is not None else torch.device("cpu")

    @abstractmethod
    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        """Row-aligned CPU tensors, one row per training example; the trainer moves them to the device once
        and slices shuffled row batches from them every epoch (in row order when :attr:`ordered_examples`)."""

    def parameter_groups(self) -> list[dict]:
        """Parameter groups for the optimiser, each may set its own options; by default one group of all."""
        return [{"params": list(self.parameters())}]

    @property
    def ordered_examples(self) -> bool:
        """True when the rows of :meth:`training_examples` are consecutive steps that must be visited in order
        every epoch, never shuffled (GRU4Rec's session-parallel mini-batches carry a hidden state across them)."""
        return False

    @abstractmethod
    def loss(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        """The training loss of one batch; random draws (negatives, masks) use ``generator``."""
