"""The shared leave-one-out evaluator: every model is scored here and nowhere else (``protocol.md``).

For each user the evaluator counts ``greater`` (candidates scored strictly above the target) and ``ties``
(other candidates scored exactly like it). Every metric follows from those two numbers:
with the ``expected`` tie policy the target's rank is uniform on ``greater+1 … greater+ties+1`` and each metric
is its mean over those ranks, so a constant scorer gets exactly the random-ranking value.

- HR@k   = P(rank ≤ k)
- NDCG@k = E[1/log2(rank+1) · 1{rank ≤ k}]   (one relevant item, so IDCG = 1)
- MRR    = E[1/rank]                         (over all candidates, not truncated)

Scoring is batched: one ``score`` call per chunk of users, then vectorised comparisons with the target's score
(no sorting). The per-user counts are kept so that every metric and paired tests can be recomputed later.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.negatives import SAMPLED_PROTOCOLS, load_or_sample
from datasets.sequences import LeaveOneOutSplit
from models.base import Recommender

PROTOCOLS = ("full", *SAMPLED_PROTOCOLS)
TIE_POLICIES = ("expected", "pessimistic", "optimistic")
DEFAULT_METRICS = ("HR@1", "HR@5", "HR@10", "NDCG@5", "NDCG@10", "MRR")  # the paper's Table 2 rows


def _count(mask: torch.Tensor) -> torch.Tensor:
    """Row-wise number of True values; summing the bytes as int32 is twice as fast as a bool sum on CPU."""
    return mask.view(torch.uint8).sum(1, dtype=torch.int32)


@contextmanager
def evaluation_mode(model):
    """Dropout off and autograd off while scoring; the model's training mode is restored afterwards."""
    was_training = getattr(model, "training", False)
    if was_training:
        model.eval()
    try:
        with torch.inference_mode():
            yield model
    finally:
        if was_training:
            model.train()


def history_batches(model, view, rows: np.ndarray, batch_size: int):
    """Chunks of ``rows`` of ``view`` as (start, rows of the chunk, users, left-padded histories) on the model's
    device, with as many history items as the model reads."""
    history_length = max(model.history_length, 1)
    device = model.device
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        yield (start, chunk, torch.from_numpy(view.users[chunk]).to(device),
               torch.from_numpy(view.padded(chunk, history_length)).to(device))


class ScoreError(ValueError):
    """A model returned scores the evaluator refuses to rank (NaN, +inf, wrong shape)."""


@dataclass
class RankCounts:
    """Per evaluated user: its row, how many candidates beat the target and how many tie with it."""

    users: np.ndarray
    greater: np.ndarray
    ties: np.ndarray

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez_compressed(tmp, users=self.users, greater=self.greater, ties=self.ties)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "RankCounts":
        with np.load(path, allow_pickle=False) as f:
            return cls(f["users"], f["greater"], f["ties"])


def _parse_metric(name: str) -> tuple[str, int | None]:
    kind, _, cutoff = name.partition("@")
    if kind == "MRR" and not cutoff:
        return kind, None
    if kind in ("HR", "NDCG") and cutoff.isdigit() and int(cutoff) > 0:
        return kind, int(cutoff)
    raise ValueError(f"unknown metric {name!r}; expected HR@k, NDCG@k (k a positive integer) or MRR")


def check_metric_name(name: str) -> bool:
    """Whether ``name`` is a ranking metric the evaluator computes (HR@k, NDCG@k, MRR)."""
    try:
        _parse_metric(name)
    except ValueError:
        return False
    return True


def per_user_metrics(greater: np.ndarray, ties: np.ndarray, metrics=DEFAULT_METRICS,
                     tie_policy: str = "expected") -> dict[str, np.ndarray]:
    """Each metric (``HR@k``, ``NDCG@k``, ``MRR``) for each user from its (greater, ties) counts."""
    parsed = [_parse_metric(name) for name in metrics]
    greater = np.asarray(greater, dtype=np.int64)
    ties = np.asarray(ties, dtype=np.int64)
    if tie_policy == "pessimistic":  # every tied candidate ranks above the target
        greater, ties = greater + ties, np.zeros_like(ties)
    elif tie_policy == "optimistic":  # the target ranks above every tied candidate
        ties = np.zeros_like(ties)
    elif tie_policy != "expected":
        raise ValueError(f"unknown tie policy {tie_policy!r}; expected one of {TIE_POLICIES}")
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
    return {name: float(values.mean()) if len(values) else float("nan") for name, values in per_user.items()}


@dataclass
class Evaluation:
    """One model scored on one split under one protocol."""

    protocol: str
    split: str
    tie_policy: str
    metrics: dict[str, float]
    counts: RankCounts
    seconds: float


class Evaluator:
    """Scores any :class:`Recommender` on the validation or test view of one leave-one-out split."""

    def __init__(self, split: LeaveOneOutSplit, seed: int, cache_dir: Path | None = None,
                 batch_size: int = 256, metrics=DEFAULT_METRICS, tie_policy: str = "expected"):
        if tie_policy not in TIE_POLICIES:
            raise ValueError(f"unknown tie policy {tie_policy!r}; expected one of {TIE_POLICIES}")
        self.split = split
        self.seed = seed
        self.cache_dir = cache_dir
        self.batch_size = batch_size
        self.metrics = tuple(metrics)
        for name in self.metrics:
            _parse_metric(name)  # fail now, not after training
        self.tie_policy = tie_policy
        self._views = {}
        self._negatives = {}

    def view(self, split: str):
        if split not in self._views:
            self._views[split] = self.split.view(split)
        return self._views[split]

    def negatives(self, split: str, protocol: str) -> np.ndarray:
        key = (split, protocol)
        if key not in self._negatives:
            self._negatives[key] = load_or_sample(self.split.data, split, protocol, self.seed, self.cache_dir)
        return self._negatives[key]

    def evaluate(self, model: Recommender, split: str, protocol: str, model_name: str | None = None,
                 users: np.ndarray | None = None) -> Evaluation:
        """Rank each user's target among the protocol's candidates; ``users`` restricts to some rows."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; expected one of {PROTOCOLS}")
        started = time.perf_counter()
        counts = self.rank_counts(model, split, protocol, model_name or type(model).__name__, users)
        per_user = per_user_metrics(counts.greater, counts.ties, self.metrics, self.tie_policy)
        return Evaluation(protocol, split, self.tie_policy, summarize(per_user), counts,
                          time.perf_counter() - started)

    def rank_counts(self, model: Recommender, split: str, protocol: str, model_name: str,
                    users: np.ndarray | None = None) -> RankCounts:
        view = self.view(split)
        rows = np.arange(len(view), dtype=np.int64) if users is None else np.asarray(users, dtype=np.int64)
        negatives = self.negatives(split, protocol) if protocol != "full" else None
        greater = np.zeros(len(rows), dtype=np.int64)
        ties = np.zeros(len(rows), dtype=np.int64)
        with evaluation_mode(model):
            for start, chunk, users_t, histories in history_batches(model, view, rows, self.batch_size):
                targets = torch.from_numpy(view.targets[chunk]).to(histories.device)
                if negatives is None:
                    g, t = self._full_counts(model, model_name, view, chunk, users_t, histories, targets)
                else:
                    g, t = self._sampled_counts(model, model_name, chunk, users_t, histories, targets,
                                                torch.from_numpy(negatives[view.users[chunk]]).to(histories.device))
                greater[start:start + len(chunk)] = g.cpu().numpy()
                ties[start:start + len(chunk)] = t.cpu().numpy()
        return RankCounts(view.users[rows], greater, ties)

    def _check(self, scores: torch.Tensor, shape: tuple, model_name: str) -> torch.Tensor:
        if tuple(scores.shape) != shape:
            raise ScoreError(f"model {model_name!r} on dataset {self.split.data.name!r}: score() returned shape "
                             f"{tuple(scores.shape)}, expected {shape}")
        scores = scores.float().contiguous()  # a broadcast view (POP) becomes a matrix we may scan and write
        highest = scores.max()  # one pass: max propagates NaN and is +inf if any score is
        if torch.isnan(highest) or torch.isposinf(highest):
            raise ScoreError(f"model {model_name!r} on dataset {self.split.data.name!r}: scores contain NaN or "
                             f"+inf; the model diverged or has a bug (check its learning rate and inputs)")
        return scores

    def _full_counts(self, model, model_name, view, chunk, users_t, histories, targets):
        n_slots = self.split.n_items + 1
        scores = self._check(model.score(users_t, histories, None), (len(chunk), n_slots), model_name)
        target_scores = scores.gather(1, targets[:, None])
        # Excluded: padding, every item of the input history, and the target itself (it is not its own rival).
        history_rows, history_items = view.flat(chunk)
        rows = torch.from_numpy(history_rows).to(scores.device)
        items = torch.from_numpy(history_items).to(scores.device)
        scores[:, 0] = -torch.inf
        scores[rows, items] = -torch.inf
        scores.scatter_(1, targets[:, None], -torch.inf)
        greater = _count(scores > target_scores)
        ties = _count(scores >= target_scores) - greater
        hopeless = torch.isneginf(target_scores[:, 0])
        if hopeless.any():
            # A target scored -inf ties with every other -inf candidate but not with the excluded columns.
            excluded = torch.zeros_like(scores, dtype=torch.bool)
            excluded[:, 0] = True
            excluded[rows, items] = True
            excluded.scatter_(1, targets[:, None], True)
            ties = torch.where(hopeless, _count(torch.isneginf(scores) & ~excluded), ties)
        return greater, ties

    def _sampled_counts(self, model, model_name, chunk, users_t, histories, targets, negatives):
        # The target goes to a random column (fixed by seed) so no model can learn where it sits.
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + int(chunk[0]))
        order = torch.rand(len(chunk), negatives.shape[1] + 1, generator=generator).argsort(1).to(targets.device)
        candidates = torch.cat([targets[:, None], negatives], 1).gather(1, order)
        target_column = (order == 0).float().argmax(1, keepdim=True)
        scores = self._check(model.score(users_t, histories, candidates), tuple(candidates.shape), model_name)
        target_scores = scores.gather(1, target_column)
        others = torch.ones_like(scores, dtype=torch.bool).scatter_(1, target_column, False)
        greater = _count((scores > target_scores) & others)
        ties = _count((scores == target_scores) & others)
        return greater, ties
