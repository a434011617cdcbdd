"""The SASRec network trained with the loss as a setting: gSASRec (``gsasrec``) and SASRec with a sampled softmax
(``sasrec-ss``).

The network, its switches and inference are SASRec's (:mod:`models.sasrec`: the official block, the shared item
embedding as output layer, r_{i,t} = F_t · M_i); only the training objective at each non-padding position t, with
the next item o_t as positive, is chosen by ``loss`` (equations in :mod:`models.losses`):

- ``"bce"``: binary cross-entropy with ``negatives`` = k sampled negatives (SASRec's loss for k = 1);
- ``"gbce"``: gBCE with k negatives and calibration ``gbce_t`` = t (gSASRec, Petrov & Macdonald, RecSys 2023);
- ``"sampled-softmax"``: the softmax over the positive and k negatives, with ``logq`` the logQ correction;
- ``"softmax"``: the full softmax over every item (SASRec-CE; Klenitskiy & Vasilev, RecSys 2023), no negatives.

Negatives (``sampler``): ``"uniform"`` over all items or ``"popularity"`` in proportion to the training counts,
drawn with replacement, one set per position (``negatives_per = "position"``, the gSASRec code's
``RandomNegativesSampler``) or one set per sequence shared by its positions (``"sequence"``, the Klenitskiy &
Vasilev code's default); ``exclude_seen`` redraws an item the user interacted with in training, as SASRec's code
does for its one negative (neither the gSASRec nor the Klenitskiy & Vasilev code excludes them).

Registered defaults, each from its paper with SASRec's network settings so that the loss is the only change
(``benchmarks/configs/gsasrec.toml``, ``sasrec-ss.toml``): gSASRec k = 256, t = 0.75, uniform per-position negatives
(the authors' README recommends k = 256, t = 0.75); sampled softmax k = 3,000 uniform negatives per sequence
(Klenitskiy & Vasilev's ML-1m setting). gSASRec's schedule waits 100 epochs for a better validation (SASRec's: 20):
binary cross-entropy over many uniform negatives first holds every score near the constant that fits the negatives,
at POP's accuracy, for tens of epochs before it learns. Every combination is open to ``--set``: ``--set gsasrec:loss=bce
--set gsasrec:negatives=1 --set gsasrec:exclude_seen=true`` trains SASRec's own objective (up to the constant
factor of :func:`models.losses.binary_cross_entropy`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from recbench.datasets.sequences import Histories
from recbench.models.base import require, require_choice
from recbench.models.losses import binary_cross_entropy, gbce_beta, log_expected_counts, sampled_softmax
from recbench.models.sampling import InteractionSet, support_weights, uniform_negatives, weighted_negatives
from recbench.models.sasrec import SASRec, SASRecConfig
from recbench.models.transformer_fast import softmax_cross_entropy

LOSSES = ("bce", "gbce", "sampled-softmax", "softmax")
SAMPLERS = ("uniform", "popularity")
NEGATIVES_PER = ("position", "sequence")


@dataclass
class SASRecLossConfig(SASRecConfig):
    loss: str = "gbce"  # "bce", "gbce", "sampled-softmax" or "softmax" (module docstring)
    negatives: int = 256  # k: negatives per positive (unused by "softmax")
    gbce_t: float = 0.75  # t: gBCE's calibration, β = α(t(1 − 1/α) + 1/α) (unused by the other losses)
    sampler: str = "uniform"  # "uniform" or "popularity" (∝ training counts)
    logq: bool = False  # sampled softmax: subtract log(k·Q(i)) from every logit
    negatives_per: str = "position"  # "position": k per position; "sequence": k per sequence, shared
    exclude_seen: bool = False  # redraw negatives the user interacted with in training
    shared_output: bool = True  # score with the input item embedding M (SASRec); false: an output table of its own

    def __post_init__(self):
        super().__post_init__()
        require_choice(self, "loss", LOSSES)
        require_choice(self, "sampler", SAMPLERS)
        require_choice(self, "negatives_per", NEGATIVES_PER)
        require(self, isinstance(self.negatives, int) and self.negatives >= 1, "negatives", "be an integer ≥ 1")
        require(self, 0.0 <= self.gbce_t <= 1.0, "gbce_t", "be in [0, 1]")
        require(self, not self.logq or self.loss == "sampled-softmax", "logq",
                "be false unless loss='sampled-softmax' (the correction is of the sampled softmax)")


class SASRecLosses(SASRec):
    """SASRec's network trained with the loss of its ``loss`` setting (module docstring)."""

    name = "sasrec-losses"
    Config = SASRecLossConfig

    def __init__(self, n_users: int, n_items: int, config: SASRecLossConfig):
        super().__init__(n_users, n_items, config)
        self.sample_weights: torch.Tensor | None = None  # popularity sampler: training counts by item id
        self.log_q: torch.Tensor | None = None  # logQ correction: log(k·Q(i)) by item id
        if not config.shared_output:  # the gSASRec code's default (reuse_item_embeddings=False)
            self.output_embedding = torch.nn.Embedding(n_items + 1, config.hidden)
            torch.nn.init.xavier_uniform_(self.output_embedding.weight)

    @property
    def item_embedding(self) -> torch.Tensor:
        """The output item table that scores F_t: M itself, or the model's own output table."""
        return self.encoder.item_embedding.weight if self.config.shared_output else self.output_embedding.weight

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        c = self.config
        self.seen = InteractionSet(train, self.n_items) if c.exclude_seen and c.loss != "softmax" else None
        if c.sampler == "popularity":
            self.sample_weights = support_weights(train, self.n_items, 1.0)
        if c.logq:
            weights = self.sample_weights if self.sample_weights is not None else \
                torch.ones(self.n_items + 1).index_fill_(0, torch.tensor([0]), 0.0)
            self.log_q = log_expected_counts(weights / weights.sum(), c.negatives)
        return self._windows(train)

    def _negatives(self, shape: tuple, users: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """k negative item ids per row of ``users`` (``shape`` = (rows, k)), from the configured sampler."""
        if self.config.sampler == "popularity":
            if self.sample_weights.device != users.device:
                self.sample_weights = self.sample_weights.to(users.device)
            return weighted_negatives(self.sample_weights, shape, generator, users[:, None], self.seen)
        return uniform_negatives(self.n_items, shape, generator, users.device, users[:, None], self.seen)

    def loss(self, batch, generator):
        hidden, targets, rows = self._encode(batch)
        c = self.config
        if c.loss == "softmax":  # logits over the real items 1..n_items only, as SASRec-CE
            return softmax_cross_entropy(hidden, self.item_embedding[1:self.n_items + 1], targets - 1)
        if c.negatives_per == "position":
            negatives = self._negatives((len(rows), c.negatives), batch["users"][rows], generator)
            negative_scores = (self.item_embedding[negatives] @ hidden[:, :, None]).squeeze(-1)
        else:  # one set per sequence: (B, k) negatives, each position scores its row's set
            negatives = self._negatives((len(batch["users"]), c.negatives), batch["users"], generator)
            negative_scores, negatives = self._row_scores(hidden, rows, negatives), negatives[rows]
        positive_scores = (hidden * self.item_embedding[targets]).sum(-1)
        if c.loss == "sampled-softmax":
            if c.logq:
                if self.log_q.device != hidden.device:  # moved once, not copied every step
                    self.log_q = self.log_q.to(hidden.device)
                return sampled_softmax(positive_scores, negative_scores, self.log_q[targets], self.log_q[negatives])
            return sampled_softmax(positive_scores, negative_scores)
        beta = gbce_beta(c.negatives, self.n_items, c.gbce_t) if c.loss == "gbce" else 1.0
        return binary_cross_entropy(positive_scores, negative_scores, beta)

    def _row_scores(self, hidden: torch.Tensor, rows: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        """F_t · M_j for each position t and each negative j of its row's set, (N, k), by one batched product
        over the rows instead of gathering k embeddings per position."""
        counts = torch.bincount(rows, minlength=len(negatives))
        width = int(counts.max())
        offsets = torch.arange(len(rows), device=rows.device) - (torch.cumsum(counts, 0) - counts)[rows]
        padded = hidden.new_zeros(len(negatives), width, hidden.shape[-1])
        padded[rows, offsets] = hidden
        scores = torch.bmm(padded, self.item_embedding[negatives].transpose(1, 2))  # (B, width, k)
        return scores[rows, offsets]


class GSASRec(SASRecLosses):
    """gSASRec: gBCE with k = 256 uniform negatives per position and t = 0.75 (``gsasrec.toml``)."""

    name = "gsasrec"


class SASRecSampledSoftmax(SASRecLosses):
    """SASRec with a sampled softmax over 3,000 uniform negatives per sequence (``sasrec-ss.toml``)."""

    name = "sasrec-ss"
