"""SASRec (Kang & McAuley, "Self-Attentive Sequential Recommendation", ICDM 2018) and SASRec-CE.

SASRec, following the paper's sections, with the authors' TF code (kang205/SASRec: ``model.py``, ``modules.py``)
where the paper is silent; under ``--profile paper`` the network is built as that code builds it:
- §III-A Embedding layer: the last n items of the sequence, left-padded with 0; Ê_i = M_{s_i} + P_i (eq. 1),
  the official code multiplying M_{s_i} by √d first (``scale_embedding``), then dropout. The last column gets
  P_{n-1} whatever the padding (the official code's fixed left padding: ``positions="end"`` of
  :mod:`models.transformer`).
- §III-B/C Self-attention blocks (``block``): ``"official"`` as the official code: the attention's queries are
  LayerNorm-ed and its keys and values are not, the residual comes from the normalised queries, there is no
  output projection W^O and no dropout on the attention output, the point-wise FFN
  ReLU(S W⁽¹⁾ + b⁽¹⁾) W⁽²⁾ + b⁽²⁾ (eq. 4) is dropped out after both of its layers ("convolutions"), and a final
  LayerNorm follows the last block; ``"pre-ln"``: the paper's eq. as a textbook pre-LN block,
  g(x) = x + Dropout(g(LayerNorm(x))) with W^O; ``"post-ln"``: x ← LN(x + Dropout(g(x))). Causal attention, so
  position t never sees a later item (eq. 2–3).
- §III-D Prediction layer with the shared item embedding M (without the √d): r_{i,t} = F_t⁽ᵇ⁾ · M_i.
- §III-E Training: at every non-padding position t, the target o_t is the next item and one negative j ∉ S^u
  is drawn per position: −Σ_t [log σ(r_{o_t,t}) + log(1 − σ(r_{j,t}))], averaged over the positions.
- Initialisation (``init``): ``"xavier"``, TF's default glorot_uniform for every embedding and weight matrix
  (each of W^Q, W^K, W^V as its own d × d matrix), biases 0, as the official code; ``"truncated_normal"``:
  BERT4Rec's, std ``init_std``. LayerNorm ε (``layer_norm_eps``): the official code's 1e-8.
- Inference: the user's score for item i is r_{i,n} at the last position.

Padding: the official code zeroes padding rows and masks keys whose rows are zero; here padding keys are masked
and padding rows are not computed at all, which gives the real positions the same values (the official code's
query masking touches only padding rows, whose outputs are never used).

SASRec-CE (``sasrec-ce``; Klenitskiy & Vasilev, "Turning Dross Into Gold Loss: is BERT4Rec really better than
SASRec?", RecSys 2023): the same network, switches and paper-profile choices (the official SASRec block), trained
with the full softmax over all items at every non-padding position, −Σ_t log softmax_i(r_{i,t})[o_t], instead of
one sampled negative, so that the loss is the only difference from SASRec.

The encoder is :class:`models.transformer_fast.PackedSequenceEncoder` (causal, ReLU, FFN inner size d) with the
ablation switches of ``EncoderConfig``. The remaining differences from the official code and their measured
effects are listed in ``models/fidelity.md``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import NeuralRecommender, ScoreFactors, require, require_choice
from recbench.models.sampling import InteractionSet, uniform_negatives
from recbench.models.transformer import INITS, check_encoder_fields, encoder_config, sliding_windows, window_matrix
from recbench.models.transformer_fast import PackedSequenceEncoder, softmax_cross_entropy, trim_padding

SASREC_BLOCKS = {"official": "sasrec", "pre-ln": "pre-ln", "post-ln": "post-ln"}  # our name → the encoder's


@dataclass
class SASRecConfig:
    max_len: int = 200  # n: most recent items the model reads
    hidden: int = 64  # d
    layers: int = 2  # b: self-attention blocks
    heads: int = 1
    dropout: float = 0.2  # embeddings and sub-layer outputs
    attention_dropout: float = 0.2  # attention probabilities (the official code uses the same rate)
    block: str = "official"  # "official" (kang205/SASRec), "pre-ln" (the paper's textbook block) or "post-ln"
    scale_embedding: bool = True  # M_{s_i}·√d before adding P_i (official code)
    use_position: bool = True
    use_ffn: bool = True
    use_layernorm: bool = True
    use_residual: bool = True
    window_step: float = 0.0  # > 0: also train on earlier windows of long sequences, step = window_step·max_len
    init: str = "xavier"  # "xavier" (official: TF's glorot_uniform) or "truncated_normal" (std init_std)
    init_std: float = 0.02  # used by init = "truncated_normal"
    layer_norm_eps: float = 1e-8  # official code: normalize(epsilon=1e-8)

    def __post_init__(self):
        check_encoder_fields(self)
        require_choice(self, "block", tuple(SASREC_BLOCKS))
        require_choice(self, "init", INITS)
        require(self, 0.0 <= self.window_step <= 1.0, "window_step", "be in [0, 1] (a fraction of max_len)")


class SASRec(NeuralRecommender):
    name = "sasrec"
    Config = SASRecConfig

    def __init__(self, n_users: int, n_items: int, config: SASRecConfig):
        super().__init__(n_users, n_items, config)
        c = config
        self.encoder = PackedSequenceEncoder(encoder_config(
            c, n_items + 1, ffn_inner=c.hidden, activation="relu", causal=True, block=SASREC_BLOCKS[c.block],
            positions="end", embedding_norm=False, scale_embedding=c.scale_embedding))
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
        """Hidden states F_t (N, d) of the non-padding input positions, their next items (N,) and the batch row
        each position belongs to (N,)."""
        inputs, targets = trim_padding(batch["items"][:, :-1], batch["items"][:, 1:])
        where = inputs != PAD  # the first item of a window is only ever an input
        hidden, _ = self.encoder(inputs)
        rows = torch.arange(len(inputs), device=inputs.device)[:, None].expand_as(inputs)[where]
        return hidden, targets[where], rows

    def loss(self, batch, generator):
        """BCE with one negative per non-padding position (§III-E)."""
        hidden, targets, rows = self._encode(batch)
        users = batch["users"][rows]
        negatives = uniform_negatives(self.n_items, users.shape, generator, users.device, users, self.seen)
        positive = (hidden * self.item_embedding[targets]).sum(-1)
        negative = (hidden * self.item_embedding[negatives]).sum(-1)
        return -(F.logsigmoid(positive) + F.logsigmoid(-negative)).mean()

    # ------------------------------------------------------------------------------------------- inference
    def score_factors(self, users, histories) -> ScoreFactors:
        """r_{i,t} = F_t · M_i (§III-D): the last position's output F_n against the shared item embedding."""
        (items,) = trim_padding(histories[:, -self.config.max_len:])
        h, _ = self.encoder(items, last_only=True)
        return ScoreFactors(h, self.item_embedding, None)

    def score(self, users, histories, candidates):
        factors = self.score_factors(users, histories)
        if candidates is None:
            return factors.full()
        return (self.item_embedding[candidates] @ factors.queries[:, :, None]).squeeze(-1)

    def attention_weights(self, histories, trim: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The scored inputs (B, T), the last ``max_len`` items, and their attention weights (B, layers, heads,
        T, T); ``trim`` drops the columns that are padding in every row."""
        items = histories[:, -self.config.max_len:]
        if trim:
            (items,) = trim_padding(items)
        _, weights = self.encoder(items, need_weights=True)
        return items, torch.stack(weights, 1)


class SASRecCE(SASRec):
    """SASRec with the full-softmax cross-entropy over all items at every non-padding position."""

    name = "sasrec-ce"

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        return self._windows(train)  # no negatives to draw

    def loss(self, batch, generator):
        hidden, targets, _ = self._encode(batch)
        # Logits only at non-padding positions, over the real items 1..n_items, taken chunk by chunk.
        return softmax_cross_entropy(hidden, self.item_embedding[1:self.n_items + 1], targets - 1)
