"""Caser: horizontal and vertical convolutions over the last L item embeddings, plus a user embedding.

Tang & Wang, "Personalized Top-N Sequential Recommendation via Convolutional Sequence Embedding", WSDM 2018;
built as the first author's PyTorch port (``graytowne/caser_pytorch``, the code the BERT4Rec paper ran) builds it.

- Embedding look-up: E = [Q_{S_{t-L}}; …; Q_{S_{t-1}}] ∈ R^{L×d}, user embedding P_u ∈ R^d.
- Horizontal convolutional layer: for each height h ∈ {1..L}, n_h filters F ∈ R^{h×d} slide over the rows,
  c_i = φ_c(E_{i:i+h-1} ⊙ F), and max pooling keeps o = max_i c_i per filter (union-level patterns of any length).
- Vertical convolutional layer: n_v filters F̃ ∈ R^{L×1}, c̃ = Σ_l F̃_l · E_l (a learned weighted sum of the L
  rows, plus a bias; point-level patterns, no activation), o' = [c̃^1 … c̃^{n_v}] ∈ R^{d·n_v}.
- Fully-connected layer: z = φ_a(W [o; o'] + b) ∈ R^d, dropout on [o; o'].
- Output layer: y^{(u,t)} = W' [z; P_u] + b', one score per item.
- Loss (binary cross-entropy): each training window of L items predicts its next T items ("skip" behaviour),
  L = −mean_{i ∈ next T} log σ(y_i) − mean_j log(1 − σ(y_j)), with ``negatives`` items j per window drawn
  uniformly, with replacement, from the items the user never had in training. The port draws 3 per window (its
  docstring and the paper say 3 per target, and the MATLAB original draws 3·T); ``negatives`` counts per window.
- Windows (the port's ``to_sequence``): a sliding window of L + T items, step 1, over each training sequence, so
  the first target of a sequence is its (L+1)-th item; a sequence shorter than L + T gives one window, left-padded
  with item 0 (PAD). ``pad_windows`` (our earlier choice, kept as a switch) also trains the windows whose L inputs
  reach before the sequence's start, so every item is a first target (the first one predicted from PAD and P_u).
- Initialisation (the port): P, Q ~ N(0, (1/d)²), W' ~ N(0, (1/2d)²), b' = 0, convolutions and W, b PyTorch's
  defaults. PAD has an ordinary, trained embedding row, as in the port.
φ_c = φ_a = ReLU (the port's and the MATLAB original's defaults).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import NeuralRecommender, ScoreFactors, require
from recbench.models.sampling import InteractionSet, dropout, uniform_negatives


@dataclass
class CaserConfig:
    hidden: int = 64  # d: item, user and z dimension
    L: int = 5  # items read by the convolutions (Markov order)
    T: int = 3  # next items each window predicts
    n_h: int = 16  # horizontal filters per height h = 1..L
    n_v: int = 4  # vertical filters
    dropout: float = 0.5  # on the concatenated convolution features
    negatives: int = 3  # negatives per window
    pad_windows: bool = False  # also train windows whose inputs reach before the sequence's start

    def __post_init__(self):
        for field in ("hidden", "L", "T", "n_h", "n_v", "negatives"):
            require(self, getattr(self, field) >= 1, field, "be >= 1")
        require(self, 0 <= self.dropout < 1, "dropout", "be in [0, 1)")


def caser_windows(train: Histories, L: int, T: int, pad_windows: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (user, L previous items, next T items) training window (module docstring), positions outside the
    sequence PAD. A window is named by its first target's position k in the sequence: the port's windows have
    k >= L and k + T <= n, or, when n < L + T, the one window k = n - T (its padded positions before the start);
    ``pad_windows`` takes every k with k + T <= n."""
    lengths = train.lengths
    row_of = np.repeat(np.arange(len(train), dtype=np.int64), lengths)
    local = np.arange(len(row_of), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    n = lengths[row_of]
    if pad_windows:
        keep = local + T <= n
    else:
        keep = ((local >= L) & (local + T <= n)) | ((n < L + T) & (local == 0))  # one row per short sequence
    first = np.flatnonzero(keep)
    k = np.where(pad_windows | (n[first] >= L + T), local[first], n[first] - T)
    starts, ends = train.offsets[row_of[first]], train.offsets[row_of[first]] + n[first]
    index = (starts + k)[:, None] + np.arange(-L, T)[None, :]  # flat positions of the L inputs and T targets
    inside = (index >= starts[:, None]) & (index < ends[:, None])
    window = np.where(inside, train.items[np.clip(index, 0, len(train.items) - 1)], PAD)
    return train.users[row_of[first]], window[:, :L], window[:, L:]


class Caser(NeuralRecommender):
    name = "caser"
    Config = CaserConfig

    def __init__(self, n_users: int, n_items: int, config: CaserConfig):
        super().__init__(n_users, n_items, config)
        d, L = config.hidden, config.L
        self.item_embedding = nn.Embedding(n_items + 1, d)  # Q, PAD included
        self.user_embedding = nn.Embedding(n_users, d)  # P
        self.horizontal = nn.ModuleList(nn.Conv2d(1, config.n_h, (h, d)) for h in range(1, L + 1))
        self.vertical = nn.Conv2d(1, config.n_v, (L, 1))
        self.fc = nn.Linear(config.n_h * L + config.n_v * d, d)  # W, b
        self.output = nn.Embedding(n_items + 1, 2 * d)  # W'
        self.output_bias = nn.Parameter(torch.zeros(n_items + 1))  # b'
        for table in (self.item_embedding, self.user_embedding, self.output):
            nn.init.normal_(table.weight, std=1.0 / table.embedding_dim)
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
        users, inputs, targets = caser_windows(train, self.config.L, self.config.T, self.config.pad_windows)
        return {"users": torch.from_numpy(users), "inputs": torch.from_numpy(inputs),
                "targets": torch.from_numpy(targets)}

    def loss(self, batch, generator):
        users, targets = batch["users"], batch["targets"]
        shape = (len(users), self.config.negatives)
        negatives = uniform_negatives(self.n_items, shape, generator, users.device, users[:, None], self.seen)
        x = self.represent(users, batch["inputs"], generator)
        positive = (x[:, None, :] * self.output(targets)).sum(-1) + self.output_bias[targets]
        negative = (x[:, None, :] * self.output(negatives)).sum(-1) + self.output_bias[negatives]
        return -F.logsigmoid(positive).mean() - F.logsigmoid(-negative).mean()

    def score_factors(self, users, histories) -> ScoreFactors:
        """The output layer y = W' [z; P_u] + b' for the last L items."""
        recent = F.pad(histories, (max(0, self.config.L - histories.shape[1]), 0))[:, -self.config.L:]
        return ScoreFactors(self.represent(users, recent), self.output.weight, self.output_bias)

    def score(self, users, histories, candidates):
        factors = self.score_factors(users, histories)
        if candidates is None:
            return factors.full()
        return (factors.queries[:, None, :] * self.output(candidates)).sum(-1) + self.output_bias[candidates]
