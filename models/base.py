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

A model whose full score matrix is a product, score(u, i) = q_u · e_i + b_i (SASRec, BERT4Rec, BPR-MF, Caser),
also defines ``score_factors(users, histories) -> ScoreFactors`` and builds its full scores from them
(:meth:`ScoreFactors.full`). The evaluator then ranks all items without holding the ``(B, n_items + 1)`` matrix:
it multiplies the queries by one tile of items at a time while the tile is in the cache.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
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


def require(settings, condition: bool, field: str, rule: str) -> None:
    """The one shape of a setting's error, raised by the ``__post_init__`` of every config dataclass (model
    configs and the trainer's settings): ``heads=3 must divide hidden=64``. The harness prefixes the model."""
    if not condition:
        raise ValueError(f"{field}={show(getattr(settings, field))} must {rule}")


def require_choice(settings, field: str, choices) -> None:
    """``require`` for a setting that takes one of a few names: ``loss='xyz' must be one of top1, bpr``."""
    require(settings, getattr(settings, field) in choices, field, f"be one of {', '.join(map(str, choices))}")


class Recommender(ABC):
    """Base of all models, neural or not. A model without gradient training (POP) also defines
    ``fit(train) -> dict``, its fit report (epochs run, best epoch, the validation curve, train seconds)."""

    name: ClassVar[str]
    Config: ClassVar[type]

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

    @property
    def ordered_examples(self) -> bool:
        """True when the rows of :meth:`training_examples` are consecutive steps that must be visited in order
        every epoch, never shuffled (GRU4Rec's session-parallel mini-batches carry a hidden state across them)."""
        return False

    @abstractmethod
    def loss(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        """The training loss of one batch; random draws (negatives, masks) use ``generator``."""
