"""The loss as a setting of a network, shared by the networks that take it: SASRec's (:mod:`models.sasrec_losses`)
and BERT4Rec's (:mod:`models.bert4rec_losses`). A config adds :class:`LossSettings` to its network's fields; the
model adds :class:`LossFamily`, which draws the negatives and evaluates the chosen loss of :mod:`models.losses` on
the scores s⁺ of the positions' positives and s⁻ of their k negatives. The full softmax (``"softmax"``) draws no
negatives and is each network's own, so each model computes it itself.

Negatives (``sampler``): ``"uniform"`` over all items or ``"popularity"`` in proportion to the training counts,
drawn with replacement, one set per position (``negatives_per = "position"``) or one set per training sequence
shared by its positions (``"sequence"``); ``exclude_seen`` redraws an item the user interacted with in training.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from recbench.datasets.sequences import Histories
from recbench.models.base import require, require_choice
from recbench.models.losses import binary_cross_entropy, gbce_beta, log_expected_counts, sampled_softmax
from recbench.models.sampling import InteractionSet, support_weights, uniform_negatives, weighted_negatives

LOSSES = ("bce", "gbce", "sampled-softmax", "softmax")
SAMPLERS = ("uniform", "popularity")
NEGATIVES_PER = ("position", "sequence")


@dataclass
class LossSettings:
    """The loss fields of a config, named first among its bases (``class C(LossSettings, NetworkConfig)``) so
    that they follow the network's fields and the network's checks run before theirs."""

    loss: str = "gbce"  # "bce", "gbce", "sampled-softmax" or "softmax" (models/losses.py)
    negatives: int = 256  # k: negatives per positive (unused by "softmax")
    gbce_t: float = 0.75  # t: gBCE's calibration, β = α(t(1 − 1/α) + 1/α) (unused by the other losses)
    sampler: str = "uniform"  # "uniform" or "popularity" (∝ training counts)
    logq: bool = False  # sampled softmax: subtract log(k·Q(i)) from every logit
    negatives_per: str = "position"  # "position": k per position; "sequence": k per sequence, shared
    exclude_seen: bool = False  # redraw negatives the user interacted with in training

    def __post_init__(self):
        super().__post_init__()
        require_choice(self, "loss", LOSSES)
        require_choice(self, "sampler", SAMPLERS)
        require_choice(self, "negatives_per", NEGATIVES_PER)
        require(self, isinstance(self.negatives, int) and self.negatives >= 1, "negatives", "be an integer ≥ 1")
        require(self, 0.0 <= self.gbce_t <= 1.0, "gbce_t", "be in [0, 1]")
        require(self, not self.logq or self.loss == "sampled-softmax", "logq",
                "be false unless loss='sampled-softmax' (the correction is of the sampled softmax)")


class LossFamily:
    """Named before the network's class among a model's bases: the negatives and the sampled losses of a model
    whose config holds :class:`LossSettings` (module docstring)."""

    def fit_negatives(self, train: Histories) -> None:
        """The sampler's state for ``train``: the user's items to avoid, the popularity weights by item id, and
        the logQ correction log(k·Q(i)) by item id."""
        c = self.config
        self.seen = InteractionSet(train, self.n_items) if c.exclude_seen and c.loss != "softmax" else None
        self.sample_weights = support_weights(train, self.n_items, 1.0) if c.sampler == "popularity" else None
        self.log_q = None
        if c.logq:
            weights = self.sample_weights if self.sample_weights is not None else \
                torch.ones(self.n_items + 1).index_fill_(0, torch.tensor([0]), 0.0)
            self.log_q = log_expected_counts(weights / weights.sum(), c.negatives)

    def _negatives(self, shape: tuple, users: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """k negative item ids per row of ``users`` (``shape`` = (rows, k)), from the configured sampler."""
        if self.config.sampler == "popularity":
            if self.sample_weights.device != users.device:
                self.sample_weights = self.sample_weights.to(users.device)
            return weighted_negatives(self.sample_weights, shape, generator, users[:, None], self.seen)
        return uniform_negatives(self.n_items, shape, generator, users.device, users[:, None], self.seen)

    def negative_scores(self, queries: torch.Tensor, rows: torch.Tensor, users: torch.Tensor,
                        generator: torch.Generator, classes: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """The negatives' item ids (N, k) and scores (N, k) for N positions with ``queries`` (N, d), from batch
        rows ``rows`` (N,) of the users ``users`` (B,); ``classes`` = (output embeddings, their biases or None,
        offset from an item id to its row), and s⁻ = query · embedding (+ bias)."""
        c = self.config
        table, bias, offset = classes
        if c.negatives_per == "position":
            negatives = self._negatives((len(rows), c.negatives), users[rows], generator)
            scores = (table[negatives - offset] @ queries[:, :, None]).squeeze(-1)
        else:  # one set per sequence: (B, k) negatives, each position scores its row's set
            drawn = self._negatives((len(users), c.negatives), users, generator)
            scores, negatives = row_scores(queries, rows, table[drawn - offset]), drawn[rows]
        return negatives, scores if bias is None else scores + bias[negatives - offset]

    def sampled_loss(self, positive: torch.Tensor, negative: torch.Tensor, targets: torch.Tensor,
                     negatives: torch.Tensor) -> torch.Tensor:
        """The configured loss (not the full softmax) of positives scored ``positive`` (N,), with item ids
        ``targets`` (N,), against ``negatives`` (N, k) scored ``negative`` (N, k)."""
        c = self.config
        if c.loss == "sampled-softmax":
            if c.logq:
                if self.log_q.device != positive.device:  # moved once, not copied every step
                    self.log_q = self.log_q.to(positive.device)
                return sampled_softmax(positive, negative, self.log_q[targets], self.log_q[negatives])
            return sampled_softmax(positive, negative)
        beta = gbce_beta(c.negatives, self.n_items, c.gbce_t) if c.loss == "gbce" else 1.0
        return binary_cross_entropy(positive, negative, beta)


def row_scores(queries: torch.Tensor, rows: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
    """query_t · e_j for each position t and each of its row's k embeddings ``embeddings`` (B, k, d), (N, k), by
    one batched product over the rows instead of gathering k embeddings per position."""
    counts = torch.bincount(rows, minlength=len(embeddings))
    width = int(counts.max())
    offsets = torch.arange(len(rows), device=rows.device) - (torch.cumsum(counts, 0) - counts)[rows]
    padded = queries.new_zeros(len(embeddings), width, queries.shape[-1])
    padded[rows, offsets] = queries
    scores = torch.bmm(padded, embeddings.transpose(1, 2))  # (B, width, k)
    return scores[rows, offsets]
