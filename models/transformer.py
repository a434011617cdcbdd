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
Padding positions are never computed at all: the point-wise parts (embeddings, projections, PFFN, LayerNorm,
dropout) run on the real positions packed into (N, d) rows (:class:`Layout`); only the attention scores use
the padded (B, T) layout, where padding is a masked key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from datasets.sequences import PAD, Histories


_ATTENTION_SLICE_FLOATS = 1 << 21  # attention weights per recomputed slice in CPU training (8 MB)


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


@dataclass(frozen=True)
class Layout:
    """Where the packed (N, ·) rows of a batch's real positions sit in its padded (B, T) layout."""

    index: torch.Tensor  # (N,) flat position b·T + t of each packed row, in row-major order
    shape: tuple[int, int]  # (B, T)
    mask: torch.Tensor  # (B, 1, T, T) additive attention mask M
    last: torch.Tensor  # (B,) packed row of each sequence's last position

    @property
    def full(self) -> bool:
        return len(self.index) == self.shape[0] * self.shape[1]

    def pad(self, packed: torch.Tensor) -> torch.Tensor:
        """(N, k) → (B, T, k), zeros at padding."""
        B, T = self.shape
        if self.full:
            return packed.view(B, T, -1)
        return packed.new_zeros(B * T, packed.shape[-1]).index_copy_(0, self.index, packed).view(B, T, -1)

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """(B, T, k) → (N, k)."""
        return padded.flatten(0, 1) if self.full else padded.flatten(0, 1).index_select(0, self.index)


class MultiHeadAttention(nn.Module):
    """MH(H) of eq. 1–2 through ``scaled_dot_product_attention``; the weights are computed explicitly only
    when asked for (heat maps)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.heads, self.dropout = config.heads, config.attention_dropout
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)  # W^Q, W^K, W^V of all heads in one matmul
        self.out = nn.Linear(config.hidden, config.hidden)  # W^O

    def forward(self, x: torch.Tensor, layout: Layout, need_weights: bool = False,
                last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Packed (N, d) inputs → packed (N, d) outputs, or (B, d) for each sequence's last position only (every
        position is still a key)."""
        q, k, v = layout.pad(self.qkv(x)).chunk(3, dim=-1)
        mask = layout.mask
        if last_only:
            q, mask = q[:, -1:], mask[:, :, -1:]
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))  # (B, h, T, d/h)
        weights = None
        if need_weights:
            weights = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask).softmax(-1)
            heads = F.dropout(weights, self.dropout, self.training) @ v
        elif self.training and self.dropout > 0 and q.device.type == "cpu" and torch.is_grad_enabled():
            heads = self._recomputed_attention(q, k, v, mask)
        else:
            heads = self._attend(q, k, v, mask)
        heads = heads.transpose(1, 2).flatten(2)  # (B, Tq, d): [head_1; …; head_h]
        return self.out(heads[:, -1] if last_only else layout.pack(heads)), weights

    def _attend(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype),
                                              dropout_p=self.dropout if self.training else 0.0)

    def _recomputed_attention(self, q, k, v, mask):
        """Eq. 2 with attention dropout, for CPU training. PyTorch's fused CPU kernel has no dropout, so the
        fallback keeps the (B, h, T, T) weights, the dropout mask and the dropped weights of every layer until
        the backward pass (about 180 MB a layer at ML-1m's batch of 256 × 200). Here each slice of the batch is
        recomputed in the backward pass instead (with the same dropout mask: the RNG state is replayed), so only
        q, k, v are kept and one slice's weights exist at a time; the price is a second forward of eq. 2."""
        rows = max(1, _ATTENTION_SLICE_FLOATS // (q.shape[1] * q.shape[2] * k.shape[2]))
        return torch.cat([checkpoint(self._attend, q[i:i + rows], k[i:i + rows], v[i:i + rows],
                                     mask[i:i + rows], use_reentrant=False)
                          for i in range(0, len(q), rows)])


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU. On a contiguous CPU float matrix PyTorch calls oneDNN, which compiles and caches one
    kernel per shape; packed rows have a new shape every batch, so that cache grows by gigabytes over a run.
    A transposed view takes ATen's own kernel instead, forward and backward: same values, nothing cached."""
    return F.gelu(x.mT).mT if x.device.type == "cpu" and x.ndim == 2 else F.gelu(x)


class FeedForward(nn.Module):
    """PFFN(H) = act(H W⁽¹⁾ + b⁽¹⁾) W⁽²⁾ + b⁽²⁾ (eq. 3)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.inner = nn.Linear(config.hidden, config.ffn_inner)
        self.act = gelu if config.activation == "gelu" else F.relu
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

    def forward(self, x: torch.Tensor, layout: Layout, need_weights: bool = False,
                last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Packed (N, d) → (N, d); ``last_only``: only each sequence's last position, (B, d), which is all
        inference needs from the final layer."""
        pre = self.config.norm_first
        attended, weights = self.attention(self.attention_norm(x) if pre else x, layout, need_weights, last_only)
        if last_only:
            x = x[layout.last]
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

    def attention_mask(self, present: torch.Tensor) -> torch.Tensor:
        """Additive (B, 1, T, T) mask M of eq. 2: 0 where a query may attend, −∞ elsewhere. Each position always
        sees itself, so padding queries stay finite (their outputs are never used) and no row is all −∞."""
        T = present.shape[1]
        allowed = present[:, None, None, :] | torch.eye(T, dtype=torch.bool, device=present.device)
        if self.config.causal:
            allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=present.device).tril()
        return torch.zeros(allowed.shape, device=present.device).masked_fill_(~allowed, float("-inf"))

    def forward(self, items: torch.Tensor, need_weights: bool = False,
                last_only: bool = False) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Last-layer hidden states of the real positions of ``items`` (B, T), packed (N, d) in row-major order
        (the rows of ``hidden[items != PAD]``), or with ``last_only`` (B, d) of each sequence's last column
        (computed even when that column is padding); with ``need_weights`` also every layer's attention weights
        (B, h, T, T)."""
        B, T = items.shape
        if T > self.config.max_len:
            raise ValueError(f"sequences of {T} positions exceed max_len {self.config.max_len}")
        present = items != PAD
        if last_only:
            present[:, -1] = True
        index = present.flatten().nonzero().squeeze(1)
        layout = Layout(index, (B, T), self.attention_mask(present), present.sum(1).cumsum(0) - 1)
        x = self.item_embedding(items.flatten()[index])
        if self.position_embedding is not None:
            x = x + self.position_embedding(index % T + (self.config.max_len - T))
        x = self.embedding_dropout(self.embedding_norm(x))
        weights = []
        for number, block in enumerate(self.blocks, start=1):
            x, w = block(x, layout, need_weights, last_only and number == len(self.blocks))
            weights.append(w)
        return self.final_norm(x), weights


class SoftmaxCrossEntropy(torch.autograd.Function):
    """Mean over rows of −log softmax(h Eᵀ + b)[target], the full-softmax loss of BERT4Rec (eq. 8) and
    SASRec-CE, without ever holding the whole (rows × items) logit matrix: it is computed in chunks of rows,
    forward keeps only each row's log-normaliser, and backward recomputes a chunk's softmax from it. Runs in
    float32 whatever the autocast state. Use through :func:`softmax_cross_entropy`."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk):
        with torch.autocast(hidden.device.type, enabled=False):
            h, w, b = hidden.float(), weight.float(), bias.float()
            log_norm = torch.cat([torch.addmm(b, h[i:i + chunk], w.T).logsumexp(-1)
                                  for i in range(0, len(h), chunk)])
            target_logit = (h * w[targets]).sum(-1) + b[targets]
        ctx.save_for_backward(hidden, weight, bias, targets, log_norm)
        ctx.chunk = chunk
        return (log_norm - target_logit).mean()

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, targets, log_norm = ctx.saved_tensors
        h, w, b = hidden.float(), weight.float(), bias.float()
        grad_h, grad_w, grad_b = torch.empty_like(h), torch.zeros_like(w), torch.zeros_like(b)
        scale = grad.float() / len(h)
        for i in range(0, len(h), ctx.chunk):
            rows = slice(i, i + ctx.chunk)
            p = torch.addmm(b, h[rows], w.T).sub_(log_norm[rows, None]).exp_()  # softmax of the chunk
            p[torch.arange(len(p), device=p.device), targets[rows]] -= 1.0  # minus the one-hot target
            p.mul_(scale)
            grad_h[rows] = p @ w
            grad_w.addmm_(p.T, h[rows])
            grad_b += p.sum(0)
        return grad_h.to(hidden.dtype), grad_w.to(weight.dtype), grad_b.to(bias.dtype), None, None


def softmax_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          bias: torch.Tensor | None = None, chunk_elements: int = 2 ** 24) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T + bias, targets)`` for (M, d) hidden rows against (V, d) output
    embeddings, in chunks of about ``chunk_elements`` logits (64 MB)."""
    if bias is None:
        bias = torch.zeros(len(weight), device=weight.device, dtype=weight.dtype)
    return SoftmaxCrossEntropy.apply(hidden, weight, bias, targets, max(1, chunk_elements // len(weight)))


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
