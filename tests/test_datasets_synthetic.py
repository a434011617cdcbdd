"""The synthetic generator: shape, determinism, sequential structure, registry sizes."""
import numpy as np
import pytest

from recbench.datasets import LeaveOneOutSplit, generate, load_dataset
from recbench.datasets.registry import REGISTRY
from recbench.datasets.synthetic import _ring_successors


def successor_vs_popularity(data) -> tuple[float, float]:
    """Hit rates on each user's held-out last item of two one-guess rules fitted on everything before it:
    "the most common successor of the user's previous item" and "the most popular item"."""
    ends = data.offsets[1:]
    before_last = np.ones(data.n_actions, dtype=bool)
    before_last[ends - 1] = False
    user = data.user_index()
    pairs = (user[:-1] == user[1:]) & before_last[1:]  # transitions that end before the held-out item
    transitions = np.zeros((data.n_items + 1, data.n_items + 1), dtype=np.int64)
    np.add.at(transitions, (data.items[:-1][pairs], data.items[1:][pairs]), 1)
    target = data.items[ends - 1]
    successor_hits = transitions[data.items[ends - 2]].argmax(axis=1) == target
    popular = np.bincount(data.items[before_last], minlength=data.n_items + 1).argmax()
    return successor_hits.mean(), (target == popular).mean()


def test_shape_and_invariants():
    data = generate(2000, 300, 20.0, seed=1)
    assert data.n_users == 2000 and data.n_items == 300
    assert data.lengths.min() >= 5 and data.lengths.max() <= 150
    assert data.stats()["avg_length"] == pytest.approx(20.0, rel=0.1)
    assert data.items.min() >= 1 and data.items.max() <= 300
    pair = data.user_index() * (data.n_items + 1) + data.items
    assert len(np.unique(pair)) == len(pair)  # no item twice within a user
    assert data.provenance["generator"]["seed"] == 1
    LeaveOneOutSplit(data)


def test_same_seed_same_data_other_seed_other_data():
    first, again, other = (generate(500, 200, 15.0, seed=s) for s in (7, 7, 8))
    assert first.content_sha256() == again.content_sha256()
    assert first.content_sha256() != other.content_sha256()


def test_popularity_has_a_long_tail():
    counts = np.sort(generate(2000, 500, 30.0, seed=0).item_counts()[1:])[::-1]
    # Popularity enters through the jumps and the choice among successors; the walks along the successor
    # rings (every item has as many predecessors as successors) spread the rest. Measured: 26.5%, top 8.8x.
    assert counts[:50].sum() > 0.2 * counts.sum()  # the top 10% of items: over twice a uniform share
    assert counts[0] > 5 * np.median(counts)


def test_every_item_has_k_successors_and_k_predecessors_in_its_genre():
    rng = np.random.default_rng(0)
    genres = np.array_split(rng.permutation(40) + 1, 3)
    table = _ring_successors(rng, genres, 40, 3)
    genre_of = np.zeros(41, dtype=int)
    for index, ring in enumerate(genres):
        genre_of[ring] = index
    rows = table[1:]
    assert all(len(set(row)) == 3 and i not in row for i, row in enumerate(rows.tolist(), 1))
    for column in rows.T:  # each successor slot is a permutation of the items: one predecessor per item
        assert sorted(column) == list(range(1, 41))
    assert np.array_equal(genre_of[rows], np.repeat(genre_of[1:, None], 3, axis=1))


def user_taste_vs_popularity(data) -> tuple[float, float]:
    """HR@10 on each user's held-out last item of "items most often co-consumed with the user's items"
    (what a user-taste model such as BPR-MF can learn) and of "the most popular items"."""
    ends = data.offsets[1:]
    before_last = np.ones(data.n_actions, dtype=bool)
    before_last[ends - 1] = False
    user = data.user_index()
    history = np.zeros((data.n_users, data.n_items + 1))
    np.add.at(history, (user[before_last], data.items[before_last]), 1)
    together = history.T @ history
    np.fill_diagonal(together, 0)
    target = data.items[ends - 1]

    def hit_rate(scores):
        scores = scores.astype(float)
        scores[history > 0] = -np.inf
        scores[:, 0] = -np.inf
        return (np.argsort(-scores, axis=1, kind="stable")[:, :10] == target[:, None]).any(axis=1).mean()

    return hit_rate(history @ together), hit_rate(np.tile(history.sum(axis=0), (data.n_users, 1)))


def test_users_have_a_taste_that_popularity_misses():
    taste, popularity = user_taste_vs_popularity(generate(1000, 500, 30.0, seed=0))
    assert taste > 1.5 * popularity
    taste, popularity = user_taste_vs_popularity(generate(1000, 500, 30.0, seed=0, n_genres=1, follow=0.0))
    assert taste < 1.2 * popularity  # one genre and no chain: nothing beyond popularity


def middle_item_hit_rates(data) -> tuple[float, float, float]:
    """Hit rates of guessing an item from transition counts given the item before it, the item after it, and
    both (counts from even users, guesses on the middle items of odd users)."""
    user, items, n = data.user_index(), data.items, data.n_items + 1
    pair = (user[:-1] == user[1:]) & (user[:-1] % 2 == 0)
    counts = np.zeros((n, n))
    np.add.at(counts, (items[:-1][pair], items[1:][pair]), 1)
    middle = np.flatnonzero((user[1:-1] == user[:-2]) & (user[1:-1] == user[2:]) & (user[1:-1] % 2 == 1)) + 1
    before, item, after = items[middle - 1], items[middle], items[middle + 1]
    popularity = counts.sum(axis=0) + 1
    left = counts[before] + 1e-3 * popularity
    right = counts[:, after].T + 1e-3 * popularity
    both = (counts[before] + 0.1) * (counts[:, after].T + 0.1) / popularity  # P(x | before) P(after | x)
    return tuple(float((guess.argmax(axis=1) == item).mean()) for guess in (left, right, both))


def test_both_neighbours_tell_a_middle_item_better_than_the_one_before_it():
    left, right, both = middle_item_hit_rates(generate(1000, 500, 30.0, seed=0))
    assert right > 0.9 * left  # the item after says as much as the item before (measured 0.40 vs 0.37)
    assert both > left + 0.08  # what a bidirectional model can use and a left-to-right one cannot (0.50)


def test_sequential_structure_beats_popularity():
    successor, popularity = successor_vs_popularity(generate(1000, 500, 30.0, seed=0))
    assert successor > 0.3 and popularity < 0.05


def test_without_the_chain_there_is_nothing_sequential_to_learn():
    successor, _ = successor_vs_popularity(generate(1000, 500, 30.0, seed=0, follow=0.0))
    assert successor < 0.05


def test_bad_parameters():
    with pytest.raises(ValueError, match="min_length"):
        generate(10, 100, 4.0)
    with pytest.raises(ValueError, match="max_length"):
        generate(10, 20, 15.0)
    with pytest.raises(ValueError, match="follow"):
        generate(10, 100, 10.0, follow=1.5)
    with pytest.raises(ValueError, match="taste=-0.1 must be in"):
        generate(10, 100, 10.0, taste=-0.1)
    with pytest.raises(ValueError, match="n_successors=3 must be .* smaller than the smallest genre"):
        generate(10, 100, 10.0, n_genres=40)


def test_default_synthetic_is_small_and_cached(tmp_path):
    data = load_dataset("synthetic", cache_dir=tmp_path)
    assert (data.n_users, data.n_items) == (1000, 500)
    assert 25 <= data.stats()["avg_length"] <= 35
    assert load_dataset("synthetic", cache_dir=tmp_path).content_sha256() == data.content_sha256()
    assert len(list((tmp_path / "prepared").glob("synthetic-*.npz"))) == 1


def test_steam_size():
    params = REGISTRY["synthetic-steam"].params
    data = generate(**params)
    assert (data.n_users, data.n_items) == (281_428, 13_044)
    assert data.n_actions == pytest.approx(3.5e6, rel=0.02)
    assert data.lengths.min() >= 5


@pytest.mark.slow
def test_ml20m_size():
    data = generate(**REGISTRY["synthetic-ml-20m"].params)
    assert (data.n_users, data.n_items) == (138_493, 26_744)
    assert data.n_actions == pytest.approx(20e6, rel=0.02)
    assert data.lengths.min() >= 5
