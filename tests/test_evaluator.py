"""The shared evaluator against hand-computed values, ties, leakage and the candidate rules of PROTOCOL.md."""
import math

import numpy as np
import pytest
import torch

from recbench.benchmarks.evaluator import Evaluator, ScoreError
from recbench.benchmarks.metrics import per_user_metrics
from recbench.benchmarks.negatives import candidate_weights, load_or_sample, sample_negatives
from recbench.datasets.sequences import LeaveOneOutSplit, SequenceData
from tests.helpers import SHARED_DATA, FixedScorer, ProductScorer, repeat_data, requires_shared_data


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
        negatives = load_or_sample(LeaveOneOutSplit(data), "test", protocol, seed=1, cache_dir=tmp_path)
        assert negatives.shape == (data.n_users, 100)
        for user in range(data.n_users):
            assert len(set(negatives[user])) == 100
            assert not set(negatives[user]) & set(data.sequence(user))
            assert negatives[user].min() >= 1 and negatives[user].max() <= data.n_items


def test_negatives_are_fixed_by_seed_and_stored(tmp_path):
    split = LeaveOneOutSplit(toy_data())
    first = load_or_sample(split, "valid", "pop100", seed=7, cache_dir=tmp_path)
    again = load_or_sample(split, "valid", "pop100", seed=7, cache_dir=None)  # drawn afresh, not read back
    assert np.array_equal(first, again)
    assert len(list(tmp_path.glob("negatives-*-valid-pop100-n100-seed7.npy"))) == 1
    assert not np.array_equal(first, load_or_sample(split, "valid", "pop100", seed=8, cache_dir=None))
    assert not np.array_equal(first, load_or_sample(split, "test", "pop100", seed=7, cache_dir=None))


def test_popularity_negatives_follow_interaction_counts():
    # Item 1 is in half of all sequences; items 2..n are rare. Users never saw item 1 in the second half.
    rng = np.random.default_rng(0)
    sequences = []
    for user in range(400):
        rest = rng.choice(np.arange(2, 1001), size=4, replace=False)
        sequences.append(np.r_[1, rest] if user < 200 else rest)
    data = SequenceData.from_sequences("skewed", sequences, n_items=1000)
    weights = candidate_weights(LeaveOneOutSplit(data), "test", "pop100")
    negatives = sample_negatives(data, weights, 100, np.random.default_rng(1))
    # For users who did not see item 1, it carries 200 of ~1800 units of weight: almost surely drawn.
    assert np.isin(1, negatives[200:]) and (negatives[200:] == 1).any(axis=1).mean() > 0.99
    # Uniform sampling picks item 1 only about 100/996 of the time.
    uniform = sample_negatives(data, candidate_weights(LeaveOneOutSplit(data), "test", "uni100"), 100,
                               np.random.default_rng(1))
    assert 0.05 < (uniform[200:] == 1).any(axis=1).mean() < 0.16


def test_pop100_popularity_counts_every_split_not_only_the_training_prefixes():
    """PROTOCOL.md, "Negatives": the weight is the item's count over the whole dataset. Item 1 is only ever a last
    (test) item, of the first 200 users; counted over training prefixes only it would weigh nothing and never be a
    negative, and every evaluator and dataset test would still pass (issue 29)."""
    rng = np.random.default_rng(0)
    sequences = [np.r_[rng.choice(np.arange(2, 1001), size=4, replace=False), [1] if user < 200 else []]
                 for user in range(400)]
    data = SequenceData.from_sequences("last", sequences, n_items=1000)
    assert candidate_weights(LeaveOneOutSplit(data), "test", "pop100")[1] == 200
    negatives = load_or_sample(LeaveOneOutSplit(data), "test", "pop100", seed=0, cache_dir=None, progress=False)
    assert (negatives[200:] == 1).any(axis=1).mean() > 0.99 and not (negatives[:200] == 1).any()


def test_too_few_items_for_negatives_is_a_clear_error():
    data = SequenceData.from_sequences("tiny", [[1, 2, 3], [2, 3, 4]], n_items=50)
    with pytest.raises(ValueError, match="leaves only 47 items"):
        sample_negatives(data, candidate_weights(LeaveOneOutSplit(data), "test", "uni100"), 100,
                         np.random.default_rng(0))


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


# ------------------------------------------------------------------ scores the evaluator must not write into
def reference_full_counts(model, split: LeaveOneOutSplit, which: str, batch_size: int = 256):
    """Full-ranking (greater, ties) as the evaluator used to compute them: the scores copied, padding, history
    and target set to −inf, then counted (a −inf target ties only with the remaining −inf candidates). Users
    are scored in the evaluator's chunks (in order of history length), as a network's scores may differ in the
    last bit with the chunk they are computed in."""
    view = split.view(which)
    order = np.argsort(view.lengths, kind="stable")
    greater, ties = np.zeros(len(view), dtype=np.int64), np.zeros(len(view), dtype=np.int64)
    with torch.inference_mode():
        for start in range(0, len(view), batch_size):
            chunk = order[start:start + batch_size]
            histories = torch.from_numpy(view.padded(chunk, max(model.history_length, 1)))
            scores = model.score(torch.from_numpy(view.users[chunk]), histories, None).float().clone()
            targets = torch.from_numpy(view.targets[chunk])[:, None]
            target_scores = scores.gather(1, targets)
            excluded = torch.zeros_like(scores, dtype=torch.bool)
            rows, items = view.flat(chunk)
            excluded[:, 0] = True
            excluded[torch.from_numpy(rows), torch.from_numpy(items)] = True
            excluded.scatter_(1, targets, True)
            scores[excluded] = -torch.inf
            g = (scores > target_scores).sum(1)
            t = (scores >= target_scores).sum(1) - g
            hopeless = torch.isneginf(target_scores[:, 0])
            t = torch.where(hopeless, (torch.isneginf(scores) & ~excluded).sum(1), t)
            greater[chunk], ties[chunk] = g.numpy(), t.numpy()
    return greater, ties


class StoredScores(FixedScorer):
    """Returns its own stored tensor, the very object, whenever the whole table is asked for."""

    def score(self, users, histories, candidates):
        if candidates is None and torch.equal(users, torch.arange(len(self.table))):
            return self.table
        return super().score(users, histories, candidates)


@pytest.mark.parametrize("batch_size", [1, 2, 256])
def test_full_ranking_never_writes_into_pop_counts(batch_size, tmp_path):
    """POP returns ``counts.expand(B, -1)``, which is POP's own storage when B = 1."""
    from recbench.models.pop import Pop

    data = toy_data(n_users=40, n_items=60, length=12)
    split = LeaveOneOutSplit(data)
    pop = Pop(data.n_users, data.n_items)
    pop.fit(split.train())
    before = pop.counts.clone()
    evaluator = Evaluator(split, seed=0, cache_dir=tmp_path, batch_size=batch_size)
    first = evaluator.evaluate(pop, "test", "full")
    assert torch.equal(pop.counts, before)
    again = evaluator.evaluate(pop, "valid", "full")  # a later pass sees the same counts
    assert torch.equal(pop.counts, before)
    expected = reference_full_counts(pop, split, "test")
    assert np.array_equal(first.counts.greater, expected[0]) and np.array_equal(first.counts.ties, expected[1])
    assert np.array_equal(again.counts.greater, reference_full_counts(pop, split, "valid")[0])


def test_full_ranking_never_writes_into_a_returned_stored_tensor(tmp_path):
    data = toy_data()
    split = LeaveOneOutSplit(data)
    table = np.random.default_rng(0).integers(0, 5, (data.n_users, data.n_items + 1)).astype(np.float32)
    model = StoredScores(table)
    evaluator = Evaluator(split, seed=0, cache_dir=tmp_path, batch_size=data.n_users)
    result = evaluator.evaluate(model, "test", "full")
    assert np.array_equal(model.table.numpy(), table)
    assert np.array_equal(result.counts.greater, reference_full_counts(FixedScorer(table), split, "test")[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_counts_equal_the_masking_reference_with_ties_repeats_and_infinities(seed, tmp_path):
    data = repeat_data(seed=seed)
    split = LeaveOneOutSplit(data)
    rng = np.random.default_rng(seed)
    table = rng.integers(-2, 3, (data.n_users, data.n_items + 1)).astype(np.float32)  # many ties
    table[rng.random(table.shape) < 0.1] = -np.inf
    table[:, 0] = 10.0  # padding scored highest: never a rival
    table[::7] = -np.inf  # users whose every score is −inf, target included
    for which in ("valid", "test"):
        expected = reference_full_counts(FixedScorer(table), split, which)
        for batch_size in (1, 3, 256, None):
            result = Evaluator(split, seed=0, cache_dir=tmp_path, batch_size=batch_size).evaluate(
                FixedScorer(table), which, "full")
            assert np.array_equal(result.counts.greater, expected[0]), (which, batch_size)
            assert np.array_equal(result.counts.ties, expected[1]), (which, batch_size)


def test_counts_and_candidates_do_not_depend_on_the_chunk_size(tmp_path):
    class Recording(FixedScorer):
        def score(self, users, histories, candidates):
            if candidates is not None:
                self.candidates.append(candidates.clone())
            return super().score(users, histories, candidates)

    data = toy_data(n_users=700, n_items=300, length=8)
    split = LeaveOneOutSplit(data)
    table = np.random.default_rng(0).integers(0, 4, (data.n_users, data.n_items + 1)).astype(np.float32)
    subset = np.sort(np.random.default_rng(1).choice(data.n_users, 500, replace=False))
    seen = {}
    for batch_size in (256, 1, 100, None):
        model = Recording(table)
        model.candidates = []
        evaluator = Evaluator(split, seed=4, cache_dir=tmp_path, batch_size=batch_size)
        counts = [evaluator.evaluate(model, "test", protocol, users=subset).counts for protocol in ("pop100", "full")]
        seen[batch_size] = ([np.r_[c.greater, c.ties] for c in counts], torch.cat(model.candidates))
    for batch_size, (counts, candidates) in seen.items():
        assert all(np.array_equal(a, b) for a, b in zip(counts, seen[256][0])), batch_size
        assert torch.equal(candidates, seen[256][1]), batch_size  # same candidate columns for every user


def test_chunks_fit_the_cpu_budget():
    from recbench.benchmarks.evaluator import ORDER_BLOCK
    from recbench.benchmarks.evaluator_fast import CPU_CHUNK_BYTES, chunk_users

    cpu = torch.device("cpu")
    for columns, history in ((3417, 200), (54543, 50), (101, 200), (26745, 200)):
        users = chunk_users(cpu, columns, history, ORDER_BLOCK)
        assert users >= 1 and users * columns * 4 <= CPU_CHUNK_BYTES
        assert users < ORDER_BLOCK or users % ORDER_BLOCK == 0  # whole blocks of the candidate order
        assert chunk_users(cpu, columns * 2, history, ORDER_BLOCK) <= users  # more items, fewer users
        assert chunk_users(cpu, columns, history * 2, ORDER_BLOCK) <= users  # longer histories, fewer users
    assert chunk_users(cpu, 10**9, 200, ORDER_BLOCK) == 1  # one user always fits


def test_evaluation_reports_progress(capsys, monkeypatch, tmp_path):
    from recbench.datasets import progress

    shown = []

    class Recording(progress.tqdm):
        def update(self, n=1):
            if not self.disable and "sampling" not in self.desc:  # the evaluator's bar, not the sampler's
                shown.append((self.total, n))
            return super().update(n)

    monkeypatch.setattr(progress, "tqdm", Recording)
    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 0.0)  # the bar shows at once, however fast
    data = toy_data(n_users=30)
    evaluator = Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path, batch_size=8)
    model = FixedScorer(np.zeros((data.n_users, data.n_items + 1)))
    evaluator.evaluate(model, "test", "full", "fixed")
    assert capsys.readouterr().err == "" and shown == []  # off by default
    evaluator.evaluate(model, "test", "full", "fixed", progress=True)
    err = capsys.readouterr().err
    assert "fixed test full" in err and "/30" in err and " users/s" in err
    assert shown == [(30, 8), (30, 8), (30, 8), (30, 6)]  # users scored out of the total, chunk by chunk
    shown.clear()
    Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path, progress=True).evaluate(model, "valid", "pop100")
    assert sum(n for _, n in shown) == 30


def test_the_tiled_path_counts_its_two_passes_on_two_bars_and_a_fallback_counts_again(capsys, monkeypatch):
    """A product model's full ranking passes over the users twice (queries, then the tiled ranking): each pass
    has a bar of its own counting to the users' number, never past it, also where the tiled counts would not be
    exact and the score matrix ranks the users again."""
    from recbench.datasets import progress

    counted = []

    class Recording(progress.tqdm):
        def update(self, n=1):
            counted.append((self.desc, self.total, n))
            return super().update(n)

    monkeypatch.setattr(progress, "tqdm", Recording)
    data = repeat_data(n_users=20, n_items=30)
    rng = np.random.default_rng(0)
    queries, items = rng.normal(size=(data.n_users, 2)), rng.normal(size=(data.n_items + 1, 2))
    evaluator = Evaluator(LeaveOneOutSplit(data), seed=0, batch_size=8, progress=True)
    for model, passes in ((ProductScorer(queries, items), ("(queries)", "(ranking)")),
                          (ProductScorer(queries * 1e18, items * 1e19), ("(queries)", ""))):  # not exact: matrix
        counted.clear()
        evaluator.evaluate(model, "test", "full", "m")
        names = [f"m test full {suffix}".strip() for suffix in passes]
        assert {name for name, _, _ in counted} == set(names)
        for desc in names:
            assert sum(n for name, total, n in counted if name == desc) == 20, (desc, counted)
            assert {total for name, total, n in counted if name == desc} == {20}


@pytest.mark.slow
@requires_shared_data
@pytest.mark.parametrize("name", ["pop", "sasrec"])
def test_full_counts_on_beauty_equal_the_masking_reference(name):
    """Every user of the real Beauty data (54,542 items): the counts equal the masking reference. Chunks of 256
    users on both sides, since a network's scores may differ in the last bit with the batch they are computed in."""
    from recbench.benchmarks.config import resolve
    from recbench.datasets import load_dataset
    from recbench.models import model_class

    data = load_dataset("beauty", data_dir=SHARED_DATA, progress=False)
    split = LeaveOneOutSplit(data)
    torch.manual_seed(0)
    model = model_class(name)(data.n_users, data.n_items, resolve(name, "beauty", "paper", ()).model)
    if name == "pop":
        model.fit(split.train())
    else:
        model.eval()  # untrained: scores close together, a hard case for ties
    result = Evaluator(split, seed=0, batch_size=256).evaluate(model, "test", "full", name)
    greater, ties = reference_full_counts(model, split, "test")
    assert np.array_equal(result.counts.greater, greater) and np.array_equal(result.counts.ties, ties)


# ------------------------------------------------------------------ full ranking of product scores, tile by tile
def both_paths(model, split, which="test", users=None, tmp_path=None):
    """(greater, ties) from the tiled path and from the full score matrix."""
    return [Evaluator(split, seed=0, cache_dir=tmp_path, tiled=tiled).rank_counts(model, which, "full", "m", users)
            for tiled in (True, False)]


@pytest.mark.parametrize("with_bias", [False, True])
def test_tiled_full_ranking_by_hand_ties_across_tiles_and_subnormal_differences(with_bias, monkeypatch):
    import recbench.benchmarks.evaluator_fast as evaluator
    monkeypatch.setattr(evaluator, "TILE_ITEMS", 4)  # 11 columns: tiles {0..3} {4..7} {8..11}, column 11 unused
    monkeypatch.setattr(evaluator, "TILE_USERS", 2)
    tiny = np.float32(2.0 ** -126)  # smallest normal float32; the next float up differs by a subnormal
    e = np.array([100, 5, 2, 50, 2, 2, 4, 60, 2, 2, 3], dtype=np.float32)  # item i's score e_i (column 0: padding)
    data = SequenceData.from_sequences("hand", [[3, 5, 3, 7, 9], [4, 1, 6, 1], [2, 3, 4, 5, 6, 7, 8]], n_items=10)
    split = LeaveOneOutSplit(data)
    queries = np.array([[1.0], [1.0], [1.0]], dtype=np.float32)
    items = e[:, None].copy()
    bias = None
    if with_bias:  # the same scores, split between the product and the bias
        items, bias = items - 1, np.ones(11, dtype=np.float32)
    model = ProductScorer(queries, items, bias)
    threads = torch.get_num_threads()
    tiled, general = both_paths(model, split)
    assert torch.get_num_threads() == threads  # the ranking's one-thread-per-part setting is undone
    # user 0: target 9 (score 2), history {3, 5, 7} left out; above: 1, 6, 10; tied: 2, 4, 8 (three tiles).
    # user 1: target 1 (score 5) was consumed before and stays a candidate; above: 3, 7; none tied.
    # user 2: target 8 (score 2), history {2..7}; above: 1, 10; tied: 9.
    assert tiled.greater.tolist() == general.greater.tolist() == [3, 2, 2]
    assert tiled.ties.tolist() == general.ties.tolist() == [3, 0, 1]

    if not with_bias:  # scores one subnormal step apart are told apart, equal ones tie
        items = np.full((11, 1), tiny, dtype=np.float32)
        items[[1, 6]] = np.nextafter(tiny, np.float32(1))
        items[[10]] = np.nextafter(tiny, np.float32(0))
        tiled, general = both_paths(ProductScorer(queries, items), split)
        assert tiled.greater.tolist() == general.greater.tolist() == [2, 0, 1]  # user 1's target is item 1
        assert tiled.ties.tolist() == general.ties.tolist() == [3, 0, 1]


@pytest.mark.parametrize("seed", [0, 1])
def test_tiled_full_ranking_equals_the_masking_reference_with_many_ties(seed, monkeypatch):
    import recbench.benchmarks.evaluator_fast as evaluator
    monkeypatch.setattr(evaluator, "TILE_ITEMS", 8)
    monkeypatch.setattr(evaluator, "TILE_USERS", 3)
    data = repeat_data(n_users=60, n_items=45, seed=seed)  # repeats, targets consumed before
    split = LeaveOneOutSplit(data)
    rng = np.random.default_rng(seed)
    queries = rng.integers(-2, 3, (data.n_users, 3)).astype(np.float32)  # integer scores: ties everywhere
    items = rng.integers(-2, 3, (data.n_items + 1, 3)).astype(np.float32)
    bias = rng.integers(-1, 2, data.n_items + 1).astype(np.float32)
    for model in (ProductScorer(queries, items), ProductScorer(queries, items, bias)):
        for which in ("valid", "test"):
            expected = reference_full_counts(model, split, which)
            subset = np.sort(rng.choice(data.n_users, 40, replace=False))
            for users in (None, subset):
                tiled, general = both_paths(model, split, which, users)
                chosen = slice(None) if users is None else subset
                assert np.array_equal(tiled.greater, expected[0][chosen]) and np.array_equal(
                    tiled.ties, expected[1][chosen])
                assert np.array_equal(general.greater, tiled.greater) and np.array_equal(general.ties, tiled.ties)
                assert np.array_equal(tiled.users, general.users)


def test_tiled_full_ranking_leaves_non_finite_or_huge_scores_to_the_full_matrix():
    data = repeat_data(n_users=20, n_items=30)
    split = LeaveOneOutSplit(data)
    rng = np.random.default_rng(0)
    queries, items = rng.normal(size=(data.n_users, 2)), rng.normal(size=(data.n_items + 1, 2))
    broken = items.copy()
    broken[5, 0] = np.nan
    with pytest.raises(ScoreError, match="NaN or \\+inf"):
        Evaluator(split, seed=0).evaluate(ProductScorer(queries, broken), "test", "full")
    overflowing = items * 1e20
    with pytest.raises(ScoreError, match="NaN or \\+inf"):
        Evaluator(split, seed=0).evaluate(ProductScorer(queries * 1e20, overflowing), "test", "full")
    huge = ProductScorer(queries * 1e18, items * 1e19)  # finite scores near float32's largest
    tiled, general = both_paths(huge, split)
    assert np.array_equal(tiled.greater, general.greater) and np.array_equal(tiled.ties, general.ties)
    model = ProductScorer(queries, items)
    expected = both_paths(model, split)[1]
    if torch.set_flush_denormal(True):  # subnormals flushed: the sign test is not exact, the matrix path runs
        try:
            from recbench.benchmarks.evaluator_fast import denormals_kept

            assert not denormals_kept()
            assert np.array_equal(both_paths(model, split)[0].greater, expected.greater)
        finally:
            torch.set_flush_denormal(False)


@requires_shared_data
@pytest.mark.parametrize("name", ["sasrec", "bert4rec", "bprmf", "caser"])
def test_tiled_full_ranking_equals_the_score_matrix_on_ml_1m(name):
    """Untrained networks on 800 real ML-1m users (3,416 items, four tiles): the same counts either way."""
    from recbench.benchmarks.config import resolve
    from recbench.datasets import load_dataset
    from recbench.models import model_class

    data = load_dataset("ml-1m", data_dir=SHARED_DATA, progress=False)
    split = LeaveOneOutSplit(data)
    torch.manual_seed(0)
    model = model_class(name)(data.n_users, data.n_items, resolve(name, "ml-1m", "paper", ()).model).eval()
    users = np.random.default_rng(0).choice(data.n_users, 800, replace=False)
    tiled, general = both_paths(model, split, users=users)
    assert np.array_equal(tiled.greater, general.greater) and np.array_equal(tiled.ties, general.ties)
