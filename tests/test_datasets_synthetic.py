"""The synthetic generator: shape, determinism, sequential structure, registry sizes."""
import numpy as np
import pytest

from datasets import LeaveOneOutSplit, generate, load_dataset
from datasets.registry import REGISTRY


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
    assert counts[:50].sum() > 0.4 * counts.sum()  # the top 10% of items get over 40% of the interactions


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
