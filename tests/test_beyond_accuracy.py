"""The beyond-accuracy metrics of the full-ranking top-k lists (PROTOCOL.md, "Beyond accuracy") against values
computed by hand, ties across a list's end included; both full-ranking paths against a plain reading; popularity
from the training view only; the refusals."""
import math

import numpy as np
import pytest
import torch

from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.metrics import (
    DEFAULT_METRICS,
    TopLists,
    TrainingPopularity,
    gini,
    list_metric_names,
    list_weights,
    parse_list_metric,
)
from recbench.datasets.sequences import LeaveOneOutSplit, SequenceData
from tests.helpers import SHARED_DATA, FixedScorer, ProductScorer, repeat_data, requires_shared_data

KINDS = ("Coverage", "Gini", "ARP", "APLT", "Novelty", "Personalization")
AT_2 = tuple(f"{kind}@2" for kind in KINDS)

# Ten items, four users; leave-one-out trains on s[:-2]: [1, 2], [1, 1], [2, 7], [1, 3]. Training interactions:
# item 1: 4, item 2: 2, items 3 and 7: 1, the rest 0 (items 4, 6, 9 and 10 are held-out targets only). Training
# users: item 1: 3 of 4, item 2: 2, items 3 and 7: 1. Short head: the 20% (two) most interacted-with, {1, 2}.
HAND = [[1, 2, 3, 4], [1, 1, 5, 6], [2, 7, 8, 9], [1, 3, 2, 10]]


def hand_table() -> np.ndarray:
    """Test-view scores (histories [1, 2, 3], [1, 1, 5], [2, 7, 8], [1, 3, 2]), with the history scored highest
    where it would otherwise enter a list. Top 2: user 0: item 4, then items 5, 6 and 7 tied for one place;
    user 1: items 2 and 3; user 2: items 1, 3 and 4 tied for two places; user 3: items 9 and 10."""
    table = np.zeros((4, 11), dtype=np.float32)
    table[0, [4, 5, 6, 7]] = [5, 3, 3, 3]
    table[0, [1, 2, 3]] = 50
    table[1, [2, 3, 1, 5]] = [9, 8, 100, 100]
    table[2, [1, 3, 4, 2]] = [4, 4, 4, 50]
    table[3, [9, 10]] = 1
    table[:, 0] = 1000  # padding is never a candidate
    return table


def by_hand() -> dict[str, float]:
    # Probabilities of being in the top 2: user 0: 4: 1, 5/6/7: 1/3; user 1: 2, 3: 1; user 2: 1/3/4: 2/3;
    # user 3: 9, 10: 1.
    shown = {1: 2 / 3, 2: 1, 3: 1, 4: 1, 5: 1 / 3, 6: 1 / 3, 7: 1 / 3, 8: 0, 9: 1, 10: 1}  # in some list
    exposure = [2 / 3, 1, 5 / 3, 5 / 3, 1 / 3, 1 / 3, 1 / 3, 0, 1, 1]  # items 1..10: lists that show them
    pairs = sum(abs(a - b) for a in exposure for b in exposure)
    information = {1: math.log2(4 / 3), 2: 1.0, 3: 2.0, 7: 2.0}  # −log2(users / 4); no user: as one user, 2
    per_user_novelty = [(2 + (2 + 2 + 2) / 3) / 2, (1 + 2) / 2, (2 / 3) * (information[1] + 2 + 2) / 2, 2.0]
    return {"Coverage@2": sum(shown.values()) / 10,
            "Gini@2": pairs / (2 * 10 ** 2 * np.mean(exposure)),
            # list means of training counts: (0 + (0 + 0 + 1)/3)/2, (2 + 1)/2, 2/3·(4 + 1 + 0)/2, 0
            "ARP@2": (1 / 6 + 3 / 2 + 5 / 3 + 0) / 4,
            # long-tail shares: (1 + 3·1/3)/2, (0 + 1)/2, 2/3·(0 + 1 + 1)/2, 1
            "APLT@2": (1 + 1 / 2 + 2 / 3 + 1) / 4,
            "Novelty@2": float(np.mean(per_user_novelty)),
            # lists in common, of six pairs: users 0 and 2 item 4 (1 · 2/3), users 1 and 2 item 3 (1 · 2/3)
            "Personalization@2": 1 - (2 / 3 + 2 / 3) / 6 / 2}


def hand_models():
    """The hand table as any model (the full score matrix) and as a product q_u · e_i (the tiled path)."""
    table = hand_table()
    return {"matrix": FixedScorer(table), "tiled": ProductScorer(np.eye(4, dtype=np.float32), table.T.copy())}


def test_training_popularity_by_hand():
    popularity = TrainingPopularity.of(LeaveOneOutSplit(SequenceData.from_sequences("hand", HAND, 10)).train(), 10)
    assert popularity.interactions.tolist() == [0, 4, 2, 1, 0, 0, 0, 1, 0, 0, 0]  # user 1's repeat counts twice
    assert popularity.users.tolist() == [0, 3, 2, 1, 0, 0, 0, 1, 0, 0, 0]
    assert popularity.n_users == 4
    assert np.flatnonzero(popularity.short_head()).tolist() == [1, 2]
    assert popularity.self_information()[[1, 2, 3, 4]] == pytest.approx([math.log2(4 / 3), 1, 2, 2])


def test_the_short_head_takes_every_item_tied_at_its_boundary_and_never_an_unseen_one():
    counts = np.array([0, 9, 5, 5, 5, 1, 1, 0, 0, 0, 0])  # ten items: the 20% are two, item 2 ties with 3 and 4
    popularity = TrainingPopularity(counts, counts, 3)
    assert np.flatnonzero(popularity.short_head()).tolist() == [1, 2, 3, 4]
    unseen = TrainingPopularity(np.array([0, 1, 0, 0, 0, 0]), np.array([0, 1, 0, 0, 0, 0]), 1)
    assert np.flatnonzero(unseen.short_head()).tolist() == [1]  # the rest tie at 0 interactions: tail


def test_list_weights_share_the_places_left_among_tied_entries():
    # user 0: 7 > 5 = 5 = 5 > 1 (k = 2: one place for three); user 1: 4 = 4 (k = 2: both); user 2: one entry only
    user = np.array([0, 0, 0, 0, 0, 1, 1, 2])
    scores = np.array([7, 5, 5, 5, 1, 4, 4, -np.inf])
    assert list_weights(user, scores, 2) == pytest.approx([1, 1 / 3, 1 / 3, 1 / 3, 0, 1, 1, 1])
    assert list_weights(user, scores, 1) == pytest.approx([1, 0, 0, 0, 0, 1 / 2, 1 / 2, 1])
    assert list_weights(user, scores, 4) == pytest.approx([1, 1, 1, 1, 0, 1, 1, 1])


def test_gini_by_hand():
    assert gini(np.array([2.0, 2.0, 2.0, 2.0])) == 0
    assert gini(np.array([0.0, 0.0, 0.0, 3.0])) == pytest.approx(3 / 4)  # one item holds all: (n − 1)/n
    assert gini(np.array([1.0, 3.0])) == pytest.approx(4 / (2 * 2**2 * 2))  # Σ over pairs |x_i − x_j| / (2n² mean)
    assert math.isnan(gini(np.zeros(3)))


@pytest.mark.parametrize("path", ["matrix", "tiled"])
@pytest.mark.parametrize("batch_size", [1, 3, None])
def test_metrics_by_hand_with_ties_across_the_lists_end(path, batch_size, tmp_path):
    split = LeaveOneOutSplit(SequenceData.from_sequences("hand", HAND, 10))
    result = Evaluator(split, seed=0, cache_dir=tmp_path, batch_size=batch_size).evaluate(
        hand_models()[path], "test", "full", metrics=("HR@1", *AT_2, "Coverage@1"))
    assert list(result.metrics) == ["HR@1", *AT_2, "Coverage@1"]  # in the order asked for
    assert {name: result.metrics[name] for name in AT_2} == pytest.approx(by_hand(), abs=1e-12)
    # Top 1: items 4 and 2 for certain, 1 and 3 with 1/3 each, 9 and 10 with 1/2 each.
    assert result.metrics["Coverage@1"] == pytest.approx((2 + 2 / 3 + 1) / 10, abs=1e-12)


def test_popularity_counts_the_training_view_not_the_held_out_targets(tmp_path):
    """User 3's list holds items 9 and 10, both held-out targets (10 its own): their popularity is 0."""
    split = LeaveOneOutSplit(SequenceData.from_sequences("hand", HAND, 10))
    table = np.zeros((4, 11), dtype=np.float32)
    table[:, [9, 10]] = 1
    result = Evaluator(split, seed=0, cache_dir=tmp_path).evaluate(FixedScorer(table), "test", "full",
                                                                  metrics=("ARP@2", "APLT@2"))
    assert result.metrics == {"ARP@2": 0.0, "APLT@2": 1.0}


def reference_metrics(table: np.ndarray, split: LeaveOneOutSplit, which: str, cutoffs, users=None) -> dict:
    """The metrics read plainly from each user's whole score row: candidates are every item but the distinct
    history items other than the target; they are walked in groups of equal score from the best, and a group
    that straddles the list's end gets the places left shared equally."""
    view = split.view(which)
    popularity = TrainingPopularity.of(split.train(), split.n_items)
    tail, information = ~popularity.short_head(), popularity.self_information()
    out = {}
    for k in cutoffs:
        exposure, unshown, means, lists = np.zeros(split.n_items + 1), np.ones(split.n_items + 1), [], []
        for row in range(len(view)) if users is None else users:
            history = set(view.items[view.offsets[row]:view.offsets[row + 1]].tolist()) - {int(view.targets[row])}
            candidates = [i for i in range(1, split.n_items + 1) if i not in history]
            scores = table[view.users[row]]
            weights, places = {}, min(k, len(candidates))
            for value in sorted({float(scores[i]) for i in candidates}, reverse=True):
                group = [i for i in candidates if scores[i] == value]
                share = min(places, len(group)) / len(group)
                weights.update({i: share for i in group})
                places -= min(places, len(group))
            length = min(k, len(candidates))
            lists.append(weights)
            for item, w in weights.items():
                exposure[item] += w
                unshown[item] *= 1 - w
            means.append([sum(w * measure[i] for i, w in weights.items()) / length
                          for measure in (popularity.interactions, tail, information)])
        overlaps = [sum(w * other.get(item, 0.0) for item, w in one.items())
                    for position, one in enumerate(lists) for other in lists[position + 1:]]
        out.update({f"Coverage@{k}": float(np.sum(1 - unshown[1:])) / split.n_items,
                    f"Personalization@{k}": 1 - float(np.mean(overlaps)) / k if overlaps else float("nan"),
                    f"Gini@{k}": gini(exposure[1:]),
                    **dict(zip((f"ARP@{k}", f"APLT@{k}", f"Novelty@{k}"), np.mean(means, axis=0)))})
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_both_paths_equal_the_plain_reading_with_many_ties_repeats_and_infinities(seed, monkeypatch, tmp_path):
    import recbench.benchmarks.evaluator_fast as evaluator_fast
    monkeypatch.setattr(evaluator_fast, "TILE_ITEMS", 8)  # 46 columns: six tiles
    monkeypatch.setattr(evaluator_fast, "TILE_USERS", 3)
    data = repeat_data(n_users=60, n_items=45, seed=seed)  # repeats, targets consumed before
    split = LeaveOneOutSplit(data)
    rng = np.random.default_rng(seed)
    queries = rng.integers(-1, 2, (data.n_users, 2)).astype(np.float32)  # integer scores: ties everywhere
    items = rng.integers(-1, 2, (data.n_items + 1, 2)).astype(np.float32)
    product = ProductScorer(queries, items)
    table = product.score_factors(torch.arange(data.n_users), None).full().numpy()
    with_infinities = table.copy()
    with_infinities[rng.random(table.shape) < 0.3] = -np.inf  # some users have fewer finite candidates than k
    names = [f"{kind}@{k}" for kind in KINDS for k in (1, 5, 40)]
    subset = np.sort(rng.choice(data.n_users, 40, replace=False))
    for which in ("valid", "test"):
        for users in (None, subset):
            expected = reference_metrics(table, split, which, (1, 5, 40), users)
            for model, tiled, batch_size in ((product, True, None), (product, False, 7), (FixedScorer(table), True, 1)):
                found = Evaluator(split, seed=0, cache_dir=tmp_path, batch_size=batch_size, tiled=tiled).evaluate(
                    model, which, "full", users=users, metrics=names).metrics
                assert found == pytest.approx(expected, abs=1e-12), (which, tiled, batch_size)
            found = Evaluator(split, seed=0, cache_dir=tmp_path, batch_size=5).evaluate(
                FixedScorer(with_infinities), which, "full", users=users, metrics=names).metrics
            assert found == pytest.approx(reference_metrics(with_infinities, split, which, (1, 5, 40), users),
                                          abs=1e-12), which


def test_the_lists_leave_the_models_scores_and_the_rank_counts_as_they_were(tmp_path):
    data = repeat_data(n_users=30, n_items=25)
    table = np.random.default_rng(0).integers(0, 3, (data.n_users, data.n_items + 1)).astype(np.float32)
    model = FixedScorer(table)
    evaluator = Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path)
    plain = evaluator.evaluate(model, "test", "full")
    both = evaluator.evaluate(model, "test", "full", metrics=(*DEFAULT_METRICS, *list_metric_names()))
    assert np.array_equal(model.table.numpy(), table)
    assert {name: both.metrics[name] for name in DEFAULT_METRICS} == plain.metrics  # exactly
    assert np.array_equal(both.counts.greater, plain.counts.greater) and np.array_equal(both.counts.ties,
                                                                                         plain.counts.ties)


def test_no_users_no_lists(tmp_path):
    data = repeat_data(n_users=20, n_items=30)
    found = Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path).evaluate(
        FixedScorer(np.zeros((20, 31))), "test", "full", users=np.array([], dtype=np.int64),
        metrics=("HR@10", *list_metric_names())).metrics
    assert all(math.isnan(value) for value in found.values())  # a mean over no users, as HR@10's


def test_metric_names_and_refusals(tmp_path):
    assert list_metric_names(("HR@1", "NDCG@20", "MRR")) == tuple(
        f"{kind}@{k}" for kind in KINDS for k in (1, 10, 20))
    assert parse_list_metric("APLT@5") == ("APLT", 5)
    with pytest.raises(ValueError, match="unknown beyond-accuracy metric 'ARP@0'"):
        parse_list_metric("ARP@0")
    data = repeat_data(n_users=20, n_items=30)
    evaluator = Evaluator(LeaveOneOutSplit(data), seed=0, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="ARP@10: beyond-accuracy metrics come from the top-k lists of full "
                                         "ranking; protocol 'pop100'"):
        evaluator.evaluate(FixedScorer(np.zeros((20, 31))), "test", "pop100", metrics=("HR@10", "ARP@10"))
    with pytest.raises(ValueError, match="unknown metric 'Diversity@10'"):
        Evaluator(LeaveOneOutSplit(data), seed=0, metrics=("Diversity@10",))


def test_a_top_list_accumulates_users_added_in_several_calls():
    popularity = TrainingPopularity(np.array([0, 3, 1, 0]), np.array([0, 2, 1, 0]), 2)
    whole, parts = TopLists([1], popularity), TopLists([1], popularity)
    rows, items, scores = np.array([0, 0, 1, 1]), np.array([1, 2, 2, 3]), np.array([2.0, 1.0, 5.0, 5.0])
    whole.add(rows, items, scores)
    parts.add(rows[2:], items[2:], scores[2:])
    parts.add(rows[:2], items[:2], scores[:2])
    names = [f"{kind}@1" for kind in KINDS]
    assert whole.metrics(names) == parts.metrics(names)
    # user 0: item 1; user 1: items 2 and 3 tied for one place. Coverage: (1 + 1/2 + 1/2)/3; ARP: (3 + 1/2)/2.
    assert whole.metrics(names)["Coverage@1"] == pytest.approx(2 / 3)
    assert whole.metrics(names)["ARP@1"] == pytest.approx(1.75)


def test_personalization_is_0_when_every_user_gets_one_list_and_1_when_no_two_share_an_item():
    popularity = TrainingPopularity(np.zeros(7, dtype=np.int64), np.zeros(7, dtype=np.int64), 3)
    rows = np.repeat([0, 1, 2], 2)
    for name, items, expected in (("one list", [1, 2, 1, 2, 1, 2], 0.0), ("disjoint", [1, 2, 3, 4, 5, 6], 1.0)):
        top = TopLists([2], popularity)
        top.add(rows, np.array(items), np.tile([2.0, 1.0], 3))
        assert top.metrics(["Personalization@2"]) == {"Personalization@2": expected}, name
    # Two users, items 1 and 2 tied for user 1's only place: the lists overlap in item 1 with probability 1/2.
    top = TopLists([1], popularity)
    top.add(np.array([0, 1, 1]), np.array([1, 1, 2]), np.array([1.0, 5.0, 5.0]))
    assert top.metrics(["Personalization@1"]) == {"Personalization@1": 0.5}
    alone = TopLists([1], popularity)
    alone.add(np.array([0]), np.array([1]), np.array([1.0]))
    assert math.isnan(alone.metrics(["Personalization@1"])["Personalization@1"])  # no pair of lists


@requires_shared_data
@pytest.mark.parametrize("name", ["bprmf", "sasrec"])
def test_both_paths_give_the_same_lists_on_ml_1m(name):
    """Untrained models on 800 real ML-1m users (3,416 items, four tiles): the same metrics from the tiled path and
    from the full score matrix, and accuracy metrics as without the lists."""
    from recbench.benchmarks.config import resolve
    from recbench.datasets import load_dataset
    from recbench.models import model_class

    data = load_dataset("ml-1m", data_dir=SHARED_DATA, progress=False)
    split = LeaveOneOutSplit(data)
    torch.manual_seed(0)
    model = model_class(name)(data.n_users, data.n_items, resolve(name, "ml-1m", "paper", ()).model).eval()
    users = np.sort(np.random.default_rng(0).choice(data.n_users, 800, replace=False))
    names = (*DEFAULT_METRICS, *list_metric_names())
    tiled, matrix = (Evaluator(split, seed=0, tiled=tiled).evaluate(model, "test", "full", users=users,
                                                                    metrics=names).metrics
                     for tiled in (True, False))
    assert tiled == pytest.approx(matrix, rel=1e-12)
    plain = Evaluator(split, seed=0).evaluate(model, "test", "full", users=users).metrics
    assert {metric: tiled[metric] for metric in DEFAULT_METRICS} == plain
