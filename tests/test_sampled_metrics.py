"""Expected sampled metrics from full ranks and the Krichene–Rendle corrections (``benchmarks/sampled_metrics.py``):
hand-computed cases, brute force over every possible draw, the evaluator's own draws, and the candidate counts the
evaluator now stores."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.metrics import RankCounts, per_user_metrics
from recbench.benchmarks.sampled_metrics import (
    above_distribution,
    corrected_bv,
    corrected_mle,
    expected_popularity,
    expected_uniform,
    inclusion_probabilities,
    kendall_tau,
    poisson_binomial,
    rank_histogram,
)
from recbench.datasets import LeaveOneOutSplit, TemporalSplit, generate
from recbench.datasets.sequences import SequenceData
from tests.helpers import FixedScorer

METRICS = ("HR@1", "HR@3", "NDCG@3", "MRR")


def one_user(greater: int, ties: int, candidates: int) -> RankCounts:
    return RankCounts(np.array([0]), np.array([greater]), np.array([ties]), np.array([candidates]))


def test_hand_computed_without_ties():
    # 4 candidates besides the target, 1 above it, 2 drawn: the one above is missed with C(3,2)/C(4,2) = 1/2.
    found = expected_uniform(one_user(1, 0, 4), 2, ("HR@1", "MRR"))
    assert found.mean["HR@1"] == pytest.approx(0.5)
    assert found.mean["MRR"] == pytest.approx(0.5 * 1 + 0.5 * 0.5)
    assert found.std["HR@1"] == pytest.approx(0.5)  # a Bernoulli(1/2) for the one user


def test_hand_computed_with_a_tie():
    # 3 candidates, one tied with the target, 1 drawn: the tied one (1/3) gives HR@1 = 1/2 under the expected tie
    # policy, either other (2/3) gives 1.
    found = expected_uniform(one_user(0, 1, 3), 1, ("HR@1",))
    assert found.mean["HR@1"] == pytest.approx(1 / 3 * 0.5 + 2 / 3 * 1.0)
    assert found.std["HR@1"] ** 2 == pytest.approx(1 / 3 * 0.25 + 2 / 3 - (5 / 6) ** 2)


@pytest.mark.parametrize("greater, ties, candidates, n", [(2, 2, 7, 3), (0, 0, 8, 3), (1, 4, 6, 4), (5, 0, 9, 2),
                                                          (0, 9, 10, 4), (3, 1, 5, 7)])
def test_every_possible_draw(greater, ties, candidates, n):
    """The mean and variance over every equally likely set of negatives, scored by the evaluator's formulas."""
    kinds = ["above"] * greater + ["tied"] * ties + ["below"] * (candidates - greater - ties)
    values = []
    for drawn in itertools.combinations(range(candidates), min(n, candidates)):
        above = sum(kinds[i] == "above" for i in drawn)
        tied = sum(kinds[i] == "tied" for i in drawn)
        values.append(per_user_metrics(np.array([above]), np.array([tied]), METRICS))
    found = expected_uniform(one_user(greater, ties, candidates), n, METRICS)
    for metric in METRICS:
        draws = np.array([v[metric][0] for v in values])
        assert found.mean[metric] == pytest.approx(draws.mean(), abs=1e-12)
        assert found.std[metric] ** 2 == pytest.approx(draws.var(), abs=1e-12)


def test_drawing_every_candidate_is_full_ranking():
    greater, ties = np.array([0, 3, 7, 2]), np.array([0, 1, 0, 5])
    counts = RankCounts(np.arange(4), greater, ties, np.array([9, 9, 9, 9]))
    found = expected_uniform(counts, 9, METRICS)
    full = per_user_metrics(greater, ties, METRICS)
    for metric in METRICS:
        assert found.per_user[metric] == pytest.approx(full[metric])
        assert found.std[metric] == pytest.approx(0.0, abs=1e-9)


def test_refuses_counts_without_candidates_or_beyond_them():
    with pytest.raises(ValueError, match="candidates"):
        expected_uniform(RankCounts(np.arange(1), np.array([1]), np.array([0])), 10, METRICS)
    with pytest.raises(ValueError, match="only 4 candidates"):
        expected_uniform(one_user(3, 2, 4), 2, METRICS)


@pytest.fixture(scope="module")
def ranked():
    data = generate(n_users=150, n_items=260, mean_length=12.0, seed=3)
    split = LeaveOneOutSplit(data)
    generator = torch.Generator().manual_seed(0)
    # Scores that favour popular items, rounded so that some candidates tie with the target.
    popular = torch.from_numpy(data.item_counts().astype(np.float32))
    scores = (torch.rand(data.n_users, data.n_items + 1, generator=generator) * 4 + popular.log1p()).round()
    model = FixedScorer(scores)
    full = Evaluator(split, seed=0).evaluate(model, "test", "full").counts
    return data, split, model, full


def test_the_evaluator_stores_each_users_candidates(ranked):
    data, split, model, full = ranked
    whole = [set(data.items[data.offsets[u]:data.offsets[u + 1]]) for u in range(data.n_users)]
    assert list(full.candidates) == [data.n_items - len(items) for items in whole]  # the uni100 pool
    assert (full.greater + full.ties <= full.candidates).all() and full.ties.any()
    sampled = Evaluator(split, seed=0).evaluate(model, "test", "uni100").counts
    assert (sampled.candidates == 100).all()


def test_the_expectation_is_the_mean_of_the_evaluators_draws(ranked):
    _, split, model, full = ranked
    draws = 60
    expected = expected_uniform(full, 100, ("NDCG@10", "HR@1"))
    realised = [Evaluator(split, seed=seed, metrics=("NDCG@10", "HR@1")).evaluate(model, "test", "uni100").metrics
                for seed in range(draws)]
    for metric in ("NDCG@10", "HR@1"):
        values = np.array([r[metric] for r in realised])
        # the mean of the draws lies within 4 standard errors of the expectation; their spread matches the std
        assert abs(values.mean() - expected.mean[metric]) < 4 * expected.std[metric] / math.sqrt(draws)
        assert values.std(ddof=1) == pytest.approx(expected.std[metric], rel=0.3)


def test_poisson_binomial_by_hand():
    pmf = poisson_binomial(np.array([[0.5, 0.2, 0.0], [1.0, 1.0, 1.0]]), 2)
    assert pmf[0] == pytest.approx([0.5 * 0.8, 0.5 * 0.8 + 0.5 * 0.2, 0.5 * 0.2])
    assert pmf[1] == pytest.approx([0, 0, 1])  # three certain successes, counted in the last entry (≥ 2)


def successive_sampling(weights: np.ndarray, n: int) -> dict[frozenset, float]:
    """Every set of n items that successive draws ∝ ``weights`` without replacement can give, with its probability,
    by enumerating the ordered draws."""
    found: dict[frozenset, float] = {}
    for order in itertools.permutations(range(len(weights)), n):
        probability, left = 1.0, weights.sum()
        for item in order:
            probability *= weights[item] / left
            left -= weights[item]
        found[frozenset(order)] = found.get(frozenset(order), 0.0) + probability
    return found


def test_rosens_inclusion_probabilities_sum_to_n_and_follow_the_weights():
    weights = np.r_[0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 9.0]
    allowed = np.ones((2, 7), dtype=bool)
    allowed[:, 0] = False
    allowed[1, 6] = False  # the second user's own item
    pi = inclusion_probabilities(weights, allowed, 3)
    assert pi.sum(1) == pytest.approx([3, 3]) and pi[1, 6] == 0 and (np.diff(pi[0, 1:]) > 0).all()
    exact = np.zeros(7)
    for drawn, probability in successive_sampling(weights[1:], 3).items():
        exact[[1 + item for item in drawn]] += probability
    assert pi[0] == pytest.approx(exact, abs=0.05)


@pytest.mark.parametrize("outranking", ["the 10 most popular", "40 at random"])
def test_the_popularity_approximation_against_successive_sampling(outranking):
    """600 items with Zipf-like weights, 20 drawn (the share of ML-1m's pool that pop100 draws): the approximation
    within 0.01 of 20,000 exact successive samples (the n items whose exponential clocks of rate w ring first)."""
    rng = np.random.default_rng(0)
    weights = np.r_[0.0, 1000.0 / np.arange(1, 601) ** 0.9]
    allowed = np.r_[False, np.ones(600, dtype=bool)][None, :]
    items = np.arange(1, 11) if outranking == "the 10 most popular" else rng.choice(np.arange(1, 601), 40, False)
    above = np.isin(np.arange(601), items)[None, :]
    pi = inclusion_probabilities(weights, allowed, 20)
    approximate = expected_popularity(pi * above, np.zeros_like(pi), 20, ("HR@1", "NDCG@10", "MRR"))
    clocks = rng.exponential(size=(20000, 600)) / weights[1:]
    drawn = np.isin(np.argpartition(clocks, 20, axis=1)[:, :20] + 1, items).sum(1)
    exact = per_user_metrics(drawn, np.zeros_like(drawn), ("HR@1", "NDCG@10", "MRR"))
    for metric, values in exact.items():
        assert approximate[metric][0] == pytest.approx(values.mean(), abs=0.01)
    # nothing above the target: it ranks first in every sample
    nothing = np.zeros_like(pi)
    assert expected_popularity(nothing, nothing, 20, ("HR@1",))["HR@1"] == pytest.approx([1.0])


def test_corrections_recover_full_ranking_when_every_candidate_is_drawn():
    greater = np.array([0, 2, 5, 11, 30])
    full = per_user_metrics(greater, np.zeros(5, dtype=np.int64), ("NDCG@10",))["NDCG@10"].mean()
    histogram = rank_histogram(above_distribution(greater, np.zeros(5), np.full(5, 40), 40), 40)
    assert corrected_bv(histogram, 40, ("NDCG@10",), gamma=0.0)["NDCG@10"] == pytest.approx(full)
    assert corrected_mle(histogram, 40, ("NDCG@10",))["NDCG@10"] == pytest.approx(full, abs=1e-6)


def test_the_corrections_come_closer_to_full_than_the_sampled_value():
    rng = np.random.default_rng(0)
    greater = np.minimum(rng.geometric(1 / 60, size=2000) - 1, 999)
    counts = RankCounts(np.arange(2000), greater, np.zeros(2000, dtype=np.int64), np.full(2000, 1000))
    full = per_user_metrics(counts.greater, counts.ties, ("NDCG@10",))["NDCG@10"].mean()
    sampled = expected_uniform(counts, 100, ("NDCG@10",)).mean["NDCG@10"]
    histogram = rank_histogram(above_distribution(counts.greater, counts.ties, counts.candidates, 100), 100)
    for estimate in (corrected_bv(histogram, 1000, ("NDCG@10",)), corrected_mle(histogram, 1000, ("NDCG@10",))):
        assert abs(estimate["NDCG@10"] - full) < abs(sampled - full) / 3


def test_realised_ranks_spread_their_ties():
    histogram = rank_histogram((np.array([0, 1]), np.array([1, 0])), 3)
    assert histogram == pytest.approx([0.25, 0.75, 0, 0])


def test_kendall_tau_names_the_pairs_that_flip():
    tau, flips = kendall_tau({"a": 3, "b": 2, "c": 1}, {"a": 1, "b": 2, "c": 3})
    assert tau == pytest.approx(-1.0) and sorted(flips) == [("a", "b"), ("a", "c"), ("b", "c")]
    tau, flips = kendall_tau({"a": 3, "b": 2, "c": 1}, {"a": 3, "b": 1, "c": 2})
    assert tau == pytest.approx(1 / 3) and flips == [("b", "c")]


def test_under_the_temporal_split_the_candidates_leave_out_the_items_not_yet_seen():
    rng = np.random.default_rng(0)
    sequences = [list(rng.choice(np.arange(1, 31), size=8, replace=False)) for _ in range(20)]
    times = [sorted(rng.integers(0, 100, size=8).tolist()) for _ in range(20)]
    split = TemporalSplit(SequenceData.from_sequences("timed", sequences, 30, times=times), (60, 80))
    scores = torch.rand(20, 31, generator=torch.Generator().manual_seed(0))
    counts = Evaluator(split, seed=0).evaluate(FixedScorer(scores), "test", "full").counts
    view, unseen = split.view("test"), set(split.new_items("test").tolist())
    for row, user in enumerate(counts.users):
        history, target = set(view.items[view.offsets[row]:view.offsets[row + 1]].tolist()), int(view.targets[row])
        others = {item for item in range(1, 31) if item not in unseen and item not in history} - {target}
        assert counts.candidates[row] == len(others)
        assert counts.greater[row] == sum(float(scores[user, item]) > float(scores[user, target]) for item in others)
