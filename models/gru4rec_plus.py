"""GRU4Rec+: GRU4Rec's network trained with many shared negatives and the ranking-max losses.

Hidasi & Karatzoglou, "Recurrent Neural Networks with Top-k Gains for Session-based Recommendations",
CIKM 2018 (arXiv 1706.03847). The network (embedding, GRU, output layer) is :class:`models.gru4rec.GRU4Rec`'s;
what changes is the training signal:

- Additional samples (the paper's extended output sampling): besides the mini-batch's own targets, N_A items
  drawn once per mini-batch and shared by all its examples, with probability ∝ supp_i^α (supp_i: the item's
  training interactions; α = 0 uniform, α = 1 popularity).
- The ranking-max loss family: the negatives are weighted by their softmax s_j = exp(r̂_j) / Σ_k exp(r̂_k), so
  the loss follows the highest-scored negatives instead of averaging many irrelevant ones to a vanishing
  gradient:
    BPR-max:   L = −log Σ_j s_j σ(r̂_i − r̂_j) + λ Σ_j s_j r̂_j²     (the second term: score regularisation)
    TOP1-max:  L = Σ_j s_j (σ(r̂_j − r̂_i) + σ(r̂_j²))
A negative equal to the example's target is dropped for that example (its s_j is zero).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from datasets.sequences import Histories
from models.gru4rec import GRU4Rec, GRU4RecConfig
from models.sampling import popularity_negatives

_EXCLUDED = -1e9  # softmax logit of a dropped negative: weight exp(-1e9) = 0, finite in bf16 and float32


@dataclass
class GRU4RecPlusConfig(GRU4RecConfig):
    loss: str = "bpr-max"  # "bpr-max" or "top1-max"
    n_sample: int = 2048  # N_A additional negatives shared by a mini-batch
    sample_alpha: float = 0.3  # α of the sampling distribution supp_i^α
    bpreg: float = 1.0  # λ of BPR-max's score regularisation


class GRU4RecPlus(GRU4Rec):
    name = "gru4rec+"
    Config = GRU4RecPlusConfig
    losses = ("bpr-max", "top1-max")

    def __init__(self, n_users: int, n_items: int, config: GRU4RecPlusConfig):
        super().__init__(n_users, n_items, config)
        if config.n_sample < 0 or config.sample_alpha < 0:
            raise ValueError(f"{self.name}: n_sample and sample_alpha must be >= 0, "
                             f"got {config.n_sample} and {config.sample_alpha}")
        self.register_buffer("sample_weights", torch.zeros(n_items + 1), persistent=False)

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        support = torch.from_numpy(np.bincount(train.items, minlength=self.n_items + 1)).float()
        weights = support.pow(self.config.sample_alpha) * (support > 0)  # never-seen items and padding: 0
        self.sample_weights = weights.to(self.sample_weights.device)
        return super().training_examples(train)

    def negatives(self, targets, generator):
        in_batch = super().negatives(targets, generator)
        if self.config.n_sample == 0:
            return in_batch
        return torch.cat([in_batch, popularity_negatives(self.sample_weights, self.config.n_sample, generator)])

    def loss(self, batch, generator):
        positive, negative, valid = self.scored_examples(batch, generator)
        negative = negative.float()  # the softmax weights in float32 under bf16 autocast
        log_s = torch.log_softmax(negative.masked_fill(~valid, _EXCLUDED), dim=1)
        s = log_s.exp()
        if self.config.loss == "bpr-max":
            ranking = -torch.logsumexp(log_s + F.logsigmoid(positive.float()[:, None] - negative), dim=1)
            per_example = ranking + self.config.bpreg * (s * negative.pow(2)).sum(1)
        else:
            per_example = (s * (torch.sigmoid(negative - positive.float()[:, None])
                                + torch.sigmoid(negative.pow(2)))).sum(1)
        return (per_example * valid.any(1)).mean()  # an example without any valid negative adds nothing
