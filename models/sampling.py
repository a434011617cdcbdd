"""Random draws on the device from the trainer's generator, shared by the models: sampled negatives and
dropout masks (so that a seed, and a checkpoint's generator state, fix every draw of a training run)."""
from __future__ import annotations

import numpy as np
import torch

from recbench.datasets.sequences import Histories


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


def support_weights(train: Histories, n_items: int, alpha: float) -> torch.Tensor:
    """``supp_i^α`` indexed by item id: each item's training interaction count raised to ``alpha`` (α = 1
    popularity, α = 0 every item seen in training alike); padding and items never seen in training get 0."""
    support = torch.from_numpy(np.bincount(train.items, minlength=n_items + 1)).double()
    return (support.pow(alpha) * (support > 0)).float()


def _avoid(draw, shape: tuple, users: torch.Tensor | None, exclude: InteractionSet | None,
           retries: int) -> torch.Tensor:
    """``draw(shape)``, redrawn (a few times) where ``exclude`` holds the (user, item) pair. After ``retries``
    redraws a rare collision is kept rather than looping forever on a user who had almost every item."""
    negatives = draw(shape)
    if exclude is None:
        return negatives
    users = users.expand(shape) if users.shape != shape else users
    for _ in range(retries):
        clash = exclude.contains(users, negatives)
        if not clash.any():
            break
        negatives = torch.where(clash, draw(shape), negatives)
    return negatives


def uniform_negatives(n_items: int, shape: tuple, generator: torch.Generator, device: torch.device,
                      users: torch.Tensor | None = None, exclude: InteractionSet | None = None,
                      retries: int = 5) -> torch.Tensor:
    """Items drawn uniformly from 1..n_items; with ``exclude``, redrawn where the user had them (``users``
    broadcasts against ``shape``)."""
    return _avoid(lambda size: torch.randint(1, n_items + 1, size, generator=generator, device=device),
                  shape, users, exclude, retries)


def weighted_negatives(weights: torch.Tensor, shape: tuple, generator: torch.Generator,
                       users: torch.Tensor | None = None, exclude: InteractionSet | None = None,
                       retries: int = 5) -> torch.Tensor:
    """Items drawn with replacement with probability ∝ ``weights`` (indexed by item id, 0 = padding, e.g.
    :func:`support_weights`); with ``exclude``, redrawn where the user had them."""
    def draw(size):
        n = int(np.prod(size))
        return torch.multinomial(weights, n, replacement=True, generator=generator).view(size)
    return _avoid(draw, tuple(shape), users, exclude, retries)


def dropout(x: torch.Tensor, p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Inverted dropout whose mask comes from ``generator``; identity when ``generator`` is None (scoring).

    ``torch.nn.Dropout`` draws from the global RNG, which the trainer's checkpoint does not hold, so a resumed
    run would not repeat the interrupted one.
    """
    if generator is None or p == 0.0:
        return x
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= p
    return x * keep / (1.0 - p)
