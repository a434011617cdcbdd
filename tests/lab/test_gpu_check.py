"""``python -m benchmarks.experiments.gpu_check`` rehearsed on the CPU with a tiny budget, as it runs on a GPU
machine: every piece, one archive holding what was written, a partial archive when the time runs out, and no
optional package (Optuna, Dask) that the device image lacks."""
import json
import sys
import tarfile
import time

import pytest

from benchmarks.experiments import gpu_check

REHEARSAL = ["--device", "cpu", "--speed-dataset", "synthetic", "--speed-batches", "1", "--ranking-datasets",
             "synthetic", "--train-dataset", "synthetic", "--set", "hidden=16", "--set", "max_len=20",
             "--set", "window_step=1.0", "--set", "batch_size=64", "--set", "valid_users=200"]
MINUTES = 3.0  # far more than the rehearsal needs: one epoch of BERT4Rec (max_epochs=1) ends it


@pytest.fixture
def bare_device(monkeypatch, tmp_path):
    """A data folder with nothing in it (the rehearsal's datasets are generated) and no Optuna or Dask: on the
    device neither is installed, so importing one fails the test."""
    for name in ("optuna", "dask", "dask.distributed"):
        monkeypatch.setitem(sys.modules, name, None)
    (tmp_path / "data").mkdir()
    return tmp_path


def archive_names(out) -> set[str]:
    with tarfile.open(out / "gpu_check.tar.gz") as archive:
        return set(archive.getnames())


def test_a_cpu_rehearsal_runs_every_piece_and_leaves_one_archive(bare_device):
    out = bare_device / "out"
    status = gpu_check.main(["--data-dir", str(bare_device / "data"), "--out", str(out), "--minutes", str(MINUTES),
                             *REHEARSAL, "--set", "max_epochs=1"])
    summary = json.loads((out / "gpu_check.json").read_text())
    assert status == 0, summary.get("stopped")
    pieces = summary["pieces"]
    assert pieces["tests"]["exit_status"] in (0, 5)  # every CUDA test skipped on the CPU (5: none collected)
    for model in gpu_check.SPEED_MODELS:
        for precision in gpu_check.PRECISIONS:
            speed = pieces["speed"][f"{model} {precision}"]
            assert speed["steps_per_s"] > 0 and speed["epoch_seconds"] > 0, (model, precision)
            assert speed["precision_used"] in ("fp32", precision)  # bf16 only where the CPU has it natively
    assert pieces["ranking"]["synthetic"]["seconds"] > 0
    rows = pieces["bert4rec"]
    assert set(rows) == {"full", "pop100", "precision_chosen", "why"}
    assert rows["full"]["precision"] == rows["precision_chosen"]  # trained in the precision it chose
    assert rows["full"]["stopped_by"] == "max epochs"  # the rehearsal's; on a GPU early stopping or the time left
    assert 0 < rows["full"]["time_budget_s"] < MINUTES * 60  # training gets what the other pieces left
    assert rows["full"]["precision"] in ("fp32", "bf16") and rows["full"]["device"].startswith("cpu")
    # Every target is stated with its figure, or as not measured (the rehearsal ranks no ML-1m)
    assert set(summary["targets"]) == set(gpu_check.TARGETS)
    assert summary["targets"]["full ranking seconds ml-1m"]["verdict"] == "not measured"
    assert summary["targets"]["sasrec-ce ml-1m epoch seconds (bf16)"]["value"] is not None
    names = archive_names(out)
    assert {"gpu_check/gpu_check.json", "gpu_check/pytest.txt", "gpu_check/bert4rec/results.jsonl"} <= names
    assert not any(name.endswith(".pt") for name in names)  # checkpoints stay out of the archive


def test_bert4rec_trains_in_the_precision_measured_faster():
    def speed(fp32, bf16, bf16_used="bf16"):
        return {"bert4rec fp32": {"precision_used": "fp32", "steps_per_s": fp32},
                "bert4rec bf16": {"precision_used": bf16_used, "steps_per_s": bf16}}

    assert gpu_check.faster_precision(speed(104.77, 61.06)) == (
        "fp32", "steps/s measured: fp32 104.77, bf16 61.06")  # the first H100's figures
    assert gpu_check.faster_precision(speed(50.0, 80.0))[0] == "bf16"
    assert gpu_check.faster_precision(speed(50.0, 50.0))[0] == "bf16"  # a tie keeps the bf16
    assert gpu_check.faster_precision(speed(50.0, 80.0, bf16_used="fp32")) == (
        "fp32", "bf16 is not native on this device")
    assert gpu_check.faster_precision({"bert4rec fp32": {"skipped": "3 s left"}})[0] == "bf16"
    assert gpu_check.faster_precision({})[0] == "bf16"


def test_when_the_time_runs_out_the_archive_holds_what_was_done(bare_device, monkeypatch):
    out = bare_device / "out"
    slow = gpu_check.training_speed

    def slow_speed(*args):  # the second measurement never ends: the command's time runs out in it
        if (out / "gpu_check.json").exists() and "speed" in json.loads((out / "gpu_check.json").read_text())[
                "pieces"]:
            time.sleep(3600)
        return slow(*args)

    monkeypatch.setattr(gpu_check, "training_speed", slow_speed)
    status = gpu_check.main(["--data-dir", str(bare_device / "data"), "--out", str(out), "--minutes", "0.5",
                             "--skip", "tests", *REHEARSAL])
    summary = json.loads((out / "gpu_check.json").read_text())
    assert status == 3 and summary["stopped"] == "time up"
    assert list(summary["pieces"]["speed"]) == ["sasrec fp32"]  # the one finished measurement
    assert summary["pieces"]["end"] == {"status": 3} and "gpu_check/gpu_check.json" in archive_names(out)
    assert summary["seconds"] <= 30.0
