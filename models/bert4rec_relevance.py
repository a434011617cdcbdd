"""BERT4Rec for relevance prediction, as the second source describes it (``PAPER.md``, "Two tasks", task 2): "L
Transformer layers, mean pooling over hidden vectors, then a BCE head against the candidate".

- Encoder: BERT4Rec's (§3.3–3.4 of Sun et al. 2019, :mod:`models.transformer`): item plus learnable positional
  embedding, L bidirectional post-LN blocks with GELU. No [MASK] token: nothing is predicted at a position, the
  whole history is read. There is no authors' code for this model, and its encoder keeps the choices it was
  measured with (``results/reference/relevance-ml1m.json``) rather than those of BERT4Rec's official code:
  positions counted from the right end (the last column gets p_{N−1}), no token-type vector, PyTorch's
  LayerNorm ε 1e-5.
- Pooling: ū = Σ_t m_t h^L_t / Σ_t m_t over the non-padding positions (m_t = 1), the "mean pooling over hidden
  vectors".
- Head against the candidate c: BERT4Rec's own output layer (eq. 7) with its softmax over all items replaced by a
  sigmoid on the one candidate,  s(u, c) = GELU(ū W^P + b^P) · E_c + b^O_c,  P(relevant) = σ(s), with E the
  shared input item embedding and b^O a bias per item. A dot product against the candidate's embedding rather
  than an MLP on [ū; E_c]: the source names no head beyond "BCE against the candidate", this keeps BERT4Rec's
  output layer as it is, and it is the same bilinear form as the LSTM's head (``lstm-rel``), so the two models
  differ only in how they read the history.
- Training (``models.relevance``): each epoch takes one example from every training window of N + 1 items: a
  cut point drawn uniformly, the items before it as the history, the item at it as the positive, plus
  ``negatives`` items drawn uniformly outside the user's training sequence; binary cross-entropy plus L2. (The
  bidirectional encoder reads the whole history, so unlike a causal model it cannot judge every prefix in one
  pass; random cuts visit every prefix across epochs.) Windows over long sequences step by ``window_step``·N, as
  BERT4Rec's training data.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import NeuralRecommender, require
from recbench.models.bert4rec import BERT4Rec
from recbench.models.relevance import RelevanceModel
from recbench.models.sampling import InteractionSet
from recbench.models.transformer import check_encoder_fields, encoder_config, sliding_windows, window_matrix
from recbench.models.transformer_fast import PackedSequenceEncoder, trim_padding


@dataclass
class BERT4RecRelevanceConfig:
    max_len: int = 200  # N: most recent history items read
    hidden: int = 64  # d
    layers: int = 2  # L
    heads: int = 2  # h
    dropout: float = 0.1  # hidden dropout: embeddings and sub-layer outputs
    attention_dropout: float = 0.1  # on the attention probabilities
    negatives: int = 1  # k sampled negative candidates per positive
    window_step: float = 0.5  # training windows of N + 1 items, step = window_step·N
    init_std: float = 0.02  # truncated normal
    layer_norm_eps: float = 1e-5  # PyTorch's default, as measured (BERT4Rec's official code: 1e-12)

    def __post_init__(self):
        check_encoder_fields(self)
        require(self, self.negatives >= 1, "negatives", "be >= 1")
        require(self, 0.0 < self.window_step <= 1.0, "window_step", "be in (0, 1]")


class BERT4RecRelevance(RelevanceModel, NeuralRecommender):
    name = "bert4rec-rel"
    Config = BERT4RecRelevanceConfig

    def __init__(self, n_users: int, n_items: int, config: BERT4RecRelevanceConfig):
        super().__init__(n_users, n_items, config)
        c = config
        self.encoder = PackedSequenceEncoder(encoder_config(
            c, n_items + 1, ffn_inner=4 * c.hidden, activation="gelu", causal=False, block="post-ln", positions="end",
            embedding_norm=True))
        # The head: W^P, b^P, the LayerNorm after the GELU (BERT4Rec's official run.py) and b^O.
        self.projection = nn.Linear(c.hidden, c.hidden)
        self.head_norm = nn.LayerNorm(c.hidden, eps=c.layer_norm_eps)
        self.output_bias = nn.Parameter(torch.zeros(n_items + 1))
        nn.init.trunc_normal_(self.projection.weight, std=c.init_std, a=-2 * c.init_std, b=2 * c.init_std)
        nn.init.zeros_(self.projection.bias)
        self.seen: InteractionSet | None = None

    # BERT4Rec's own pieces, used as they are: eq. 7's left factor GELU(h W^P + b^P) with its LayerNorm, and the
    # official optimiser's groups (no weight decay on biases and LayerNorm).
    transform = BERT4Rec.transform
    parameter_groups = BERT4Rec.parameter_groups

    @property
    def history_length(self) -> int:
        return self.config.max_len

    def user_vector(self, items: torch.Tensor) -> torch.Tensor:
        """GELU(ū W^P + b^P), ū the mean of the last layer's hidden vectors over the non-padding positions."""
        hidden, _ = self.encoder(items)  # (N, d): the non-padding positions, row by row
        present = items != PAD
        total = torch.zeros(len(items), hidden.shape[-1], device=hidden.device)
        total.index_add_(0, present.nonzero()[:, 0], hidden.float())  # summed in float32 even under bf16 autocast
        return self.transform(total / present.sum(1, keepdim=True).clamp(min=1))

    def candidate_logits(self, u: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """s(u, c) = u · E_c + b^O_c for ``candidates`` ``(B, C)``."""
        return (self.encoder.item_embedding(candidates) @ u[:, :, None]).squeeze(-1) + self.output_bias[candidates]

    # ------------------------------------------------------------------------------------------- training
    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        """Left-padded windows of N + 1 items with at least two (a history item and a next item), and their users."""
        self.seen = InteractionSet(train, self.n_items)
        length = self.config.max_len + 1
        rows, ends = sliding_windows(train, length, max(1, round(self.config.window_step * self.config.max_len)))
        windows = window_matrix(train, rows, ends, length)
        keep = (windows != PAD).sum(1) >= 2
        return {"users": torch.from_numpy(train.users[rows[keep]]), "items": torch.from_numpy(windows[keep])}

    def cut(self, items: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One example per window of n items: j uniform in 1..n−1, history = its first j items (left-padded to
        N columns), positive = item j + 1."""
        width = items.shape[1]
        n = (items != PAD).sum(1)
        first = width - n  # column of the window's first item
        j = 1 + (torch.rand(len(items), generator=generator, device=items.device) * (n - 1)).long()
        positives = items.gather(1, (first + j)[:, None])[:, 0]
        index = (first + j)[:, None] - (width - 1) + torch.arange(width - 1, device=items.device)[None, :]
        history = torch.where(index >= first[:, None], items.gather(1, index.clamp(min=0)), PAD)
        return history, positives

    def loss(self, batch, generator):
        history, positives = self.cut(batch["items"], generator)
        u = self.user_vector(*trim_padding(history))
        return self.sampled_bce(lambda candidates: self.candidate_logits(u, candidates), batch["users"], positives,
                                self.seen, generator)

    # ------------------------------------------------------------------------------------------- inference
    def score(self, users, histories, candidates):
        """Logits s(u, c) of ``candidates`` ``(B, C)``, or of every item id ``(B, n_items + 1)``."""
        u = self.user_vector(*trim_padding(histories[:, -self.config.max_len:]))
        if candidates is None:
            return u @ self.encoder.item_embedding.weight.T + self.output_bias
        return self.candidate_logits(u, candidates)
