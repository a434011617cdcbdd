"""The interface battery (``benchmarks.check_model``): every registered model and the README's models of one's own
pass it and then run in a one-job grid; each kind of broken model fails the check that concerns it, with one line
that says what to fix (issue 29: a fitted model whose ``fit`` returned a dict passed and then failed its grid job; a
model reading the held-out target, or one whose scores depend on the batch above 64 users, passed). The battery
replaces the hand-kept lists of models whose shapes, candidate scores, batching, padding and training examples the
tests checked."""
import gc
import inspect
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from recbench.benchmarks.commands import check_model as battery
from recbench.benchmarks.commands.check_model import FAILED, ModelCheckError, check_model
from recbench.benchmarks.config import resolve
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.jobs import Job
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.store import implausible
from recbench.datasets import PAPER_DATASETS, generate
from recbench.datasets.sequences import LeaveOneOutSplit, SequenceData
from recbench.models import model_class, model_name_of, model_names
from recbench.models.base import FitReport, NeuralRecommender, Recommender, gather_candidates
from tests.helpers import PADDING_SENSITIVE_MODEL, ROOT, readme_blocks, write_package

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def readme_models(tmp_path_factory) -> dict[str, str]:
    """The README's models of one's own ("Bring your own model"), saved as it says into a package named afresh (a
    process imports a module once): README file name -> import path."""
    package = f"readme_{uuid.uuid4().hex[:8]}"
    files = {Path(target).name: body for _, body, target in readme_blocks("Bring your own model") if target}
    root = tmp_path_factory.mktemp("readme")
    write_package(root, package, files)
    sys.path.insert(0, str(root))
    yield {name: f"{package}.{name.removesuffix('.py')}:{_defined_model(body)}"
           for name, body in files.items() if name.endswith(".py")}
    sys.path.remove(str(root))


def _defined_model(source: str) -> str:
    """The name of the model class a README block defines."""
    return next(line.split()[1].split("(")[0] for line in source.splitlines()
                if line.startswith("class ") and "Recommender)" in line)


@pytest.mark.parametrize("name", [*model_names(), "README:mymodel.py", "README:itemknn.py"])
def test_every_model_that_passes_the_battery_runs_in_a_one_job_grid(name, readme_models, tmp_path):
    """Every registered model and the README's own: the battery, then the grid the battery promises it runs in
    (tiny synthetic data, the smoke profile, both test protocols)."""
    name = readme_models[name.removeprefix("README:")] if name.startswith("README:") else name
    results = check_model(name)  # raises ModelCheckError naming each failure
    assert {result.check for result in results} >= {"interface", "settings", "test item", "shapes", "candidates",
                                                    "batch", "padding", "relevance"}
    ran = {result.check for result in results if result.status != "skipped"}
    assert "checkpoint" in ran or not issubclass(model_class(name), NeuralRecommender)
    options = RunOptions(output=tmp_path / "out", profile="smoke", cache_dir=tmp_path / "cache", device="cpu",
                         progress=False)
    grid = run_jobs([Job("tiny", name, 0, overrides=_short(name))], options,
                    preloaded={"tiny": generate(120, 300, 8.0, seed=1, name="tiny")}, log=lambda *_: None)
    assert not grid.failed, grid.failed[0].error
    assert sorted(row["protocol"] for row in grid.rows) == ["full", "pop100"]
    assert all(np.isfinite(list(row["metrics"].values())).all() for row in grid.rows)


def _short(name: str) -> tuple:
    """Smoke-sized training on the tiny data: at most 3 epochs (no setting for a model that does not train)."""
    return (f"{name}:max_epochs=3",) if issubclass(model_class(name), NeuralRecommender) else ()


@pytest.mark.parametrize("name", model_names())
def test_every_registered_model_is_named_as_registered_and_its_paper_profile_resolves(name):
    assert model_class(name).name == name
    for dataset in (*PAPER_DATASETS, "synthetic"):
        resolve(name, dataset, "paper")


# ------------------------------------------------------------------------------------------- broken models

@dataclass
class SmallConfig:
    hidden: int = 8


class Sound(NeuralRecommender):
    """Mean of the history's embeddings, padding masked: passes every check."""

    Config = SmallConfig

    def __init__(self, n_users, n_items, config):
        super().__init__(n_users, n_items, config)
        self.items = nn.Embedding(n_items + 1, config.hidden, padding_idx=0)

    @property
    def history_length(self):
        return 3

    def query(self, histories):
        real = (histories > 0).float().unsqueeze(-1)
        return (self.items(histories) * real).sum(1) / real.sum(1).clamp(min=1)

    def training_examples(self, train):
        items = torch.from_numpy(train.items)
        return {"history": torch.stack([torch.zeros_like(items), torch.zeros_like(items), items], 1)[:-1],
                "target": items[1:]}

    def loss(self, batch, generator):
        return F.cross_entropy(self.query(batch["history"]) @ self.items.weight.T, batch["target"])

    def score(self, users, histories, candidates):
        return gather_candidates(self.query(histories) @ self.items.weight.T, candidates)


class PaddingCounts(Sound):
    def query(self, histories):
        return self.items(histories).sum(1) + (histories == 0).sum(1, keepdim=True)  # padding adds up


class CandidatesApart(Sound):
    def score(self, users, histories, candidates):
        full = self.query(histories) @ self.items.weight.T
        return full if candidates is None else full.gather(1, candidates) * 2


class BatchNormalised(Sound):
    def score(self, users, histories, candidates):
        full = self.query(histories) @ self.items.weight.T
        return gather_candidates(full - full.mean(0), candidates)  # depends on the other users


class StateOutsideTheStateDict(Sound):
    """Learns a scale in a plain attribute, which no checkpoint keeps."""

    def loss(self, batch, generator):
        self.scale = getattr(self, "scale", 1.0) + 1.0
        return super().loss(batch, generator)

    def score(self, users, histories, candidates):
        return super().score(users, histories, candidates) * getattr(self, "scale", 1.0)


@dataclass
class ListConfig:
    sizes: list = None  # not a type --set can read


class UnreadableSettings(Sound):
    Config = ListConfig

    def __init__(self, n_users, n_items, config):
        super().__init__(n_users, n_items, SmallConfig())
        self.config = config


class WrongShape(Sound):
    def score(self, users, histories, candidates):
        return super().score(users, histories, candidates)[:, 1:]  # forgets column 0


class NotAModel:
    Config = SmallConfig


class ReadsTheTarget(Sound):
    """Looks up the evaluator's held-out targets while it scores (in its callers' frames) and ranks them first."""

    def score(self, users, histories, candidates):
        full = self.query(histories) @ self.items.weight.T
        frame = inspect.currentframe().f_back
        while frame is not None and not isinstance(frame.f_locals.get("targets"), torch.Tensor):
            frame = frame.f_back
        if frame is not None:
            full = full.clone()
            full[torch.arange(len(full)), frame.f_locals["targets"]] += 100.0
        return gather_candidates(full, candidates)


class FindsTheDataThroughGc(Sound):
    """Issue 70's peeking model: finds the dataset among the objects Python's garbage collector tracks while it
    scores, and ranks each user's real last item first (what it can reach of the held-out items)."""

    def score(self, users, histories, candidates):
        full = self.query(histories) @ self.items.weight.T
        found = [data for data in gc.get_objects() if type(data) is SequenceData and data.n_users > int(users.max())]
        if found:
            data = max(found, key=lambda data: data.n_actions)
            last = torch.from_numpy(data.items)[torch.from_numpy(data.offsets[1:])[users] - 1]
            full = full.clone()
            full[torch.arange(len(full)), last] += 100.0
        return gather_candidates(full, candidates)


class BatchNormalisedAbove64(Sound):
    """Scores relative to the batch's mean, but only in batches of more than 64 users."""

    def score(self, users, histories, candidates):
        full = self.query(histories) @ self.items.weight.T
        return gather_candidates(full - full.mean(0) if len(full) > 64 else full, candidates)


class FitReturnsADict(Recommender):
    """POP whose fit returns a plain dict (the issue's model: the grid failed on 'dict' has no 'settings')."""

    Config = SmallConfig

    def __init__(self, n_users, n_items, config):
        super().__init__(n_users, n_items, config)
        self.counts = torch.zeros(n_items + 1)

    def fit(self, train):
        self.counts = torch.from_numpy(np.bincount(train.items, minlength=self.n_items + 1).astype(np.float32))
        return {"train_seconds": 0.0}

    def score(self, users, histories, candidates):
        return gather_candidates(self.counts.expand(len(users), -1), candidates)


class ExamplesInAList(Sound):
    def training_examples(self, train):
        return list(super().training_examples(train).values())


class ExamplesOfTwoLengths(Sound):
    def training_examples(self, train):
        examples = super().training_examples(train)
        return {**examples, "target": examples["target"][:-1]}


class LossPerExample(Sound):
    def loss(self, batch, generator):
        return F.cross_entropy(self.query(batch["history"]) @ self.items.weight.T, batch["target"], reduction="none")


class FactorsInATuple(Sound):
    def score_factors(self, users, histories):
        return self.query(histories), self.items.weight, None


class ReportOfNumpyIntegers(Sound):
    def training_report(self):
        return {"examples": np.int64(3)}


class AttentionWithoutItems(Sound):
    def attention_weights(self, histories):
        return torch.full((len(histories), 1, 1, 3, 3), 1 / 3)


class FractionalHistoryLength(Sound):
    @property
    def history_length(self):
        return 3.0


@pytest.mark.parametrize("cls, check, words", [
    (PaddingCounts, "padding", "left padding"),
    (CandidatesApart, "candidates", "gather_candidates"),
    (BatchNormalised, "batch", "other users of the batch"),
    (BatchNormalisedAbove64, "batch", "300 users at once against batches of 32 and of one"),
    (ReadsTheTarget, "test item", "change with the item held out, for the same users and histories"),
    (FindsTheDataThroughGc, "test item", "the evaluator's test pass change with the item held out"),
    (StateOutsideTheStateDict, "checkpoint", "register_buffer"),
    (UnreadableSettings, "settings", "annotate each Config field"),
    (WrongShape, "shapes", "column 0 (padding) included"),
    (NotAModel, "interface", "derive it from recbench.models.base.NeuralRecommender"),
    # what the worker's path gets back and cannot use: one line saying what to return
    (FitReturnsADict, "interface", "fit(train) returned a dict; return a FitReport"),
    (ExamplesInAList, "interface", "training_examples(train) returned a list; return a dict of tensors"),
    (ExamplesOfTwoLengths, "interface", "returned tensors of 'history': (2314, 3), 'target': (2313,); return a dict"),
    (LossPerExample, "interface", "returned a torch.float32 tensor of shape (256,); return the batch's loss as a "
                                  "scalar tensor"),
    (FactorsInATuple, "interface", "score_factors(users, histories) returned a tuple of 3 (a torch.float32 tensor of "
                                   "shape (300, 8), a torch.float32 tensor of shape (1001, 8), None); return "
                                   "ScoreFactors(queries (300, d), items (1001, d), bias (1001,) or None)"),
    (ReportOfNumpyIntegers, "interface", "training_report() returned a dict that JSON cannot hold"),
    (AttentionWithoutItems, "interface", "attention_weights(histories) returned a torch.float32 tensor of shape "
                                         "(1, 1, 1, 3, 3); return (items (B, T), weights (B, layers, heads, T, T))"),
    (FractionalHistoryLength, "interface", "history_length returned a float; return an int >= 0"),
])
def test_a_broken_model_fails_the_check_that_concerns_it_in_one_line(cls, check, words):
    with pytest.raises(ModelCheckError) as raised:
        check_model(cls)
    failed = {result.check: result.message for result in raised.value.results if result.status == FAILED}
    assert set(failed) == {check}, failed
    assert words in failed[check] and words in str(raised.value)
    assert "\n" not in failed[check]


def test_the_faults_the_battery_now_catches_change_the_metrics():
    """What passed before (issue 29, issue 70): reading the target, from the evaluator's frames or through the
    garbage collector, gives HR@1 = 1 in the evaluator; scores normalised over batches above 64 users give other
    metrics at the evaluator's batch of 256 than at 32."""
    data, _ = battery.sentinel_data()
    split = LeaveOneOutSplit(data)
    for cls in (ReadsTheTarget, FindsTheDataThroughGc, BatchNormalisedAbove64):
        torch.manual_seed(0)
        model = cls(data.n_users, data.n_items, SmallConfig()).eval()
        by_batch = {size: Evaluator(split, seed=0, batch_size=size).evaluate(model, "test", "full").metrics
                    for size in (32, 256)}
        if cls is not BatchNormalisedAbove64:
            assert by_batch[32]["HR@1"] == by_batch[256]["HR@1"] == 1.0
        else:
            assert by_batch[32]["NDCG@10"] != by_batch[256]["NDCG@10"]


def test_a_class_derived_from_the_checkouts_models_base_is_told_it_is_the_same_file_under_another_name():
    """From the checkout, ``models.base`` is recbench/models/base.py imported again under its folder's name."""
    from models.base import Recommender as Twin  # the same file under the checkout's folder name, on purpose

    class Fitted(Twin):
        Config = SmallConfig

        def fit(self, train):
            return FitReport(train_seconds=0.0)

        def score(self, users, histories, candidates):
            return torch.zeros(len(users), self.n_items + 1)

    with pytest.raises(ModelCheckError) as raised:
        check_model(Fitted)
    (message,) = [result.message for result in raised.value.results if result.status == FAILED]
    assert "derives from models.base.Recommender, and models.base is the suite's models/base.py imported a second " \
           "time under another name" in message
    assert "`from recbench.models.base import NeuralRecommender` (or Recommender)" in message


class GlobalDropout(Sound):
    def loss(self, batch, generator):
        query = F.dropout(self.query(batch["history"]), 0.5, self.training)  # torch's global generator
        return F.cross_entropy(query @ self.items.weight.T, batch["target"])


def test_a_loss_drawing_from_the_global_generator_is_warned_of_with_the_fix():
    """Issue 29: the warning named no fix, although the suite has one for dropout."""
    results = check_model(GlobalDropout, raise_on_failure=False)
    (draws,) = [result for result in results if result.check == "draws"]
    assert draws.status == battery.WARNING and "\n" not in draws.message
    assert "recbench.models.sampling.dropout(x, p, generator) in place of nn.Dropout" in draws.message


def test_a_sound_model_passes_and_the_results_can_be_returned_instead_of_raised():
    results = check_model(Sound, raise_on_failure=False)
    assert not [result for result in results if result.status == FAILED]
    assert [result.check for result in results][0] == "interface"


def test_the_test_item_check_catches_a_split_that_leaks(monkeypatch):
    """Were the training view to hold whole sequences instead of s[:-2], the battery would say so."""
    monkeypatch.setattr(LeaveOneOutSplit, "train", lambda self: self._prefix(0, targets=False))
    with pytest.raises(ModelCheckError) as raised:
        check_model(Sound)
    message = next(result.message for result in raised.value.results if result.check == "test item")
    assert "training_examples(train) returned the test item in 'history'" in message
    assert "training_examples(train) returned the validation item" in message


def test_the_settings_check_fails_when_a_wrong_set_is_accepted(monkeypatch):
    bench, _ = battery._bench(model_name_of(Sound))
    monkeypatch.setattr(battery, "resolve", lambda *args, **kwargs: None)  # a suite that accepted anything
    monkeypatch.setattr(battery, "check_overrides", lambda *args, **kwargs: [])
    assert "--set tests.test_check_model:Sound:no_such_field=1 was accepted" in battery._check_settings(bench)


def test_the_command_exits_1_for_a_model_whose_scores_change_with_padding(tmp_path):
    """(It exits 0 for a sound one, the README's example: tests/test_readme_example.py.)"""
    write_package(tmp_path, "ownpkg", {"padded.py": PADDING_SENSITIVE_MODEL})
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    padded = subprocess.run([sys.executable, "-m", "benchmarks.check_model", "ownpkg.padded:MyRec"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=300)
    assert padded.returncode == 1, padded.stdout + padded.stderr
    failures = [line for line in padded.stdout.splitlines() if "FAIL" in line]
    assert len(failures) == 1 and failures[0].strip().startswith("FAIL  padding: scores change with 7 more columns")


class TablesBuiltInFit(Recommender):
    """Issue 70: a valid fitted model whose ``fit`` builds what ``score`` reads failed, scored before its fit."""

    Config = SmallConfig

    def __init__(self, n_users, n_items, config):
        super().__init__(n_users, n_items, config)
        self.counts = None

    def fit(self, train):
        self.counts = torch.from_numpy(np.bincount(train.items, minlength=self.n_items + 1).astype(np.float32))
        return FitReport(train_seconds=0.0)

    def score(self, users, histories, candidates):
        return gather_candidates(self.counts.expand(len(users), -1), candidates)


class FitsThenFailsToScore(TablesBuiltInFit):
    def score(self, users, histories, candidates):
        return gather_candidates(self.counts.expand(len(users), -1)[:, self.missing], candidates)


def test_a_fitted_model_is_fitted_before_any_check_scores_it():
    results = check_model(TablesBuiltInFit)
    assert {result.check: result.status for result in results}["shapes"] == "passed"


def test_a_failure_that_raised_names_the_method_and_line_and_debug_adds_the_traceback():
    line = inspect.getsourcelines(FitsThenFailsToScore.score)[1] + 1
    with pytest.raises(ModelCheckError) as raised:
        check_model(FitsThenFailsToScore)
    (failure,) = [result for result in raised.value.results if result.status == FAILED]
    assert failure.check == "interface" and "\n" not in failure.message
    assert (f"AttributeError: 'FitsThenFailsToScore' object has no attribute 'missing' (in "
            f"FitsThenFailsToScore.score, test_check_model.py line {line})") in failure.message
    assert "Traceback" not in str(raised.value) and "Traceback (most recent call last)" in failure.traceback
    with pytest.raises(ModelCheckError, match="Traceback"):
        check_model(FitsThenFailsToScore, debug=True)


def test_a_model_no_fresh_process_can_rebuild_is_checked_here_with_a_warning():
    """A class defined in a function pickles by no name: the swapped world is scored in this process, and the
    isolation warning says that the garbage collector's path to the real data stayed open."""
    class Local(Sound):
        pass

    results = {result.check: result for result in check_model(Local, raise_on_failure=False)}
    assert results["test item"].status == "passed"
    assert results["isolation"].status == battery.WARNING and "\n" not in results["isolation"].message
    assert "scored the swapped data in this process, where the real data stays reachable" in \
        results["isolation"].message
    assert check_model(Sound, raise_on_failure=False)[2:4] == [battery.CheckResult("test item", "passed"),
                                                             battery.CheckResult("isolation", "passed")]


def test_the_command_shows_tracebacks_with_debug_only(tmp_path):
    write_package(tmp_path, "ownpkg2", {"broken.py": BROKEN_OWN_MODEL})
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    for debug in (False, True):
        shown = subprocess.run([sys.executable, "-m", "benchmarks.check_model", "ownpkg2.broken:MyRec",
                                *(["--debug"] if debug else [])], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=300)
        assert shown.returncode == 1
        assert "FAIL  interface: ZeroDivisionError: division by zero (in MyRec.score, broken.py line 17)" in \
            shown.stdout, shown.stdout + shown.stderr
        assert ("Traceback (most recent call last)" in shown.stderr) == debug


BROKEN_OWN_MODEL = """\
from dataclasses import dataclass

import torch

from recbench.models.base import FitReport, Recommender


class MyRec(Recommender):
    @dataclass
    class Config:
        pass

    def fit(self, train):
        return FitReport(train_seconds=0.0)

    def score(self, users, histories, candidates):
        return 1 / 0
"""


def test_a_grid_row_with_figures_no_model_learns_draws_one_line_in_the_run_and_the_report(tmp_path, capsys):
    """Issue 70: the gc-peeking model scored HR@1, NDCG@10 and MRR of 1.0000 in bold, without a word. The row
    stays (it is a result), flagged in one line by the run and under the report's title."""
    import run_all

    peeking = model_name_of(FindsTheDataThroughGc)
    code = run_all.main(["--models", "pop", peeking, "--set", f"{peeking}:max_epochs=1", "--output",
                         str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--quiet", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0
    warned = [line for line in out.splitlines() if line.startswith("warning: synthetic/")]
    assert len(warned) == 2 and all("HR@1 1.0000: nearly every user's held-out item ranked first" in line
                                    and "check_model" in line for line in warned)  # full and pop100
    assert not any("synthetic/pop/" in line for line in warned)
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.count("> **Implausible figures.** synthetic/tests.test_check_model:FindsTheDataThroughGc") == 2


def test_a_test_figure_far_above_the_best_validation_is_implausible():
    row = {"protocol": "full", "valid_metric": "NDCG@10 under full", "best_valid": 0.10,
           "metrics": {"HR@1": 0.2, "NDCG@10": 0.31}}
    assert implausible(row).startswith("test NDCG@10 0.3100 against 0.1000 at the best validation: ")
    assert implausible({**row, "metrics": {"HR@1": 0.2, "NDCG@10": 0.19}}) is None  # above, not far
    assert implausible({**row, "protocol": "pop100"}) is None  # validated under another protocol
