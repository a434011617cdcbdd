"""The relevance-prediction task (``benchmarks.relevance``, ``lstm-rel``, ``bert4rec-rel``, ``--task relevance``).

Pairs are fixed by seed, stored, balanced and never use an item of the user's sequence as a negative; the metrics
agree with hand computations (AUC ties count ½) and with the random and oracle predictors; Platt calibration sees
only validation pairs and recovers a known sigmoid; both relevance models learn a small synthetic dataset on the
CPU in seconds; ``run_all.py --task relevance`` writes rows in the result schema that the report renders.
"""
import math

import numpy as np
import pytest
import torch

import run_all
from recbench.benchmarks.evaluator import ScoreError
from recbench.benchmarks.relevance import (
    PAIR_LABELS,
    PlattScaling,
    RelevanceEvaluator,
    accuracy,
    calibrate,
    log_loss,
    relevance_metrics,
    roc_auc,
)
from recbench.benchmarks.store import read_results
from recbench.benchmarks.trainer import Trainer, TrainRun, TrainSettings
from recbench.datasets import generate
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.models import model_class
from recbench.models.pop import Pop
from recbench.reports.results import load_results
from recbench.reports.tables import relevance_table

SCHEMA_KEYS = {"schema", "run_id", "study", "variant", "sweep", "dataset", "dataset_info", "model", "hyperparameters",
               "train_settings", "task", "protocol", "tie_policy", "split", "seed", "metrics", "users_evaluated",
               "per_user_file", "epochs_run", "best_epoch", "best_valid", "valid_metric", "curve", "train_seconds",
               "eval_seconds", "peak_memory_mb", "device", "versions", "commit", "created", "calibration"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny networks: intra-op threads only add overhead on a shared CPU. Restored after this module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def split():
    """300 users over 200 items with strong first-order structure (datasets.synthetic)."""
    return LeaveOneOutSplit(generate(300, 200, 20.0, seed=0))


class Scripted(torch.nn.Module):
    """A stand-in model whose probabilities come from ``rule(users, candidates) -> (B, C)``."""

    history_length = 5
    device = torch.device("cpu")

    def __init__(self, rule):
        super().__init__()
        self.rule = rule

    def predict_proba(self, users, histories, candidates):
        return self.rule(users, candidates)


# ----------------------------------------------------------------------------------------------------- pairs

def test_pairs_are_fixed_by_seed_stored_and_balanced(split, tmp_path):
    first = RelevanceEvaluator(split, seed=3, cache_dir=tmp_path)
    for which in ("valid", "test"):
        pairs = first.pairs(which)
        assert pairs.shape == (split.data.n_users, 2)  # one positive and one negative per user
        np.testing.assert_array_equal(pairs[:, 0], split.view(which).targets)
        again = RelevanceEvaluator(split, seed=3, cache_dir=None).pairs(which)  # drawn afresh, not read back
        np.testing.assert_array_equal(pairs, again)
        assert not np.array_equal(pairs, RelevanceEvaluator(split, seed=4).pairs(which))
    assert len(list(tmp_path.glob("negatives-*-pairs-n1-seed3.npy"))) == 2  # stored beside the data, per split
    assert not np.array_equal(first.pairs("valid")[:, 1], first.pairs("test")[:, 1])


def test_no_item_of_the_users_sequence_is_a_negative(split):
    evaluator = RelevanceEvaluator(split, seed=0)
    for which in ("valid", "test"):
        negatives = evaluator.pairs(which)[:, 1]
        assert negatives.min() >= 1 and negatives.max() <= split.n_items
        for user, negative in enumerate(negatives):
            assert negative not in split.data.sequence(user)


# --------------------------------------------------------------------------------------------------- metrics

def test_auc_counts_ties_as_half_and_log_loss_by_hand():
    labels = np.array([1, 1, 0, 0])
    scores = np.array([0.8, 0.5, 0.5, 0.2])
    # (positive, negative) pairs: 0.8>0.5, 0.8>0.2, 0.5=0.5 (½), 0.5>0.2  ->  3.5 / 4
    assert roc_auc(labels, scores) == pytest.approx(0.875)
    assert roc_auc(labels, np.full(4, 0.3)) == 0.5
    assert log_loss(np.array([1, 0]), np.array([0.8, 0.4])) == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2)
    assert log_loss(np.array([0]), np.array([1.0])) == pytest.approx(-math.log(1e-7), rel=1e-6)  # clipped, finite
    assert accuracy(np.array([1, 0, 1, 0]), np.array([0.5, 0.49, 0.2, 0.9])) == 0.5  # p >= 0.5 means "relevant"
    with pytest.raises(ValueError, match="positive and negative"):
        roc_auc(np.array([1, 1]), np.array([0.1, 0.2]))


def test_random_predictor_scores_one_half_and_oracle_one(split):
    evaluator = RelevanceEvaluator(split, seed=0)
    generator = torch.Generator().manual_seed(0)
    random = evaluator.evaluate(Scripted(lambda u, c: torch.rand(c.shape, generator=generator)), "test", "random")
    assert random.metrics["AUC"] == pytest.approx(0.5, abs=0.06)
    assert random.metrics["accuracy"] == pytest.approx(0.5, abs=0.06)
    constant = evaluator.evaluate(Scripted(lambda u, c: torch.full(c.shape, 0.7)), "test", "constant")
    assert constant.metrics["AUC"] == 0.5 and constant.metrics["accuracy"] == 0.5
    targets = torch.from_numpy(split.test().targets)
    oracle = evaluator.evaluate(Scripted(lambda u, c: (c == targets[u][:, None]).double()), "test", "oracle")
    assert oracle.metrics["AUC"] == 1.0 and oracle.metrics["accuracy"] == 1.0
    assert oracle.metrics["log_loss"] == pytest.approx(-math.log(1 - 1e-7))


def test_bad_probabilities_and_uncalibrated_rankers_are_explained(split):
    evaluator = RelevanceEvaluator(split, seed=0)
    with pytest.raises(ScoreError, match="'broken' on dataset 'synthetic'.*NaN"):
        evaluator.evaluate(Scripted(lambda u, c: torch.full(c.shape, math.nan)), "valid", "broken")
    with pytest.raises(ScoreError, match="outside \\[0, 1\\]"):
        evaluator.evaluate(Scripted(lambda u, c: torch.full(c.shape, 2.0)), "valid", "logits")
    with pytest.raises(ScoreError, match="shape"):
        evaluator.evaluate(Scripted(lambda u, c: torch.zeros(len(c))), "valid", "flat")
    with pytest.raises(TypeError, match="calibrate"):
        evaluator.evaluate(Pop(split.data.n_users, split.n_items), "valid", "pop")


# ----------------------------------------------------------------------------------------------- calibration

def test_platt_scaling_recovers_a_known_sigmoid():
    rng = np.random.default_rng(0)
    scores = rng.normal(3.0, 2.0, size=20_000)
    labels = (rng.random(len(scores)) < 1 / (1 + np.exp(-(1.5 * scores - 4.0)))).astype(int)
    platt = PlattScaling.fit(scores, labels)
    assert platt.slope == pytest.approx(1.5, rel=0.05) and platt.intercept == pytest.approx(-4.0, rel=0.05)
    separable = PlattScaling.fit(np.array([0.0, 1.0, 2.0, 3.0]), np.array([0, 0, 1, 1]))
    assert math.isfinite(separable.slope) and separable.slope > 0  # Platt's smoothed targets keep it finite


class ValidationOnly(RelevanceEvaluator):
    """Refuses to show anything of the test split."""

    def view(self, split):
        assert split == "valid", "calibration looked at the test split"
        return super().view(split)


def test_calibration_is_fitted_on_validation_pairs_only(split):
    pop = Pop(split.data.n_users, split.n_items)
    pop.fit(split.train())
    calibrated = calibrate(pop, ValidationOnly(split, seed=0), "pop")  # would fail on any look at the test split
    again = calibrate(pop, RelevanceEvaluator(split, seed=0), "pop")
    assert calibrated.platt == again.platt
    evaluator = RelevanceEvaluator(split, seed=0)
    scores = evaluator.scores(pop, "valid", "pop")
    assert calibrated.platt == PlattScaling.fit(scores, np.broadcast_to(PAIR_LABELS, scores.shape))
    test = evaluator.evaluate(calibrated, "test", "pop")
    assert test.metrics["AUC"] > 0.6  # popularity separates targets from uniform negatives
    p = calibrated.predict_proba(torch.arange(3), torch.zeros(3, 1, dtype=torch.long), torch.tensor([1, 2, 3]))
    assert p.shape == (3,) and bool(((p > 0) & (p < 1)).all())


# ---------------------------------------------------------------------------------------------------- models

SMALL = {
    "lstm-rel": (dict(hidden=32, max_len=30), dict(lr=1e-2, batch_size=32, max_epochs=8)),
    "bert4rec-rel": (dict(hidden=32, max_len=30, heads=2, dropout=0.1, attention_dropout=0.1),
                     dict(lr=3e-3, batch_size=64, max_epochs=15, warmup_steps=0)),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_relevance_models_learn_and_give_the_sigmoid_of_their_scores(split, name):
    cls = model_class(name)
    torch.manual_seed(0)
    model = cls(split.data.n_users, split.n_items, cls.Config(**SMALL[name][0]))
    evaluator = RelevanceEvaluator(split, seed=0)
    settings = TrainSettings(**SMALL[name][1], valid_metric="AUC", patience=100)
    fit = Trainer(settings, TrainRun(seed=0, progress=False)).fit(
        model, split.train(), lambda current: evaluator.evaluate(current, "valid", name).metrics)
    assert "valid_AUC" in fit.curve[0]
    result = evaluator.evaluate(model, "test", name)
    assert result.metrics["AUC"] > 0.7 and result.metrics["accuracy"] > 0.6, result.metrics

    # The probabilities are σ of the logits that rank (shapes, single candidates and padding: the battery of
    # benchmarks.check_model, tests/test_check_model.py).
    model.eval()
    view = split.test()
    rows = np.arange(16)
    users = torch.from_numpy(view.users[rows])
    histories = torch.from_numpy(view.padded(rows, model.history_length))
    candidates = torch.from_numpy(evaluator.pairs("test")[rows])
    with torch.inference_mode():
        both = model.predict_proba(users, histories, candidates)
        logits = model.score(users, histories, candidates)
    torch.testing.assert_close(torch.sigmoid(logits.double()), both)


@pytest.mark.parametrize("name", list(SMALL))
def test_training_examples_hold_only_training_items(split, name):
    cls = model_class(name)
    model = cls(split.data.n_users, split.n_items, cls.Config(**SMALL[name][0]))
    examples = model.training_examples(split.train())
    windows = examples["windows"] if "windows" in examples else examples["items"]
    train = split.train()
    for user, window in zip(examples["users"].numpy(), windows.numpy()):
        assert set(window[window != 0]) <= set(train.items[train.offsets[user]:train.offsets[user + 1]])


# ---------------------------------------------------------------------------------------------- end to end

def test_run_all_relevance_writes_schema_rows_the_report_renders(tmp_path, capsys):
    output = tmp_path / "out"
    argv = ["--task", "relevance", "--datasets", "synthetic", "--models", "pop", "lstm-rel", "--output", str(output),
            "--cache-dir", str(tmp_path / "cache"), "--device", "cpu", "--quiet", "--no-report",
            "--set", "lstm-rel:max_epochs=2"]
    assert run_all.main(argv) == 0
    rows = read_results(output / "results.jsonl")
    assert [row["run_id"] for row in rows] == ["synthetic/pop/relevance/seed0", "synthetic/lstm-rel/relevance/seed0"]
    for row in rows:
        assert SCHEMA_KEYS <= set(row)
        assert (row["task"], row["protocol"], row["split"]) == ("relevance", "pairs", "test")
        assert set(row["metrics"]) == {"accuracy", "AUC", "log_loss"}
        assert row["users_evaluated"] == row["dataset_info"]["stats"]["users"]
        with np.load(output / row["per_user_file"]) as stored:
            assert stored["probabilities"].shape == stored["labels"].shape == (row["users_evaluated"], 2)
            again = relevance_metrics(stored["labels"], stored["probabilities"])
        assert again == pytest.approx(row["metrics"])
    pop, lstm = rows
    assert pop["calibration"]["method"] == "platt" and pop["calibration"]["fitted_on"] == "valid"
    assert lstm["calibration"] is None and lstm["valid_metric"] == "AUC on pairs" and lstm["epochs_run"] == 2

    table = relevance_table(load_results(output), "pairs")
    assert [[cell.text for cell in line[:2]] for line in table.rows] == [["synthetic", "POP"],
                                                                         ["synthetic", "LSTM (relevance)"]]
    assert run_all.main(argv + ["--resume"]) == 0
    assert capsys.readouterr().out.count("already in results.jsonl") == 2


def test_relevance_task_refuses_ranking_protocols(capsys):
    with pytest.raises(SystemExit):
        run_all.parse_args(["--task", "relevance", "--protocols", "full"])
    assert "--protocols applies to --task next-item" in capsys.readouterr().err


def test_the_default_output_folder_names_the_datasets_task_profile_and_split():
    for argv, folder in ((["--datasets", "ml-1m", "beauty"], "results/ml-1m-beauty-smoke"),
                         (["--task", "relevance", "--profile", "converge"], "results/ml-1m-relevance-converge"),
                         (["--split", "temporal", "--profile", "converge"], "results/ml-1m-converge-temporal")):
        assert run_all.parse_args(["--datasets", "ml-1m", *argv]).output == folder
