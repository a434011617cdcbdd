"""``benchmarks.experiments.gpu_check`` on the CPU with tiny settings: a run split over two invocations skips
what the first one finished and resumes its interrupted training from the checkpoint instead of restarting."""
import json
from pathlib import Path

import torch

from recbench.benchmarks.experiments import gpu_check


def latest_epoch(folder: Path) -> int:
    epochs = [torch.load(path, map_location="cpu", weights_only=False)["state"]["epoch"]
              for path in folder.rglob("*.pt")]
    return max(epochs, default=0)


def test_two_short_invocations_resume_rather_than_restart(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    argv = ["--out", str(out), "--device", "cpu", "--cache-dir", str(tmp_path / "cache"),
            "--speed-datasets", "synthetic", "--speed-models", "sasrec-ce", "--speed-batches", "1",
            "--train-datasets", "synthetic", "--train-minutes", "synthetic=1000", "--threads", "1",
            "--set", "hidden=16", "--set", "max_len=20", "--set", "dupe_factor=0", "--set", "max_epochs=6",
            "--set", "patience=100", "--set", "warmup_steps=0", "--set", "valid_users=200"]

    # First invocation: its time runs out (the clock is replaced) once training has checkpointed an epoch.
    monkeypatch.setattr(gpu_check.Deadline, "passed", lambda self: latest_epoch(out / "bert4rec") >= 1)
    assert gpu_check.main(argv) == gpu_check.MORE_WORK
    first_log = capsys.readouterr().out
    assert "interrupted at the time limit" in first_log
    paused_at = latest_epoch(out / "bert4rec")
    assert 1 <= paused_at < 6
    checkpoint = next((out / "bert4rec").rglob("*.pt"))
    history = torch.load(checkpoint, map_location="cpu", weights_only=False)["state"]["history"]
    tests_summary, speed_file = out / "tests" / "summary.json", out / "speed" / "synthetic__sasrec-ce.json"
    assert json.loads(tests_summary.read_text())["exit_status"] == 0  # the cuda tests, skipped on the CPU
    stamps = tests_summary.stat().st_mtime_ns, speed_file.stat().st_mtime_ns
    assert not json.loads((out / "gpu_check.json").read_text())["finished"]

    # Second invocation, with the real clock: nothing done is redone, training goes on from the checkpoint.
    monkeypatch.undo()
    assert gpu_check.main(argv) == 0
    second_log = capsys.readouterr().out
    assert "tests:" not in second_log and "speed: sasrec-ce" not in second_log
    assert (tests_summary.stat().st_mtime_ns, speed_file.stat().st_mtime_ns) == stamps
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["finished"] and summary["environment"]["torch"] == torch.__version__
    curve = summary["bert4rec"]["synthetic"]["curve"]
    assert [row["epoch"] for row in curve] == list(range(1, 7))
    assert curve[:len(history)] == history  # the first epochs' records, timings included, were kept, not redone
    assert summary["speed"]["synthetic__sasrec-ce"]["train_steps_per_s"] > 0
