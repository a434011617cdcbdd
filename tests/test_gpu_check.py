"""``benchmarks.experiments.gpu_check`` rehearsed on the CPU with tiny settings, as the device tool will run it:
each call on a bare machine, the work carried from one call to the next in one archive under ``$OUT``; its
training plan, its targets, the device limits on what comes back, and its optional imports."""
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from benchmarks.experiments import gpu_carry, gpu_check, gpu_plan
from recbench.benchmarks import provenance
from recbench.reports.published import load_published
from tests.helpers import SHARED_DATA, requires_shared_data

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device", "cpu", "--speed-datasets", "synthetic", "--speed-models", "bert4rec", "--speed-batches", "2",
        "--train-datasets", "synthetic", "--train-minutes", "synthetic=0.1", "--threads", "1",
        "--set", "hidden=16", "--set", "max_len=20", "--set", "window_step=1.0", "--set", "dupe_factor=1",
        "--set", "batch_size=64", "--set", "patience=100", "--set", "warmup_steps=0", "--set", "valid_users=200"]
BLOCKED = ("dask", "optuna")  # optional packages the device image lacks


def latest_epoch(folder: Path) -> int:
    epochs = [torch.load(path, map_location="cpu", weights_only=False)["state"]["epoch"]
              for path in folder.rglob("*.pt")]
    return max(epochs, default=0)


def block_optional_imports(tmp_path: Path, monkeypatch) -> Path:
    """Packages named dask and optuna first on every child process's path: importing one writes its name to the
    returned file and fails, as on the device, where neither is installed."""
    folder, record = tmp_path / "blockers", tmp_path / "optional-imports.txt"
    for name in BLOCKED:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(
            f"with open({str(record)!r}, 'a') as f:\n    f.write('{name}\\n')\n"
            f"raise ImportError('{name} is not installed on the device')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    return record


def test_two_calls_on_bare_machines_carry_the_work_in_one_archive(tmp_path, monkeypatch, capsys):
    imported = block_optional_imports(tmp_path, monkeypatch)
    carry = tmp_path / "checkout" / ".cache" / "gpu-check"
    first, second = tmp_path / "machine-1", tmp_path / "machine-2"

    def argv(machine: Path) -> list[str]:
        return ["--carry", str(carry), "--out", str(machine / "gpu-check"), "--pack-to", str(machine / "OUT"),
                "--cache-dir", str(machine / "cache"), *TINY]

    # Call 1: its time runs out (the clock is replaced) once training has checkpointed an epoch.
    with monkeypatch.context() as patch:
        patch.setattr(gpu_check.Deadline, "passed", lambda self: latest_epoch(first / "gpu-check" / "bert4rec") >= 1)
        assert gpu_check.main(argv(first)) == gpu_check.MORE_WORK
    first_log = capsys.readouterr().out
    assert "interrupted at the time limit" in first_log
    returned = first / "OUT"
    assert sorted(p.name for p in returned.iterdir()) == [gpu_carry.SUMMARY, gpu_carry.ARCHIVE]
    assert gpu_carry.return_problems(returned) == []
    checkpoint = next((first / "gpu-check" / "bert4rec").rglob("*.pt"))
    history = torch.load(checkpoint, map_location="cpu", weights_only=False)["state"]["history"]
    assert 1 <= len(history)
    summary = json.loads((returned / gpu_carry.SUMMARY).read_text())
    assert not summary["finished"] and summary["tests"]["exit_status"] == 0  # the cuda tests, skipped on the CPU
    assert summary["bert4rec"]["synthetic"]["progress"]["state"] == "training unfinished"
    plan = summary["bert4rec"]["synthetic"]["plan"]
    assert plan["budget_from"] == "--train-minutes" and plan["train_budget_s"] == 6.0
    assert plan["authors_max_steps"] == 400_000 and 1 <= plan["max_steps"] < 400_000

    # The lead carries the archive into the next call; the first machine is gone, with its cache.
    carry.mkdir(parents=True)
    shutil.copyfile(returned / gpu_carry.ARCHIVE, carry / gpu_carry.ARCHIVE)
    kept = {name: (first / "gpu-check" / name).read_bytes() for name in
            ("tests/summary.json", "speed/synthetic__bert4rec__fp32.json", "speed/synthetic__bert4rec__bf16.json",
             "plans.json")}
    shutil.rmtree(first)

    # Call 2, a fresh process as on the device: it unpacks, redoes nothing finished, resumes training.
    run = subprocess.run([sys.executable, "-m", "benchmarks.experiments.gpu_check", *argv(second)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "carry: unpacked" in run.stdout and "resuming from" in run.stdout
    assert "tests: " not in run.stdout and "speed: bert4rec" not in run.stdout
    out = second / "gpu-check"
    assert {name: (out / name).read_bytes() for name in kept} == kept
    summary = json.loads((out / gpu_carry.SUMMARY).read_text())
    assert summary["finished"] and len(summary["invocations"]) == 2
    assert set(summary["speed"]) == {"synthetic__bert4rec__fp32", "synthetic__bert4rec__bf16"}
    training = summary["bert4rec"]["synthetic"]
    assert training["curve"][:len(history)] == history  # the first call's epochs were kept, not redone
    assert training["precision"] == "fp32" and training["train_settings"]["max_steps"] == plan["max_steps"]
    assert training["schedule"]["authors_max_steps"] == 400_000 and "why" in training["schedule"]
    assert gpu_carry.return_problems(second / "OUT") == []
    assert not imported.exists()  # no process of either call imported dask or optuna


def test_plan_budget_arithmetic_by_hand():
    # Call 2 of 30 device minutes: call 1 ran 9 min, 2 min overhead per call, 30 s run here, 490 s left here.
    # Spent 9 + 2 * 2 + 0.5 = 13.5; after this call 30 - 13.5 - 8.5 = 8 minutes: one last call of 8 - 2 = 6
    # minutes, losing 60 + 20 s; the test evaluation 30 s: 490 + 360 - 80 - 30 = 740 s.
    seconds, arithmetic = gpu_plan.training_budget_s(30, 2, 9, [9.0], 30, 490, margin_s=20)
    assert seconds == pytest.approx(740) and arithmetic["further_calls"] == 1
    # Call 1 after 6 minutes of tests and speed, 160 s left: 30 - 8 - 3 = 19 minutes after it, one full call of
    # 9 (+2) and one of 6 (+2): 160 + 60 * 15 - 2 * 80 - 30 = 870 s.
    assert gpu_plan.training_budget_s(30, 2, 9, [], 360, 160, margin_s=20)[0] == pytest.approx(870)
    # Nothing left after this call: only what this call has left, less the test evaluation.
    assert gpu_plan.training_budget_s(20, 2, 9, [9.0], 0, 400, margin_s=20)[0] == pytest.approx(370)
    # 3 minutes after this call: a last call of 3 - 2 = 1 minute would not train (60 s against 60 + 20 s).
    seconds, arithmetic = gpu_plan.training_budget_s(25, 2, 9, [9.0], 0, 400, margin_s=20)
    assert seconds == pytest.approx(370) and arithmetic["further_calls"] == 0
    # 0.9 * 1000 s over 1/100 s a step plus a 0.5 s validation per 441-step epoch: 80,835 steps.
    assert gpu_plan.max_steps_for(1000, 100, 0.5, 441, 1, 400_000) == 80_835
    assert gpu_plan.max_steps_for(10**6, 100, 0.5, 441, 1, 400_000) == 400_000  # never beyond the authors'


def test_targets_are_table5_default_row_and_short_runs_say_how_far_they_got():
    published = {(e.table, e.dataset, e.variant, e.metric): e.value for e in load_published()[0]}
    assert gpu_check.TABLE5["ml-1m"] == published[("Table 5", "ml-1m", "default", "NDCG@10")] == 0.4759
    assert gpu_check.TABLE5["beauty"] == 0.1832
    plan = {"authors_max_steps": 400_000, "projected_hours_for_authors_schedule": 2.5}
    training = {"metrics": {"pop100": {"NDCG@10": 0.43}, "full": {"NDCG@10": 0.16}}, "device": "cuda:0 (H100)",
                "schedule": {"max_steps": 70_000, "steps_run": 70_000}, "train_seconds": 800.0, "plan": plan}
    pop100, full = gpu_check.bert4rec_targets("ml-1m", training)
    assert "Table 5" in pop100["paper_source"] and pop100["bound"] == ">= 0.4759" and pop100["met"] is False
    assert pop100["how_far"]["steps_run"] == 70_000 and pop100["how_far"]["projected_hours_for_authors_schedule"]
    assert full["met"] is True and "how_far" not in full
    unfinished = {"plan": plan, "progress": {"state": "training unfinished", "steps": 5000}}
    assert gpu_check.bert4rec_targets("ml-1m", unfinished)[0]["how_far"]["steps"] == 5000


def test_archive_limits_and_unpacking(tmp_path):
    out = tmp_path / "out"
    (out / "bert4rec" / "per_user").mkdir(parents=True)
    (out / "bert4rec" / "per_user" / "a.npz").write_bytes(b"x" * 100)
    (out / "bert4rec" / "checkpoints").mkdir()
    (out / "bert4rec" / "checkpoints" / "run.pt").write_bytes(os.urandom(gpu_carry.RETURN_FILE_BYTES + 1))
    (out / gpu_carry.SUMMARY).write_text("{}")
    messages = []
    archive = gpu_carry.pack(out, tmp_path / "OUT", messages.append)
    # Too large to come back with the checkpoint: packed again without it.
    assert archive.stat().st_size <= gpu_carry.RETURN_FILE_BYTES and any("without 1" in m for m in messages)
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["bert4rec/per_user/a.npz", gpu_carry.SUMMARY]
    assert gpu_carry.return_problems(tmp_path / "OUT") == []
    fresh = tmp_path / "fresh"
    assert gpu_carry.unpack(archive, fresh, messages.append)
    assert (fresh / "bert4rec" / "per_user" / "a.npz").read_bytes() == b"x" * 100
    assert not gpu_carry.unpack(archive, fresh, messages.append)  # never over work already there

    bad = tmp_path / "bad"
    (bad / "a" / "b" / "c").mkdir(parents=True)
    (bad / "a" / "b" / "c" / "deep.txt").write_text("")
    (bad / "odd name.txt").write_text("")
    for number in range(8):
        (bad / f"f{number}").write_text("")
    problems = gpu_carry.return_problems(bad)
    assert len(problems) == 3 and "10 files" in problems[0]
    assert any("3 folders down" in p for p in problems) and any("odd name" in p for p in problems)


def test_work_carried_from_another_kind_of_device_is_set_aside(tmp_path):
    out = tmp_path / "gpu-check"
    (out / "done").mkdir(parents=True)
    (out / "done" / "tests").touch()
    (out / "invocations.json").write_text(json.dumps([{"device": "cpu (1 threads, x86_64)", "minutes": 1.0}]))
    gpu_check.set_aside_other_device(out, "cpu")  # the same kind: kept
    assert gpu_check.is_done(out, "tests")
    gpu_check.set_aside_other_device(out, "cuda")  # a CPU rehearsal carried to the GPU: not done there
    assert not gpu_check.is_done(out, "tests") and gpu_check.invocations(out) == []
    assert [p.name.startswith("gpu-check-cpu-") for p in tmp_path.iterdir()].count(True) == 1


@requires_shared_data
def test_prepare_carry_copies_the_data_files_the_commit_and_the_archive(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
    (checkout / ".gitignore").write_text("/.cache/\n")
    archive = tmp_path / gpu_carry.ARCHIVE
    with tarfile.open(archive, "w:gz"):
        pass
    carry = checkout / ".cache" / "gpu-check"
    gpu_carry.prepare_carry(carry, checkout, str(SHARED_DATA), ["ml-1m", "synthetic"], str(archive), print)
    name = "ml-1m_seq_full.txt.gz"  # the file ML-1m loads from there; the generated dataset needs none
    assert sorted(p.name for p in (carry / "data").iterdir()) == [name]
    assert (carry / "data" / name).read_bytes() == (SHARED_DATA / name).read_bytes()
    assert (carry / gpu_carry.COMMIT_FILE).read_text().strip() and (carry / gpu_carry.ARCHIVE).is_file()
    with pytest.raises(SystemExit, match="not a folder git ignores"):
        gpu_carry.prepare_carry(checkout / "travels", checkout, str(SHARED_DATA), [], None, print)


def test_device_command_fits_the_tool_and_names_an_ignored_carry_folder(capsys):
    command = gpu_check.DEVICE_COMMAND
    assert len(command) <= 2000 and command in gpu_check.__doc__
    assert f"--carry {gpu_check.CARRY}" in command and '--pack-to "$OUT"' in command and "--no-index" in command
    assert gpu_check.main(["--print-device-command"]) == 0
    assert command in capsys.readouterr().out
    ignored = subprocess.run(["git", "check-ignore", "-q", gpu_check.CARRY], cwd=ROOT)
    assert ignored.returncode == 0, f"{gpu_check.CARRY} must be ignored by git, or it travels with every call"


def test_commit_of_a_copy_without_git_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "ROOT", tmp_path)  # no .git here, as in the device's copy of the checkout
    monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
    assert provenance.git_commit() == "unknown"
    monkeypatch.setenv(provenance.COMMIT_ENV, "0123abcd")
    assert provenance.git_commit() == "0123abcd"
