"""The shared trainer: early stopping, best-weight restore, seeds and resume after an interruption."""
import numpy as np
import pytest
import torch

from benchmarks.trainer import Trainer, TrainSettings, resolve_device
from datasets.sequences import LeaveOneOutSplit, SequenceData
from models.bprmf import BPRMF, BPRMFConfig


def toy_split(seed=0) -> LeaveOneOutSplit:
    rng = np.random.default_rng(seed)
    sequences = [rng.choice(np.arange(1, 61), size=10, replace=False) for _ in range(40)]
    return LeaveOneOutSplit(SequenceData.from_sequences("toy", sequences, n_items=60))


def new_model(seed=0) -> BPRMF:
    torch.manual_seed(seed)
    return BPRMF(40, 60, BPRMFConfig(hidden=8))


def settings(**changes) -> TrainSettings:
    base = dict(lr=0.05, batch_size=64, max_epochs=6, patience=2, progress=False, seed=1)
    base.update(changes)
    return TrainSettings(**base)


def scripted_validator(values):
    calls = iter(values)
    snapshots = []

    def validate(model):
        snapshots.append(model.item_factors.weight.detach().clone())
        return {"NDCG@10": next(calls)}

    return validate, snapshots


def test_early_stopping_keeps_the_best_weights():
    model = new_model()
    validate, snapshots = scripted_validator([0.1, 0.3, 0.2, 0.25, 0.9])
    report = Trainer(settings()).fit(model, toy_split().train(), validate)
    assert report["epochs_run"] == 4  # two validations without improvement after epoch 2
    assert report["best_epoch"] == 2 and report["best_valid"] == pytest.approx(0.3)
    assert torch.equal(model.item_factors.weight, snapshots[1])
    assert [row["epoch"] for row in report["curve"]] == [1, 2, 3, 4]
    assert report["curve"][1]["valid_NDCG@10"] == pytest.approx(0.3)


def test_same_seed_same_weights_on_cpu():
    split = toy_split()
    first, second = new_model(), new_model()
    Trainer(settings(max_epochs=3)).fit(first, split.train(), None)
    Trainer(settings(max_epochs=3)).fit(second, split.train(), None)
    assert torch.equal(first.item_factors.weight, second.item_factors.weight)
    third = new_model()
    Trainer(settings(max_epochs=3, seed=2)).fit(third, split.train(), None)
    assert not torch.equal(first.item_factors.weight, third.item_factors.weight)


def test_interrupted_run_resumes_to_the_same_result(tmp_path):
    split = toy_split()
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    reference = new_model()
    Trainer(settings()).fit(reference, split.train(), scripted_validator(values)[0])

    checkpoint = tmp_path / "run.pt"
    calls = {"n": 0}

    def crash_at_epoch_4(model):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return {"NDCG@10": values[calls["n"] - 1]}

    interrupted = new_model()
    with pytest.raises(KeyboardInterrupt):
        Trainer(settings(checkpoint=str(checkpoint))).fit(interrupted, split.train(), crash_at_epoch_4)
    assert checkpoint.exists()

    resumed = new_model(seed=123)  # different init: everything must come from the checkpoint
    report = Trainer(settings(checkpoint=str(checkpoint))).fit(resumed, split.train(), scripted_validator(values[3:])[0])
    assert report["epochs_run"] == 6
    assert torch.equal(resumed.item_factors.weight, reference.item_factors.weight)

    # A finished checkpoint just restores the best weights: no more training.
    again = new_model(seed=5)
    report = Trainer(settings(checkpoint=str(checkpoint))).fit(again, split.train(), None)
    assert report["epochs_run"] == 6
    assert torch.equal(again.item_factors.weight, reference.item_factors.weight)


def test_time_budget_stops_training():
    model = new_model()
    report = Trainer(settings(max_epochs=10_000, time_budget_s=0.5)).fit(model, toy_split().train(), None)
    assert report["epochs_run"] < 10_000
    assert report["train_seconds"] < 5


def test_bad_settings_and_devices_are_explained():
    with pytest.raises(ValueError, match="optimizer must be"):
        TrainSettings(optimizer="rmsprop")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            resolve_device("cuda")


def test_diverging_loss_is_reported():
    model = new_model()
    with torch.no_grad():
        model.user_factors.weight[0] = float("nan")
    with pytest.raises(FloatingPointError, match="lower the learning rate"):
        Trainer(settings()).fit(model, toy_split().train(), None)
