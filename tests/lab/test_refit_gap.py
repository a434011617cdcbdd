"""The refit measurement (benchmarks/experiments/refit_gap.py): the refit trains on ``s[:-1]`` (the validation item
included, the test item never) for the protocol run's selected epochs, a finished protocol row is reused only
when its settings are the ones resolved, and the refit resumes from its checkpoint."""
import json

import numpy as np
import pytest

import run_all
from benchmarks.experiments import refit_gap
from recbench.benchmarks import trainer
from recbench.datasets import load_dataset
from recbench.datasets.sequences import LeaveOneOutSplit

pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = ["--profile", "smoke", "--set", "bprmf:max_epochs=3", "--set", "bprmf:patience=1",
            "--set", "time_budget_s=none"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """BPR-MF on the synthetic data under the protocol, two seeds, as run_all.py writes it."""
    folder = tmp_path_factory.mktemp("protocol")
    assert run_all.main(["--models", "bprmf", "--seeds", "0", "1", *SETTINGS, "--quiet", "--no-report",
                         "--output", str(folder), "--cache-dir", str(folder / "cache")]) == 0
    return folder


def test_the_refit_trains_on_the_validation_item_for_the_selected_epochs(finished, tmp_path, monkeypatch):
    seen = []
    fit = trainer.Trainer.fit

    def recording_fit(self, model, train, validate):
        seen.append((train, validate, self.settings.max_epochs))
        return fit(self, model, train, validate)

    monkeypatch.setattr(trainer.Trainer, "fit", recording_fit)
    assert refit_gap.main(["--dataset", "synthetic", "--models", "bprmf", *SETTINGS, "--seeds", "0", "1",
                           "--protocol-results", str(finished / "results.jsonl"), "--cache-dir",
                           str(finished / "cache"), "--checkpoint-dir", str(tmp_path / "checkpoints"),
                           "--output", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "refit-gap-synthetic-smoke-bprmf.json").read_text())
    assert report["seeds"] == [0, 1] and [row["seed"] for row in report["rows"]] == [0, 1]
    rows = [json.loads(line) for line in (finished / "results.jsonl").read_text().splitlines()]
    assert len(seen) == 2  # two training runs, the refits, with nothing to validate on
    for row, (train, validate, epochs) in zip(report["rows"], seen):
        pop100 = next(r for r in rows if r["protocol"] == "pop100" and r["seed"] == row["seed"])
        assert row["protocol_run"]["best_epoch"] == pop100["best_epoch"]  # this seed's row, reused, not retrained
        assert row["protocol_run"]["metrics"]["pop100"] == pop100["metrics"]
        assert validate is None and epochs == pop100["best_epoch"] == row["refit_on_s[:-1]"]["epochs_run"]
    data = load_dataset("synthetic", cache_dir=finished / "cache")
    valid = LeaveOneOutSplit(data).valid()
    assert len(train) == len(valid) > 100
    for row_id in (0, 7, len(train) - 1):
        user = train.users[row_id]
        trained = train.items[train.offsets[row_id]:train.offsets[row_id + 1]]
        sequence = data.items[data.offsets[user]:data.offsets[user + 1]]
        assert np.array_equal(trained, sequence[:-1])  # the validation item is in, the test item is not
        assert valid.users[row_id] == user and trained[-1] == valid.targets[row_id]
    for seed in (0, 1):
        assert (tmp_path / "checkpoints" / f"synthetic__bprmf__seed{seed}__smoke__refit.pt").exists()


def test_a_row_trained_with_other_settings_is_refused_in_one_line(finished, tmp_path):
    with pytest.raises(SystemExit) as error:
        refit_gap.main(["--dataset", "synthetic", "--models", "bprmf", *SETTINGS, "--set", "bprmf:lr=0.5",
                        "--protocol-results", str(finished / "results.jsonl"), "--cache-dir",
                        str(finished / "cache"), "--output", str(tmp_path)])
    message = str(error.value)
    assert "differs from --profile smoke and --set in lr;" in message and "\n" not in message
    with pytest.raises(SystemExit, match="no ncf row of synthetic, seed 0, under pop100, full"):
        refit_gap.main(["--dataset", "synthetic", "--models", "ncf", "--protocol-results",
                        str(finished / "results.jsonl"), "--cache-dir", str(finished / "cache")])
