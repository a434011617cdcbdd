"""The global temporal split (PROTOCOL.md, "Temporal split"): its boundaries computed by hand (ties at a cut, items
first seen after a cut, users without history), the candidates and negatives it leaves out, no leakage on real data,
the one-line refusal of data without times, the key rule, and a grid run end to end."""
import json

import numpy as np
import pytest

from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.jobs import GridError, Job
from recbench.benchmarks.metrics import TrainingPopularity
from recbench.benchmarks.negatives import candidate_weights, load_or_sample
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.planner import plan_grid
from recbench.datasets import generate, load_dataset, registry
from recbench.datasets.sequences import SequenceData
from recbench.datasets.splits import SplitSpec, TemporalSplit, quantile_time
from tests.helpers import SHARED_DATA, FixedScorer, ProductScorer, requires_shared_data

pytestmark = pytest.mark.usefixtures("one_thread")

# Five users over items 1..8, cut times 10 and 20 (the 0.3 and 0.6 quantiles of these 15 times):
#   user 0: 1@1 2@2 | 3@10 4@12 | 5@20   its validation target 3 is at exactly c1, its test target 5 at exactly c2
#   user 1: 3@5 | 6@10 5@15 | 7@25      6 is first seen at c1: no validation candidate, so its target is dropped
#   user 2: 7@8 | | 8@30                no interaction between the cuts; 8 is first seen after c2: target dropped
#   user 3: | 2@11 | 1@21               a validation target but no history: skipped; tested after [2]
#   user 4: | | 4@22 2@23               a test target but no history: skipped
HAND = [([1, 2, 3, 4, 5], [1, 2, 10, 12, 20]), ([3, 6, 5, 7], [5, 10, 15, 25]), ([7, 8], [8, 30]),
        ([2, 1], [11, 21]), ([4, 2], [22, 23])]


def hand_data() -> SequenceData:
    return SequenceData.from_sequences("hand", [items for items, _ in HAND], n_items=8,
                                       times=[times for _, times in HAND])


def timed_data(n_users=120, n_items=300, seed=0) -> SequenceData:
    """Synthetic sequences with times: each user starts at a random time and moves on by 1..5 per interaction."""
    base = generate(n_users, n_items, mean_length=12.0, seed=seed, progress=False)
    rng = np.random.default_rng(seed)
    times = [rng.integers(0, 200) + np.cumsum(rng.integers(1, 6, size=len(base.sequence(u))))
             for u in range(n_users)]
    return SequenceData.from_sequences("timed", [base.sequence(u) for u in range(n_users)], base.n_items,
                                       times=times)


def csr(view) -> list[list[int]]:
    return [view.items[view.offsets[r]:view.offsets[r + 1]].tolist() for r in range(len(view))]


# ------------------------------------------------------------------------------------------ boundaries by hand
def test_cut_times_are_quantiles_of_the_interaction_times_with_ties_counted_later():
    times = hand_data().times  # sorted: 1 2 5 8 10 10 11 12 15 20 21 22 23 25 30
    assert quantile_time(times, 0.3) == 10  # position ⌊4.5⌋ = 4: four interactions come before it
    assert quantile_time(times, 0.35) == 10  # position 5 is the second 10: still four before (the tie goes later)
    assert quantile_time(times, 0.6) == 20 and quantile_time(times, 0.99) == 30
    assert TemporalSplit.at_quantiles(hand_data(), (0.3, 0.6)).cuts == (10, 20)


def test_training_view_holds_the_interactions_before_the_first_cut_only():
    train = TemporalSplit(hand_data(), (10, 20)).train()
    assert train.users.tolist() == [0, 1, 2]  # users 3 and 4 have nothing before 10
    assert csr(train) == [[1, 2], [3], [7]]  # 3@10 (user 0) and 6@10 (user 1) lie on the cut: later period


def test_validation_and_test_views_by_hand():
    split = TemporalSplit(hand_data(), (10, 20))
    valid, test = split.holdout("valid"), split.holdout("test")
    assert valid.view.users.tolist() == [0] and csr(valid.view) == [[1, 2]] and valid.view.targets.tolist() == [3]
    assert (valid.users_skipped, valid.targets_dropped) == (1, 1)  # user 3 skipped; user 1's item 6 is new at c1
    assert test.view.users.tolist() == [0, 1, 3]
    assert csr(test.view) == [[1, 2, 3, 4], [3, 6, 5], [2]] and test.view.targets.tolist() == [5, 7, 1]
    assert (test.users_skipped, test.targets_dropped) == (1, 1)  # user 4 skipped; user 2's item 8 is new after c2


def test_items_first_seen_at_or_after_a_cut_are_no_candidates_and_weigh_nothing():
    split = TemporalSplit(hand_data(), (10, 20))
    assert split.new_items("valid").tolist() == [4, 5, 6, 8]  # first seen at 12, 15, 10 (on the cut) and 30
    assert split.new_items("test").tolist() == [8]
    assert split.popularity("valid").tolist() == [0, 1, 1, 1, 0, 0, 0, 1, 0]  # interactions before 10
    assert split.popularity("test").tolist() == [0, 1, 2, 2, 1, 1, 1, 1, 0]  # interactions before 20
    summary = split.summary("test")
    assert summary == {"cut_times": [10, 20], "quantiles": None, "part": "test", "train_users": 3,
                       "train_interactions": 4, "users_skipped": 1, "targets_dropped": 1, "items_excluded": 1}


def test_full_ranking_leaves_out_the_new_items_on_both_paths(tmp_path):
    """Every user scores item i as s_i below; item 8, new in both parts, scores highest and must change nothing.
    Candidates by hand (every item but padding, the history and the part's new items), target's score in brackets:
    test user 0 (history 1 2 3 4, target 5 [1]) among 6 [3] and 7 [1]: one above, one tied; user 1 (3 6 5, target
    7 [1]) among 1 [2], 2 [9], 4 [1]: two above, one tied; user 3 (2, target 1 [2]) among 3 4 5 7 [1] and 6 [3]:
    one above. Validation user 0 (1 2, target 3 [1]) among 7 [1] alone (4, 5, 6 and 8 are new at c1): one tied."""
    split = TemporalSplit(hand_data(), (10, 20))
    item_scores = np.array([0, 2, 9, 1, 1, 1, 3, 1, 50], dtype=np.float32)
    expected = {"test": [(1, 1), (2, 1), (1, 0)], "valid": [(0, 1)]}
    product = ProductScorer(np.ones((5, 1)), item_scores[:, None])  # ranked tile by tile on the CPU
    for model, tiled in ((FixedScorer(np.tile(item_scores, (5, 1))), False), (product, True), (product, False)):
        evaluator = Evaluator(split, seed=0, cache_dir=tmp_path, tiled=tiled)
        for part in ("test", "valid"):
            counts = evaluator.rank_counts(model, part, "full", "m")
            assert list(zip(counts.greater.tolist(), counts.ties.tolist())) == expected[part], (part, tiled)


def test_the_top_lists_leave_out_the_new_items_and_so_does_the_catalogue(tmp_path):
    """The scores of the test above: item 8, new in both parts, scores highest and is in no list. Test users' top 1
    by hand: user 0 gets 6 [3], user 1 gets 2 [9], user 3 gets 6 [3]; the test catalogue is items 1-7 (8 is no
    candidate), so Coverage@1 = 2/7; Gini@1 of exposures (0, 1, 0, 0, 0, 2, 0) is Σ_j (2j − 8) e_(j) / (7 · 3) =
    (4 · 1 + 6 · 2) / 21."""
    split = TemporalSplit(hand_data(), (10, 20))
    item_scores = np.array([0, 2, 9, 1, 1, 1, 3, 1, 50], dtype=np.float32)
    popularity = TrainingPopularity.of(split.train(), split.n_items).interactions
    product = ProductScorer(np.ones((5, 1)), item_scores[:, None])
    for model, tiled in ((FixedScorer(np.tile(item_scores, (5, 1))), False), (product, True), (product, False)):
        evaluator = Evaluator(split, seed=0, cache_dir=tmp_path, tiled=tiled)
        values = evaluator.evaluate(model, "test", "full", "m", metrics=("Coverage@1", "Gini@1", "ARP@1")).metrics
        assert values["Coverage@1"] == pytest.approx(2 / 7), tiled
        assert values["Gini@1"] == pytest.approx(16 / 21), tiled
        assert values["ARP@1"] == pytest.approx((2 * popularity[6] + popularity[2]) / 3), tiled


def test_sampled_negatives_come_from_the_items_seen_before_the_cut(tmp_path):
    split = TemporalSplit.at_quantiles(timed_data())
    for part in ("valid", "test"):
        view, new = split.view(part), split.new_items(part)
        assert len(view) and len(new)
        pop = candidate_weights(split, part, "pop100")
        assert np.array_equal(pop, split.popularity(part)) and not pop[new].any()
        assert not candidate_weights(split, part, "uni100")[new].any()
        for protocol in ("pop100", "uni100"):
            negatives = load_or_sample(split, part, protocol, seed=0, cache_dir=tmp_path, progress=False)
            others = np.setdiff1d(np.arange(split.data.n_users), view.users)
            assert not negatives[others].any()  # drawn only for the users the part evaluates
            for user in view.users:
                drawn = negatives[user]
                assert len(set(drawn)) == 100 and not np.isin(drawn, new).any()
                assert not np.isin(drawn, split.data.sequence(user)).any()  # never an item of the whole sequence
    assert len(list(tmp_path.glob("negatives-*-temporal-*-test-pop100-n100-seed0.npy"))) == 1


def test_times_must_run_forward_within_each_user():
    with pytest.raises(ValueError, match="user row 1 goes back in time at position 2"):
        SequenceData.from_sequences("bad", [[1, 2], [3, 4, 5]], n_items=5, times=[[5, 6], [1, 3, 2]])
    SequenceData.from_sequences("ok", [[1, 2], [3, 4, 5]], n_items=5, times=[[5, 6], [1, 3, 3]])  # ties are fine


def test_cuts_that_leave_a_view_empty_are_refused():
    assert TemporalSplit(hand_data(), (10, 20)).problems() == []
    only = TemporalSplit(hand_data(), (12, 13)).problems()  # [12, 13) holds 4@12 of user 0 alone, first seen there
    assert only == ["dataset 'hand': no user has a valid target between the cut times 12 and 13 (with a history and "
                    "an item seen before it); move the cuts"]
    assert len(TemporalSplit(hand_data(), (26, 29)).problems()) == 2  # neither a validation nor a test target
    assert "nothing is left to train on" in TemporalSplit(hand_data(), (1, 20)).problems()[0]
    with pytest.raises(ValueError, match="the cut times must rise, c1 < c2; got 20 and 10"):
        TemporalSplit(hand_data(), (20, 10))
    for bad, message in (({"quantiles": (0.9, 0.8)}, "0 < q1 < q2 < 1"), ({"cut_times": (5, 5)}, "t1 < t2"),
                         ({"quantiles": (0.1, 0.2), "cut_times": (1, 2)}, "not both")):
        with pytest.raises(ValueError, match=message):
            SplitSpec("temporal", **bad)
    with pytest.raises(ValueError, match="apply to --split temporal only"):
        SplitSpec("leave-one-out", quantiles=(0.5, 0.6))


# ------------------------------------------------------------------------------------------------ real data
@requires_shared_data
def test_no_training_interaction_at_or_after_the_first_cut_and_no_history_after_the_second_on_ml_100k(tmp_path):
    """The split a planned job runs on, checked against the interactions' own times on ML-100k."""
    planned, datasets = plan_grid([Job("ml-100k", "pop", 0)], RunOptions(
        output=tmp_path / "out", data_dir=SHARED_DATA, cache_dir=tmp_path, split="temporal", device="cpu",
        progress=False), log=lambda *_: None)
    data = datasets["ml-100k"]
    split = planned[0].data_split(data)
    first, second = split.cuts
    assert (first, second) == (quantile_time(data.times, 0.8), quantile_time(data.times, 0.9))
    train = split.train()
    assert len(train.items) == int((data.times < first).sum())  # every interaction before c1 is trained on
    for row, user in enumerate(train.users):  # ... and nothing else: each user's training items lie before c1
        start, length = data.offsets[user], train.lengths[row]
        assert np.array_equal(train.items[train.offsets[row]:train.offsets[row + 1]], data.items[start:start + length])
        assert data.times[start + length - 1] < first
    for part, cut in (("valid", first), ("test", second)):
        view, new = split.view(part), split.new_items(part)
        for row, user in enumerate(view.users):
            start, length = data.offsets[user], view.lengths[row]
            assert np.array_equal(csr(view)[row], data.items[start:start + length])
            assert 0 < length and data.times[start + length - 1] < cut <= data.times[start + length]
            assert view.targets[row] == data.items[start + length] and view.targets[row] not in new
        if part == "valid":
            assert (data.times[data.offsets[view.users] + view.lengths] < second).all()
    summary = split.summary("test")
    after = np.unique(data.user_index()[data.times >= second])  # users with an interaction at or after c2
    assert len(split.test()) + summary["users_skipped"] + summary["targets_dropped"] == len(after)


@requires_shared_data
def test_ml_100k_keeps_its_leave_one_out_hash_when_its_times_are_kept(tmp_path):
    """Carrying the times changes nothing that leave-one-out reads: the same sequences, the same content hash."""
    from recbench.datasets.preprocess import prepare
    from recbench.datasets.readers import read_interactions
    from recbench.datasets.registry import get_spec

    timed = load_dataset("ml-100k", SHARED_DATA, tmp_path, progress=False, timed=True)
    source = get_spec("ml-100k").sources[0]
    interactions = read_interactions(SHARED_DATA / "ml-100k_u.data.gz", source.fmt)
    untimed = prepare(type(interactions)(**{**interactions.__dict__, "timed": False}), source.preprocessing, "ml-100k")
    assert timed.times is not None and untimed.times is None
    assert timed.content_sha256() == untimed.content_sha256()
    assert timed.content_sha256() == load_dataset("ml-100k", SHARED_DATA, tmp_path, progress=False).content_sha256()


# ------------------------------------------------------------------------------------------------ sources with times
def staggered_log(n_users=30, per_user=10, n_items=40, seed=0) -> list[tuple[int, int, int]]:
    """(user, item, day) rows: users start on staggered days and act every day or two, so that users span the
    cuts; each user's items are distinct."""
    rng = np.random.default_rng(seed)
    rows = []
    for user in range(1, n_users + 1):
        days = 3 * user + np.cumsum(rng.integers(1, 3, size=per_user))
        rows += [(user, int(item), int(day)) for item, day in zip(rng.choice(np.arange(1, n_items + 1), per_user,
                                                                              replace=False), days)]
    return rows


DAY = 86_400


def day(d: int) -> str:
    """Day ``d`` (0..335) of 2015 as an ISO date, months taken as 28 days long."""
    return f"2015-{1 + d // 28:02d}-{1 + d % 28:02d}"


def write_source(folder, dataset: str, rows) -> None:
    """``rows`` in the upstream layout of ``dataset``'s raw file, where the registry looks for it."""
    lines = {
        "ml-1m": ("ml-1m/ratings.dat", [f"{u}::{i}::4::{d * DAY}" for u, i, d in rows]),
        "ml-20m": ("ml-20m/ratings.csv", ["userId,movieId,rating,timestamp"]
                   + [f"{u},{i},4.0,{d * DAY}" for u, i, d in rows]),
        "beauty": ("ratings_Beauty.csv", [f"A{u:05d},B{i:05d},5.0,{d * DAY}" for u, i, d in rows]),
        "steam": ("steam_reviews.json", [repr({"username": f"u{u}", "product_id": str(i), "date": day(d)})
                                         for u, i, d in rows]),
    }
    name, text = lines[dataset]
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(text) + "\n")


@pytest.mark.parametrize("dataset", ["ml-1m", "ml-20m", "beauty", "steam"])
def test_the_raw_pipelines_keep_their_times_and_split_by_time(dataset, tmp_path):
    write_source(tmp_path, dataset, staggered_log())
    (tmp_path / "ml-1m_seq_full.txt").write_text("".join(f"{u} {i}\n" for u, i, _ in staggered_log()))
    data = load_dataset(dataset, tmp_path, tmp_path / "cache", download=False, progress=False, timed=True)
    assert data.provenance["source"] == "raw" and data.times is not None
    split = SplitSpec("temporal").build(data)
    assert split.problems() == [] and len(split.test()) > 0
    if dataset == "ml-1m":  # leave-one-out keeps its preference for the file without times
        untimed = load_dataset(dataset, tmp_path, tmp_path / "cache", download=False, progress=False)
        assert untimed.provenance["source"] == "sequences" and untimed.times is None


def test_a_log_with_a_time_column_runs_on_the_temporal_split(tmp_path):
    from recbench.benchmarks.grid import run_jobs
    from recbench.datasets import InteractionLog, LogFormat

    log = tmp_path / "clicks.csv"  # ISO dates: the times are nanoseconds
    log.write_text("uid,iid,when\n" + "".join(f"{u},{i},{day(d)}T08:00:00Z\n" for u, i, d in staggered_log()))
    options = RunOptions(output=tmp_path / "out", cache_dir=tmp_path, split="temporal", device="cpu", progress=False,
                         protocols=("full",),
                         logs={"clicks": InteractionLog(log, LogFormat(user="uid", item="iid", time="when"))})
    (row, *_), = [run_jobs([Job("clicks", "pop", 0)], options, log=lambda *_: None).rows]
    assert row["split_scheme"] == "temporal" and row["users_evaluated"] > 0


# ------------------------------------------------------------------------------------------------ refusals
def refusal(tmp_path, dataset: str, **options) -> str:
    with pytest.raises(GridError) as error:
        plan_grid([Job(dataset, "pop", 0)], RunOptions(output=tmp_path / "out", cache_dir=tmp_path / "cache",
                                                        split="temporal", device="cpu", progress=False, **options),
                  log=lambda *_: None)
    message = str(error.value)
    assert "\n" not in message, message  # one line
    return message


@requires_shared_data
@pytest.mark.parametrize(("dataset", "found", "named"), [
    ("ml-1m", "ml-1m_seq_full.txt.gz", "ml-1m.zip or ml-1m/ratings.dat (GroupLens MovieLens 1M ratings.dat, source "
                                       "'raw'"),
    ("beauty", "beauty.txt.gz", "ratings_Beauty.csv (Amazon product data 2014, Beauty ratings only"),
])
def test_the_authors_files_without_times_are_refused_in_one_line_naming_the_file_with_times(
        dataset, found, named, tmp_path, monkeypatch):
    monkeypatch.delitem(registry.URLS, f"{dataset}/raw")  # offline: nothing with times to download
    message = refusal(tmp_path, dataset, data_dir=SHARED_DATA)
    assert message.startswith(f"dataset {dataset!r}: the temporal split needs interaction times, and the file "
                              f"found, {found}")
    assert "keeps only each user's order" in message and named in message


@requires_shared_data
def test_datasets_and_logs_without_any_times_are_refused_in_one_line(tmp_path):
    assert "has no file with interaction times (only each user's order, in Video.txt" in refusal(
        tmp_path, "video", data_dir=SHARED_DATA)
    assert "'synthetic' is generated without interaction times" in refusal(tmp_path, "synthetic")
    log = tmp_path / "clicks.csv"
    log.write_text("user,item\n" + "".join(f"{u},{i}\n" for u in range(3) for i in range(6)))
    from recbench.datasets import InteractionLog
    message = refusal(tmp_path, "clicks", logs={"clicks": InteractionLog(log)})
    assert message.startswith("dataset 'clicks' is a log without a time column (name it with --columns "
                              "time=COLUMN), which the temporal split needs")


@requires_shared_data
def test_the_command_line_refusal_is_one_line(tmp_path, monkeypatch, capsys):
    import run_all
    monkeypatch.delitem(registry.URLS, "beauty/raw")
    code = run_all.main(["--datasets", "beauty", "--split", "temporal", "--models", "pop", "--data-dir",
                         str(SHARED_DATA), "--cache-dir", str(tmp_path), "--output", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: dataset 'beauty': the temporal split needs")


# ------------------------------------------------------------------------------------------------ the key rule
@requires_shared_data
def test_the_key_holds_the_split_only_when_it_is_not_leave_one_out(tmp_path):
    def planned(**split):
        options = RunOptions(output=tmp_path / "out", data_dir=SHARED_DATA, cache_dir=tmp_path, device="cpu",
                             progress=False, **split)
        return plan_grid([Job("ml-100k", "bprmf", 0)], options, log=lambda *_: None)[0][0]

    loo, default, explicit = planned(), planned(split="leave-one-out"), planned(split=SplitSpec("leave-one-out"))
    assert loo.key == default.key == explicit.key and "split" not in loo.identity()
    temporal = planned(split="temporal")
    record = temporal.identity()["split"]
    assert temporal.key != loo.key and {k: v for k, v in record.items() if k != "times_sha256"} == {
        "scheme": "temporal", "cut_times": list(temporal.data_split(load_dataset(
            "ml-100k", SHARED_DATA, tmp_path, progress=False, timed=True)).cuts), "quantiles": [0.8, 0.9]}
    other_cuts = planned(split=SplitSpec("temporal", quantiles=(0.7, 0.9)))
    assert other_cuts.key not in (temporal.key, loo.key)
    assert {k: v for k, v in temporal.identity().items() if k != "split"} == loo.identity()  # nothing else moves


# ------------------------------------------------------------------------------------------------ grids
def test_every_registered_model_trains_selects_and_tests_on_the_temporal_split(tmp_path):
    """Through the harness, as a user runs it: each model reads the temporal training view and is validated and
    tested on its views (the relevance models on their pairs), with no change to any model."""
    from recbench.benchmarks.grid import run_jobs
    from recbench.models import is_registered, model_class, model_names
    from recbench.models.relevance import RelevanceModel

    registered_names = [name for name in model_names() if is_registered(name)]
    data = timed_data()
    small = ("max_epochs=1", "patience=none", "hidden=16", "valid_users=30")
    jobs = [Job("timed", name, 0, overrides=small, task="relevance" if issubclass(model_class(name), RelevanceModel)
                else "next-item") for name in registered_names]
    options = RunOptions(output=tmp_path / "out", cache_dir=tmp_path, split="temporal", device="cpu", progress=False)
    result = run_jobs(jobs, options, preloaded={"timed": data}, log=lambda *_: None)
    assert not result.failed, [(outcome.run_id, outcome.error) for outcome in result.failed]
    split = TemporalSplit.at_quantiles(data)
    for row in result.rows:
        assert row["split_scheme"] == "temporal" and row["split"] == "test"
        assert row["temporal_split"] == split.summary("test")
        assert row["users_evaluated"] == len(split.test())
    assert {row["model"] for row in result.rows} == set(registered_names)


@requires_shared_data
def test_run_all_runs_the_temporal_split_on_ml_100k_end_to_end(tmp_path):
    """``run_all.py --datasets ml-100k --split temporal --models pop bprmf sasrec bert4rec --profile smoke``, with
    small settings: every row names the split and what it left out, and the report is written."""
    import run_all

    output = tmp_path / "out"
    code = run_all.main(["--datasets", "ml-100k", "--split", "temporal", "--models", "pop", "bprmf", "sasrec",
                         "bert4rec", "--profile", "smoke", "--data-dir", str(SHARED_DATA), "--cache-dir",
                         str(tmp_path), "--output", str(output), "--quiet", "--set", "max_epochs=1", "--set",
                         "hidden=16", "--set", "max_len=20"])
    assert code == 0 and (output / "report.md").is_file()
    rows = [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]
    assert sorted((row["model"], row["protocol"]) for row in rows) == sorted(
        (model, protocol) for model in ("pop", "bprmf", "sasrec", "bert4rec") for protocol in ("full", "pop100"))
    for row in rows:
        split = row["temporal_split"]
        assert row["split_scheme"] == "temporal" and split["quantiles"] == [0.8, 0.9] and split["part"] == "test"
        assert row["users_evaluated"] > 0 and split["users_skipped"] > 0 and split["items_excluded"] > 0
    jobs = json.loads((output / "config.json").read_text())["jobs"]  # every job's resolved settings, its split too
    assert [job["split"]["scheme"] for job in jobs] == ["temporal"] * 4
    assert len({row["temporal_split"]["cut_times"][0] for row in rows}) == 1


@requires_shared_data
def test_the_api_runs_the_relevance_task_on_the_temporal_split(tmp_path):
    from recbench.benchmarks.api import run

    results = run(datasets="ml-latest-small", models=["pop"], task="relevance", split="temporal",
                  output=tmp_path / "out", data_dir=SHARED_DATA, cache_dir=tmp_path, device="cpu", progress=False,
                  log=lambda *_: None)
    assert list(results["split_scheme"]) == ["temporal"] and results["users_evaluated"][0] > 0
    assert 0.0 <= results["AUC"][0] <= 1.0


@requires_shared_data
@pytest.mark.parametrize("command", ["studies", "tune"])
def test_studies_and_tuning_plan_on_the_temporal_split(command, tmp_path, capsys):
    if command == "studies":
        from recbench.benchmarks.commands.studies import main
        argv = ["ablation", "--variants", "default", "--no-estimate", "--profile", "smoke"]
    else:
        from recbench.benchmarks.commands.tune import main
        argv = ["--models", "sasrec", "--trials", "1"]
    code = main([*argv, "--datasets", "ml-100k", "--split", "temporal", "--cut-quantiles", "0.7", "0.85",
                 "--data-dir", str(SHARED_DATA), "--cache-dir", str(tmp_path), "--output", str(tmp_path / "out"),
                 "--dry-run", "--quiet"])
    assert code == 0
    if command == "studies":
        assert "split: temporal, cut times" in capsys.readouterr().out


def test_the_console_table_of_a_temporal_split_states_its_users_and_warns_when_they_are_few():
    """Issue 70: the temporal split of ML-100k tested 82 users, and its console table did not say so."""
    from recbench.reports.console import main_tables

    def row(model, users):
        return {"dataset": "ml-100k", "protocol": "full", "study": "main", "model": model, "seed": 0,
                "split_scheme": "temporal", "users_evaluated": users, "metrics": {"HR@10": 0.1, "NDCG@10": 0.05}}

    text = main_tables([row("pop", 82), row("bprmf", 82)])
    assert "(1 seed, test split, temporal split, 82 users evaluated)" in text
    assert ("> ml-100k, global temporal split: only 82 users evaluated, so a hit rate moves in steps of 1/82 = 0.012"
            in text)
    assert "users evaluated" not in main_tables([{**row("pop", 82), "split_scheme": "leave-one-out"}])
    assert "only 400 users" not in main_tables([row("pop", 400)]) and "400 users evaluated" in main_tables(
        [row("pop", 400)])
