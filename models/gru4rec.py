"""GRU4Rec: a GRU over the item sequence, scores from its hidden state, trained with a pairwise ranking loss.

Hidasi, Karatzoglou, Baltrunas & Tikk, "Session-based Recommendations with Recurrent Neural Networks",
ICLR 2016 (arXiv 1511.06939).

- Input (§3.1): the item at step t. The paper feeds 1-of-N codes; multiplying a one-hot by the GRU's input
  weights is a lookup, which we factor as an item embedding of size d followed by the GRU's input weights.
- GRU (§3): z_t = σ(W_z x_t + U_z h_{t-1}),  r_t = σ(W_r x_t + U_r h_{t-1}),
  ĥ_t = tanh(W x_t + U (r_t ⊙ h_{t-1})),  h_t = (1 − z_t) h_{t-1} + z_t ĥ_t;  dropout on h_t (§4.2).
- Output (§3.1): one score per item, r̂_i = h_t · w_i + b_i (a feed-forward layer over all items).
- Negatives (§3.1.2, "sampling on the output"): the other examples' target items of the same mini-batch,
  i.e. negatives drawn in proportion to popularity, shared by every example of the batch.
- Losses (§3.1.3), with N_S negatives j for the target i:
    BPR:   L = −1/N_S Σ_j log σ(r̂_i − r̂_j)
    TOP1:  L = 1/N_S Σ_j σ(r̂_j − r̂_i) + σ(r̂_j²)      (the second term pulls negatives' scores to zero)

Deviation, documented: the paper's session-parallel mini-batches (§3.1.1) step B sessions forward together
and reset a session's hidden state when it ends. Here each training sequence is cut into right-padded windows of at most
``max_len`` steps (``models.recurrent``) run in one call of the GRU, every real position is a next-item example,
and ``batch_negatives`` of the batch's targets, drawn without replacement, play the role of the paper's
mini-batch of B sessions' targets. A negative equal to an example's own target is dropped for that example.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.recurrent import RecurrentRecommender, run_rnn
from models.sampling import dropout


@dataclass
class GRU4RecConfig:
    hidden: int = 64  # d: item embedding and GRU units
    layers: int = 1  # stacked GRU layers (the paper's best runs use one)
    dropout: float = 0.25  # on the GRU output h_t
    loss: str = "top1"  # "top1" or "bpr" (§3.1.3)
    batch_negatives: int = 64  # negatives per batch, taken from the batch's own targets (mini-batch size B)
    max_len: int = 200  # steps per training window and history length read when scoring


class GRU4Rec(RecurrentRecommender):
    name = "gru4rec"
    Config = GRU4RecConfig
    losses = ("top1", "bpr")

    def __init__(self, n_users: int, n_items: int, config: GRU4RecConfig):
        super().__init__(n_users, n_items, config, config.hidden)
        if config.loss not in self.losses:
            raise ValueError(f"{self.name}: loss must be one of {self.losses}, got {config.loss!r}")
        if config.batch_negatives < 1:
            raise ValueError(f"{self.name}: batch_negatives must be >= 1, got {config.batch_negatives}")
        self.item_embedding = nn.Embedding(n_items + 1, config.hidden, padding_idx=0)
        self.gru = nn.GRU(config.hidden, config.hidden, num_layers=config.layers, batch_first=True)

    def encode(self, sequences, generator):
        h = run_rnn(self.gru, self.item_embedding(sequences))  # the GRU update at every step
        return dropout(h, self.config.dropout, generator)

    def negatives(self, targets: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The batch's shared negatives: ``batch_negatives`` of its targets (§3.1.2 mini-batch sampling)."""
        pick = torch.randperm(len(targets), generator=generator, device=targets.device)
        return targets[pick[:self.config.batch_negatives]]

    def scored_examples(self, batch, generator):
        """Positive scores ``(P,)``, negative scores ``(P, N)`` and which negatives count (not the target)."""
        states, targets = self.positions(batch, generator)
        negatives = self.negatives(targets, generator)
        positive = self.item_scores(states, targets[:, None])[:, 0]
        negative = self.item_scores(states, negatives)
        return positive, negative, negatives[None, :] != targets[:, None]

    def loss(self, batch, generator):
        positive, negative, valid = self.scored_examples(batch, generator)
        if self.config.loss == "bpr":
            per_negative = -F.logsigmoid(positive[:, None] - negative)
        else:
            per_negative = torch.sigmoid(negative - positive[:, None]) + torch.sigmoid(negative.pow(2))
        per_example = (per_negative * valid).sum(1) / valid.sum(1).clamp(min=1)
        return per_example.mean()
