"""What the recurrent models (GRU4Rec, GRU4Rec+, LSTM) share: training windows, scoring from left-padded
histories, and the item output layer ``r_i = h · w_i + b_i``.

Training: each training sequence is cut, from its end, into windows of at most ``max_len + 1`` items that
overlap by one item, so that every item but a sequence's first is a next-item target exactly once. A window
is stored right-padded (PAD after its last item): its inputs are ``w[:-1]`` and its targets ``w[1:]``. A
recurrent network reads a right-padded row left to right, so its state at a real position never depends on
the padding behind it (no packing needed), and the state at position ``t`` has seen items ``≤ t`` only.

Scoring: the evaluator passes left-padded histories (most recent item last). They are shifted to right padding
and the network's representation at the last real position scores the items, exactly as that position would
be scored in training.
"""
from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch
from torch import nn

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import NeuralRecommender


def windows_per_user(train: Histories, max_len: int) -> np.ndarray:
    """How many windows :func:`sequence_windows` cuts from each history: ceil((n − 1) / max_len)."""
    return (np.maximum(train.lengths - 1, 0) + max_len - 1) // max_len


def sequence_windows(train: Histories, max_len: int) -> np.ndarray:
    """``(n_windows, max_len + 1)`` right-padded windows of the training sequences (see module docstring), the
    windows of each history together, histories in order."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    per_user = windows_per_user(train, max_len)
    owner = np.repeat(np.arange(len(train), dtype=np.int64), per_user)
    k = np.arange(len(owner), dtype=np.int64) - np.repeat(np.cumsum(per_user) - per_user, per_user)
    end = train.offsets[owner + 1] - 1 - k * max_len  # flat index of the window's last item (k = 0: newest)
    start = np.maximum(train.offsets[owner], end - max_len)
    index = start[:, None] + np.arange(max_len + 1, dtype=np.int64)[None, :]
    valid = index <= end[:, None]
    return np.where(valid, train.items[np.where(valid, index, 0)], PAD)


def right_align(histories: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(B, W)`` histories as right-padded rows (same width), and each row's length."""
    width = histories.shape[1]
    lengths = (histories != PAD).sum(1)
    columns = torch.arange(width, device=histories.device)
    # Row r starts at column W - len_r; rotating it left by that much moves the leading pads to the end.
    return histories.gather(1, (columns[None, :] + (width - lengths)[:, None]) % width), lengths


def run_rnn(rnn: nn.RNNBase, x: torch.Tensor) -> torch.Tensor:
    """Every step's output of ``rnn`` on ``(B, T, d)`` inputs, computed in float32 even under the trainer's bf16
    autocast: CUDA has bf16 RNN kernels only in recent cuDNN versions, and these networks are small."""
    with torch.autocast(x.device.type, enabled=False):
        return rnn(x.float())[0]


class RecurrentRecommender(NeuralRecommender):
    """A network that turns a right-padded item sequence into one user vector per position (:meth:`encode`),
    scored against every item by an output layer with its own item vectors and biases."""

    def __init__(self, n_users: int, n_items: int, config, hidden: int):
        super().__init__(n_users, n_items, config)
        self.output = nn.Embedding(n_items + 1, hidden)
        self.output_bias = nn.Parameter(torch.zeros(n_items + 1))
        # Glorot-uniform over (hidden, items), GRU4Rec's initialisation of its output layer: scores start near 0
        # (nn.Embedding's N(0, 1) would start them at about ±sqrt(hidden), saturating the ranking losses).
        nn.init.xavier_uniform_(self.output.weight)

    @property
    def history_length(self) -> int:
        return self.config.max_len

    @abstractmethod
    def encode(self, sequences: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """``(B, T)`` right-padded items -> ``(B, T, hidden)`` user vectors; position ``t`` sees items ``≤ t``.
        ``generator`` is given in training only (dropout)."""

    def item_scores(self, states: torch.Tensor, items: torch.Tensor | None = None) -> torch.Tensor:
        """``r_i = h · w_i + b_i`` for ``states`` ``(B, d)`` and ``items``: None (all), ``(C,)`` shared by every
        row, or ``(B, C)`` per row."""
        if items is None:
            return states @ self.output.weight.T + self.output_bias
        if items.dim() == 1:
            return states @ self.output(items).T + self.output_bias[items]
        return (states[:, None, :] * self.output(items)).sum(-1) + self.output_bias[items]

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        return {"windows": torch.from_numpy(sequence_windows(train, self.config.max_len))}

    def positions(self, batch: dict, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The user vector and next-item target of every real position of a batch of windows: ``(P, d)``, ``(P,)``."""
        windows = batch["windows"]
        windows = windows[:, :int((windows != PAD).sum(1).max())]  # drop columns that are padding in every row
        inputs, targets = windows[:, :-1], windows[:, 1:]
        states = self.encode(inputs, generator)
        real = targets != PAD
        return states[real], targets[real]

    def score(self, users, histories, candidates):
        sequences, lengths = right_align(histories[:, -self.config.max_len:])
        sequences = sequences[:, :max(int(lengths.max()), 1)]  # columns that are padding in every row
        states = self.encode(sequences, None)
        last = states[torch.arange(len(states), device=states.device), (lengths - 1).clamp(min=0)]
        return self.item_scores(last, candidates)
