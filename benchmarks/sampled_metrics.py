"""Sampled metrics without sampling noise, and the Krichene–Rendle correction (``PROTOCOL.md``, "Sampled metrics
from full ranks").

**Uniform negatives, exactly.** A user's full ranking holds ``E`` candidates besides the target (``candidates`` of
:class:`benchmarks.metrics.RankCounts`); ``m`` of them score above it (``greater``) and ``t`` alike (``ties``). Under
leave-one-out's test view they are exactly the items ``uni100`` draws from (every item but the user's sequence), so n
negatives drawn uniformly without replacement put X = Hypergeometric(E, m, n) of them above the target, and the
sampled rank is 1 + X. With ties, the ``expected`` tie policy equals the mean over the target's place among its t
ties, u uniform on 0..t, of the hypergeometric with m + u above (a uniform order of the tied items stays uniform on
any subset a draw keeps), so

    P(X = x) = (1/(t+1)) Σ_{u=0..t} C(m+u, x) C(E-m-u, n-x) / C(E, n)
             = (E+1)/((n+1)(t+1)) · [P(H_{m+t} ≥ x+1) − P(H_{m-1} ≥ x+1)],  H_y ~ Hypergeometric(E+1, y+1, n+1),

the second line because C(y, x) C(E-y, n-x) / C(E+1, n+1) is the probability that the (x+1)-th smallest of n+1
numbers drawn from 0..E is y: the sum over y = m..m+t is a difference of two of its distribution functions. Every
metric's expectation is then Σ_x f(1+x) P(X=x), exact for any n and any tie count. The draw's spread: users draw
independently, so the row's variance is Σ_u Var_u / U²; each user's Var_u is exact from the joint draw of the
negatives above and tied with the target.

**Popularity negatives, approximately.** ``pop100`` draws items with probability ∝ their interaction count w_i,
successively without replacement. Item i then enters the sample with probability π_i ≈ 1 − exp(−λ w_i), λ chosen so
that Σ π_i = n over the user's pool (Rosén's approximation of successive sampling), and the number of drawn negatives
above the target is taken as a sum of independent Bernoulli(π_i) over the items ranked above it (a Poisson-binomial
count; the tied items likewise). That needs the set of items the model ranks above the target, which the per-user
files do not keep: it is computed from a model's scores. ``benchmarks/experiments/sampled_check.py`` holds it against
realised draws.

**Correcting sampled ranks** (Krichene & Rendle, "On Sampled Metrics for Item Recommendation", KDD 2020, Section 5).
Given only sampled ranks, each full-ranking metric is estimated two ways the paper describes: *MLE*, which
estimates the distribution of full ranks by expectation maximisation over P(sampled rank | full rank) and
averages the metric over it; and *BV(γ)*, a corrected metric f̃ of the sampled rank chosen to minimise
Σ_R [(E[f̃ | R] − f(R))² + γ Var[f̃ | R]] over the full ranks R (uniformly weighted), whose minimiser is
f̃ = ((1−γ) AᵀA + γ diag(Aᵀ1))⁻¹ Aᵀ f with A[R, r] = P(sampled rank r | R); γ = 0 is the least-biased metric.
The paper draws with replacement (binomial A); this suite draws without (hypergeometric A), at the users' mean pool
size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.special import gammaln

from recbench.benchmarks.metrics import RankCounts, per_user_metrics

SAMPLE_SIZES = (10, 50, 100, 1000)  # the numbers of negatives the reports compare with full ranking
BV_GAMMA = 0.1  # the bias-variance weight of the corrected metric BV(γ)
JOINT_LIMIT = 100  # largest n whose tied users get the exact joint variance; above, the tie-broken upper bound


def rank_values(metrics, n: int) -> dict[str, np.ndarray]:
    """Each metric's value at sampled rank 1 + x, x = 0..n (one relevant item, no ties), from the shared evaluator's
    formulas."""
    return per_user_metrics(np.arange(n + 1), np.zeros(n + 1, dtype=np.int64), metrics)


def _checked(greater, ties, candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    greater, ties = np.asarray(greater, dtype=np.int64), np.asarray(ties, dtype=np.int64)
    if candidates is None:
        raise ValueError("the expected sampled metrics need each user's number of candidates besides the target "
                         "(the 'candidates' of a per-user file); files written before it was kept lack it: rerun "
                         "the job")
    candidates = np.broadcast_to(np.asarray(candidates, dtype=np.int64), greater.shape)
    bad = np.flatnonzero((greater < 0) | (ties < 0) | (greater + ties > candidates))
    if len(bad):
        raise ValueError(f"user {bad[0]}: {greater[bad[0]]} candidates above and {ties[bad[0]]} tied with the "
                         f"target, but only {candidates[bad[0]]} candidates besides it")
    return greater, ties, candidates


def _log_choose(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    valid = (b >= 0) & (b <= a)
    a, b = np.where(valid, a, 0), np.where(valid, b, 0)
    return np.where(valid, gammaln(a + 1) - gammaln(b + 1) - gammaln(a - b + 1), -np.inf)


def hypergeom_pmf(k, population, successes, draws) -> np.ndarray:
    """P(k successes) in ``draws`` draws without replacement from ``population`` items of which ``successes`` are
    successes, broadcast over all arguments (log-gamma: scipy's per-element hypergeom is 100× slower here)."""
    return np.exp(_log_choose(successes, k) + _log_choose(population - successes, draws - k)
                  - _log_choose(population, draws))


def above_distribution(greater, ties, candidates, n: int) -> np.ndarray:
    """``(users, n + 1)``: per user, P(x of n uniformly drawn negatives rank above the target) under the
    ``expected`` tie policy (module docstring). A user with fewer than n candidates draws them all."""
    greater, ties, pool = _checked(greater, ties, candidates)
    drawn = np.minimum(pool, n)[:, None]
    x = np.arange(n + 1)[None, :]

    def at_least(above):  # P(H_above ≥ x + 1) for H ~ Hypergeometric(E + 1, above + 1, drawn + 1), x = 0..n
        pmf = hypergeom_pmf(np.arange(n + 2)[None, :], pool[:, None] + 1, above[:, None] + 1, drawn + 1)
        tail = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]  # tail[:, k] = P(H ≥ k)
        return np.where(above[:, None] < 0, 0.0, tail[:, 1:])

    pmf = (pool[:, None] + 1) / ((drawn + 1) * (ties[:, None] + 1)) * (at_least(greater + ties) - at_least(greater - 1))
    pmf[x > drawn] = 0.0
    return np.clip(pmf, 0.0, None)




def _second_moments(greater, ties, pool, n: int, pmf: np.ndarray, values) -> dict[str, np.ndarray]:
    """E[metric²] per user. Without ties the metric is a function of the sampled rank, so ``pmf`` and ``values``
    (the metric at sampled rank 1 + x) give it; a user with ties needs the joint draw of the negatives above and
    tied with the target, exact when n ≤ ``JOINT_LIMIT`` (above it the tie-broken draw's value, an upper bound)."""
    out = {name: pmf @ (value ** 2) for name, value in values.items()}
    tied = np.flatnonzero(ties > 0)
    if not len(tied) or n > JOINT_LIMIT:
        return out
    n = min(n, int(pool[tied].max()))  # no user draws more than its pool
    a, b = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")  # drawn above, drawn tied
    squares = {name: value.reshape(n + 1, n + 1) ** 2
               for name, value in per_user_metrics(a.ravel(), b.ravel(), tuple(values)).items()}
    for start in range(0, len(tied), 64):
        rows = tied[start:start + 64]
        g, t, e = (greater[rows][:, None, None], ties[rows][:, None, None], pool[rows][:, None, None])
        drawn = np.minimum(e, n)
        joint = np.exp(_log_choose(g, a) + _log_choose(t, b) + _log_choose(e - g - t, drawn - a - b)
                       - _log_choose(e, drawn))
        for name, square in squares.items():
            out[name][rows] = (joint * square[None]).sum(axis=(1, 2))
    return out


@dataclass(frozen=True)
class SampledExpectation:
    """A row's metrics expected under n uniformly sampled negatives, with the spread of one draw."""

    n: int
    mean: dict[str, float]  # metric -> the expectation of the row's value (mean over users)
    std: dict[str, float]  # metric -> the standard deviation of the row's value over draws
    per_user: dict[str, np.ndarray]  # metric -> each user's expected value (for paired tests)


def expected_uniform(counts: RankCounts, n: int, metrics) -> SampledExpectation:
    """The exact expectation and draw-to-draw standard deviation of each metric of a full-ranking row had its
    targets been ranked among ``n`` uniformly sampled negatives (``counts`` of the full ranking, with
    ``candidates``)."""
    greater, ties, pool = _checked(counts.greater, counts.ties, counts.candidates)
    metrics = tuple(metrics)
    values = rank_values(metrics, n)
    pmf = above_distribution(greater, ties, pool, n)
    per_user = {name: pmf @ values[name] for name in metrics}
    second = _second_moments(greater, ties, pool, n, pmf, values)
    users = max(len(greater), 1)
    std = {name: float(np.sqrt(np.clip(second[name] - per_user[name] ** 2, 0, None).sum()) / users)
           for name in metrics}
    return SampledExpectation(n, {name: float(v.mean()) if len(v) else float("nan") for name, v in per_user.items()},
                              std, per_user)


# ------------------------------------------------------------------------------ popularity-sampled negatives

def inclusion_probabilities(weights: np.ndarray, allowed: np.ndarray, n: int, iterations: int = 60) -> np.ndarray:
    """``(users, items)``: each allowed item's probability of being among n successive draws ∝ ``weights``
    without replacement, by Rosén's approximation π = 1 − exp(−λ w) with λ per user solved (bisection on log λ)
    so that Σ π = n over the user's ``allowed`` items (``allowed``: boolean ``(users, items)``)."""
    w = np.where(allowed, weights[None, :], 0.0)
    low = np.full(len(w), -30.0)
    high = np.full(len(w), 30.0)
    for _ in range(iterations):
        middle = (low + high) / 2
        total = (-np.expm1(-np.exp(middle)[:, None] * w)).sum(1)
        above = total > n
        high = np.where(above, middle, high)
        low = np.where(above, low, middle)
    return -np.expm1(-np.exp((low + high) / 2)[:, None] * w)


def poisson_binomial(probabilities: np.ndarray, n: int) -> np.ndarray:
    """``(users, n + 1)``: per row of ``probabilities`` ``(users, items)``, the distribution of the number of
    independent Bernoulli(p) successes over its items, x = 0..n (the last entry holds every count ≥ n)."""
    pmf = np.zeros((len(probabilities), n + 1))
    pmf[:, 0] = 1.0
    for column in np.flatnonzero(probabilities.any(0)):
        p = probabilities[:, column:column + 1]
        moved = pmf * p
        pmf *= 1 - p
        pmf[:, 1:] += moved[:, :-1]
        pmf[:, -1] += moved[:, -1]
    return pmf


def expected_popularity(above: np.ndarray, tied: np.ndarray, n: int, metrics) -> dict[str, np.ndarray]:
    """Per user, each metric's approximate expectation under ``n`` popularity-sampled negatives, from the inclusion
    probabilities (``inclusion_probabilities``) of the items the model ranks above the target (``above``,
    ``(users, items)``, 0 for the others) and of those it ties with the target (``tied``): the numbers drawn of
    each are taken as sums of independent Bernoulli draws (module docstring), and the ``expected`` tie policy
    applies to the pair."""
    values = rank_values(tuple(metrics), n)
    drawn_above = poisson_binomial(above, n)
    out = {name: drawn_above @ value for name, value in values.items()}
    with_ties = np.flatnonzero(tied.any(1))
    if len(with_ties):
        drawn_tied = poisson_binomial(tied[with_ties], n)
        a, b = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        grid = per_user_metrics(a.ravel(), b.ravel(), tuple(values))
        for name in values:
            joint = drawn_above[with_ties][:, :, None] * drawn_tied[:, None, :]
            out[name][with_ties] = (joint * grid[name].reshape(n + 1, n + 1)[None]).sum(axis=(1, 2))
    return out


# ------------------------------------------------------------------------------ correcting sampled ranks

def sampled_rank_matrix(pool: int, n: int) -> np.ndarray:
    """``A``, ``(pool + 1, n + 1)``: A[R-1, r-1] = P(sampled rank r | full rank R) for n uniform negatives drawn
    without replacement from a pool of ``pool`` candidates besides the target."""
    return hypergeom_pmf(np.arange(n + 1)[None, :], pool, np.arange(pool + 1)[:, None], min(n, pool))


def rank_histogram(pmf_or_counts, n: int) -> np.ndarray:
    """The share of users at each sampled rank 1..n+1: from ``(users, n + 1)`` distributions (their mean), or from
    realised sampled counts as (greater, ties), ties spread uniformly over the tied ranks."""
    if isinstance(pmf_or_counts, np.ndarray):
        return pmf_or_counts.mean(0)
    greater, ties = (np.asarray(a, dtype=np.int64) for a in pmf_or_counts)
    histogram = np.zeros(n + 1)
    for extra in range(int(ties.max(initial=0)) + 1):
        share = np.where(extra <= ties, 1.0 / (ties + 1), 0.0)
        np.add.at(histogram, np.minimum(greater + extra, n), share)
    return histogram / max(len(greater), 1)


def _within(histogram: np.ndarray, pool: int) -> np.ndarray:
    """The histogram of sampled ranks cut to the ranks a pool of ``pool`` candidates allows (n ≥ pool draws them
    all, and the sampled rank is the full one), anything beyond counted at the last."""
    if len(histogram) <= pool + 1:
        return histogram
    return np.r_[histogram[:pool], histogram[pool:].sum()]


def corrected_bv(histogram: np.ndarray, pool: int, metrics, gamma: float = BV_GAMMA) -> dict[str, float]:
    """Krichene & Rendle's BV(γ) estimate of each full-ranking metric from a histogram of sampled ranks
    (:func:`rank_histogram`): the mean of the corrected metric f̃ (module docstring) over the sampled ranks."""
    histogram = _within(histogram, pool)
    a = sampled_rank_matrix(pool, len(histogram) - 1)
    system = (1 - gamma) * a.T @ a + gamma * np.diag(a.sum(0))
    full = rank_values(tuple(metrics), pool)
    return {name: float(histogram @ np.linalg.solve(system, a.T @ full[name])) for name in full}


def corrected_mle(histogram: np.ndarray, pool: int, metrics, iterations: int = 500) -> dict[str, float]:
    """Krichene & Rendle's MLE estimate: the distribution of full ranks that makes the observed sampled ranks most
    likely (expectation maximisation from the uniform one), and each metric's mean over it."""
    histogram = _within(histogram, pool)
    a = sampled_rank_matrix(pool, len(histogram) - 1)
    p = np.full(pool + 1, 1.0 / (pool + 1))
    for _ in range(iterations):
        likely = p @ a  # P(sampled rank r) under p
        p = p * (a @ np.where(likely > 0, histogram / np.where(likely > 0, likely, 1.0), 0.0))
        p /= p.sum()
    full = rank_values(tuple(metrics), pool)
    return {name: float(p @ full[name]) for name in full}


def mean_pool(counts: RankCounts) -> int:
    """The users' mean number of candidates besides the target, the single pool size the corrections assume."""
    _, _, pool = _checked(counts.greater, counts.ties, counts.candidates)
    return int(round(float(pool.mean())))


# ------------------------------------------------------------------------------ orderings

def kendall_tau(first: dict[str, float], second: dict[str, float]) -> tuple[float, list[tuple[str, str]]]:
    """Kendall's τ (τ-b) between two orderings of the same models by value, and the pairs they order oppositely
    (each pair as (better by ``first``, worse by ``first``))."""
    models = sorted(first.keys() & second.keys())
    flips = [(a, b) if first[a] > first[b] else (b, a) for i, a in enumerate(models) for b in models[i + 1:]
             if (first[a] - first[b]) * (second[a] - second[b]) < 0]
    if len(models) < 2:
        return float("nan"), flips
    tau = stats.kendalltau([first[m] for m in models], [second[m] for m in models]).statistic
    return float(tau), flips

