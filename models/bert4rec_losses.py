"""The BERT4Rec network trained with the loss as a setting: gBERT4Rec (``gbert4rec``), the name Petrov & Macdonald
give BERT4Rec trained with gBCE (gSASRec: RecSys 2023; their BERT4Rec with sampled negatives and gBCE is
``bert4recft.py`` of asash/RecJPQ).

The network, its Cloze copies and inference are BERT4Rec's (:mod:`models.bert4rec`); only the objective at the
masked positions changes (§3.6, eq. 8: the positives are the masked items v*_m, and no other position has a
target). Each masked position m is scored as eq. 7 scores it, before the softmax:
s_i = GELU(h_m W^P + b^P) · E_i + b^O_i, over the output embeddings and biases of BERT4Rec's training softmax
(:meth:`models.bert4rec.BERT4Rec.softmax_classes`). ``loss`` chooses (equations in :mod:`models.losses`):

- ``"bce"``: binary cross-entropy of s⁺ = s_{v*_m} against k = ``negatives`` sampled items;
- ``"gbce"``: gBCE with k negatives and calibration ``gbce_t`` = t, β = α(t(1 − 1/α) + 1/α), α = k / (|I| − 1);
- ``"sampled-softmax"``: the softmax over the masked item and its k negatives, ``logq`` the logQ correction;
- ``"softmax"``: the full softmax of eq. 8, BERT4Rec's own loss (the same value on the same batch and draws).

The negatives are drawn from the n items only, never from the special tokens of ``softmax_classes =
"vocabulary"``, one set per masked position (``negatives_per = "position"``) or one per Cloze copy shared by its
masked positions (``"sequence"``); the rest of the sampler (:mod:`models.loss_family`) is SASRec's family's.

Registered defaults (``benchmarks/configs/gbert4rec.toml``): BERT4Rec's network, Cloze copies and schedule per
dataset and profile, unchanged but for the converge profile's patience, which waits out gBCE's plateau at POP's level
as gSASRec's does, so that the loss is the only other change; gBCE with k = 256 uniform negatives per
position and t = 0.75, the values the gSASRec README recommends (no configuration in the authors' code sets
gBERT4Rec's). Where this differs from the authors' code is in ``models/fidelity.md``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from recbench.datasets.sequences import Histories
from recbench.models.base import ScoreFactors, require_choice
from recbench.models.bert4rec import BERT4Rec, BERT4RecConfig
from recbench.models.loss_family import LossFamily, LossSettings

OUTPUT_HEADS = ("bert4rec", "item-embedding")


@dataclass
class BERT4RecLossConfig(LossSettings, BERT4RecConfig):
    """BERT4Rec's fields, then the loss's: a class of its own, so that ``bert4rec``'s fields, and with them the
    keys of its stored results, stay as they are."""

    # "bert4rec": eq. 7, GELU(h W^P + b^P), the head's LayerNorm, then E and b^O; "item-embedding": the encoder's
    # output h against the item embedding E alone, as the authors' gBERT4Rec code scores (no W^P, LayerNorm or b^O)
    output_head: str = "bert4rec"

    def __post_init__(self):
        super().__post_init__()
        require_choice(self, "output_head", OUTPUT_HEADS)


class GBERT4Rec(LossFamily, BERT4Rec):
    """BERT4Rec's network trained with the loss of its ``loss`` setting at the masked positions (module
    docstring); registered with gBCE, k = 256, t = 0.75 (``gbert4rec.toml``)."""

    name = "gbert4rec"
    Config = BERT4RecLossConfig

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        """BERT4Rec's examples, each with its window's user (whose items ``exclude_seen`` avoids)."""
        examples = super().training_examples(train)
        self.fit_negatives(train)
        rows, _ = self.window_ends(train)
        examples["users"] = torch.from_numpy(train.users[rows])[examples["window"]]
        return examples

    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        """Eq. 7's left factor, or under ``output_head = "item-embedding"`` the encoder's output itself."""
        return hidden if self.config.output_head == "item-embedding" else super().transform(hidden)

    def softmax_classes(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """BERT4Rec's classes; under ``output_head = "item-embedding"`` without their biases."""
        weight, bias, offset = super().softmax_classes()
        return (weight, torch.zeros_like(bias), offset) if self.config.output_head == "item-embedding" else (
            weight, bias, offset)

    def score_factors(self, users, histories) -> ScoreFactors:
        factors = super().score_factors(users, histories)
        return factors._replace(bias=None) if self.config.output_head == "item-embedding" else factors

    def loss(self, batch, generator):
        if self.config.loss == "softmax":
            return super().loss(batch, generator)
        queries, targets, rows = self.masked_outputs(batch, generator)
        weight, bias, offset = classes = self.softmax_classes()
        negatives, negative_scores = self.negative_scores(queries, rows, batch["users"], generator, classes)
        positive_scores = (queries * weight[targets - offset]).sum(-1) + bias[targets - offset]
        return self.sampled_loss(positive_scores, negative_scores, targets, negatives)
