"""The Transformer encoder of SASRec and BERT4Rec in plain (B, T, d) form: the equations, each written once.

Notation of the BERT4Rec paper (§3.3–3.4); SASRec (Kang & McAuley 2018, §III-A–C) is the same encoder with causal
attention and ReLU. Item ids (B, T) are left-padded with 0; a real position is a non-zero id.

Embedding layer (BERT4Rec eq. 6; SASRec eq. 1):
    h⁰_t = Dropout(LN(s·E[v_t] + P[p_t] + τ))
        s = √d with ``scale_embedding`` (SASRec's official code), else 1
        τ  BERT's token-type vector, the same at every position (``token_type``; BERT4Rec's official code)
        LN only with ``embedding_norm`` (BERT4Rec's official code; SASRec has none)
        p_t with ``positions="start"``: 0 for the sequence's first item, 1 for the next, … (BERT4Rec's official
            code, which pads on the right); ``positions="end"``: the last of the batch's T columns gets
            P[max_len − 1], column t gets P[max_len − T + t] (SASRec's official code, which pads on the left)
Multi-head attention (eq. 1–2), queries Q attending over keys K:
    MH(Q, K) = [head_1; …; head_h] W^O,  head_i = softmax((Q W_i^Q)(K W_i^K)ᵀ / √(d/h) + M) (K W_i^V)
        M = −∞ at padding keys, and at later keys when ``causal`` (SASRec's "no look-ahead" mask); each position
        always sees itself. SASRec's official block has no W^O.
Point-wise feed-forward network (BERT4Rec eq. 3; SASRec eq. 4):
    PFFN(H) = act(H W⁽¹⁾ + b⁽¹⁾) W⁽²⁾ + b⁽²⁾, act = GELU (BERT4Rec) or ReLU (SASRec); SASRec's official block
    drops out act(·) as well
Blocks (``block``), each followed by the next:
    "post-ln"  BERT4Rec eq. 5 and BERT:       H ← LN(H + Dropout(MH(H, H)));  H ← LN(H + Dropout(PFFN(H)))
    "pre-ln"   the SASRec paper's §III-C:    H ← H + Dropout(MH(LN H, LN H)); H ← H + Dropout(PFFN(LN H))
    "sasrec"   kang205/SASRec (model.py, modules.py): queries normalised, keys and values not, the residual
               taken from the normalised queries, no dropout on the attention output:
                   Q = LN H;  H ← Q + MH(Q, H);  G = LN H;  H ← G + Dropout(PFFN(G))
    "pre-ln" and "sasrec" end with a final LN after the last block.

Ablation switches (BERT4Rec Table 5): ``use_position`` (w/o PE), ``use_ffn`` (w/o PFFN), ``use_layernorm``
(w/o LN: every LayerNorm of the encoder), ``use_residual`` (w/o RC), ``dropout = attention_dropout = 0``
(w/o Dropout), ``layers``, ``heads``.

This module is the reference. Training and scoring run :class:`models.transformer_fast.PackedSequenceEncoder`,
the same parameters computed on the real positions only, which a test holds to these equations' outputs and
gradients. Also here: the training windows both models cut from long histories.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import require, require_choice

ACTIVATIONS = ("gelu", "relu")
BLOCKS = ("post-ln", "pre-ln", "sasrec")
POSITIONS = ("start", "end")
INITS = ("truncated_normal", "xavier")


def check_encoder_fields(config) -> None:
    """Range checks of the encoder fields a model's Config shares (``hidden``, ``layers``, ``heads``,
    ``max_len``, the dropouts, ``init_std``, ``layer_norm_eps``), for its ``__post_init__``."""
    for name in ("hidden", "layers", "heads", "max_len"):
        require(config, getattr(config, name) >= 1, name, "be >= 1")
    require(config, config.hidden % config.heads == 0, "heads", f"divide hidden={config.hidden}")
    for name in ("dropout", "attention_dropout"):
        require(config, 0.0 <= getattr(config, name) < 1.0, name, "be in [0, 1)")
    require(config, config.init_std > 0, "init_std", "be > 0")
    require(config, config.layer_norm_eps > 0, "layer_norm_eps", "be > 0")


@dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int  # item ids 0..vocab_size-1, 0 = padding (BERT4Rec adds its [MASK] id at the end)
    max_len: int  # N: positions available
    hidden: int = 64  # d
    layers: int = 2  # L
    heads: int = 2  # h
    ffn_inner: int = 256  # inner size of PFFN: 4d in BERT4Rec, d in SASRec
    activation: str = "gelu"  # "gelu" (BERT4Rec) or "relu" (SASRec)
    dropout: float = 0.1  # on the embeddings and sub-layer outputs ("hidden dropout")
    attention_dropout: float = 0.1  # on the attention probabilities
    causal: bool = False  # True: position t attends only to positions <= t (SASRec)
    block: str = "post-ln"  # "post-ln" (BERT4Rec), "pre-ln" (SASRec paper) or "sasrec" (SASRec's official code)
    positions: str = "end"  # which position P[0] is: "start" = the first item, "end" = N columns before the last
    embedding_norm: bool = True  # LN after the embedding sum (BERT4Rec's official code; SASRec has none)
    scale_embedding: bool = False  # E[v]·√d (SASRec's official code)
    token_type: bool = False  # BERT's token-type vector τ added at every position (BERT4Rec's official code)
    use_position: bool = True
    use_ffn: bool = True
    use_layernorm: bool = True
    use_residual: bool = True
    layer_norm_eps: float = 1e-5
    init: str = "truncated_normal"  # "truncated_normal" (init_std, cut at 2σ: BERT) or "xavier" (TF's glorot_uniform)
    init_std: float = 0.02

    def __post_init__(self):
        for name, choices in (("activation", ACTIVATIONS), ("block", BLOCKS), ("positions", POSITIONS),
                              ("init", INITS)):
            require_choice(self, name, choices)


# The fields a model's Config shares with EncoderConfig, under the same names and meaning: the sizes and dropouts
# (check_encoder_fields), the ablation switches and the initialisation, where the model has them.
SHARED_FIELDS = ("max_len", "hidden", "layers", "heads", "dropout", "attention_dropout", "use_position", "use_ffn",
                 "use_layernorm", "use_residual", "layer_norm_eps", "init", "init_std")


def encoder_config(config, vocab_size: int, **architecture) -> EncoderConfig:
    """The encoder of a model whose ``config`` (a dataclass) declares some of :data:`SHARED_FIELDS`: those fields
    as it sets them, the model's fixed ``architecture`` (activation, block, causal, ...) as given, and
    EncoderConfig's defaults for the rest. The one place a model's settings become the encoder's."""
    declared = {field.name for field in dataclasses.fields(config)}
    shared = {name: getattr(config, name) for name in SHARED_FIELDS if name in declared}
    return EncoderConfig(vocab_size=vocab_size, **shared, **architecture)


def layer_norm(config: EncoderConfig) -> nn.Module:
    return nn.LayerNorm(config.hidden, eps=config.layer_norm_eps) if config.use_layernorm else nn.Identity()


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, d) → (B, h, T, d/h)."""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d/h) → (B, T, d): [head_1; …; head_h]."""
    return x.transpose(1, 2).flatten(2)


class MultiHeadAttention(nn.Module):
    """MH(Q, K) of eq. 1–2."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.heads = config.heads
        self.dropout = nn.Dropout(config.attention_dropout)
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)  # W^Q, W^K, W^V of all heads, stacked
        self.out = nn.Linear(config.hidden, config.hidden) if config.block != "sasrec" else None  # W^O

    def project(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q W^Q, K W^K and K W^V (biases included)."""
        if queries is keys:
            return self.qkv(queries).chunk(3, dim=-1)
        d = queries.shape[-1]
        w, b = self.qkv.weight, self.qkv.bias
        return (F.linear(queries, w[:d], b[:d]), *F.linear(keys, w[d:], b[d:]).chunk(2, dim=-1))

    def forward(self, queries: torch.Tensor, keys: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, Tq, d) queries over (B, T, d) keys with the additive mask M (B, 1, Tq, T): the (B, Tq, d) output
        and the attention weights (B, h, Tq, T)."""
        q, k, v = (split_heads(t, self.heads) for t in self.project(queries, keys))
        weights = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask).softmax(-1)  # eq. 2
        heads = merge_heads(self.dropout(weights) @ v)
        return (heads if self.out is None else self.out(heads)), weights


class FeedForward(nn.Module):
    """PFFN(H) = act(H W⁽¹⁾ + b⁽¹⁾) W⁽²⁾ + b⁽²⁾ (eq. 3), act(·) dropped out in SASRec's official block."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.inner = nn.Linear(config.hidden, config.ffn_inner)
        self.act = F.gelu if config.activation == "gelu" else F.relu
        self.inner_dropout = nn.Dropout(config.dropout) if config.block == "sasrec" else nn.Identity()
        self.outer = nn.Linear(config.ffn_inner, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(self.inner_dropout(self.act(self.inner(x))))


class TransformerBlock(nn.Module):
    """One layer: the attention sub-layer, then (unless ``use_ffn`` is off) PFFN, wired as ``config.block``."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.attention = MultiHeadAttention(config)
        self.attention_norm = layer_norm(config)
        self.ffn = FeedForward(config) if config.use_ffn else None
        self.ffn_norm = layer_norm(config) if config.use_ffn else None
        self.drop = nn.Dropout(config.dropout)

    def residual(self, x: torch.Tensor, sublayer_out: torch.Tensor) -> torch.Tensor:
        return x + sublayer_out if self.config.use_residual else sublayer_out

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, d) → (B, T, d), and the attention weights (B, h, T, T)."""
        block = self.config.block
        if block == "post-ln":
            attended, weights = self.attention(x, x, mask)
            x = self.attention_norm(self.residual(x, self.drop(attended)))
            if self.ffn is not None:
                x = self.ffn_norm(self.residual(x, self.drop(self.ffn(x))))
        elif block == "pre-ln":
            h = self.attention_norm(x)
            attended, weights = self.attention(h, h, mask)
            x = self.residual(x, self.drop(attended))
            if self.ffn is not None:
                x = self.residual(x, self.drop(self.ffn(self.ffn_norm(x))))
        else:  # "sasrec"
            q = self.attention_norm(x)
            attended, weights = self.attention(q, x, mask)
            x = self.residual(q, attended)
            if self.ffn is not None:
                g = self.ffn_norm(x)
                x = self.residual(g, self.drop(self.ffn(g)))
        return x, weights


class SequenceEncoder(nn.Module):
    """Embedding layer plus L blocks: item ids (B, T) → hidden states (B, T, d)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.item_embedding = nn.Embedding(config.vocab_size, config.hidden, padding_idx=PAD)  # E
        self.position_embedding = nn.Embedding(config.max_len, config.hidden) if config.use_position else None
        self.token_type = nn.Parameter(torch.empty(1, config.hidden)) if config.token_type else None  # τ
        self.embedding_scale = math.sqrt(config.hidden) if config.scale_embedding else 1.0
        self.embedding_norm = layer_norm(config) if config.embedding_norm else nn.Identity()
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.layers))
        self.final_norm = layer_norm(config) if config.block != "post-ln" else nn.Identity()
        self.apply(self._init)
        if self.token_type is not None:
            self._init_matrix(self.token_type)

    # ------------------------------------------------------------------------------------------ initialisation
    def _init_matrix(self, weight: torch.Tensor) -> None:
        if self.config.init == "xavier":
            nn.init.xavier_uniform_(weight)
        else:
            std = self.config.init_std
            nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)

    def _init(self, module: nn.Module) -> None:
        """Every weight matrix and embedding by ``config.init``, biases 0, the padding row 0, LayerNorm (1, 0)."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            self._init_matrix(module.weight)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
        if isinstance(module, MultiHeadAttention) and self.config.init == "xavier":
            for projection in module.qkv.weight.view(3, self.config.hidden, self.config.hidden):
                nn.init.xavier_uniform_(projection)  # W^Q, W^K, W^V: each its own d × d matrix, as the official code

    # ---------------------------------------------------------------------------------------------- layout
    def real_positions(self, items: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """(B, T) bool: the non-padding positions, plus the last column when ``last_only`` (computed even where
        it is padding)."""
        present = items != PAD
        if last_only:
            present[:, -1] = True
        return present

    def position_ids(self, present: torch.Tensor) -> torch.Tensor:
        """(B, T) index p_t into P for every column (padding columns: 0 or whatever, never used)."""
        if self.config.positions == "start":
            return (present.cumsum(1) - 1).clamp_(min=0)
        T = present.shape[1]
        return torch.arange(self.config.max_len - T, self.config.max_len, device=present.device).expand_as(present)

    def attention_mask(self, present: torch.Tensor) -> torch.Tensor:
        """Additive (B, 1, T, T) mask M of eq. 2: 0 where a query may attend, −∞ elsewhere. Each position always
        sees itself, so padding queries stay finite (their outputs are never used) and no row is all −∞."""
        T = present.shape[1]
        allowed = present[:, None, None, :] | torch.eye(T, dtype=torch.bool, device=present.device)
        if self.config.causal:
            allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=present.device).tril()
        return torch.zeros(allowed.shape, device=present.device).masked_fill_(~allowed, float("-inf"))

    def check_length(self, items: torch.Tensor) -> None:
        if items.shape[1] > self.config.max_len:
            raise ValueError(f"sequences of {items.shape[1]} positions exceed max_len {self.config.max_len}")

    # ---------------------------------------------------------------------------------------------- layers
    def embed(self, items: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """h⁰ = Dropout(LN(s·E[v] + P[p] + τ)) of item ids and position ids of any (equal) shape."""
        x = self.item_embedding(items)
        if self.embedding_scale != 1.0:
            x = x * self.embedding_scale
        if self.position_embedding is not None:
            x = x + self.position_embedding(positions)
        if self.token_type is not None:
            x = x + self.token_type[0]
        return self.embedding_dropout(self.embedding_norm(x))

    def hidden_states(self, items: torch.Tensor, last_only: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Last-layer states (B, T, d) of every column, and every layer's attention weights (B, h, T, T)."""
        self.check_length(items)
        present = self.real_positions(items, last_only)
        mask = self.attention_mask(present)
        x = self.embed(items, self.position_ids(present))
        weights = []
        for block in self.blocks:
            x, w = block(x, mask)
            weights.append(w)
        return self.final_norm(x), weights

    def forward(self, items: torch.Tensor, need_weights: bool = False,
                last_only: bool = False) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """The interface both encoders share: the last-layer states of the real positions of ``items`` (B, T),
        packed (N, d) in row-major order (the rows of ``hidden[items != PAD]``), or with ``last_only`` (B, d) of
        each sequence's last column; and, with ``need_weights``, every layer's attention weights (else None)."""
        hidden, weights = self.hidden_states(items, last_only)
        out = hidden[:, -1] if last_only else hidden[items != PAD]
        return out, (weights if need_weights else [None] * len(weights))


# ------------------------------------------------------------------------------------------ training windows
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
