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
from recbench.models.loss_family import LossFamily, LossSettings
from recbench.models.sasrec import SASRec, SASRecConfig
from recbench.models.transformer_fast import softmax_cross_entropy


@dataclass
class SASRecLossConfig(LossSettings, SASRecConfig):
    shared_output: bool = True  # score with the input item embedding M (SASRec); false: an output table of its own


class SASRecLosses(LossFamily, SASRec):
    """SASRec's network trained with the loss of its ``loss`` setting (module docstring)."""

    name = "sasrec-losses"
    Config = SASRecLossConfig

    def __init__(self, n_users: int, n_items: int, config: SASRecLossConfig):
        super().__init__(n_users, n_items, config)
        if not config.shared_output:  # the gSASRec code's default (reuse_item_embeddings=False)
            self.output_embedding = torch.nn.Embedding(n_items + 1, config.hidden)
            torch.nn.init.xavier_uniform_(self.output_embedding.weight)

    @property
    def item_embedding(self) -> torch.Tensor:
        """The output item table that scores F_t: M itself, or the model's own output table."""
        return self.encoder.item_embedding.weight if self.config.shared_output else self.output_embedding.weight

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        self.fit_negatives(train)
        return self._windows(train)

    def loss(self, batch, generator):
        hidden, targets, rows = self._encode(batch)
        if self.config.loss == "softmax":  # logits over the real items 1..n_items only, as SASRec-CE
            return softmax_cross_entropy(hidden, self.item_embedding[1:self.n_items + 1], targets - 1)
        negatives, negative_scores = self.negative_scores(hidden, rows, batch["users"], generator,
                                                          (self.item_embedding, None, 0))
        positive_scores = (hidden * self.item_embedding[targets]).sum(-1)
        return self.sampled_loss(positive_scores, negative_scores, targets, negatives)


class GSASRec(SASRecLosses):
    """gSASRec: gBCE with k = 256 uniform negatives per position and t = 0.75 (``gsasrec.toml``)."""

    name = "gsasrec"


class SASRecSampledSoftmax(SASRecLosses):
    """SASRec with a sampled softmax over 3,000 uniform negatives per sequence (``sasrec-ss.toml``)."""

    name = "sasrec-ss"
