"""What the relevance-prediction models share (``PAPER.md``, "Two tasks", task 2): given a history and one
candidate item, the probability that the user likes the candidate, trained with binary cross-entropy on sampled
negative candidates plus L2 (the trainer's ``weight_decay`` with ``optimizer = "adam"``, which folds λ‖θ‖² into
the gradient).

A relevance model's :meth:`~models.base.Recommender.score` is the logit s(u, c) of a candidate, so it also ranks
candidates like any other model; the probability is P(relevant | history, c) = σ(s(u, c)).

Loss, per training example (a history with its true next item c⁺ and k negatives c⁻_j drawn uniformly from the
items outside the user's training sequence):

    L = ½ [ −log σ(s(u, c⁺)) − (1/k) Σ_j log(1 − σ(s(u, c⁻_j))) ]

the mean binary cross-entropy of a *balanced* sample: the positive and its k negatives weigh the same in total,
whatever k, so the learned odds refer to the 1:1 mix of the evaluation pairs and p = 0.5 is the natural
threshold.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from recbench.models.sampling import InteractionSet, uniform_negatives


class RelevanceModel:
    """Mixin for a :class:`models.base.NeuralRecommender` trained for relevance prediction; the harness selects
    such a model on the validation pairs' relevance metrics and takes its probabilities as they are."""

    def predict_proba(self, users: torch.Tensor, histories: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """σ(s(u, c)) in float64: ``candidates`` ``(B,)`` -> ``(B,)``, or ``(B, C)`` -> ``(B, C)`` (each candidate
        judged on its own; one pass over each history)."""
        single = candidates.dim() == 1
        logits = self.score(users, histories, candidates[:, None] if single else candidates)
        probabilities = torch.sigmoid(logits.double())
        return probabilities[:, 0] if single else probabilities

    def sampled_bce(self, logits, users: torch.Tensor, positives: torch.Tensor, seen: InteractionSet,
                    generator: torch.Generator) -> torch.Tensor:
        """The module docstring's L averaged over examples. ``logits(candidates (P, 1 + k)) -> (P, 1 + k)`` scores
        each example's positive (column 0) and its ``k = config.negatives`` negatives, which avoid ``seen``."""
        k = self.config.negatives
        negatives = uniform_negatives(self.n_items, (len(positives), k), generator, positives.device, users[:, None],
                                      seen)
        s = logits(torch.cat([positives[:, None], negatives], 1)).float()
        return 0.5 * -(F.logsigmoid(s[:, 0]) + F.logsigmoid(-s[:, 1:]).mean(1)).mean()
