"""POP: rank every item by how often it was interacted with in the training sequences (paper §4.3)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from recbench.datasets.sequences import Histories
from recbench.models.base import FitReport, Recommender, gather_candidates


@dataclass
class PopConfig:
    """POP has no hyper-parameters."""


class Pop(Recommender):
    name = "pop"
    Config = PopConfig

    def __init__(self, n_users: int, n_items: int, config: PopConfig | None = None):
        super().__init__(n_users, n_items, config or PopConfig())
        self.counts = torch.zeros(n_items + 1)

    def fit(self, train: Histories) -> FitReport:
        started = time.perf_counter()
        # Counts from training interactions only: validation and test items must not leak into the ranking.
        self.counts = torch.from_numpy(np.bincount(train.items, minlength=self.n_items + 1).astype(np.float32))
        return FitReport(train_seconds=time.perf_counter() - started)

    def score(self, users, histories, candidates):
        return gather_candidates(self.counts.to(users.device).expand(len(users), -1), candidates)
