"""BERT4Rec (Sun et al., "BERT4Rec: Sequential Recommendation with Bidirectional Encoder Representations from
Transformer", CIKM 2019), with the authors' TF code as the tie-breaker where the paper is silent.

- §3.4 Embedding layer: h⁰_i = v_i + p_i, item embedding E plus a *learnable* positional embedding, then (as
  the official ``modeling.py``) LayerNorm and dropout. Item ids 1..n, 0 = padding, [MASK] = n + 1.
- §3.3 Transformer layer (eq. 1–5): L bidirectional blocks, h heads, PFFN with GELU and inner size 4d,
  post-LN: LN(x + Dropout(sublayer(x))).
- §3.5 Output layer (eq. 7): P(v) = softmax(GELU(h_t W^P + b^P) Eᵀ + b^O), with the shared item embedding E
  and a bias per item; the official ``run.py`` adds a LayerNorm after the GELU (``head_norm``).
- §3.6 Cloze training (eq. 8): a proportion ρ of each sequence's items (at least one, at most
  ``max_predictions``; exactly min(max_predictions, max(1, round(ρ·n))) as the official ``gen_data_fin.py``)
  become [MASK]; L = (1/|S_m|) Σ_{v_m ∈ S_m} −log P(v_m = v*_m | S'_u). Masks are drawn afresh on the device
  for every batch. Plus, per training window, one sample with only its last item masked, which matches
  inference. Sequences longer than N are cut into windows of N items with step N/2.
- Inference: append [MASK] to the last N − 1 history items and score with its final hidden vector.

Differences from the official code, all without effect on what is learned: padding is on the left with
positions counted from the right end (the official code pads on the right), and the constant token-type
embedding of BERT (one type for every position) is left out. Masked copies per window are set by
``dupe_factor`` per epoch instead of being written to files once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from datasets.sequences import PAD, Histories
from models.base import NeuralRecommender
from models.transformer import (EncoderConfig, SequenceEncoder, gelu, sliding_windows, softmax_cross_entropy,
                                trim_padding, window_matrix)


@dataclass
class BERT4RecConfig:
    max_len: int = 200  # N, the [MASK] of inference included
    hidden: int = 64  # d
    layers: int = 2  # L
    heads: int = 2  # h
    dropout: float = 0.1  # hidden dropout: embeddings and sub-layer outputs
    attention_dropout: float = 0.1  # on the attention probabilities
    mask_proportion: float = 0.2  # ρ
    max_predictions: int = 40  # cap on masked items per sequence
    mask_token_prob: float = 1.0  # a masked item becomes [MASK] with this probability, else half kept, half random
    dupe_factor: int = 10  # Cloze-masked copies of every window per epoch (0: last-item samples only)
    mask_last: bool = True  # one extra sample per window with only its last item masked
    window_step: float = 0.5  # windows of N items, step = window_step·N
    use_position: bool = True
    use_ffn: bool = True
    use_layernorm: bool = True  # every LayerNorm: embedding, blocks and output head
    use_residual: bool = True
    head_norm: bool = True  # LayerNorm after GELU(h W^P + b^P) (official run.py; eq. 7 does not show it)
    init_std: float = 0.02

    def __post_init__(self):
        if not 0.0 < self.mask_proportion <= 1.0:
            raise ValueError(f"mask_proportion ρ must be in (0, 1], got {self.mask_proportion}")
        if self.max_predictions < 1 or self.max_len < 2:
            raise ValueError(f"max_predictions must be >= 1 and max_len >= 2, got {self.max_predictions}, "
                             f"{self.max_len}")
        if not 0.0 <= self.mask_token_prob <= 1.0 or not 0.0 < self.window_step <= 1.0:
            raise ValueError(f"mask_token_prob must be in [0, 1] and window_step in (0, 1], got "
                             f"{self.mask_token_prob}, {self.window_step}")
        if self.dupe_factor < 0 or (self.dupe_factor == 0 and not self.mask_last):
            raise ValueError("dupe_factor must be >= 0, and with dupe_factor = 0 mask_last must be on "
                             "(otherwise there is nothing to train on)")


class BERT4Rec(NeuralRecommender):
    name = "bert4rec"
    Config = BERT4RecConfig

    def __init__(self, n_users: int, n_items: int, config: BERT4RecConfig):
        super().__init__(n_users, n_items, config)
        self.mask_token = n_items + 1
        c = config
        self.encoder = SequenceEncoder(EncoderConfig(
            vocab_size=n_items + 2, max_len=c.max_len, hidden=c.hidden, layers=c.layers, heads=c.heads,
            ffn_inner=4 * c.hidden, activation="gelu", dropout=c.dropout,
            attention_dropout=c.attention_dropout, causal=False, norm_first=False,
            embedding_norm=True, use_position=c.use_position, use_ffn=c.use_ffn, use_layernorm=c.use_layernorm,
            use_residual=c.use_residual, init_std=c.init_std))
        # Output layer (eq. 7): W^P, b^P, the head's LayerNorm, and b^O; E is the encoder's item embedding.
        self.projection = nn.Linear(c.hidden, c.hidden)
        self.head_norm = nn.LayerNorm(c.hidden) if c.head_norm and c.use_layernorm else nn.Identity()
        self.output_bias = nn.Parameter(torch.zeros(n_items + 1))  # b^O per item id (0 unused)
        nn.init.trunc_normal_(self.projection.weight, std=c.init_std, a=-2 * c.init_std, b=2 * c.init_std)
        nn.init.zeros_(self.projection.bias)
        self.windows: torch.Tensor | None = None  # training windows, set by training_examples

    @property
    def history_length(self) -> int:
        return self.config.max_len - 1  # plus the appended [MASK]

    def parameter_groups(self) -> list[dict]:
        """The official optimiser decays every weight matrix and embedding but no bias and no LayerNorm
        (``exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]``): the 1-d parameters."""
        decay = [p for p in self.parameters() if p.ndim >= 2]
        return [{"params": decay}, {"params": [p for p in self.parameters() if p.ndim < 2], "weight_decay": 0.0}]

    # --------------------------------------------------------------------------------------------- output
    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        """GELU(h W^P + b^P), then the head's LayerNorm: the left factor of eq. 7."""
        return self.head_norm(gelu(self.projection(hidden)))

    def item_embeddings(self) -> torch.Tensor:
        """E restricted to the real items 1..n (no padding, no [MASK]): the classes of the softmax."""
        return self.encoder.item_embedding.weight[1:self.n_items + 1]

    # ------------------------------------------------------------------------------------------- training
    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        """Every window (N items, step window_step·N), ``dupe_factor`` times for Cloze masking and once flagged
        ``last`` for the last-item-only sample. Masks are drawn later, per batch. The windows are stored once
        (``self.windows``) and an example is a window's row number, so that a copy costs 8 bytes, not N items
        (ML-1m's 11 copies of 10,253 windows would otherwise hold 180 MB)."""
        c = self.config
        rows, ends = sliding_windows(train, c.max_len, max(1, round(c.window_step * c.max_len)))
        self.windows = torch.from_numpy(window_matrix(train, rows, ends, c.max_len)).to(self.device)
        copies = c.dupe_factor + int(c.mask_last)
        last = torch.zeros(copies * len(self.windows), dtype=torch.bool)
        if c.mask_last:
            last[-len(self.windows):] = True
        return {"window": torch.arange(len(self.windows)).repeat(copies), "last": last}

    def draw_masks(self, items: torch.Tensor, last: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Which positions to predict, (B, T) bool: k = min(max_predictions, max(1, round(ρ·n))) positions drawn
        uniformly without replacement among a window's n items, or only the last column for ``last`` rows."""
        c = self.config
        present = items != PAD
        n = present.sum(1)
        k = torch.clamp(torch.round(n * c.mask_proportion), min=1, max=c.max_predictions).long()
        k = torch.where(last, torch.ones_like(k), k)
        keys = torch.rand(items.shape, generator=generator, device=items.device)
        keys = keys.masked_fill(~present, 2.0)  # padding sorts last and is never drawn
        keys[:, -1] = torch.where(last, -1.0, keys[:, -1])  # the last item comes first for ``last`` rows
        rank = keys.argsort(1).argsort(1)  # exact ranks: exactly k positions per row, even with tied keys
        return rank < k[:, None]

    def corrupt(self, items: torch.Tensor, masked: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Inputs S'_u: masked positions become [MASK] with probability mask_token_prob, else (official code and
        BERT) half of them keep their item and half get a uniformly random item."""
        p = self.config.mask_token_prob
        if p == 1.0:
            return items.masked_fill(masked, self.mask_token)
        draw = torch.rand(items.shape, generator=generator, device=items.device)
        random_items = torch.randint(1, self.n_items + 1, items.shape, generator=generator, device=items.device)
        out = torch.where(masked & (draw < p), self.mask_token, items)
        return torch.where(masked & (draw >= p + (1 - p) / 2), random_items, out)

    def loss(self, batch, generator):
        """Eq. 8: mean −log P of the masked items; logits only at masked positions."""
        items, = trim_padding(self.windows[batch["window"]])
        masked = self.draw_masks(items, batch["last"], generator)
        hidden, _ = self.encoder(self.corrupt(items, masked, generator))  # rows of the non-padding positions
        # Eq. 7 only at the masked positions; the softmax over all items is taken chunk by chunk.
        return softmax_cross_entropy(self.transform(hidden[masked[items != PAD]]), self.item_embeddings(),
                                     items[masked] - 1, self.output_bias[1:])

    # ------------------------------------------------------------------------------------------- inference
    def append_mask(self, histories: torch.Tensor) -> torch.Tensor:
        """The last N − 1 history items followed by [MASK]: (B, N) at most."""
        histories = histories[:, -(self.config.max_len - 1):]
        mask = torch.full((len(histories), 1), self.mask_token, dtype=histories.dtype, device=histories.device)
        return torch.cat([histories, mask], 1)

    def score(self, users, histories, candidates):
        (items,) = trim_padding(self.append_mask(histories))
        hidden, _ = self.encoder(items, last_only=True)
        h = self.transform(hidden)  # the [MASK] position
        if candidates is None:
            E = self.encoder.item_embedding.weight[:self.n_items + 1]
            return h @ E.T + self.output_bias
        E = self.encoder.item_embedding(candidates)
        return (E @ h[:, :, None]).squeeze(-1) + self.output_bias[candidates]

    def attention_maps(self, users, histories) -> torch.Tensor:
        """(layers, heads, N, N) attention weights for the first user of the batch, its [MASK] last."""
        _, weights = self.encoder(self.append_mask(histories[:1]), need_weights=True)
        return torch.stack([w[0] for w in weights])

    def attention_items(self, histories) -> torch.Tensor:
        return self.append_mask(histories)


@dataclass
class BERT4Rec1MaskConfig(BERT4RecConfig):
    dupe_factor: int = 0  # paper Table 3, "BERT4Rec (1 mask)": trained only with the last item masked


class BERT4Rec1Mask(BERT4Rec):
    """The Cloze study's "BERT4Rec (1 mask)": the same network, trained only on last-item-masked samples."""

    name = "bert4rec-1mask"
    Config = BERT4Rec1MaskConfig
