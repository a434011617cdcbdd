"""Ranking metrics from per-user rank counts (``PROTOCOL.md``, "Rank and ties" and "Metrics").

For each user the evaluator keeps two numbers: ``greater`` (candidates scored strictly above the target) and
``ties`` (other candidates scored exactly like it). Every metric follows from them. Under the ``expected`` tie
policy the target's rank is uniform on ``greater+1 … greater+ties+1`` and each metric is its mean over those
ranks, so a constant scorer gets exactly the random-ranking value:

- HR@k   = P(rank ≤ k)
- NDCG@k = E[1/log2(rank+1) · 1{rank ≤ k}]   (one relevant item, so IDCG = 1)
- MRR    = E[1/rank]                         (over all candidates, not truncated)

The reports recompute metrics and paired tests from the stored counts with these same functions.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recbench.benchmarks.store import npz_bytes, write_atomic
from recbench.datasets.errors import unknown

TIE_POLICIES = ("expected", "pessimistic", "optimistic")
DEFAULT_METRICS = ("HR@1", "HR@5", "HR@10", "NDCG@5", "NDCG@10", "MRR")  # the paper's Table 2 rows


@dataclass
class RankCounts:
    """Per evaluated user: its row, how many candidates beat the target and how many tie with it."""

    users: np.ndarray
    greater: np.ndarray
    ties: np.ndarray

    def save(self, path: Path) -> None:
        write_atomic(path, npz_bytes(dataclasses.asdict(self)))

    @classmethod
    def load(cls, path: Path) -> "RankCounts":
        with np.load(path, allow_pickle=False) as f:
            return cls(f["users"], f["greater"], f["ties"])


def parse_metric(name: str) -> tuple[str, int | None]:
    """(kind, cutoff) of a metric name: ``("NDCG", 10)`` for ``NDCG@10``, ``("MRR", None)`` for ``MRR``."""
    kind, _, cutoff = name.partition("@")
    if kind == "MRR" and not cutoff:
        return kind, None
    if kind in ("HR", "NDCG") and cutoff.isdigit() and int(cutoff) > 0:
        return kind, int(cutoff)
    raise unknown("metric", name, ["HR@k", "NDCG@k (k a positive integer)", "MRR"])


def check_metric_name(name: str) -> bool:
    """Whether ``name`` is a ranking metric the evaluator computes (HR@k, NDCG@k, MRR)."""
    try:
        parse_metric(name)
    except ValueError:
        return False
    return True


def check_tie_policy(tie_policy: str) -> None:
    if tie_policy not in TIE_POLICIES:
        raise unknown("tie policy", tie_policy, TIE_POLICIES)


def per_user_metrics(greater: np.ndarray, ties: np.ndarray, metrics=DEFAULT_METRICS,
                     tie_policy: str = "expected") -> dict[str, np.ndarray]:
    """Each metric (``HR@k``, ``NDCG@k``, ``MRR``) for each user from its (greater, ties) counts."""
    parsed = [parse_metric(name) for name in metrics]
    check_tie_policy(tie_policy)
    greater = np.asarray(greater, dtype=np.int64)
    ties = np.asarray(ties, dtype=np.int64)
    if tie_policy == "pessimistic":  # every tied candidate ranks above the target
        greater, ties = greater + ties, np.zeros_like(ties)
    elif tie_policy == "optimistic":  # the target ranks above every tied candidate
        ties = np.zeros_like(ties)
    worst = greater + ties + 1  # the lowest rank the target can take
    width = (ties + 1).astype(np.float64)  # number of equally likely ranks
    ranks = np.arange(1, int(worst.max(initial=1)) + 1, dtype=np.float64)
    gain_sum = np.r_[0.0, np.cumsum(1.0 / np.log2(ranks + 1.0))]  # gain_sum[n] = Σ_{r≤n} 1/log2(r+1)
    reciprocal_sum = np.r_[0.0, np.cumsum(1.0 / ranks)]  # reciprocal_sum[n] = Σ_{r≤n} 1/r
    out = {}
    for name, (kind, k) in zip(metrics, parsed):
        if kind == "HR":
            out[name] = np.clip(k - greater, 0, ties + 1) / width
        elif kind == "NDCG":
            out[name] = (gain_sum[np.minimum(worst, k)] - gain_sum[np.minimum(greater, k)]) / width
        else:
            out[name] = (reciprocal_sum[worst] - reciprocal_sum[greater]) / width
    return out


def summarize(per_user: dict[str, np.ndarray]) -> dict[str, float]:
    """The mean of each metric over the users (NaN when there are none)."""
    return {name: float(values.mean()) if len(values) else float("nan") for name, values in per_user.items()}
