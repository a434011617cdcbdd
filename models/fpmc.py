"""FPMC: matrix factorisation plus a factorised first-order Markov chain, trained with S-BPR.

Rendle, Freudenthaler & Schmidt-Thieme, "Factorizing Personalized Markov Chains for Next-Basket
Recommendation", WWW 2010. Here every basket is one item (the previous item is the whole basket B_{t-1}).

- Factorised transition cube, pairwise interaction model (FPMC):
    x̂_{u,l,i} = ⟨v^{U,I}_u, v^{I,U}_i⟩ + ⟨v^{I,L}_i, v^{L,I}_l⟩ (+ ⟨v^{U,L}_u, v^{L,U}_l⟩)
  The user-to-last-item term does not depend on the candidate i, so it cancels in every ranking and in the
  S-BPR differences; the paper drops it and so do we. The first term is MF (the user's taste), the second the
  factorised Markov chain (what follows item l).
- S-BPR criterion:  max Σ ln σ(x̂_{u,t,i} − x̂_{u,t,j}) − λ ‖Θ‖²  over observed transitions l → i of user u and
  items j ∉ B_t, learned from bootstrapped (u, t, i, j) draws. One negative per transition, drawn uniformly
  from the items the user never had in training (these data have no repeats, so a user's own items are never
  the next one either); λ applies to the vectors each example touches, as in LearnSBPR's updates.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import NeuralRecommender, require
from recbench.models.sampling import InteractionSet, uniform_negatives


@dataclass
class FPMCConfig:
    hidden: int = 64  # k_{U,I} = k_{I,L}: both factorisations' dimension
    reg: float = 1e-4  # λ of S-BPR, per example
    init_std: float = 0.01  # Gaussian initialisation of every factor

    def __post_init__(self):
        require(self, self.hidden >= 1, "hidden", "be >= 1")
        require(self, self.reg >= 0, "reg", "be >= 0")
        require(self, self.init_std > 0, "init_std", "be > 0")


class FPMC(NeuralRecommender):
    name = "fpmc"
    Config = FPMCConfig

    def __init__(self, n_users: int, n_items: int, config: FPMCConfig):
        super().__init__(n_users, n_items, config)
        d = config.hidden
        self.user_item = nn.Embedding(n_users, d)  # v^{U,I}_u
        self.item_user = nn.Embedding(n_items + 1, d)  # v^{I,U}_i
        self.item_last = nn.Embedding(n_items + 1, d)  # v^{I,L}_i
        self.last_item = nn.Embedding(n_items + 1, d, padding_idx=PAD)  # v^{L,I}_l; no previous item: 0
        for table in (self.user_item, self.item_user, self.item_last, self.last_item):
            nn.init.normal_(table.weight, std=config.init_std)
        with torch.no_grad():
            self.last_item.weight[PAD].zero_()
        self.seen: InteractionSet | None = None

    @property
    def history_length(self) -> int:
        return 1  # a first-order chain reads the last item only

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        self.seen = InteractionSet(train, self.n_items)
        row_of, items = train.flat(np.arange(len(train)))
        follows = np.flatnonzero(np.r_[False, row_of[1:] == row_of[:-1]])  # positions with a previous item
        return {"users": torch.from_numpy(train.users[row_of[follows]]),
                "previous": torch.from_numpy(items[follows - 1]),
                "items": torch.from_numpy(items[follows])}

    def transition_scores(self, users, previous, items):
        """x̂_{u,l,i} for ``items`` ``(B, C)`` given the user ``(B,)`` and the previous item ``(B,)``."""
        taste = (self.user_item(users)[:, None, :] * self.item_user(items)).sum(-1)
        chain = (self.last_item(previous)[:, None, :] * self.item_last(items)).sum(-1)
        return taste + chain

    def loss(self, batch, generator):
        users, previous, positives = batch["users"], batch["previous"], batch["items"]
        negatives = uniform_negatives(self.n_items, positives.shape, generator, positives.device, users, self.seen)
        x = self.transition_scores(users, previous, torch.stack([positives, negatives], 1))
        touched = (self.user_item(users), self.last_item(previous), self.item_user(positives),
                   self.item_last(positives), self.item_user(negatives), self.item_last(negatives))
        regulariser = sum(v.pow(2).sum(-1) for v in touched)
        return -F.logsigmoid(x[:, 0] - x[:, 1]).mean() + self.config.reg * regulariser.mean()

    def score(self, users, histories, candidates):
        previous = histories[:, -1]
        if candidates is None:
            return (self.user_item(users) @ self.item_user.weight.T
                    + self.last_item(previous) @ self.item_last.weight.T)
        return self.transition_scores(users, previous, candidates)
