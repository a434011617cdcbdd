"""The LSTM baseline of the second source for relevance prediction (``PAPER.md``, "Two tasks", task 2).

The network is :class:`models.lstm.LSTM`'s, unchanged:
- user vector u_t = w_1 o_t + w_2 (1/t) Σ_{k≤t} e_{vk}, the learned weighted sum of the LSTM's last output and the
  mean pooling of the input item vectors;
- the candidate c is judged by the same bilinear form with a bias as the next-item output layer,
  s(u_t, c) = u_t · w_c + b_c, and P(relevant) = σ(s).

Training (``models.relevance``): binary cross-entropy of every position's true next item against ``negatives``
items drawn uniformly outside the user's training sequence, plus L2. As in the next-item LSTM, every position of
a training window is an example, so one pass of the LSTM gives a positive for every next item of the training
sequences, each judged from its own past.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import require
from recbench.models.lstm import LSTM, LSTMConfig
from recbench.models.recurrent import windows_per_user
from recbench.models.relevance import RelevanceModel
from recbench.models.sampling import InteractionSet


@dataclass
class LSTMRelevanceConfig(LSTMConfig):
    negatives: int = 1  # k sampled negative candidates per positive

    def __post_init__(self):
        super().__post_init__()
        require(self, self.negatives >= 1, "negatives", "be >= 1")


class LSTMRelevance(RelevanceModel, LSTM):
    name = "lstm-rel"
    Config = LSTMRelevanceConfig

    def __init__(self, n_users: int, n_items: int, config: LSTMRelevanceConfig):
        super().__init__(n_users, n_items, config)
        self.seen: InteractionSet | None = None

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        """The next-item LSTM's windows, each with its user (negatives avoid the user's training items)."""
        self.seen = InteractionSet(train, self.n_items)
        owners = train.users[np.repeat(np.arange(len(train)), windows_per_user(train, self.config.max_len))]
        return {**super().training_examples(train), "users": torch.from_numpy(owners)}

    def loss(self, batch, generator):
        states, positives = self.positions(batch, generator)  # real positions, row by row
        users = batch["users"].repeat_interleave((batch["windows"][:, 1:] != PAD).sum(1))
        return self.sampled_bce(lambda candidates: self.item_scores(states, candidates), users, positives,
                                self.seen, generator)
