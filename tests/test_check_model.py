"""The interface battery (``benchmarks.check_model``): every registered model passes it, and each kind of broken
model fails the check that concerns it, with a message that says what to fix. The battery replaces the hand-kept
lists of models whose shapes, candidate scores, batching, padding and training examples the tests checked."""
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from recbench.benchmarks.commands import check_model as battery
from recbench.benchmarks.commands.check_model import FAILED, ModelCheckError, check_model
from recbench.benchmarks.config import resolve
from recbench.datasets import PAPER_DATASETS
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.models import model_class, model_name_of, model_names
from recbench.models.base import NeuralRecommender, gather_candidates
from tests.helpers import PADDING_SENSITIVE_MODEL, ROOT, write_package

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", model_names())
def test_every_registered_model_passes_the_battery(name):
    results = check_model(name)  # raises ModelCheckError naming each failure
    assert {result.check for result in results} >= {"interface", "settings", "test item", "shapes", "candidates",
                                                    "batch", "padding", "relevance"}
    ran = {result.check for result in results if result.status != "skipped"}
    assert "checkpoint" in ran or not issubclass(model_class(name), NeuralRecommender)


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


@pytest.mark.parametrize("cls, check, words", [
    (PaddingCounts, "padding", "left padding"),
    (CandidatesApart, "candidates", "gather_candidates"),
    (BatchNormalised, "batch", "other users of the batch"),
    (StateOutsideTheStateDict, "checkpoint", "register_buffer"),
    (UnreadableSettings, "settings", "annotate each Config field"),
    (WrongShape, "shapes", "column 0 (padding) included"),
    (NotAModel, "interface", "derive it from recbench.models.base.NeuralRecommender"),
])
def test_a_broken_model_fails_the_check_that_concerns_it(cls, check, words):
    with pytest.raises(ModelCheckError) as raised:
        check_model(cls)
    failed = {result.check: result.message for result in raised.value.results if result.status == FAILED}
    assert set(failed) == {check}, failed
    assert words in failed[check] and words in str(raised.value)


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
    bench = battery._bench(model_name_of(Sound))
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
