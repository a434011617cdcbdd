"""SASRec (Kang & McAuley, "Self-Attentive Sequential Recommendation", ICDM 2018) and SASRec-CE.

SASRec, following the paper's sections:
- §III-A Embedding layer: the last n items of the sequence, left-padded with 0; Ê_i = M_{s_i} + P_i (eq. 1),
  then dropout.
- §III-B Self-attention block: S = SA(Ê) = Attention(ÊW^Q, ÊW^K, ÊW^V) with causal masking, so position t
  never sees a later item (eq. 2–3); point-wise FFN_i = ReLU(S_i W⁽¹⁾ + b⁽¹⁾) W⁽²⁾ + b⁽²⁾ (eq. 4).
- §III-C Stacking b blocks (eq. 5), each sub-layer wrapped as g(x) = x + Dropout(g(LayerNorm(x))) (pre-LN).
- §III-D Prediction layer with the shared item embedding M: r_{i,t} = F_t⁽ᵇ⁾ · M_i.
- §III-E Training: at every non-padding position t, the target o_t is the next item and one negative j ∉ S^u
  is drawn per position: −Σ_t [log σ(r_{o_t,t}) + log(1 − σ(r_{j,t}))].
- Inference: the user's score for item i is r_{i,n} at the last position.

SASRec-CE (``sasrec-ce``; Klenitskiy & Vasilev, "Turning Dross Into Gold Loss: is BERT4Rec really better than
SASRec?", RecSys 2023): the same network, trained with the full softmax over all items at every non-padding
position, −Σ_t log softmax_i(r_{i,t})[o_t], instead of one sampled negative.

The blocks are :class:`models.transformer.SequenceEncoder` (causal, pre-LN, ReLU, FFN inner size d) with the
ablation switches of ``EncoderConfig``. Weight init is BERT4Rec's truncated normal (std 0.02) so that both
attention models start alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from datasets.sequences import PAD, Histories
from models.base import NeuralRecommender
from models.sampling import InteractionSet, uniform_negatives
from models.transformer import (EncoderConfig, SequenceEncoder, sliding_windows, softmax_cross_entropy, trim_padding,
                                window_matrix)


@dataclass
class SASRecConfig:
    max_len: int = 200  # n: most recent items the model reads
    hidden: int = 64  # d
    layers: int = 2  # b: self-attention blocks
    heads: int = 1
    dropout: float = 0.2  # embeddings and sub-layer outputs
    attention_dropout: float = 0.2  # attention probabilities (the official code uses the same rate)
    norm_first: bool = True  # pre-LN as in the SASRec paper; False: post-LN
    use_position: bool = True
    use_ffn: bool = True
    use_layernorm: bool = True
    use_residual: bool = True
    window_step: float = 0.0  # > 0: also train on earlier windows of long sequences, step = window_step·max_len
    init_std: float = 0.02

    def __post_init__(self):
        if not 0.0 <= self.window_step <= 1.0:
            raise ValueError(f"window_step must be in [0, 1] (a fraction of max_len), got {self.window_step}")


class SASRec(NeuralRecommender):
    name = "sasrec"
    Config = SASRecConfig

    def __init__(self, n_users: int, n_items: int, config: SASRecConfig):
        super().__init__(n_users, n_items, config)
        self.encoder = SequenceEncoder(EncoderConfig(
            vocab_size=n_items + 1, max_len=config.max_len, hidden=config.hidden, layers=config.layers,
            heads=config.heads, ffn_inner=config.hidden, activation="relu", dropout=config.dropout,
            attention_dropout=config.attention_dropout, causal=True,
            norm_first=config.norm_first, embedding_norm=False, use_position=config.use_position,
            use_ffn=config.use_ffn, use_layernorm=config.use_layernorm, use_residual=config.use_residual,
            init_std=config.init_std))
        self.seen: InteractionSet | None = None

    @property
    def history_length(self) -> int:
        return self.config.max_len

    @property
    def item_embedding(self) -> torch.Tensor:
        return self.encoder.item_embedding.weight  # M, shared by input and prediction (§III-D)

    # ------------------------------------------------------------------------------------------- training
    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        self.seen = InteractionSet(train, self.n_items)  # negatives must avoid the user's items
        return self._windows(train)

    def _windows(self, train: Histories) -> dict[str, torch.Tensor]:
        """One row per window of max_len + 1 items: input = window[:-1], targets = window[1:]."""
        length = self.config.max_len + 1
        rows, ends = sliding_windows(train, length, round(self.config.window_step * self.config.max_len))
        windows = window_matrix(train, rows, ends, length)
        return {"users": torch.from_numpy(train.users[rows]), "items": torch.from_numpy(windows)}

    def _encode(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Hidden states F_t (N, d) of the non-padding input positions, their next items (N,) and the users."""
        inputs, targets = trim_padding(batch["items"][:, :-1], batch["items"][:, 1:])
        where = inputs != PAD  # the first item of a window is only ever an input
        hidden, _ = self.encoder(inputs)
        return hidden, targets[where], batch["users"][:, None].expand_as(inputs)[where]

    def loss(self, batch, generator):
        """BCE with one negative per non-padding position (§III-E)."""
        hidden, targets, users = self._encode(batch)
        negatives = uniform_negatives(self.n_items, users.shape, generator, users.device, users, self.seen)
        positive = (hidden * self.item_embedding[targets]).sum(-1)
        negative = (hidden * self.item_embedding[negatives]).sum(-1)
        return -(F.logsigmoid(positive) + F.logsigmoid(-negative)).mean()

    # ------------------------------------------------------------------------------------------- inference
    def score(self, users, histories, candidates):
        (items,) = trim_padding(histories[:, -self.config.max_len:])
        h, _ = self.encoder(items, last_only=True)  # F_n: the last position's output
        if candidates is None:
            return h @ self.item_embedding.T
        return (self.item_embedding[candidates] @ h[:, :, None]).squeeze(-1)

    def attention_maps(self, users, histories) -> torch.Tensor:
        """(layers, heads, T, T) attention weights for the first user of the batch."""
        _, weights = self.encoder(histories[:1, -self.config.max_len:], need_weights=True)
        return torch.stack([w[0] for w in weights])

    def attention_items(self, histories) -> torch.Tensor:
        return histories[:, -self.config.max_len:]


class SASRecCE(SASRec):
    """SASRec with the full-softmax cross-entropy over all items at every non-padding position."""

    name = "sasrec-ce"

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        return self._windows(train)  # no negatives to draw

    def loss(self, batch, generator):
        hidden, targets, _ = self._encode(batch)
        # Logits only at non-padding positions, over the real items 1..n_items, taken chunk by chunk.
        return softmax_cross_entropy(hidden, self.item_embedding[1:self.n_items + 1], targets - 1)
