"""Re-breaking timestamp ties (benchmarks/experiments/timestamp_ties.py): each ordering moves items only within a
run of one user's equal times, the counts of tied targets by hand, the file's ordering reproduces the registry's
preparation exactly, and a dataset without times is refused in one line."""
import json

import numpy as np
import pytest

from benchmarks.experiments import timestamp_ties
from recbench.benchmarks.evaluator import Evaluator
from recbench.datasets import LeaveOneOutSplit, load_dataset
from recbench.datasets.sequences import SequenceData
from recbench.models.pop import Pop
from tests.helpers import SHARED_DATA, requires_shared_data

# User 0: item 5 at time 1, items 3 and 7 tied at 2, item 2 at 3; user 1: items 4, 9 and 1 all at time 1.
HAND = SequenceData.from_sequences("hand", [[5, 3, 7, 2], [4, 9, 1]], 9, times=[[1, 2, 2, 3], [1, 1, 1]])


@pytest.mark.parametrize("ordering, expected", [
    ("file", [[5, 3, 7, 2], [4, 9, 1]]),
    ("item", [[5, 3, 7, 2], [1, 4, 9]]),
    ("reverse", [[5, 7, 3, 2], [1, 9, 4]]),
])
def test_an_ordering_reorders_only_within_a_users_run_of_equal_times(ordering, expected):
    items = HAND.items[timestamp_ties.tie_order(HAND, ordering)]
    assert [items[:4].tolist(), items[4:].tolist()] == expected


def test_a_random_ordering_keeps_every_user_and_time_in_place():
    order = timestamp_ties.tie_order(HAND, "random-3")
    assert sorted(order.tolist()) == list(range(7))
    assert np.array_equal(HAND.times[order], HAND.times)  # times and users stay where they were
    assert sorted(HAND.items[order][4:].tolist()) == [1, 4, 9] and HAND.items[order][0] == 5
    assert np.array_equal(order, timestamp_ties.tie_order(HAND, "random-3"))  # the seed fixes it
    with pytest.raises(ValueError, match="unknown ordering 'shuffled'"):
        timestamp_ties.tie_order(HAND, "shuffled")


def test_a_tie_in_time_is_one_users_and_never_spans_two_users():
    assert HAND.tied_in_time().tolist() == [False, True, True, False, True, True, True]
    across = SequenceData.from_sequences("across", [[1, 2], [], [3, 4]], 4, times=[[1, 5], [], [5, 6]])
    assert across.tied_in_time().tolist() == [False, False, False, False]  # time 5 ends one user, starts the next
    with pytest.raises(ValueError, match="no interaction times"):
        SequenceData.from_sequences("untimed", [[1, 2, 3]], 3).tied_in_time()


def test_tied_targets_counted_by_hand():
    # Test targets: item 2 (alone at time 3), item 1 (tied); validation targets: 7 and 9, both tied.
    assert timestamp_ties.tie_counts(HAND) == {"users": 2, "test_target_in_a_tie": 0.5,
                                               "validation_target_in_a_tie": 1.0,
                                               "interactions_in_a_tie": round(5 / 7, 4)}


@requires_shared_data
def test_the_files_ordering_is_the_registrys_preparation_and_another_moves_targets(tmp_path):
    assert timestamp_ties.main(["--dataset", "ml-100k", "--data-dir", str(SHARED_DATA), "--cache-dir",
                                str(tmp_path / "cache"), "--models", "pop", "--seeds", "0", "--orderings", "file",
                                "item", "--output", str(tmp_path / "runs"), "--reference", str(tmp_path)]) == 0
    found = json.loads((tmp_path / "timestamp-ties-ml-100k.json").read_text())
    file, item = found["orderings"]
    data = load_dataset("ml-100k", data_dir=SHARED_DATA, cache_dir=tmp_path / "cache", progress=False)
    split = LeaveOneOutSplit(data)
    pop = Pop(data.n_users, data.n_items)
    pop.fit(split.train())
    direct = Evaluator(split, seed=0, cache_dir=tmp_path / "negatives").evaluate(pop, "test", "pop100").metrics
    assert file["models"]["pop"]["pop100 NDCG@10"] == {"0": round(direct["NDCG@10"], 4)}
    assert file["test_targets_changed"] == 0.0 and 0 < item["test_targets_changed"] <= found["ties"][
        "test_target_in_a_tie"]  # only a tied target can change
    assert "--orderings file item" in found["command"]


def test_a_dataset_without_times_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="synthetic: its file has no interaction times"):
        timestamp_ties.main(["--dataset", "synthetic", "--data-dir", str(tmp_path), "--cache-dir",
                             str(tmp_path / "cache"), "--reference", str(tmp_path)])
