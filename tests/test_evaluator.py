"""The shared evaluator against hand-computed values, ties, leakage and the candidate rules of protocol.md."""
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from benchmarks.evaluator import Evaluator, ScoreError, per_user_metrics
from benchmarks.negatives import candidate_weights, load_or_sample, sample_negatives
from datasets.sequences import LeaveOneOutSplit, SequenceData
from models.base import Recommender, gather_candidates


@dataclass
class _NoConfig:
    pass


class FixedScorer(Recommender):
    """Scores every item with ``table[user, item]``; records every history it was shown."""

    name = "fixed"
    Config = _NoConfig

    def __init__(self, table: np.ndarray, history_length: int = 8):
        super().__init__(table.shape[0], table.shape[1] - 1, _NoConfig())
        self.table = torch.as_tensor(table, dtype=torch.float32)
        self._history_length = history_length
        self.seen_histories = []

    @property
    def history_length(self):
        return self._history_length

    def fit(self, train, validate, settings):
        return {}

    def score(self, users, histories, candidates):
        self.seen_histories.append(histories.clone())
        return gather_candidates(self.table[users], candidates)


def toy_data(n_users=30, n_items=400, length=12, seed=0) -> SequenceData:
    rng = np.random.default_rng(seed)
    sequences = [rng.choice(np.arange(1, n_items + 1), size=length, replace=False) for _ in range(n_users)]
    return SequenceData.from_sequences("toy", sequences, n_items=n_items)


def test_metrics_by_hand_without_ties():
    # rank 3: HR@1 = 0, HR@5 = 1, NDCG@5 = 1/log2(4) = 0.5, MRR = 1/3
    m = per_user_metrics(np.array([2]), np.array([0]), metrics=("HR@1", "HR@5", "NDCG@1", "NDCG@5", "MRR"))
    assert m["HR@1"][0] == 0 and m["HR@5"][0] == 1
    assert m["NDCG@5"][0] == pytest.approx(0.5)
    assert m["NDCG@1"][0] == 0
    assert m["MRR"][0] == pytest.approx(1 / 3)


def test_metrics_by_hand_with_ties():
    # one tie, nothing above: rank 1 or 2 with equal probability
    m = per_user_metrics(np.array([0]), np.array([1]), metrics=("HR@1", "HR@5", "NDCG@1", "NDCG@5", "MRR"))
    assert m["HR@1"][0] == pytest.approx(0.5)
    assert m["NDCG@1"][0] == pytest.approx(0.5)
    assert m["NDCG@5"][0] == pytest.approx((1 + 1 / math.log2(3)) / 2)
    assert m["MRR"][0] == pytest.approx(0.75)
    # four above and three tied: ranks 5..8 → HR@5 = 1/4, HR@10 = 1
    m = per_user_metrics(np.array([4]), np.array([3]), metrics=("HR@5", "HR@10", "NDCG@5", "MRR"))
    assert m["HR@5"][0] == pytest.approx(0.25)
    assert m["HR@10"][0] == 1
    assert m["NDCG@5"][0] == pytest.approx(1 / math.log2(6) / 4)
    assert m["MRR"][0] == pytest.approx((1 / 5 + 1 / 6 + 1 / 7 + 1 / 8) / 4)


def test_tie_policies():
    pessimistic = per_user_metrics(np.array([0]), np.array([1]), metrics=("HR@1", "MRR"), tie_policy="pessimistic")
    optimistic = per_user_metrics(np.array([0]), np.array([1]), metrics=("HR@1", "MRR"), tie_policy="optimistic")
    assert pessimistic["HR@1"][0] == 0 and pessimistic["MRR"][0] == pytest.approx(0.5)
    assert optimistic["HR@1"][0] == 1 and optimistic["MRR"][0] == 1
    with pytest.raises(ValueError, match="unknown metric 'HR@0'"):
        per_user_metrics(np.array([0]), np.array([0]), metrics=("HR@0",))
    with pytest.raises(ValueError, match="tie policy"):
        per_user_metrics(np.array([0]), np.array([0]), tie_policy="random")


def test_constant_scorer_gets_exact_random_value_under_pop100(tmp_path):
    data = toy_data()
    evaluator = Evaluator(LeaveOneOutSplit(data), seed=3, cache_dir=tmp_path)
    result = evaluator.evaluate(FixedScorer(np.zeros((data.n_users, data.n_items + 1))), "test", "pop100")
    assert result.metrics["HR@10"] == pytest.approx(10 / 101, abs=1e-12)
    assert result.metrics["HR@1"] == pytest.approx(1 / 101, abs=1e-12)
    expected_ndcg = sum(1 / math.log2(r + 1) for r in range(1, 11)) / 101
    assert result.metrics["NDCG@10"] == pytest.approx(expected_ndcg, abs=1e-12)
    assert result.metrics["MRR"] == pytest.approx(sum(1 / r for r in range(1, 102)) / 101, abs=1e-12)


def test_constant_scorer_under_full_ranks_among_non_history_items(tmp_path):
    data = toy_data()
    evaluator = Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path)
    result = evaluator.evaluate(FixedScorer(np.zeros((data.n_users, data.n_items + 1))), "test", "full")
    candidates = data.n_items - (12 - 1)  # every item except the 11 history items; the target is one of them
    assert result.metrics["HR@10"] == pytest.approx(10 / candidates)


def oracle_table(data: SequenceData, split: str) -> np.ndarray:
    view = LeaveOneOutSplit(data).view(split)
    table = np.zeros((data.n_users, data.n_items + 1))
    table[view.users, view.targets] = 1.0
    return table


@pytest.mark.parametrize("protocol", ["full", "pop100", "uni100"])
def test_oracle_gets_one(protocol, tmp_path):
    data = toy_data()
    evaluator = Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path)
    result = evaluator.evaluate(FixedScorer(oracle_table(data, "test")), "test", protocol)
    assert all(value == pytest.approx(1.0) for value in result.metrics.values())


def test_full_protocol_ignores_history_items(tmp_path):
    """A model that scores the user's history highest still ranks the target first among the rest."""
    data = toy_data()
    split = LeaveOneOutSplit(data)
    table = oracle_table(data, "test") * 0.5
    test_view = split.test()
    rows, items = test_view.flat(np.arange(len(test_view)))
    table[test_view.users[rows], items] = 10.0
    result = Evaluator(split, seed=0, cache_dir=tmp_path).evaluate(FixedScorer(table), "test", "full")
    assert result.metrics["HR@1"] == pytest.approx(1.0)


def test_target_in_history_is_still_ranked(tmp_path):
    """Repeat consumption: when the target also occurs in the history it stays a candidate."""
    data = SequenceData.from_sequences("repeat", [[1, 2, 3, 2], [4, 5, 6, 7]], n_items=30)
    table = np.zeros((2, 31))
    table[0, 2] = 1.0
    table[1, 7] = 1.0
    result = Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path).evaluate(
        FixedScorer(table), "test", "full")
    assert result.metrics["HR@1"] == pytest.approx(1.0)


def test_scores_with_nan_or_inf_raise_naming_model_and_dataset(tmp_path):
    data = toy_data()
    table = np.zeros((data.n_users, data.n_items + 1))
    table[0, 5] = np.nan
    evaluator = Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path)
    with pytest.raises(ScoreError, match="'broken'.*'toy'"):
        evaluator.evaluate(FixedScorer(table), "test", "full", model_name="broken")
    table[0, :] = np.inf  # every candidate of user 0, whichever were drawn
    with pytest.raises(ScoreError, match="NaN or \\+inf"):
        evaluator.evaluate(FixedScorer(table), "test", "pop100", model_name="broken")


def test_negatives_exclude_the_whole_sequence_and_are_distinct(tmp_path):
    data = toy_data(n_users=50, n_items=200, length=60)
    for protocol in ("pop100", "uni100"):
        negatives = load_or_sample(data, "test", protocol, seed=1, cache_dir=tmp_path)
        assert negatives.shape == (data.n_users, 100)
        for user in range(data.n_users):
            assert len(set(negatives[user])) == 100
            assert not set(negatives[user]) & set(data.sequence(user))
            assert negatives[user].min() >= 1 and negatives[user].max() <= data.n_items


def test_negatives_are_fixed_by_seed_and_stored(tmp_path):
    data = toy_data()
    first = load_or_sample(data, "valid", "pop100", seed=7, cache_dir=tmp_path)
    again = load_or_sample(data, "valid", "pop100", seed=7, cache_dir=None)  # drawn afresh, not read back
    assert np.array_equal(first, again)
    assert len(list(tmp_path.glob("negatives-*-valid-pop100-n100-seed7.npy"))) == 1
    assert not np.array_equal(first, load_or_sample(data, "valid", "pop100", seed=8, cache_dir=None))
    assert not np.array_equal(first, load_or_sample(data, "test", "pop100", seed=7, cache_dir=None))


def test_popularity_negatives_follow_interaction_counts():
    # Item 1 is in half of all sequences; items 2..n are rare. Users never saw item 1 in the second half.
    rng = np.random.default_rng(0)
    sequences = []
    for user in range(400):
        rest = rng.choice(np.arange(2, 1001), size=4, replace=False)
        sequences.append(np.r_[1, rest] if user < 200 else rest)
    data = SequenceData.from_sequences("skewed", sequences, n_items=1000)
    weights = candidate_weights(data, "pop100")
    negatives = sample_negatives(data, weights, 100, np.random.default_rng(1))
    # For users who did not see item 1, it carries 200 of ~1800 units of weight: almost surely drawn.
    assert np.isin(1, negatives[200:]) and (negatives[200:] == 1).any(axis=1).mean() > 0.99
    # Uniform sampling picks item 1 only about 100/996 of the time.
    uniform = sample_negatives(data, candidate_weights(data, "uni100"), 100, np.random.default_rng(1))
    assert 0.05 < (uniform[200:] == 1).any(axis=1).mean() < 0.16


def test_too_few_items_for_negatives_is_a_clear_error():
    data = SequenceData.from_sequences("tiny", [[1, 2, 3], [2, 3, 4]], n_items=50)
    with pytest.raises(ValueError, match="leaves only 47 items"):
        sample_negatives(data, candidate_weights(data, "uni100"), 100, np.random.default_rng(0))


def test_split_views_never_contain_the_test_item():
    data = toy_data()
    split = LeaveOneOutSplit(data)
    train, valid, test = split.train(), split.valid(), split.test()
    for user in range(data.n_users):
        sequence = data.sequence(user)
        assert np.array_equal(train.items[train.offsets[user]:train.offsets[user + 1]], sequence[:-2])
        assert np.array_equal(valid.items[valid.offsets[user]:valid.offsets[user + 1]], sequence[:-2])
        assert valid.targets[user] == sequence[-2]
        assert np.array_equal(test.items[test.offsets[user]:test.offsets[user + 1]], sequence[:-1])
        assert test.targets[user] == sequence[-1]
    assert train.targets is None


def test_validation_pass_shows_only_training_items(tmp_path):
    data = toy_data()
    model = FixedScorer(np.zeros((data.n_users, data.n_items + 1)), history_length=20)
    Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path).evaluate(model, "valid", "full")
    shown = torch.cat(model.seen_histories).numpy()
    for user in range(data.n_users):
        assert np.array_equal(shown[user][shown[user] > 0], data.sequence(user)[:-2])


def test_split_refuses_users_with_fewer_than_three_items():
    data = SequenceData.from_sequences("short", [[1, 2, 3], [4, 5]], n_items=5)
    with pytest.raises(ValueError, match="fewer than 3 interactions.*user row 1 with 2"):
        LeaveOneOutSplit(data)


def test_padded_histories_are_left_padded():
    data = SequenceData.from_sequences("pad", [[1, 2, 3, 4, 5], [6, 7, 8]], n_items=8)
    test = LeaveOneOutSplit(data).test()
    assert test.padded(np.array([0, 1]), 3).tolist() == [[2, 3, 4], [0, 6, 7]]


def test_candidate_order_hides_the_target(tmp_path):
    """A model that always favours the first candidate column gets the random value, not 1.0."""

    class FirstColumn(FixedScorer):
        def score(self, users, histories, candidates):
            scores = torch.zeros(candidates.shape)
            scores[:, 0] = 1.0
            return scores

    data = toy_data(n_users=200)
    result = Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path).evaluate(
        FirstColumn(np.zeros((data.n_users, data.n_items + 1))), "test", "pop100")
    assert result.metrics["HR@1"] < 0.05


def test_target_scored_minus_infinity_ties_only_with_real_candidates(tmp_path):
    data = SequenceData.from_sequences("inf", [[1, 2, 3, 4]], n_items=10)
    table = np.full((1, 11), -np.inf)
    table[0, 5:8] = 1.0  # three candidates above the target; items 8..10 tie with it at -inf
    result = Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path).evaluate(
        FixedScorer(table), "test", "full")
    assert result.counts.greater.tolist() == [3] and result.counts.ties.tolist() == [3]
