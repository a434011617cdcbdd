"""GRU4Rec+: GRU4Rec's network trained with many shared negatives and the ranking-max losses.

Hidasi & Karatzoglou, "Recurrent Neural Networks with Top-k Gains for Session-based Recommendations",
CIKM 2018 (arXiv 1706.03847); built as the authors' Theano code (``hidasib/GRU4Rec``, 2018 version) builds it
with that code's defaults. The network and the session-parallel mini-batches are
:class:`models.gru4rec.GRU4Rec`'s; what changes is the training signal:

- Additional samples (the paper's extended output sampling): besides the step's other targets, N_A = ``n_sample``
  items drawn with replacement once per step and shared by all its examples, with probability ∝ supp_i^α
  (supp_i: the item's training interactions; α = ``sample_alpha``, 0 uniform, 1 popularity). The code keeps a
  store of pre-drawn samples only for speed; the draws are the same independent ones.
- The ranking-max loss family: the negatives are weighted by their softmax s_j = exp(r̂_j) / Σ_k exp(r̂_k)
  over the columns j ≠ i, so the loss follows the highest-scored negatives instead of averaging many irrelevant
  ones to a vanishing gradient:
    BPR-max:   L = −log Σ_j s_j σ(r̂_i − r̂_j) + λ Σ_j s_j r̂_j²     (λ = ``bpreg``: score regularisation)
    TOP1-max:  L = Σ_j s_j (σ(r̂_j − r̂_i) + σ(r̂_j²))
As in the code, an additional sample equal to an example's target still counts as a negative.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from recbench.datasets.sequences import Histories
from recbench.models.base import require
from recbench.models.gru4rec import GRU4Rec, GRU4RecConfig, ranking_loss
from recbench.models.sampling import support_weights, weighted_negatives


@dataclass
class GRU4RecPlusConfig(GRU4RecConfig):
    dropout_hidden: float = 0.0  # the code's default
    final_act: str = "linear"  # the code's default
    loss: str = "bpr-max"  # "bpr-max" or "top1-max"
    session_batch: int = 32  # the code's default mini-batch
    n_sample: int = 2048  # N_A additional negatives shared by a step
    sample_alpha: float = 0.75  # α of the sampling distribution supp^α (the code's default)
    bpreg: float = 1.0  # λ of BPR-max's score regularisation (the code's default)

    losses = ("bpr-max", "top1-max")

    def __post_init__(self):
        super().__post_init__()
        require(self, self.n_sample >= 0, "n_sample", "be >= 0")
        require(self, self.sample_alpha >= 0, "sample_alpha", "be >= 0")
        require(self, self.bpreg >= 0, "bpreg", "be >= 0")


class GRU4RecPlus(GRU4Rec):
    name = "gru4rec+"
    Config = GRU4RecPlusConfig

    def __init__(self, n_users: int, n_items: int, config: GRU4RecPlusConfig):
        super().__init__(n_users, n_items, config)
        self.register_buffer("sample_weights", torch.zeros(n_items + 1), persistent=False)

    @property
    def n_sample(self) -> int:
        return self.config.n_sample

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        self.sample_weights = support_weights(train, self.n_items, self.config.sample_alpha).to(self.device)
        return super().training_examples(train)

    def extra_negatives(self, generator):
        if self.config.n_sample == 0:
            return None
        return weighted_negatives(self.sample_weights, (self.config.n_sample,), generator)

    def ranking(self, positive, negative, valid):
        return ranking_loss(self.config.loss, positive, negative, valid, self.config.bpreg)
