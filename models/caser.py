"""Caser: horizontal and vertical convolutions over the last L item embeddings, plus a user embedding.

Tang & Wang, "Personalized Top-N Sequential Recommendation via Convolutional Sequence Embedding", WSDM 2018.

- Embedding look-up: E = [Q_{S_{t-L}}; …; Q_{S_{t-1}}] ∈ R^{L×d}, user embedding P_u ∈ R^d.
- Horizontal convolutional layer: for each height h ∈ {1..L}, n_h filters F ∈ R^{h×d} slide over the rows,
  c_i = φ_c(E_{i:i+h-1} ⊙ F), and max pooling keeps o = max_i c_i per filter (union-level patterns of any length).
- Vertical convolutional layer: n_v filters F̃ ∈ R^{L×1}, c̃ = Σ_l F̃_l · E_l (a learned weighted sum of the L
  rows; point-level patterns), o' = [c̃^1 … c̃^{n_v}] ∈ R^{d·n_v}.
- Fully-connected layer: z = φ_a(W [o; o'] + b) ∈ R^d, dropout on [o; o'].
- Output layer: y^{(u,t)} = W' [z; P_u] + b', one score per item.
- Loss (the negative log-likelihood, i.e. binary cross-entropy): each window of L items predicts the next T
  items ("skip" behaviour): −Σ_{i ∈ next T} log σ(y_i) − Σ_j log(1 − σ(y_j)), with negatives j drawn
  uniformly from the items the user never had, 3 per target (§4).
φ_c = φ_a = ReLU. Windows whose L inputs reach before the sequence's start are padded with a zero embedding,
so short sequences still train (the first window reads only padding and learns from P_u alone).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from datasets.sequences import PAD, Histories
from models.base import NeuralRecommender
from models.sampling import InteractionSet, dropout, uniform_negatives


@dataclass
class CaserConfig:
    hidden: int = 64  # d: item, user and z dimension
    L: int = 5  # items read by the convolutions (Markov order)
    T: int = 3  # next items each window predicts
    n_h: int = 16  # horizontal filters per height h = 1..L
    n_v: int = 4  # vertical filters
    dropout: float = 0.5  # on the concatenated convolution features
    negatives: int = 3  # negatives per target


def caser_windows(train: Histories, L: int, T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (user, L previous items, next T items) of the training sequences: a window starts at each
    position k with k + T <= n; inputs before the sequence's start are PAD."""
    lengths = train.lengths
    row_of = np.repeat(np.arange(len(train), dtype=np.int64), lengths)
    local = np.arange(len(row_of), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    first = np.flatnonzero(local + T <= lengths[row_of])  # windows whose T targets all exist
    starts = train.offsets[row_of[first]]
    g = starts + local[first]  # flat index of each window's first target
    inputs_index = g[:, None] - L + np.arange(L)[None, :]
    inputs = np.where(inputs_index >= starts[:, None], train.items[np.maximum(inputs_index, 0)], PAD)
    targets = train.items[g[:, None] + np.arange(T)[None, :]]
    return train.users[row_of[first]], inputs, targets


class Caser(NeuralRecommender):
    name = "caser"
    Config = CaserConfig

    def __init__(self, n_users: int, n_items: int, config: CaserConfig):
        super().__init__(n_users, n_items, config)
        d, L = config.hidden, config.L
        if min(d, L, config.T, config.n_h, config.n_v, config.negatives) < 1:
            raise ValueError(f"{self.name}: hidden, L, T, n_h, n_v and negatives must all be >= 1; got {config}")
        self.item_embedding = nn.Embedding(n_items + 1, d, padding_idx=PAD)  # Q
        self.user_embedding = nn.Embedding(n_users, d)  # P
        self.horizontal = nn.ModuleList(nn.Conv2d(1, config.n_h, (h, d)) for h in range(1, L + 1))
        self.vertical = nn.Conv2d(1, config.n_v, (L, 1))
        self.fc = nn.Linear(config.n_h * L + config.n_v * d, d)  # W, b
        self.output = nn.Embedding(n_items + 1, 2 * d)  # W'
        self.output_bias = nn.Parameter(torch.zeros(n_items + 1))  # b'
        for table in (self.item_embedding, self.user_embedding, self.output):
            nn.init.normal_(table.weight, std=1.0 / d)  # small Gaussian, shrinking with d
        with torch.no_grad():
            self.item_embedding.weight[PAD].zero_()
        self.seen: InteractionSet | None = None

    @property
    def history_length(self) -> int:
        return self.config.L

    def represent(self, users, recent, generator=None) -> torch.Tensor:
        """[z; P_u] ``(B, 2d)`` from ``recent`` ``(B, L)`` items (left-padded)."""
        E = self.item_embedding(recent).unsqueeze(1)  # (B, 1, L, d): one input channel
        o = torch.cat([F.relu(conv(E)).squeeze(3).amax(2) for conv in self.horizontal], 1)  # (B, n_h·L)
        o_prime = self.vertical(E).flatten(1)  # (B, n_v·d)
        z = F.relu(self.fc(dropout(torch.cat([o, o_prime], 1), self.config.dropout, generator)))
        return torch.cat([z, self.user_embedding(users)], 1)

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        self.seen = InteractionSet(train, self.n_items)
        users, inputs, targets = caser_windows(train, self.config.L, self.config.T)
        return {"users": torch.from_numpy(users), "inputs": torch.from_numpy(inputs),
                "targets": torch.from_numpy(targets)}

    def loss(self, batch, generator):
        users, targets = batch["users"], batch["targets"]
        shape = (len(users), self.config.T * self.config.negatives)
        negatives = uniform_negatives(self.n_items, shape, generator, users.device, users[:, None], self.seen)
        x = self.represent(users, batch["inputs"], generator)
        positive = (x[:, None, :] * self.output(targets)).sum(-1) + self.output_bias[targets]
        negative = (x[:, None, :] * self.output(negatives)).sum(-1) + self.output_bias[negatives]
        return -F.logsigmoid(positive).mean() - F.logsigmoid(-negative).mean()

    def score(self, users, histories, candidates):
        recent = F.pad(histories, (max(0, self.config.L - histories.shape[1]), 0))[:, -self.config.L:]
        x = self.represent(users, recent)
        if candidates is None:
            return x @ self.output.weight.T + self.output_bias
        return (x[:, None, :] * self.output(candidates)).sum(-1) + self.output_bias[candidates]
