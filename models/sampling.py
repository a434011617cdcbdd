"""Random draws on the device from the trainer's generator, shared by the models: sampled negatives and
dropout masks (so that a seed, and a checkpoint's generator state, fix every draw of a training run)."""
from __future__ import annotations

import numpy as np
import torch

from datasets.sequences import Histories


class InteractionSet:
    """Membership test for (user, item) pairs of the training view, on the device, by binary search."""

    def __init__(self, train: Histories, n_items: int):
        row_of, items = train.flat(np.arange(len(train)))
        keys = np.unique(train.users[row_of] * (n_items + 1) + items)
        self.keys = torch.from_numpy(keys)
        self.stride = n_items + 1

    def to(self, device: torch.device) -> "InteractionSet":
        self.keys = self.keys.to(device)
        return self

    def contains(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        if self.keys.device != items.device:
            self.keys = self.keys.to(items.device)
        query = users * self.stride + items
        position = torch.searchsorted(self.keys, query).clamp(max=max(len(self.keys) - 1, 0))
        return self.keys[position] == query if len(self.keys) else torch.zeros_like(query, dtype=torch.bool)


def uniform_negatives(n_items: int, shape: tuple, generator: torch.Generator, device: torch.device,
                      users: torch.Tensor | None = None, exclude: InteractionSet | None = None,
                      retries: int = 5) -> torch.Tensor:
    """Items drawn uniformly from 1..n_items; with ``exclude``, redrawn (a few times) where the user had them.

    ``users`` broadcasts against ``shape``. After ``retries`` redraws a rare collision is kept rather than
    looping forever on a user who interacted with almost every item.
    """
    negatives = torch.randint(1, n_items + 1, shape, generator=generator, device=device)
    if exclude is None:
        return negatives
    users = users.expand(shape) if users.shape != shape else users
    for _ in range(retries):
        clash = exclude.contains(users, negatives)
        if not clash.any():
            break
        redraw = torch.randint(1, n_items + 1, shape, generator=generator, device=device)
        negatives = torch.where(clash, redraw, negatives)
    return negatives


def popularity_negatives(weights: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` item ids drawn with replacement with probability ∝ ``weights`` (indexed by item id, 0 = padding).

    Callers pass e.g. training interaction counts raised to a power (GRU4Rec+'s ``supp^α``).
    """
    return torch.multinomial(weights, n, replacement=True, generator=generator)


def dropout(x: torch.Tensor, p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Inverted dropout whose mask comes from ``generator``; identity when ``generator`` is None (scoring).

    ``torch.nn.Dropout`` draws from the global RNG, which the trainer's checkpoint does not hold, so a resumed
    run would not repeat the interrupted one.
    """
    if generator is None or p == 0.0:
        return x
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= p
    return x * keep / (1.0 - p)
