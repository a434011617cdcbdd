"""LSTM next-item baseline of the suite's second source (``PAPER.md``, "Two tasks"; that source is
described there, not named).

- Item vectors: e_v = E[v] (d-dimensional).
- An LSTM reads e_{v1} … e_{vt} and outputs o_t.
- User vector (the source's definition): a learned weighted sum of the LSTM's last output and the mean
  pooling of the input item vectors,  u_t = w_1 o_t + w_2 (1/t) Σ_{k≤t} e_{vk},  with (w_1, w_2) = softmax(θ)
  and θ learned (starting from equal weights).
- Next-item prediction: P(v_{t+1} = i) = softmax_i(u_t · w_i + b_i) over all items, trained with the
  cross-entropy of the true next item.

Every position of a training window is an example (its mean pooling is over the window's items up to that
position), so one pass of the LSTM yields a prediction for every next item, each seeing only the past.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from recbench.datasets.sequences import PAD
from recbench.models.base import require
from recbench.models.recurrent import RecurrentRecommender, run_rnn
from recbench.models.sampling import dropout


@dataclass
class LSTMConfig:
    hidden: int = 64  # d: item vectors and LSTM units (equal, so that the two parts of u can be summed)
    layers: int = 1  # stacked LSTM layers
    dropout: float = 0.2  # on the item vectors and on the user vector
    max_len: int = 200  # steps per training window and history length read when scoring

    def __post_init__(self):
        for field in ("hidden", "layers", "max_len"):
            require(self, getattr(self, field) >= 1, field, "be >= 1")
        require(self, 0 <= self.dropout < 1, "dropout", "be in [0, 1)")


class LSTM(RecurrentRecommender):
    name = "lstm"
    Config = LSTMConfig

    def __init__(self, n_users: int, n_items: int, config: LSTMConfig):
        super().__init__(n_users, n_items, config, config.hidden)
        self.item_embedding = nn.Embedding(n_items + 1, config.hidden, padding_idx=0)
        self.lstm = nn.LSTM(config.hidden, config.hidden, num_layers=config.layers, batch_first=True)
        self.mix = nn.Parameter(torch.zeros(2))  # θ: softmax(θ) weighs the last output and the mean pooling

    def encode(self, sequences, generator):
        e = dropout(self.item_embedding(sequences), self.config.dropout, generator)
        o = run_rnn(self.lstm, e)
        seen = (sequences != PAD).cumsum(1).clamp(min=1).unsqueeze(-1)  # t, per position (padding is behind)
        mean_pool = e.cumsum(1) / seen
        w = torch.softmax(self.mix, 0)
        return dropout(w[0] * o + w[1] * mean_pool, self.config.dropout, generator)

    def loss(self, batch, generator):
        states, targets = self.positions(batch, generator)
        return F.cross_entropy(self.item_scores(states)[:, 1:], targets - 1)  # over items 1..n, not padding
