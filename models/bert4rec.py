"""BERT4Rec (Sun et al., "BERT4Rec: Sequential Recommendation with Bidirectional Encoder Representations from
Transformer", CIKM 2019). Where the paper is silent, ``--profile paper`` builds it as the authors' TF code does
(FeiSun/BERT4Rec: ``gen_data_fin.py``, ``modeling.py``, ``run.py``, ``optimization.py``).

- §3.4 Embedding layer: h⁰_i = v_i + p_i, item embedding E plus a *learnable* positional embedding; the official
  ``modeling.py`` (BERT) also adds a token-type vector, one for every position (``token_type_embedding``), then
  LayerNorm and dropout. Item ids 1..n, 0 = padding, [MASK] = n + 1. Positions (``positions``): ``"start"``, the
  official code's: it pads on the right, so a window's first item gets p_0 and the [MASK] appended at inference
  after n items gets p_n; ``"end"``: the last column gets p_{N−1}, as SASRec's code.
- §3.3 Transformer layer (eq. 1–5): L bidirectional blocks, h heads, PFFN with GELU and inner size 4d (§3.3;
  ``ffn_inner`` sets another, as the authors' ``bert_config_ml-1m_256.json`` has 512 = 2d), post-LN:
  LN(x + Dropout(sublayer(x))); LayerNorm ε 1e-12 as TF's ``layer_norm`` (``layer_norm_eps``).
- §3.5 Output layer (eq. 7): P(v) = softmax(GELU(h_t W^P + b^P) Eᵀ + b^O), with the shared item embedding E
  and a bias per item; the official ``run.py`` adds a LayerNorm after the GELU (``head_norm``). The training
  softmax runs over every row of the official vocabulary (``softmax_classes="vocabulary"``: the padding id 0, the
  n items, [MASK] and two special tokens the official vocabulary holds and never uses, n + 4 classes, none of
  them but the items ever a target), or over the n items only (``"items"``). Scores rank items either way.
- §3.6 Cloze training (eq. 8): a proportion ρ of each window's n items, exactly
  k = min(max_predictions, max(1, round(ρ·n))) of them with Python 2's ``round`` (double precision, halves away
  from zero) as ``gen_data_fin.py``, drawn uniformly, become [MASK] (or, with ``mask_token_prob`` < 1, half of
  the rest keep their item and half get a random one); L = (1/|S_m|) Σ_{v_m ∈ S_m} −log P(v_m = v*_m | S'_u)
  over the masked items of a batch. Per window: ``dupe_factor`` masked copies plus one with only its last item
  masked, which matches inference. ``fresh_masks = false`` (official): the copies are masked once and the same
  copies come back every epoch, as the files ``gen_data_fin.py`` writes once; ``true``: masks are drawn afresh
  for every batch. Histories longer than N are cut into windows of N items, step int(window_step·N).
- Inference: append [MASK] to the last N − 1 history items and score with its final hidden vector.
- Initialisation: truncated normal (std 0.02, cut at 2σ) for every weight matrix and embedding, biases 0.

The remaining differences from the official code and their measured effects are listed in
``models/fidelity.md``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import NeuralRecommender, ScoreFactors, require, require_choice
from recbench.models.transformer import POSITIONS, check_encoder_fields, encoder_config, sliding_windows, window_matrix
from recbench.models.transformer_fast import PackedSequenceEncoder, gelu, softmax_cross_entropy, trim_padding

SOFTMAX_CLASSES = ("vocabulary", "items")
# The official vocabulary (vocab.py FreqVocab): 0 (padding), the n items, then [pad], [MASK] and [NO_USE].
SPECIAL_TOKENS = 3


@dataclass
class BERT4RecConfig:
    max_len: int = 200  # N, the [MASK] of inference included
    hidden: int = 64  # d
    layers: int = 2  # L
    heads: int = 2  # h
    ffn_inner: int | None = None  # inner size of the PFFN; none: 4d (§3.3)
    dropout: float = 0.1  # hidden dropout: embeddings and sub-layer outputs
    attention_dropout: float = 0.1  # on the attention probabilities
    mask_proportion: float = 0.2  # ρ
    max_predictions: int = 40  # cap on masked items per sequence
    mask_token_prob: float = 1.0  # a masked item becomes [MASK] with this probability, else half kept, half random
    dupe_factor: int = 10  # Cloze-masked copies of every window per epoch (0: last-item samples only)
    mask_last: bool = True  # one extra sample per window with only its last item masked
    fresh_masks: bool = False  # True: new masks for every batch; False: copies masked once, reused (official)
    window_step: float = 0.5  # windows of N items, step = int(window_step·N)
    positions: str = "start"  # "start": a window's first item gets p_0 (official); "end": the last column p_{N-1}
    token_type_embedding: bool = True  # BERT's token-type vector added at every position (official modeling.py)
    use_position: bool = True
    use_ffn: bool = True
    use_layernorm: bool = True  # every LayerNorm: embedding, blocks and output head
    use_residual: bool = True
    head_norm: bool = True  # LayerNorm after GELU(h W^P + b^P) (official run.py; eq. 7 does not show it)
    softmax_classes: str = "vocabulary"  # training softmax over "vocabulary" (n + 4 ids, official) or "items" (n)
    layer_norm_eps: float = 1e-12  # TF's layer_norm, used by the official modeling.py and run.py
    init_std: float = 0.02

    def __post_init__(self):
        check_encoder_fields(self)
        require(self, self.max_len >= 2, "max_len", "be >= 2 (at least one item and the [MASK])")
        require(self, 0.0 < self.mask_proportion <= 1.0, "mask_proportion", "be in (0, 1]")
        require(self, self.max_predictions >= 1, "max_predictions", "be >= 1")
        require(self, self.ffn_inner is None or self.ffn_inner >= 1, "ffn_inner", "be >= 1, or none (4·hidden)")
        require(self, 0.0 <= self.mask_token_prob <= 1.0, "mask_token_prob", "be in [0, 1]")
        require(self, self.dupe_factor >= 0, "dupe_factor", "be >= 0")
        require(self, self.dupe_factor > 0 or self.mask_last, "mask_last",
                "be true when dupe_factor=0 (else nothing is trained on)")
        require(self, 0.0 < self.window_step <= 1.0 and int(self.window_step * self.max_len) >= 1, "window_step",
                f"be in (0, 1] with int(window_step·max_len) >= 1 (max_len={self.max_len})")
        require_choice(self, "positions", POSITIONS)
        require_choice(self, "softmax_classes", SOFTMAX_CLASSES)


class BERT4Rec(NeuralRecommender):
    name = "bert4rec"
    Config = BERT4RecConfig

    def __init__(self, n_users: int, n_items: int, config: BERT4RecConfig):
        super().__init__(n_users, n_items, config)
        self.mask_token = n_items + 1
        c = config
        vocabulary = n_items + 1 + (SPECIAL_TOKENS if c.softmax_classes == "vocabulary" else 1)  # + [MASK] at least
        self.encoder = PackedSequenceEncoder(encoder_config(
            c, vocabulary, ffn_inner=c.ffn_inner or 4 * c.hidden, activation="gelu", causal=False, block="post-ln",
            positions=c.positions, embedding_norm=True, token_type=c.token_type_embedding))
        # Output layer (eq. 7): W^P, b^P, the head's LayerNorm, and b^O; E is the encoder's item embedding.
        self.projection = nn.Linear(c.hidden, c.hidden)
        self.head_norm = (nn.LayerNorm(c.hidden, eps=c.layer_norm_eps) if c.head_norm and c.use_layernorm
                          else nn.Identity())
        self.output_bias = nn.Parameter(torch.zeros(vocabulary if c.softmax_classes == "vocabulary" else n_items + 1))
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

    def softmax_classes(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The training softmax's output embeddings, their biases, and the offset from an item id to its class:
        every row of the vocabulary, or the real items 1..n only."""
        E = self.encoder.item_embedding.weight
        if self.config.softmax_classes == "vocabulary":
            return E, self.output_bias, 0
        return E[1:self.n_items + 1], self.output_bias[1:], 1

    # ------------------------------------------------------------------------------------------- training
    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        """Every window (N items, step int(window_step·N)), ``dupe_factor`` times for Cloze masking and once
        flagged ``last`` for the last-item-only sample. The windows are stored once (``self.windows``) and an
        example is a window's row number, so that a copy costs 8 bytes, not N items (ML-1m's 11 copies of
        10,253 windows would otherwise hold 180 MB). Without ``fresh_masks`` each copy's masks are drawn here,
        once, and kept as its masked columns and what they read (:meth:`fixed_masks`)."""
        c = self.config
        rows, ends = self.window_ends(train)
        windows = torch.from_numpy(window_matrix(train, rows, ends, c.max_len))
        self.windows = windows.to(self.device)
        copies = c.dupe_factor + int(c.mask_last)
        last = torch.zeros(copies * len(windows), dtype=torch.bool)
        if c.mask_last:
            last[-len(windows):] = True
        examples = {"window": torch.arange(len(windows)).repeat(copies), "last": last}
        if not c.fresh_masks:
            examples.update(self.fixed_masks(windows, examples["window"], last))
        self.cloze_facts = self.cloze_copy_facts(windows)
        return examples

    def window_ends(self, train: Histories) -> tuple[np.ndarray, np.ndarray]:
        """Each training window's user row and end offset (N items, step int(window_step·N))."""
        return sliding_windows(train, self.config.max_len, int(self.config.window_step * self.config.max_len))

    def cloze_copy_facts(self, windows: torch.Tensor) -> dict:
        """What the Cloze copies of ``windows`` mask: ``masked_proportion``, the share of their items masked
        (ρ, or less where ``max_predictions`` binds), and ``capped_windows``, the share of windows whose count
        max_predictions cut. Every copy of a window masks the same count (:meth:`mask_counts`), so these hold
        for fixed and fresh masks alike; None without Cloze copies (``dupe_factor = 0``)."""
        if not self.config.dupe_factor:
            return {"masked_proportion": None, "capped_windows": None}
        n = (windows != PAD).sum(1)
        k = self.mask_counts(n)
        return {"masked_proportion": float(k.sum() / n.sum()),
                "capped_windows": float((k < self.rounded_counts(n).clamp(min=1)).double().mean())}

    def training_report(self) -> dict:
        """Facts of this run's training copies for its result rows (:meth:`cloze_copy_facts`); empty before
        :meth:`training_examples` has built them."""
        return dict(getattr(self, "cloze_facts", {}))

    def fixed_masks(self, windows: torch.Tensor, window: torch.Tensor, last: torch.Tensor,
                    chunk: int = 8192) -> dict[str, torch.Tensor]:
        """Masks drawn once for every example, as the official ``gen_data_fin.py`` writes its masked copies to a
        file once: ``masked_columns`` (E, P) the masked columns of the N-column window, ascending, N where
        unused; ``masked_tokens`` (E, P) what the input reads there ([MASK], or the item or a random one). Drawn
        from a generator seeded by the global RNG, which the harness seeds per run."""
        N, P = self.config.max_len, self.config.max_predictions if self.config.dupe_factor else 1
        generator = torch.Generator().manual_seed(int(torch.randint(2 ** 62, ())))
        columns, tokens = [], []
        for i in range(0, len(window), chunk):
            items, rows_last = windows[window[i:i + chunk]], last[i:i + chunk]
            masked = self.draw_masks(items, rows_last, generator)
            inputs = self.corrupt(items, masked, rows_last, generator)
            where = torch.where(masked, torch.arange(N), N).sort(1).values[:, :P]
            columns.append(where.to(torch.int16))
            tokens.append(torch.cat([inputs, inputs[:, :1]], 1).gather(1, where).to(torch.int32))
        return {"masked_columns": torch.cat(columns), "masked_tokens": torch.cat(tokens)}

    def rounded_counts(self, n: torch.Tensor) -> torch.Tensor:
        """round(ρ·n) for window lengths ``n`` with Python 2's ``round`` of the official ``gen_data_fin.py``: ρ·n
        in double precision, halves rounded away from zero."""
        x = n.double() * self.config.mask_proportion
        whole = x.floor()
        return (whole + (x - whole >= 0.5)).long()

    def mask_counts(self, n: torch.Tensor) -> torch.Tensor:
        """k = min(max_predictions, max(1, round(ρ·n))) for window lengths ``n`` (``gen_data_fin.py``)."""
        return self.rounded_counts(n).clamp(1, self.config.max_predictions)

    def draw_masks(self, items: torch.Tensor, last: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Which positions to predict, (B, T) bool: :meth:`mask_counts` positions drawn uniformly without
        replacement among a window's n items, or only the last column for ``last`` rows."""
        present = items != PAD
        k = torch.where(last, 1, self.mask_counts(present.sum(1)))
        keys = torch.rand(items.shape, generator=generator, device=items.device)
        keys = keys.masked_fill(~present, 2.0)  # padding sorts last and is never drawn
        keys[:, -1] = torch.where(last, -1.0, keys[:, -1])  # the last item comes first for ``last`` rows
        rank = keys.argsort(1).argsort(1)  # exact ranks: exactly k positions per row, even with tied keys
        return rank < k[:, None]

    def corrupt(self, items: torch.Tensor, masked: torch.Tensor, last: torch.Tensor,
                generator: torch.Generator) -> torch.Tensor:
        """Inputs S'_u: masked positions become [MASK] with probability mask_token_prob, else (official code and
        BERT) half of them keep their item and half get a uniformly random item. A last-item sample's item
        always becomes [MASK] (the official ``create_masked_lm_predictions_force_last``)."""
        p = self.config.mask_token_prob
        if p == 1.0:
            return items.masked_fill(masked, self.mask_token)
        draw = torch.rand(items.shape, generator=generator, device=items.device).masked_fill_(last[:, None], -1.0)
        random_items = torch.randint(1, self.n_items + 1, items.shape, generator=generator, device=items.device)
        out = torch.where(masked & (draw < p), self.mask_token, items)
        return torch.where(masked & (draw >= p + (1 - p) / 2), random_items, out)

    def masked_inputs(self, batch, generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A batch's windows (B, T), the positions to predict (B, T) and the corrupted inputs S'_u (B, T), with
        the all-padding columns trimmed off."""
        items = self.windows[batch["window"]]
        if "masked_columns" not in batch:  # fresh masks, drawn on the trimmed batch
            (items,) = trim_padding(items)
            masked = self.draw_masks(items, batch["last"], generator)
            return items, masked, self.corrupt(items, masked, batch["last"], generator)
        columns = batch["masked_columns"].long()  # N: none
        spare = items.new_zeros(len(items), 1)
        masked = torch.zeros(items.shape[0], items.shape[1] + 1, dtype=torch.bool, device=items.device)
        masked = masked.scatter_(1, columns, True)[:, :-1]
        inputs = torch.cat([items, spare], 1).scatter_(1, columns, batch["masked_tokens"].long())[:, :-1]
        return trim_padding(items, masked, inputs)

    def masked_outputs(self, batch, generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Eq. 7's left factor (:meth:`transform`) only at a batch's M masked positions (M, d), their items (M,)
        and the batch row each belongs to (M,)."""
        items, masked, inputs = self.masked_inputs(batch, generator)
        hidden, _ = self.encoder(inputs)  # rows of the non-padding positions
        rows = torch.arange(len(items), device=items.device)[:, None].expand_as(items)[masked]
        return self.transform(hidden[masked[items != PAD]]), items[masked], rows

    def loss(self, batch, generator):
        """Eq. 8: mean −log P of the masked items; logits only at masked positions, the softmax over all
        classes taken chunk by chunk."""
        queries, targets, _ = self.masked_outputs(batch, generator)
        weight, bias, offset = self.softmax_classes()
        return softmax_cross_entropy(queries, weight, targets - offset, bias)

    # ------------------------------------------------------------------------------------------- inference
    def append_mask(self, histories: torch.Tensor) -> torch.Tensor:
        """The last N − 1 history items followed by [MASK]: (B, N) at most."""
        histories = histories[:, -(self.config.max_len - 1):]
        mask = torch.full((len(histories), 1), self.mask_token, dtype=histories.dtype, device=histories.device)
        return torch.cat([histories, mask], 1)

    def score_factors(self, users, histories) -> ScoreFactors:
        """Eq. 7 before the softmax: gelu(h_t W^P + b^P) E^T + b^O at the appended [MASK] position."""
        (items,) = trim_padding(self.append_mask(histories))
        hidden, _ = self.encoder(items, last_only=True)
        return ScoreFactors(self.transform(hidden), self.encoder.item_embedding.weight[:self.n_items + 1],
                            self.output_bias[:self.n_items + 1])

    def score(self, users, histories, candidates):
        factors = self.score_factors(users, histories)
        if candidates is None:
            return factors.full()
        E = self.encoder.item_embedding(candidates)
        return (E @ factors.queries[:, :, None]).squeeze(-1) + self.output_bias[candidates]

    def attention_weights(self, histories, trim: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The scored inputs (B, T), the last N − 1 items and [MASK], and their attention weights (B, layers,
        heads, T, T); ``trim`` drops the columns that are padding in every row."""
        items = self.append_mask(histories)
        if trim:
            (items,) = trim_padding(items)
        _, weights = self.encoder(items, need_weights=True)
        return items, torch.stack(weights, 1)


@dataclass
class BERT4Rec1MaskConfig(BERT4RecConfig):
    dupe_factor: int = 0  # paper Table 3, "BERT4Rec (1 mask)": trained only with the last item masked


class BERT4Rec1Mask(BERT4Rec):
    """The Cloze study's "BERT4Rec (1 mask)" read as "only the last item masked": the same network, trained only
    on last-item-masked samples."""

    name = "bert4rec-1mask"
    Config = BERT4Rec1MaskConfig


@dataclass
class BERT4Rec1MaskRandomConfig(BERT4RecConfig):
    max_predictions: int = 1  # paper Table 3, "BERT4Rec (1 mask)" read as one random item per Cloze copy

    def __post_init__(self):
        super().__post_init__()
        require(self, self.max_predictions == 1, "max_predictions",
                "be 1 (this variant masks one random item per copy; bert4rec masks more)")


class BERT4Rec1MaskRandom(BERT4Rec):
    """The Cloze study's "BERT4Rec (1 mask)" read as "one random item masked per training copy": the authors'
    ``gen_data_fin.py`` run with ``max_predictions_per_seq = 1``, so each of the ``dupe_factor`` copies of a
    window masks one item drawn uniformly among its n items (num_to_predict = min(1, max(1, round(ρ·n))) = 1),
    and ``mask_last()`` adds the copy with only the last item masked, as for BERT4Rec."""

    name = "bert4rec-1mask-random"
    Config = BERT4Rec1MaskRandomConfig
