"""NCF (NeuMF): a generalised matrix factorisation and an MLP over user and item embeddings, fused.

He, Liao, Zhang, Nie, Hu & Chua, "Neural Collaborative Filtering", WWW 2017.

- GMF:    φ^GMF = p^G_u ⊙ q^G_i
- MLP:    z_1 = [p^M_u; q^M_i],  φ_l = ReLU(W_l z_{l-1} + b_l) for a tower of layers halving in width;
          φ^MLP is the last layer's output
- NeuMF:  ŷ_ui = σ(h^T [φ^GMF; φ^MLP]), GMF and MLP with separate embeddings (§3.4)
- Loss (log loss, i.e. binary cross-entropy): L = −Σ_{(u,i)∈Y} log ŷ_ui − Σ_{(u,j)∈Y⁻} log(1 − ŷ_uj), with Y⁻
  sampled uniformly from the user's unobserved items, 4 per observed interaction (the paper's sampling ratio).
Scores are the logits h^T[φ^GMF; φ^MLP] (σ is monotone, so rankings are unchanged).

Not reproduced: the paper's pre-training of NeuMF from separately trained GMF and MLP (§3.4.1); NeuMF is
trained from scratch, the variant the paper also reports (Table 2's "without pre-training" column, slightly
lower).

The first MLP layer acts on a concatenation, so W_1 [p; q] = W_1^U p + W_1^I q: scoring every item then
computes the item half once per item instead of once per (user, item) pair.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from datasets.sequences import Histories
from models.base import NeuralRecommender
from models.sampling import InteractionSet, uniform_negatives

_PAIRS_PER_CHUNK = 1 << 16  # (user, item) pairs per MLP pass when scoring all items, to bound memory


@dataclass
class NCFConfig:
    factors: int = 64  # predictive factors of GMF (its embedding size)
    mlp_layers: tuple = (256, 128, 64)  # MLP tower widths; its embeddings are half the first width
    negatives: int = 4  # sampled negatives per observed interaction
    init_std: float = 0.01  # Gaussian initialisation of the embeddings


class NCF(NeuralRecommender):
    name = "ncf"
    Config = NCFConfig

    def __init__(self, n_users: int, n_items: int, config: NCFConfig):
        super().__init__(n_users, n_items, config)
        widths = list(config.mlp_layers)
        if not widths or widths[0] % 2 or config.factors < 1 or config.negatives < 1:
            raise ValueError(f"{self.name}: need factors >= 1, negatives >= 1 and a non-empty mlp_layers whose "
                             f"first width is even (it is split between user and item); got {config}")
        self.gmf_user = nn.Embedding(n_users, config.factors)  # p^G
        self.gmf_item = nn.Embedding(n_items + 1, config.factors)  # q^G
        self.mlp_user = nn.Embedding(n_users, widths[0] // 2)  # p^M
        self.mlp_item = nn.Embedding(n_items + 1, widths[0] // 2)  # q^M
        for table in (self.gmf_user, self.gmf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(table.weight, std=config.init_std)
        self.first_user = nn.Linear(widths[0] // 2, widths[0])  # W_1^U (with b_1)
        self.first_item = nn.Linear(widths[0] // 2, widths[0], bias=False)  # W_1^I
        self.tower = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.predict = nn.Linear(config.factors + widths[-1], 1, bias=False)  # h
        self.seen: InteractionSet | None = None

    def mlp(self, first: torch.Tensor) -> torch.Tensor:
        """φ^MLP from the first layer's pre-activation W_1 z_1 + b_1."""
        x = F.relu(first)
        for layer in self.tower:
            x = F.relu(layer(x))
        return x

    def logits(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """h^T [φ^GMF; φ^MLP] for ``items`` ``(B, C)`` of ``users`` ``(B,)``."""
        h_gmf, h_mlp = self.predict.weight[0].split([self.config.factors, self.config.mlp_layers[-1]])
        gmf = ((self.gmf_user(users) * h_gmf)[:, None, :] * self.gmf_item(items)).sum(-1)
        first = self.first_user(self.mlp_user(users))[:, None, :] + self.first_item(self.mlp_item(items))
        return gmf + self.mlp(first) @ h_mlp

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        self.seen = InteractionSet(train, self.n_items)
        row_of, items = train.flat(np.arange(len(train)))
        return {"users": torch.from_numpy(train.users[row_of]), "items": torch.from_numpy(items)}

    def loss(self, batch, generator):
        users, positives = batch["users"], batch["items"]
        shape = (len(users), self.config.negatives)
        negatives = uniform_negatives(self.n_items, shape, generator, users.device, users[:, None], self.seen)
        logits = self.logits(users, torch.cat([positives[:, None], negatives], 1))
        labels = torch.zeros_like(logits)
        labels[:, 0] = 1.0
        return F.binary_cross_entropy_with_logits(logits, labels)

    def score(self, users, histories, candidates):
        if candidates is not None:
            return self.logits(users, candidates)
        h_gmf, h_mlp = self.predict.weight[0].split([self.config.factors, self.config.mlp_layers[-1]])
        scores = (self.gmf_user(users) * h_gmf) @ self.gmf_item.weight.T
        user_first = self.first_user(self.mlp_user(users))
        item_first = self.first_item(self.mlp_item.weight)  # every item's half of the first layer, once
        step = max(1, _PAIRS_PER_CHUNK // len(users))
        for start in range(0, self.n_items + 1, step):
            chunk = item_first[start:start + step]
            scores[:, start:start + step] += self.mlp(user_first[:, None, :] + chunk[None, :, :]) @ h_mlp
        return scores
