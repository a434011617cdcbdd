"""NCF (NeuMF): a generalised matrix factorisation and an MLP over user and item embeddings, fused.

He, Liao, Zhang, Nie, Hu & Chua, "Neural Collaborative Filtering", WWW 2017; built as the authors' Keras code
(``hexiangnan/neural_collaborative_filtering``: ``GMF.py``, ``MLP.py``, ``NeuMF.py``) builds it.

- GMF:    φ^GMF = p^G_u ⊙ q^G_i                                    (``factors`` predictive factors)
- MLP:    z_1 = [p^M_u; q^M_i] (width ``mlp_layers[0]``, so each embedding has half of it),
          φ_l = ReLU(W_l φ_{l-1} + b_l) for the widths ``mlp_layers[1:]``; φ^MLP is the last one
- NeuMF:  ŷ_ui = σ(h^T [φ^GMF; φ^MLP] + b), GMF and MLP with separate embeddings (§3.4). ``towers`` = "gmf" or
          "mlp" builds that model alone (ŷ = σ(h^T φ + b)), as pre-training uses them.
- Loss (log loss): L = −Σ_{(u,i)∈Y} log ŷ_ui − Σ_{(u,j)∈Y⁻} log(1 − ŷ_uj). As the authors' code, every observed
  (u, i) is one training instance and each of its ``negatives`` unobserved (u, j) another, all shuffled together
  and batched by instance; j is drawn uniformly from the items outside the user's training sequence, afresh every
  epoch (here: when its instance's batch comes).
- Initialisation (the code): embeddings N(0, 0.01²); hidden layers Glorot-uniform with zero biases; h
  LeCun-uniform, U(±√(3 / fan_in)), with a zero bias b.
- Pre-training (§3.4.1): :meth:`NCF.from_towers` starts NeuMF from a trained GMF and MLP, h = [α h^GMF;
  (1 − α) h^MLP], b = α b^GMF + (1 − α) b^MLP (the code's α = 0.5). The BERT4Rec paper does not say that its NCF
  was pre-trained, so its profile trains NeuMF from scratch; ``benchmarks/experiments/baseline_gaps.py`` measures
  pre-training (``models/fidelity.md``).
Scores are the logits h^T[φ^GMF; φ^MLP] + b (σ is monotone, so rankings are unchanged).

The first MLP layer acts on a concatenation, so W_1 [p; q] = W_1^U p + W_1^I q: scoring every item then computes
the item half once per item instead of once per (user, item) pair.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import NeuralRecommender, require, require_choice
from recbench.models.sampling import InteractionSet, uniform_negatives

_PAIRS_PER_CHUNK = 1 << 16  # (user, item) pairs per MLP pass when scoring all items, to bound memory
TOWERS = ("neumf", "gmf", "mlp")


@dataclass
class NCFConfig:
    factors: int = 64  # GMF's predictive factors (its embedding size)
    mlp_layers: tuple = (512, 256, 128, 64)  # [0]: the concatenated embeddings; then the hidden layers' widths
    negatives: int = 4  # sampled negative instances per observed interaction
    init_std: float = 0.01  # Gaussian initialisation of the embeddings
    towers: str = "neumf"  # "neumf" (GMF and MLP fused), or "gmf" / "mlp" alone (pre-training)

    def __post_init__(self):
        self.mlp_layers = tuple(self.mlp_layers)
        require(self, self.factors >= 1, "factors", "be >= 1")
        require(self, len(self.mlp_layers) >= 2 and all(isinstance(w, int) and w >= 1 for w in self.mlp_layers),
                "mlp_layers", "list at least two widths >= 1: the concatenated embeddings, then each hidden layer")
        require(self, self.mlp_layers[0] % 2 == 0, "mlp_layers",
                "start with an even width (the user and item embeddings each take half)")
        require(self, self.negatives >= 1, "negatives", "be >= 1")
        require(self, self.init_std > 0, "init_std", "be > 0")
        require_choice(self, "towers", TOWERS)


def glorot_uniform_(weight: torch.Tensor, fan_in: int, fan_out: int) -> None:
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(weight, -limit, limit)


class NCF(NeuralRecommender):
    name = "ncf"
    Config = NCFConfig

    def __init__(self, n_users: int, n_items: int, config: NCFConfig):
        super().__init__(n_users, n_items, config)
        widths = config.mlp_layers
        self.gmf = config.towers in ("neumf", "gmf")
        self.use_mlp = config.towers in ("neumf", "mlp")
        if self.gmf:
            self.gmf_user = nn.Embedding(n_users, config.factors)  # p^G
            self.gmf_item = nn.Embedding(n_items + 1, config.factors)  # q^G
        if self.use_mlp:
            self.mlp_user = nn.Embedding(n_users, widths[0] // 2)  # p^M
            self.mlp_item = nn.Embedding(n_items + 1, widths[0] // 2)  # q^M
            self.first_user = nn.Linear(widths[0] // 2, widths[1])  # W_1^U (with b_1)
            self.first_item = nn.Linear(widths[0] // 2, widths[1], bias=False)  # W_1^I
            self.tower = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[1:], widths[2:]))
            for half in (self.first_user, self.first_item):  # W_1 is one Glorot-initialised matrix
                glorot_uniform_(half.weight, widths[0], widths[1])
            for layer in self.tower:
                glorot_uniform_(layer.weight, layer.in_features, layer.out_features)
            for bias in [self.first_user.bias] + [layer.bias for layer in self.tower]:
                nn.init.zeros_(bias)
        for table in self.embeddings():
            nn.init.normal_(table.weight, std=config.init_std)
        self.predict = nn.Linear(self.gmf_width + self.mlp_width, 1)  # h, b
        nn.init.uniform_(self.predict.weight, -math.sqrt(3.0 / self.predict.in_features),
                         math.sqrt(3.0 / self.predict.in_features))
        nn.init.zeros_(self.predict.bias)
        self.seen: InteractionSet | None = None

    @property
    def gmf_width(self) -> int:
        return self.config.factors if self.gmf else 0

    @property
    def mlp_width(self) -> int:
        return self.config.mlp_layers[-1] if self.use_mlp else 0

    def embeddings(self) -> list[nn.Embedding]:
        return ([self.gmf_user, self.gmf_item] if self.gmf else []) + (
            [self.mlp_user, self.mlp_item] if self.use_mlp else [])

    @classmethod
    def from_towers(cls, gmf: "NCF", mlp: "NCF", alpha: float = 0.5) -> "NCF":
        """NeuMF initialised from a trained GMF and MLP (§3.4.1): their embeddings and layers as they are, the
        output layer h = [α h^GMF; (1 − α) h^MLP], b = α b^GMF + (1 − α) b^MLP."""
        if gmf.config.towers != "gmf" or mlp.config.towers != "mlp":
            raise ValueError("from_towers needs a model with towers='gmf' and one with towers='mlp'")
        config = NCFConfig(factors=gmf.config.factors, mlp_layers=mlp.config.mlp_layers,
                           negatives=gmf.config.negatives, init_std=gmf.config.init_std, towers="neumf")
        model = cls(gmf.n_users, gmf.n_items, config).to(gmf.device)
        state = {**{k: v for k, v in gmf.state_dict().items() if not k.startswith("predict.")},
                 **{k: v for k, v in mlp.state_dict().items() if not k.startswith("predict.")},
                 "predict.weight": torch.cat([alpha * gmf.predict.weight, (1 - alpha) * mlp.predict.weight], 1),
                 "predict.bias": alpha * gmf.predict.bias + (1 - alpha) * mlp.predict.bias}
        model.load_state_dict(state)
        return model

    def mlp(self, first: torch.Tensor) -> torch.Tensor:
        """φ^MLP from the first layer's pre-activation W_1 z_1 + b_1."""
        x = F.relu(first)
        for layer in self.tower:
            x = F.relu(layer(x))
        return x

    def logits(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """h^T [φ^GMF; φ^MLP] + b for ``items`` ``(B, C)`` of ``users`` ``(B,)``."""
        h_gmf, h_mlp = self.predict.weight[0].split([self.gmf_width, self.mlp_width])
        out = self.predict.bias.expand(items.shape)
        if self.gmf:
            out = out + ((self.gmf_user(users) * h_gmf)[:, None, :] * self.gmf_item(items)).sum(-1)
        if self.use_mlp:
            first = self.first_user(self.mlp_user(users))[:, None, :] + self.first_item(self.mlp_item(items))
            out = out + self.mlp(first) @ h_mlp
        return out

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        """One row per instance: each observed (u, i), then ``negatives`` rows (u, PAD) whose item is drawn when
        their batch comes."""
        self.seen = InteractionSet(train, self.n_items)
        row_of, items = train.flat(np.arange(len(train)))
        users = np.repeat(train.users[row_of], 1 + self.config.negatives)
        slots = np.zeros((len(items), 1 + self.config.negatives), dtype=np.int64)
        slots[:, 0] = items
        return {"users": torch.from_numpy(users), "items": torch.from_numpy(slots.reshape(-1))}

    def loss(self, batch, generator):
        users, items = batch["users"], batch["items"]
        positive = items != PAD
        negatives = uniform_negatives(self.n_items, items.shape, generator, users.device, users, self.seen)
        logits = self.logits(users, torch.where(positive, items, negatives)[:, None])[:, 0]
        return F.binary_cross_entropy_with_logits(logits, positive.to(logits.dtype))

    def score(self, users, histories, candidates):
        if candidates is not None:
            return self.logits(users, candidates)
        h_gmf, h_mlp = self.predict.weight[0].split([self.gmf_width, self.mlp_width])
        scores = self.predict.bias.expand(len(users), self.n_items + 1).clone()
        if self.gmf:
            scores += (self.gmf_user(users) * h_gmf) @ self.gmf_item.weight.T
        if self.use_mlp:
            user_first = self.first_user(self.mlp_user(users))
            item_first = self.first_item(self.mlp_item.weight)  # every item's half of the first layer, once
            step = max(1, _PAIRS_PER_CHUNK // len(users))
            for start in range(0, self.n_items + 1, step):
                chunk = item_first[start:start + step]
                scores[:, start:start + step] += self.mlp(user_first[:, None, :] + chunk[None, :, :]) @ h_mlp
        return scores
