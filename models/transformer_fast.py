"""The encoder of :mod:`models.transformer` made fast, behind the same interface, and the other speed work of the
attention models: what training and scoring run.

- Packed rows: padding positions are never computed. The point-wise parts (embeddings, projections, PFFN,
  LayerNorm, dropout) run on the real positions packed into (N, d) rows (:class:`Layout`); only the attention
  scores use the padded (B, T) layout, where padding is a masked key. At inference the last layer computes only
  each sequence's last position, all that scoring needs.
- Recomputed attention: CPU training (not under ``--compile``) recomputes eq. 2 slice by slice in the backward
  pass from q, k, v and a one-byte dropout mask drawn once, instead of keeping every layer's (B, h, T, T) weights;
  a slice holds sequences of similar length and computes only their own columns; CPU dropout masks take four
  entries from each random draw (:func:`dropout_keep_mask`).
- :func:`gelu` on packed rows without oneDNN's per-shape kernel cache.
- :func:`softmax_cross_entropy`: the full-softmax loss, its softmax kept for backward when small enough, else in
  chunks without the whole (rows × items) logit matrix.
- :func:`trim_padding`: batches lose their all-padding columns.

A test holds :class:`PackedSequenceEncoder` to :class:`models.transformer.SequenceEncoder`'s outputs and gradients
for every block wiring and position scheme.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from recbench.datasets.sequences import PAD
from recbench.models.transformer import (
    FeedForward,
    MultiHeadAttention,
    SequenceEncoder,
    TransformerBlock,
    merge_heads,
    split_heads,
)

# Attention weights per recomputed slice in CPU training: 1 MB, the L2 cache of one core of the machines here, where
# the slice's chain of softmax, mask and gradient passes stays; 8 MB slices trained ML-1m's BERT4Rec 1.09× slower.
_ATTENTION_SLICE_FLOATS = 1 << 18


@dataclass(frozen=True)
class Layout:
    """Where the packed (N, ·) rows of a batch's real positions sit in its padded (B, T) layout."""

    index: torch.Tensor  # (N,) flat position b·T + t of each packed row, in row-major order
    shape: tuple[int, int]  # (B, T)
    mask: torch.Tensor  # (B, 1, T, T) additive attention mask M
    last: torch.Tensor  # (B,) packed row of each sequence's last position
    spans: torch.Tensor  # (B, 2) each sequence's first real position and one past its last

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

    @functools.cached_property
    def by_length(self) -> Layout:
        """This layout with the padded batch's sequences in order of decreasing length: :meth:`pad` puts the
        same packed rows in that order and :meth:`pack` returns them in theirs, so no gather is added."""
        order = torch.argsort(self.spans[:, 1] - self.spans[:, 0], descending=True, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=order.device)
        T = self.shape[1]
        return Layout(rank[self.index // T] * T + self.index % T, self.shape, self.mask[order], self.last[order],
                      self.spans[order])


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU. On a contiguous CPU float matrix PyTorch calls oneDNN, which compiles and caches one
    kernel per shape; packed rows have a new shape every batch, so that cache grows by gigabytes over a run.
    A transposed view takes ATen's own kernel instead, forward and backward: same values, nothing cached."""
    return F.gelu(x.mT).mT if x.device.type == "cpu" and x.ndim == 2 else F.gelu(x)


def _attend(q, k, v, mask, dropout: float):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout)


def dropout_keep_mask(shape: tuple, p: float, device: torch.device) -> torch.Tensor:
    """A bool mask that keeps each entry with probability 1 − p, from the global RNG. PyTorch's CPU generator
    draws one number at a time, so each 64-bit draw here serves four entries of 16 bits each: a quarter of the
    draws of ``bernoulli_`` (which PyTorch's dropout calls), with p rounded to a multiple of 2⁻¹⁶ (0.2 becomes
    0.199997)."""
    n = math.prod(shape)
    draws = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-2 ** 63, 2 ** 63 - 1)
    return draws.view(torch.int16)[:n].view(shape) >= round(p * 65536) - 32768


def as_factor(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as 0/1 numbers of ``dtype``. The mask's bytes read as uint8: PyTorch's CPU kernels convert
    uint8 to float vectorised, but bool element by element (9× slower on a (3, 2, 200, 200) slice), and a float
    tensor times a bool one converts the bool one first. Same values as multiplying by the bool mask."""
    return keep.view(torch.uint8).to(dtype)


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose CPU mask comes from :func:`dropout_keep_mask`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0 or x.device.type != "cpu":
            return super().forward(x)
        return (x * as_factor(dropout_keep_mask(x.shape, self.p, x.device), x.dtype)).div_(1.0 - self.p)


class DroppedAttention(torch.autograd.Function):
    """Eq. 2 with attention dropout, A = (softmax(q kᵀ/√d_h + M) ⊙ keep) v / (1 − p), for one slice of a CPU
    training batch. Forward keeps q, k, v, M and the one-byte keep mask, not the (B, h, T, T) weights; backward
    recomputes the weights from them (one extra product q kᵀ) and applies the softmax's gradient,
    ∂S = P ⊙ (∂P − Σ_j ∂P_j P_j)."""

    @staticmethod
    def weights(q, k, mask) -> torch.Tensor:
        """P = softmax(q kᵀ/√d_h + M)."""
        return torch.softmax(((q * q.shape[-1] ** -0.5) @ k.mT).add_(mask), dim=-1)

    @staticmethod
    def forward(ctx, q, k, v, mask, keep, p: float):
        ctx.save_for_backward(q, k, v, mask, keep)
        ctx.p = p
        weights = DroppedAttention.weights(q, k, mask)  # float32 under autocast (softmax), whatever q is
        return (weights.mul_(as_factor(keep, weights.dtype)) @ v).div_(1.0 - p)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask, keep = ctx.saved_tensors
        weights = DroppedAttention.weights(q, k, mask)
        keep = as_factor(keep, weights.dtype)  # once, for both products below
        grad = grad / (1.0 - ctx.p)
        grad_weights = (grad @ v.mT).mul_(keep)
        grad_scores = grad_weights * weights
        grad_scores.sub_(grad_scores.sum(-1, keepdim=True) * weights)  # P ⊙ ∂P − P Σ_j ∂P_j P_j
        grad_v = weights.mul_(keep).mT @ grad
        scale = q.shape[-1] ** -0.5
        return (grad_scores @ k).mul_(scale), (grad_scores.mT @ q).mul_(scale), grad_v, None, None, None


def _recomputed_attention(q, k, v, mask, dropout: float, spans: torch.Tensor):
    """Eq. 2 with attention dropout, for CPU training. PyTorch's fused CPU kernel has no dropout, so its
    fallback keeps the (B, h, T, T) weights, the dropout mask and the dropped weights of every layer until the
    backward pass (about 180 MB a layer at ML-1m's batch of 256 × 200). Here the dropout mask is drawn once
    (one byte per weight; whole, so that the slicing never changes it) and :class:`DroppedAttention`
    recomputes each slice's weights in the backward pass, so one slice's weights exist at a time.

    A slice is consecutive sequences, computed on the columns where one of them has a real position (``spans``)
    only: a column outside is a padding key to all of them (weight exactly 0) and a padding query (output never
    used, returned as 0). Sequences in order of decreasing length (:attr:`Layout.by_length`) make each slice's
    columns its longest sequence's: on ML-1m, where 56% of the windows are full and the rest shorter, about two
    thirds of the padded batch's attention weights."""
    B, heads, queries, T = *q.shape[:3], k.shape[2]
    square = queries == T  # else the last position's query only (last_only), computed in every slice
    first, end = spans.T.tolist()
    slices, i = [], 0  # (sequences, first column, end column)
    while i < B:
        length = end[i] - first[i]  # the slice's longest when lengths fall along the batch
        count = max(1, _ATTENTION_SLICE_FLOATS // (heads * (length if square else 1) * length))
        slices.append((min(count, B - i), min(first[i:i + count]), max(end[i:i + count])))
        i += count
    keep = dropout_keep_mask((B, heads, queries, T), dropout, q.device)
    counts = [count for count, _, _ in slices]
    pieces = []
    # split, not slicing: one gradient per input, not one zero-filled copy per slice
    for (_, a, e), q_part, k_part, v_part, mask_part, keep_part in zip(
            slices, *(t.split(counts) for t in (q, k, v, mask, keep))):
        keys = slice(a, e)
        rows = keys if square else slice(None)
        part = DroppedAttention.apply(q_part[:, :, rows].contiguous(), k_part[:, :, keys].contiguous(),
                                      v_part[:, :, keys].contiguous(), mask_part[:, :, rows, keys],
                                      keep_part[:, :, rows, keys], dropout)
        pieces.append(F.pad(part, (0, 0, a, T - e)) if square else part)  # zeros at the padding queries
    return torch.cat(pieces)


def packed_attention(attention: MultiHeadAttention, queries: torch.Tensor, keys: torch.Tensor, layout: Layout,
                     last_only: bool) -> torch.Tensor:
    """MH(Q, K) of packed (N, d) query and key rows → packed (N, d), or (B, d) for each sequence's last position
    only (every position is still a key)."""
    dropout = attention.dropout.p if attention.training else 0.0
    # Under --compile the plain kernel, which keeps every layer's weights for backward: inductor fails on the
    # slices' data-dependent shapes (torch 2.13, CPU).
    recompute = (dropout > 0 and queries.device.type == "cpu" and torch.is_grad_enabled()
                 and not torch.compiler.is_compiling())
    if recompute and not last_only:
        layout = layout.by_length  # the padded batch in length order, for the recomputed slices
    if queries is keys:
        q, k, v = layout.pad(attention.qkv(queries)).chunk(3, dim=-1)  # one gather for W^Q, W^K, W^V
    else:
        d = queries.shape[-1]
        w, b = attention.qkv.weight, attention.qkv.bias
        q = layout.pad(F.linear(queries, w[:d], b[:d]))
        k, v = layout.pad(F.linear(keys, w[d:], b[d:])).chunk(2, dim=-1)
    mask = layout.mask
    if last_only:
        q, mask = q[:, -1:], mask[:, :, -1:]
    q, k, v = (split_heads(t, attention.heads) for t in (q, k, v))
    if recompute:
        heads = _recomputed_attention(q, k, v, mask, dropout, layout.spans)
    else:
        heads = _attend(q, k, v, mask, dropout)
    heads = merge_heads(heads)
    heads = heads[:, -1] if last_only else layout.pack(heads)
    return heads if attention.out is None else attention.out(heads)


def packed_ffn(ffn: FeedForward, x: torch.Tensor) -> torch.Tensor:
    act = gelu if ffn.act is F.gelu else ffn.act
    return ffn.outer(ffn.inner_dropout(act(ffn.inner(x))))


def packed_block(block: TransformerBlock, x: torch.Tensor, layout: Layout, last_only: bool) -> torch.Tensor:
    """:meth:`TransformerBlock.forward` on packed rows; ``last_only``: each sequence's last position, (B, d)."""
    kind = block.config.block
    if kind == "post-ln":
        attended = packed_attention(block.attention, x, x, layout, last_only)
        x = x[layout.last] if last_only else x
        x = block.attention_norm(block.residual(x, block.drop(attended)))
        if block.ffn is not None:
            x = block.ffn_norm(block.residual(x, block.drop(packed_ffn(block.ffn, x))))
    elif kind == "pre-ln":
        h = block.attention_norm(x)
        attended = packed_attention(block.attention, h, h, layout, last_only)
        x = x[layout.last] if last_only else x
        x = block.residual(x, block.drop(attended))
        if block.ffn is not None:
            x = block.residual(x, block.drop(packed_ffn(block.ffn, block.ffn_norm(x))))
    else:  # "sasrec"
        q = block.attention_norm(x)
        attended = packed_attention(block.attention, q, x, layout, last_only)
        q = q[layout.last] if last_only else q
        x = block.residual(q, attended)
        if block.ffn is not None:
            g = block.ffn_norm(x)
            x = block.residual(g, block.drop(packed_ffn(block.ffn, g)))
    return x


class PackedSequenceEncoder(SequenceEncoder):
    """:class:`models.transformer.SequenceEncoder`, same parameters and interface, computed on packed rows."""

    def __init__(self, config):
        super().__init__(config)
        for module in list(self.modules()):  # every dropout draws its CPU mask the cheaper way
            for name, child in module.named_children():
                if type(child) is nn.Dropout:
                    setattr(module, name, Dropout(child.p))

    def forward(self, items: torch.Tensor, need_weights: bool = False,
                last_only: bool = False) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        if need_weights:  # attention maps for a heat map: the plain equations, which compute the weights anyway
            return super().forward(items, need_weights, last_only)
        self.check_length(items)
        B, T = items.shape
        present = self.real_positions(items, last_only)
        index = present.flatten().nonzero().squeeze(1)
        spans = torch.stack([present.byte().argmax(1), T - present.flip(1).byte().argmax(1)], 1)
        layout = Layout(index, (B, T), self.attention_mask(present), present.sum(1).cumsum(0) - 1, spans)
        x = self.embed(items.flatten()[index], self.position_ids(present).flatten()[index])
        for number, block in enumerate(self.blocks, start=1):
            x = packed_block(block, x, layout, last_only and number == len(self.blocks))
        return self.final_norm(x), [None] * len(self.blocks)


class SoftmaxCrossEntropy(torch.autograd.Function):
    """Mean over rows of −log softmax(h Eᵀ + b)[target], the full-softmax loss of BERT4Rec (eq. 8) and
    SASRec-CE, in float32 whatever the autocast state. A (rows × items) softmax of at most ``keep`` entries is
    computed whole and kept for the backward pass, which then needs no second logit product. A larger one is never
    held whole: forward computes it in chunks of rows and keeps only each row's log-normaliser, backward recomputes
    a chunk's softmax from it. Use through :func:`softmax_cross_entropy`."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk, keep):
        with torch.autocast(hidden.device.type, enabled=False):
            h, w, b = hidden.float(), weight.float(), bias.float()
            ctx.kept = len(h) * len(w) <= keep
            if ctx.kept:
                log_p = torch.log_softmax(torch.addmm(b, h, w.T), -1)
                loss = -log_p[torch.arange(len(h), device=h.device), targets].mean()
                ctx.save_for_backward(hidden, weight, bias, targets, log_p.exp_())
                return loss
            log_norm = torch.cat([torch.addmm(b, h[i:i + chunk], w.T).logsumexp(-1)
                                  for i in range(0, len(h), chunk)])
            target_logit = (h * w[targets]).sum(-1) + b[targets]
        ctx.save_for_backward(hidden, weight, bias, targets, log_norm)
        ctx.chunk = chunk
        return (log_norm - target_logit).mean()

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, targets, saved = ctx.saved_tensors
        h, w = hidden.float(), weight.float()
        scale = grad.float() / len(h)
        if ctx.kept:  # the logits' gradient is softmax minus one-hot; the one-hot part goes to the target rows
            p = saved
            grad_h = (p @ w).sub_(w[targets]).mul_(scale)
            grad_w = (p.T @ h).index_add_(0, targets, h, alpha=-1.0).mul_(scale)
            grad_b = p.sum(0).sub_(torch.bincount(targets, minlength=len(w))).mul_(scale)
        else:
            log_norm, b = saved, bias.float()
            grad_h, grad_w, grad_b = torch.empty_like(h), torch.zeros_like(w), torch.zeros_like(b)
            for i in range(0, len(h), ctx.chunk):
                rows = slice(i, i + ctx.chunk)
                p = torch.addmm(b, h[rows], w.T).sub_(log_norm[rows, None]).exp_()  # softmax of the chunk
                p[torch.arange(len(p), device=p.device), targets[rows]] -= 1.0  # minus the one-hot target
                p.mul_(scale)
                grad_h[rows] = p @ w
                grad_w.addmm_(p.T, h[rows])
                grad_b += p.sum(0)
        return grad_h.to(hidden.dtype), grad_w.to(weight.dtype), grad_b.to(bias.dtype), None, None, None


def softmax_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          bias: torch.Tensor | None = None, chunk_elements: int = 2 ** 24,
                          keep_elements: int = 2 ** 26) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T + bias, targets)`` for (M, d) hidden rows against (V, d) output
    embeddings. The whole (M, V) softmax is kept for the backward pass when it has at most ``keep_elements``
    entries (256 MB), else it is computed in chunks of about ``chunk_elements`` logits (64 MB) and recomputed."""
    if bias is None:
        bias = torch.zeros(len(weight), device=weight.device, dtype=weight.dtype)
    return SoftmaxCrossEntropy.apply(hidden, weight, bias, targets, max(1, chunk_elements // len(weight)),
                                     keep_elements)


def trim_padding(items: torch.Tensor, *aligned: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Drop the columns that are padding in every row (left-padded batches), from ``items`` and from the
    tensors ``aligned`` with it. Neither position scheme depends on them, so results do not change; work does."""
    used = (items != PAD).any(0)
    first = int(used.float().argmax()) if bool(used.any()) else items.shape[1] - 1
    return tuple(t[:, first:] for t in (items, *aligned))
