"""BPR-MF: matrix factorisation trained with Bayesian Personalised Ranking.

Rendle et al., "BPR: Bayesian Personalized Ranking from Implicit Feedback", UAI 2009. The BERT4Rec authors ran
their own TensorFlow BPR-MF, which is not public; this is the model as Rendle et al. define it.
- Score (MF):   x̂_ui = p_u · q_i
- Loss (BPR-Opt, §4.1):  −Σ ln σ(x̂_ui − x̂_uj) + λ (‖p_u‖² + ‖q_i‖² + ‖q_j‖²),
  one negative j ∉ I_u⁺ per observed (u, i), drawn uniformly (the paper's LearnBPR) or, with ``sample_alpha``
  > 0, with probability ∝ supp_j^α (supp_j: j's training interactions), a switch measured in
  ``models/fidelity.md`` because the paper's test candidates are drawn by popularity.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recbench.datasets.sequences import Histories
from recbench.models.base import NeuralRecommender, ScoreFactors, require
from recbench.models.sampling import InteractionSet, support_weights, uniform_negatives, weighted_negatives


@dataclass
class BPRMFConfig:
    hidden: int = 64  # factor dimension d
    reg: float = 1e-4  # λ of BPR-Opt, per example
    init_std: float = 0.01
    sample_alpha: float = 0.0  # negatives ∝ supp^α; 0: uniform over all items (LearnBPR)

    def __post_init__(self):
        require(self, self.hidden >= 1, "hidden", "be >= 1")
        require(self, self.reg >= 0, "reg", "be >= 0")
        require(self, self.init_std > 0, "init_std", "be > 0")
        require(self, self.sample_alpha >= 0, "sample_alpha", "be >= 0 (0: uniform negatives)")


class BPRMF(NeuralRecommender):
    name = "bprmf"
    Config = BPRMFConfig

    def __init__(self, n_users: int, n_items: int, config: BPRMFConfig):
        super().__init__(n_users, n_items, config)
        self.user_factors = nn.Embedding(n_users, config.hidden)
        self.item_factors = nn.Embedding(n_items + 1, config.hidden, padding_idx=0)
        nn.init.normal_(self.user_factors.weight, std=config.init_std)
        nn.init.normal_(self.item_factors.weight, std=config.init_std)
        with torch.no_grad():
            self.item_factors.weight[0].zero_()
        self.register_buffer("sample_weights", torch.zeros(n_items + 1), persistent=False)
        self.seen: InteractionSet | None = None

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        self.seen = InteractionSet(train, self.n_items)
        if self.config.sample_alpha > 0:
            self.sample_weights = support_weights(train, self.n_items, self.config.sample_alpha).to(self.device)
        row_of, items = train.flat(np.arange(len(train)))
        return {"users": torch.from_numpy(train.users[row_of]), "items": torch.from_numpy(items)}

    def negatives(self, users: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One negative per example, never an item the user had in training."""
        if self.config.sample_alpha > 0:
            return weighted_negatives(self.sample_weights, users.shape, generator, users, self.seen)
        return uniform_negatives(self.n_items, users.shape, generator, users.device, users, self.seen)

    def loss(self, batch, generator):
        users, positives = batch["users"], batch["items"]
        negatives = self.negatives(users, generator)
        p_u = self.user_factors(users)
        q_i, q_j = self.item_factors(positives), self.item_factors(negatives)
        x_uij = (p_u * q_i).sum(-1) - (p_u * q_j).sum(-1)
        regulariser = p_u.pow(2).sum(-1) + q_i.pow(2).sum(-1) + q_j.pow(2).sum(-1)
        return -F.logsigmoid(x_uij).mean() + self.config.reg * regulariser.mean()

    def score_factors(self, users, histories) -> ScoreFactors:
        """x̂_ui = p_u · q_i."""
        return ScoreFactors(self.user_factors(users), self.item_factors.weight, None)

    def score(self, users, histories, candidates):
        factors = self.score_factors(users, histories)
        if candidates is None:
            return factors.full()
        return (factors.queries[:, None, :] * self.item_factors(candidates)).sum(-1)
