"""The Transformer encoder shared by SASRec and BERT4Rec, with the switches of BERT4Rec's ablation (Table 5).

Notation of the BERT4Rec paper (§3.3–3.4); SASRec (Kang & McAuley 2018, §III-B/C) is the same block with causal
attention, ReLU and pre-LN.

    h⁰_i = Dropout(LN(E[v_i] + P[i]))                            embedding layer (eq. 6; LN: official code)
    MH(H) = [head_1; …; head_h] W^O,  head_i = Attention(H W_i^Q, H W_i^K, H W_i^V)               (eq. 1)
    Attention(Q, K, V) = softmax(Q Kᵀ / √(d/h) + M) V                                             (eq. 2)
        M = −∞ at padding keys, and at later keys when causal (SASRec's "no look-ahead" mask)
    PFFN(H) = act(H W⁽¹⁾ + b⁽¹⁾) W⁽²⁾ + b⁽²⁾, act = GELU (eq. 3) or ReLU (SASRec eq. 4)
    post-LN (BERT4Rec eq. 5):   x ← LN(x + Dropout(sublayer(x)))
    pre-LN  (SASRec eq. 5):     x ← x + Dropout(sublayer(LN(x))), plus a final LN after the last block

Switches (``EncoderConfig``): ``use_position`` (w/o PE), ``use_ffn`` (w/o PFFN), ``use_layernorm`` (w/o LN:
every LayerNorm of the encoder), ``use_residual`` (w/o RC), ``dropout = attention_dropout = 0``
(w/o Dropout), ``layers``, ``heads``.

Sequences are *left*-padded with item 0 so the most recent item sits in the last column, and positions are
counted from the right end: column ``j`` of a ``T``-column batch gets ``P[max_len − T + j]``. Trimming all-padding
columns off the left of a batch (:func:`trim_padding`) therefore never changes a result, only saves work.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from datasets.sequences import PAD, Histories


@dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int  # item ids 0..vocab_size-1, 0 = padding (BERT4Rec adds its [MASK] id at the end)
    max_len: int  # N: positions available
    hidden: int = 64  # d
    layers: int = 2  # L
    heads: int = 2  # h
    ffn_inner: int = 256  # inner size of PFFN: 4d in BERT4Rec, d in SASRec
    activation: str = "gelu"  # "gelu" (BERT4Rec) or "relu" (SASRec)
    dropout: float = 0.1  # on the embeddings and every sub-layer output ("hidden dropout")
    attention_dropout: float = 0.1  # on the attention probabilities
    causal: bool = False  # True: position t attends only to positions <= t (SASRec)
    norm_first: bool = False  # pre-LN (SASRec) instead of post-LN (BERT4Rec)
    embedding_norm: bool = True  # LN after E[v] + P (BERT4Rec's official code; SASRec has none)
    use_position: bool = True
    use_ffn: bool = True
    use_layernorm: bool = True
    use_residual: bool = True
    init_std: float = 0.02  # truncated normal, cut at two standard deviations (BERT4Rec's initializer)

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden size {self.hidden} is not divisible by heads {self.heads}; "
                             f"choose heads among the divisors of hidden")
        if self.activation not in ("gelu", "relu"):
            raise ValueError(f"activation must be 'gelu' or 'relu', got {self.activation!r}")
        if not (0.0 <= self.dropout < 1.0 and 0.0 <= self.attention_dropout < 1.0):
            raise ValueError(f"dropout and attention_dropout must be in [0, 1), got {self.dropout} and "
                             f"{self.attention_dropout}")
        if self.layers < 1 or self.max_len < 1:
            raise ValueError(f"layers and max_len must be >= 1, got {self.layers} and {self.max_len}")


def layer_norm(config: EncoderConfig) -> nn.Module:
    return nn.LayerNorm(config.hidden) if config.use_layernorm else nn.Identity()


class MultiHeadAttention(nn.Module):
    """MH(H) of eq. 1–2 through ``scaled_dot_product_attention``; the weights are computed explicitly only
    when asked for (heat maps)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.heads, self.dropout = config.heads, config.attention_dropout
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)  # W^Q, W^K, W^V of all heads in one matmul
        self.out = nn.Linear(config.hidden, config.hidden)  # W^O

    def forward(self, x: torch.Tensor, mask: torch.Tensor, need_weights: bool = False,
                last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every position of ``x`` (B, T, d) is a key; the queries are every position, or only the last one.
        ``mask`` (B, 1, Tq, T) is added to the attention logits."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if last_only:
            q = q[:, -1:]
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))  # (B, h, T, d/h)
        weights = None
        if need_weights:
            weights = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask).softmax(-1)
            heads = F.dropout(weights, self.dropout, self.training) @ v
        else:
            heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype),
                                                   dropout_p=self.dropout if self.training else 0.0)
        return self.out(heads.transpose(1, 2).flatten(2)), weights


class FeedForward(nn.Module):
    """PFFN(H) = act(H W⁽¹⁾ + b⁽¹⁾) W⁽²⁾ + b⁽²⁾ (eq. 3)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.inner = nn.Linear(config.hidden, config.ffn_inner)
        self.act = nn.GELU() if config.activation == "gelu" else nn.ReLU()
        self.outer = nn.Linear(config.ffn_inner, config.hidden)

    def forward(self, x):
        return self.outer(self.act(self.inner(x)))


class TransformerBlock(nn.Module):
    """One layer: attention sub-layer, then (unless ``use_ffn`` is off) the PFFN sub-layer, each wrapped in
    residual + dropout + LayerNorm in post-LN or pre-LN order."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.attention = MultiHeadAttention(config)
        self.attention_norm = layer_norm(config)
        self.ffn = FeedForward(config) if config.use_ffn else None
        self.ffn_norm = layer_norm(config) if config.use_ffn else None
        self.drop = nn.Dropout(config.dropout)

    def _residual(self, x: torch.Tensor, sublayer_out: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        out = x + self.drop(sublayer_out) if self.config.use_residual else self.drop(sublayer_out)
        return out if self.config.norm_first else norm(out)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, need_weights: bool = False,
                last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``last_only``: compute only the last position's output (all positions still serve as keys); that is
        all inference needs from the final layer."""
        pre = self.config.norm_first
        h = self.attention_norm(x) if pre else x
        if last_only:
            x, mask = x[:, -1:], mask[:, :, -1:]
        attended, weights = self.attention(h, mask, need_weights, last_only)
        x = self._residual(x, attended, self.attention_norm)
        if self.ffn is not None:
            x = self._residual(x, self.ffn(self.ffn_norm(x) if pre else x), self.ffn_norm)
        return x, weights


class SequenceEncoder(nn.Module):
    """Embedding layer plus L blocks: item ids (B, T) → hidden states (B, T, d)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.item_embedding = nn.Embedding(config.vocab_size, config.hidden, padding_idx=PAD)  # E
        self.position_embedding = nn.Embedding(config.max_len, config.hidden) if config.use_position else None
        self.embedding_norm = layer_norm(config) if config.embedding_norm else nn.Identity()
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.layers))
        self.final_norm = layer_norm(config) if config.norm_first else nn.Identity()
        self.apply(self._init)

    def _init(self, module: nn.Module) -> None:
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()

    def attention_mask(self, items: torch.Tensor) -> torch.Tensor:
        """Additive (B, 1, T, T) mask M of eq. 2: 0 where a query may attend, −∞ elsewhere. Each position always
        sees itself, so padding queries stay finite (their outputs are never used) and no row is all −∞."""
        T = items.shape[1]
        allowed = (items != PAD)[:, None, None, :] | torch.eye(T, dtype=torch.bool, device=items.device)
        if self.config.causal:
            allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=items.device).tril()
        return torch.zeros(allowed.shape, device=items.device).masked_fill_(~allowed, float("-inf"))

    def forward(self, items: torch.Tensor, need_weights: bool = False,
                last_only: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Hidden states (B, T, d) of the last layer, or (B, 1, d) of the last position with ``last_only``;
        with ``need_weights`` also every layer's attention weights (B, h, T, T)."""
        T = items.shape[1]
        if T > self.config.max_len:
            raise ValueError(f"sequences of {T} positions exceed max_len {self.config.max_len}")
        x = self.item_embedding(items)
        if self.position_embedding is not None:
            x = x + self.position_embedding.weight[self.config.max_len - T:]
        x = self.embedding_dropout(self.embedding_norm(x))
        mask = self.attention_mask(items)
        weights = []
        for number, block in enumerate(self.blocks, start=1):
            x, w = block(x, mask, need_weights, last_only and number == len(self.blocks) and not need_weights)
            weights.append(w)
        return self.final_norm(x), weights


def trim_padding(items: torch.Tensor, *aligned: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Drop the columns that are padding in every row (left-padded batches), from ``items`` and from the
    tensors ``aligned`` with it. Positions are right-aligned, so results do not change; work does."""
    used = (items != PAD).any(0)
    first = int(used.float().argmax()) if bool(used.any()) else items.shape[1] - 1
    return tuple(t[:, first:] for t in (items, *aligned))


def sliding_windows(histories: Histories, length: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of at most ``length`` items over every history, as (row of the window's user, end offset).

    As the BERT4Rec authors' data generation: a history of n <= length items is one window; a longer one is cut
    into windows starting at n − length, n − length − step, … (> 0) and at 0, so the most recent items always
    form a full window. ``step = 0`` keeps only that most recent window.
    """
    lengths = histories.lengths
    if step:
        count = np.where(lengths > length, -(-(lengths - length) // step) + 1, 1)
    else:
        count = np.ones_like(lengths)
    rows = np.repeat(np.arange(len(histories), dtype=np.int64), count)
    k = np.arange(len(rows)) - np.repeat(np.cumsum(count) - count, count)  # 0 = the most recent window
    n = lengths[rows]
    begin = np.maximum(n - length - k * step, 0)
    return rows, histories.offsets[rows] + np.minimum(begin + length, n)


def window_matrix(histories: Histories, rows: np.ndarray, ends: np.ndarray, length: int) -> np.ndarray:
    """Left-padded (len(rows), length) matrix of the ``length`` items before each absolute offset in ``ends``,
    never reaching back before the row's own history (one vectorised gather, as ``Histories.padded``)."""
    index = ends[:, None] - length + np.arange(length, dtype=np.int64)[None, :]
    valid = index >= histories.offsets[rows][:, None]
    return np.where(valid, histories.items[np.where(valid, index, 0)], PAD).astype(np.int64)
