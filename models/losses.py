"""Next-item losses over one positive and k sampled negatives per position, shared by the networks that take the
loss as a setting (:mod:`models.loss_family`). Each takes the positive's score s⁺ (N,) and the negatives' scores
s⁻ (N, k) of N positions and returns the mean over the positions.

- Binary cross-entropy with k negatives (SASRec §III-E for k = 1):
  ℓ = −[log σ(s⁺) + Σ_j log(1 − σ(s⁻_j))] / (k + 1), the mean over the position's k + 1 logits as the gSASRec code
  averages its BCE (SASRec's code sums the two terms: a constant factor 2 at k = 1).
- gBCE (Petrov & Macdonald, "gSASRec: Reducing Overconfidence in Sequential Recommendation Trained with Negative
  Sampling", RecSys 2023, eq. 6–8): the positive's probability raised to β,
  ℓ = −[log σ(s⁺)^β + Σ_j log(1 − σ(s⁻_j))] / (k + 1), with β = α(t(1 − 1/α) + 1/α) and α = k / (|I| − 1) the
  sampling rate; t = 0 gives β = 1 (BCE), t = 1 gives β = α (calibrated probabilities). The authors' code reaches
  the same value by BCE on the transformed logit log(1 / (σ(s⁺)^−β − 1)); −β·log σ(s⁺) needs no float64.
- Sampled softmax (Jean et al., ACL 2015; Klenitskiy & Vasilev, RecSys 2023 with uniform negatives):
  ℓ = −log softmax([s⁺, s⁻_1, …, s⁻_k])[0]; with the logQ correction every logit first loses log(k·Q(i)), Q the
  sampler's probability of item i (as TensorFlow's sampled_softmax_loss subtracts the log expected count from the
  true and the sampled logits), which makes the estimate of the full softmax consistent under popularity sampling.
  Under uniform sampling the correction shifts every logit alike and changes nothing.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def gbce_beta(negatives: int, n_items: int, t: float) -> float:
    """β of gBCE for k = ``negatives`` drawn from ``n_items`` items and calibration ``t`` (eq. 8)."""
    alpha = negatives / (n_items - 1)
    return alpha * (t * (1.0 - 1.0 / alpha) + 1.0 / alpha)


def binary_cross_entropy(positive: torch.Tensor, negatives: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """gBCE with exponent ``beta`` on the positive's probability; ``beta`` = 1 is the plain BCE (module docstring)."""
    per_position = -(beta * F.logsigmoid(positive) + F.logsigmoid(-negatives).sum(-1))
    return (per_position / (negatives.shape[-1] + 1)).mean()


def sampled_softmax(positive: torch.Tensor, negatives: torch.Tensor, positive_log_q: torch.Tensor | None = None,
                    negative_log_q: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy of the positive among itself and its k negatives; with the log expected counts log(k·Q) of
    the positive (N,) and of each negative (N, k), the logQ-corrected sampled softmax (module docstring)."""
    logits = torch.cat([positive[:, None], negatives], dim=-1)
    if positive_log_q is not None:
        logits = logits - torch.cat([positive_log_q[:, None], negative_log_q], dim=-1)
    return -torch.log_softmax(logits, dim=-1)[:, 0].mean()


def log_expected_counts(probabilities: torch.Tensor, negatives: int) -> torch.Tensor:
    """log(k·Q(i)) indexed by item id from the sampler's probabilities Q (padding and never-drawn items: 0 → a
    large finite value, never used for a drawn item)."""
    return torch.log(probabilities.clamp_min(1e-30)) + math.log(negatives)
