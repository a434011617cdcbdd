"""Relevance prediction, the second task of ``PAPER.md`` ("Two tasks"; ``PROTOCOL.md``, "Relevance prediction").

Given a history and *one* candidate item, predict the probability that the user likes the candidate.

Pairs. For every user and for each of the validation and test splits: the split's held-out target (label 1)
and one negative (label 0) drawn uniformly from the items the user never interacted with (whole sequence), both
judged against the split's input history. The negatives are drawn once per (dataset, split, seed), stored beside
the prepared data and shared by every model, exactly like the ranking negatives (``benchmarks.negatives``,
protocol ``pairs``). So every model judges the same 2·U pairs, half of them positive.

Metrics over the pairs (labels y, probabilities p):

- accuracy = mean 1{(p ≥ 0.5) = y}
- AUC = P(p⁺ > p⁻) + ½ P(p⁺ = p⁻) over all (positive, negative) pairs of pairs: the Mann–Whitney statistic
  (Σ_{y=1} R_i − n⁺(n⁺+1)/2) / (n⁺ n⁻) with R the average ranks of p (ties share their mean rank), so a
  constant predictor gets exactly 0.5
- log-loss = −mean[y log p + (1 − y) log(1 − p)], p clipped to [ε, 1 − ε]

Models. A model trained for this task (:class:`models.relevance.RelevanceModel`) returns probabilities itself
(``predict_proba``). Any other model is a ranker: its next-item score s of the candidate becomes a probability
by Platt scaling, p = σ(a·s + b), with (a, b) the logistic regression of the *validation* pairs' labels on their
scores (:func:`calibrate`); it is then applied unchanged to the test pairs, so no test information enters it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.special import expit
from scipy.stats import rankdata
from torch import nn

from recbench.benchmarks.evaluator import ScoreError, evaluation_mode, history_batches
from recbench.benchmarks.negatives import PAIRS, load_or_sample
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.datasets.splits import TemporalSplit
from recbench.models.base import Recommender

TASK = "relevance"  # the ``task`` of its result rows; their ``protocol`` is ``pairs``
SELECTION_METRICS = ("accuracy", "AUC")  # higher is better: what the trainer may select on
THRESHOLD = 0.5
EPSILON = 1e-7  # log-loss clips probabilities to [ε, 1 − ε]
PAIR_LABELS = np.array([1, 0])  # column 0 of a user's pair is the positive (the split's target), column 1 the negative


# ------------------------------------------------------------------------------------------------- metrics

def accuracy(labels: np.ndarray, probabilities: np.ndarray, threshold: float = THRESHOLD) -> float:
    """Share of pairs where ``p >= threshold`` agrees with the label."""
    return float(np.mean((np.asarray(probabilities) >= threshold) == (np.asarray(labels) == 1)))


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC-AUC as the Mann–Whitney statistic with average ranks (a tie between a positive and a negative
    counts ½)."""
    positive = np.asarray(labels) == 1
    n_positive, n_negative = int(positive.sum()), int((~positive).sum())
    if not n_positive or not n_negative:
        raise ValueError(f"AUC needs positive and negative pairs; got {n_positive} and {n_negative}")
    ranks = rankdata(np.asarray(scores, dtype=np.float64), method="average")
    return float((ranks[positive].sum() - n_positive * (n_positive + 1) / 2) / (n_positive * n_negative))


def log_loss(labels: np.ndarray, probabilities: np.ndarray, epsilon: float = EPSILON) -> float:
    """Mean binary cross-entropy, probabilities clipped to [ε, 1 − ε] so a confident mistake costs log(1/ε)."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), epsilon, 1.0 - epsilon)
    return float(-np.mean(np.where(np.asarray(labels) == 1, np.log(p), np.log1p(-p))))


def relevance_metrics(labels: np.ndarray, probabilities: np.ndarray) -> dict[str, float]:
    labels, probabilities = np.ravel(labels), np.ravel(probabilities)
    return {"accuracy": accuracy(labels, probabilities), "AUC": roc_auc(labels, probabilities),
            "log_loss": log_loss(labels, probabilities)}


# --------------------------------------------------------------------------------------------- calibration

@dataclass(frozen=True)
class PlattScaling:
    """p = σ(slope·s + intercept): Platt's ("Probabilistic Outputs for Support Vector Machines", 1999) sigmoid
    fitted by maximum likelihood, with his smoothed targets (n⁺+1)/(n⁺+2) and 1/(n⁻+2) so that separable scores
    still give a finite slope."""

    slope: float
    intercept: float

    @classmethod
    def fit(cls, scores: np.ndarray, labels: np.ndarray) -> "PlattScaling":
        scores = np.ravel(np.asarray(scores, dtype=np.float64))
        positive = np.ravel(labels) == 1
        n_positive, n_negative = int(positive.sum()), int((~positive).sum())
        target = np.where(positive, (n_positive + 1) / (n_positive + 2), 1 / (n_negative + 2))
        # Fitted on standardised scores (POP's counts and a network's logits differ by orders of magnitude).
        center, scale = scores.mean(), scores.std() or 1.0
        z = (scores - center) / scale

        def cross_entropy(theta):
            logit = theta[0] * z + theta[1]
            residual = expit(logit) - target
            return (np.mean(np.logaddexp(0.0, logit) - target * logit),
                    np.array([np.mean(residual * z), np.mean(residual)]))

        a, b = minimize(cross_entropy, np.zeros(2), jac=True, method="BFGS").x
        return cls(slope=float(a / scale), intercept=float(b - a * center / scale))

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.slope * scores.double() + self.intercept)


class Calibrated(nn.Module):
    """A ranker whose candidate scores are turned into probabilities by a fitted :class:`PlattScaling`.

    An ``nn.Module`` holding the ranker, so that ``eval()``/``train()`` reach a neural one."""

    def __init__(self, model: Recommender, platt: PlattScaling):
        super().__init__()
        self.model = model
        self.platt = platt

    @property
    def history_length(self) -> int:
        return self.model.history_length

    @property
    def device(self) -> torch.device:
        return self.model.device

    def predict_proba(self, users: torch.Tensor, histories: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """``candidates`` ``(B,)`` -> ``(B,)``, or ``(B, C)`` -> ``(B, C)``, each candidate judged on its own."""
        single = candidates.dim() == 1
        scores = self.model.score(users, histories, candidates[:, None] if single else candidates)
        probabilities = self.platt(scores)
        return probabilities[:, 0] if single else probabilities


# --------------------------------------------------------------------------------------------- evaluation

@dataclass
class RelevanceEvaluation:
    """One model judged on one split's pairs; per user row: its two candidates, labels and probabilities."""

    split: str
    metrics: dict[str, float]
    users: np.ndarray  # (U,)
    candidates: np.ndarray  # (U, 2): [target, negative]
    probabilities: np.ndarray  # (U, 2)
    seconds: float

    @property
    def labels(self) -> np.ndarray:
        return np.broadcast_to(PAIR_LABELS, self.candidates.shape)

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-user file's arrays: ``users``, ``candidates``, ``labels``, ``probabilities``."""
        return {"users": self.users, "candidates": self.candidates, "labels": self.labels,
                "probabilities": self.probabilities}


class RelevanceEvaluator:
    """Judges any model on the validation or test pairs of one split (leave-one-out or temporal)."""

    def __init__(self, split: LeaveOneOutSplit | TemporalSplit, seed: int, cache_dir: Path | None = None,
                 batch_size: int = 256):
        self.split = split
        self.seed = seed
        self.cache_dir = cache_dir
        self.batch_size = batch_size
        self._views = {}
        self._pairs = {}

    def view(self, split: str):
        if split not in self._views:
            self._views[split] = self.split.view(split)
        return self._views[split]

    def pairs(self, split: str) -> np.ndarray:
        """``(len(view), 2)`` candidates of every row of the view: the split's target, then the stored negative."""
        if split not in self._pairs:
            view = self.view(split)
            negatives = load_or_sample(self.split, split, PAIRS, self.seed, self.cache_dir, n=1)
            self._pairs[split] = np.stack([view.targets, negatives[view.users, 0]], axis=1)
        return self._pairs[split]

    def evaluate(self, model, split: str, model_name: str | None = None,
                 users: np.ndarray | None = None) -> RelevanceEvaluation:
        """Probabilities of every pair from ``model.predict_proba`` and their metrics; ``users`` restricts to
        some rows."""
        name = model_name or type(model).__name__
        started = time.perf_counter()
        rows = self._rows(split, users)
        probabilities = self._collect(model, split, rows, model.predict_proba, name, probabilities=True)
        candidates = self.pairs(split)[rows]
        metrics = relevance_metrics(np.broadcast_to(PAIR_LABELS, candidates.shape), probabilities)
        return RelevanceEvaluation(split, metrics, self.view(split).users[rows], candidates, probabilities,
                                   time.perf_counter() - started)

    def scores(self, model: Recommender, split: str, model_name: str | None = None,
               users: np.ndarray | None = None) -> np.ndarray:
        """A ranker's own scores ``(U, 2)`` of every user's pair (for calibration)."""
        return self._collect(model, split, self._rows(split, users), model.score,
                             model_name or type(model).__name__, probabilities=False)

    def _rows(self, split: str, users: np.ndarray | None) -> np.ndarray:
        return np.arange(len(self.view(split)), dtype=np.int64) if users is None else np.asarray(users, np.int64)

    def _collect(self, model, split: str, rows: np.ndarray, predict, model_name: str,
                 probabilities: bool) -> np.ndarray:
        """``predict(users, histories, candidates (B, 2))`` over chunks of user rows, checked, as float64."""
        view, pairs = self.view(split), self.pairs(split)
        out = np.zeros((len(rows), 2), dtype=np.float64)
        with evaluation_mode(model):
            for start, chunk, users, histories in history_batches(model, view, rows, self.batch_size):
                candidates = torch.from_numpy(pairs[chunk]).to(histories.device)
                values = predict(users, histories, candidates)
                out[start:start + len(chunk)] = self._check(values, (len(chunk), 2), model_name, probabilities)
        return out

    def _check(self, values: torch.Tensor, shape: tuple, model_name: str, probabilities: bool) -> np.ndarray:
        what = "predict_proba" if probabilities else "score"
        where = f"model {model_name!r} on dataset {self.split.data.name!r}: {what}()"
        if tuple(values.shape) != shape:
            raise ScoreError(f"{where} returned shape {tuple(values.shape)}, expected {shape}")
        values = values.double().cpu().numpy()
        if not np.isfinite(values).all():
            raise ScoreError(f"{where} returned NaN or infinite values; the model diverged or has a bug "
                             f"(check its learning rate and inputs)")
        if probabilities and (values.min() < 0.0 or values.max() > 1.0):
            raise ScoreError(f"{where} returned values outside [0, 1] (min {values.min():.4g}, max "
                             f"{values.max():.4g}); it must return probabilities, e.g. σ(logit)")
        return values


def calibrate(model: Recommender, evaluator: RelevanceEvaluator, model_name: str | None = None) -> Calibrated:
    """Platt scaling of a ranker's scores, fitted on the validation pairs only."""
    scores = evaluator.scores(model, "valid", model_name)
    return Calibrated(model, PlattScaling.fit(scores, np.broadcast_to(PAIR_LABELS, scores.shape)))
