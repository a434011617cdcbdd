"""The run layer as a user meets it (issue 10): jobs keyed by their settings, a grid checked before it trains,
failures recorded without stopping the grid, parallel and distributed execution, and faults survived."""
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import run_all
from recbench.benchmarks.store import ClaimedElsewhere, claimed, read_results, row_threads
from tests.helpers import (
    ROOT,
    SHARED_DATA,
    dask_cluster,
    interrupt_training_at_validation,
    requires_shared_data,
    wait_for,
)

# Small, deterministic jobs on the built-in synthetic data: budgets in epochs, no wall-clock cap.
TINY = ["--set", "time_budget_s=none", "--set", "sasrec:max_len=20", "--set", "sasrec:hidden=16",
        "--set", "sasrec:max_epochs=2"]


def run(argv, tmp_path, capsys=None, output="out"):
    """run_all.main in this process; returns (exit code, stdout, stderr)."""
    code = run_all.main([*argv, "--output", str(tmp_path / output), "--cache-dir", str(tmp_path / "cache"),
                         "--quiet", "--no-report"])
    captured = capsys.readouterr() if capsys else None
    return code, (captured.out if captured else ""), (captured.err if captured else "")


def rows(tmp_path, output="out"):
    return read_results(tmp_path / output / "results.jsonl")


def test_resume_with_changed_settings_runs_a_new_job_and_keeps_the_old_rows(tmp_path, capsys):
    assert run(["--models", "pop", "bprmf"], tmp_path, capsys)[0] == 0
    code, out, _ = run(["--models", "pop", "bprmf", "--set", "bprmf:hidden=8", "--resume"], tmp_path, capsys)
    assert code == 0
    assert "synthetic/pop/seed0: already in results.jsonl" in out  # POP's settings did not change
    assert "synthetic/bprmf/seed0: already" not in out
    hidden = sorted((row["hyperparameters"]["hidden"], row["protocol"]) for row in rows(tmp_path)
                    if row["model"] == "bprmf")
    assert hidden == [(8, "full"), (8, "pop100"), (64, "full"), (64, "pop100")]
    assert len({row["key"] for row in rows(tmp_path) if row["model"] == "bprmf"}) == 2
    # POP has no training loop, so nothing that could stand stopped; BPR-MF's short run did not
    assert {row["model"]: row["train_paused_seconds"] for row in rows(tmp_path)} == {"pop": None, "bprmf": 0.0}
    # The same changed command again skips everything; the smoke rows are not reused by the paper profile.
    code, out, _ = run(["--models", "pop", "bprmf", "--set", "bprmf:hidden=8", "--resume", "--dry-run"],
                       tmp_path, capsys)
    assert out.count("skip (done)") == 2
    code, out, _ = run(["--models", "pop", "bprmf", "--profile", "paper", "--resume", "--dry-run"], tmp_path, capsys)
    assert out.count("skip (done)") == 0 and out.count("  run\n") == 2
    # The report names the setting that differs between the configurations it holds.
    from recbench.reports.results import load_results

    (change,) = load_results(tmp_path / "out").changes
    assert change.label == "synthetic/bprmf seed 0" and change.differences == ("hidden: 64 -> 8",)


def test_resume_reruns_a_job_that_lacks_one_protocols_row(tmp_path, capsys):
    assert run(["--models", "pop", "bprmf"], tmp_path, capsys)[0] == 0
    results = tmp_path / "out" / "results.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    results.write_text("".join(line for line in lines if '"bprmf"' not in line or '"full"' not in line))
    code, out, _ = run(["--models", "pop", "bprmf", "--resume"], tmp_path, capsys)
    assert code == 0 and "synthetic/pop/seed0: already in results.jsonl" in out
    assert "synthetic/bprmf/seed0: already" not in out  # its pop100 row alone does not make it finished
    assert sorted((row["model"], row["protocol"]) for row in rows(tmp_path)) == [
        ("bprmf", "full"), ("bprmf", "pop100"), ("pop", "full"), ("pop", "pop100")]


def test_a_resume_on_another_thread_count_trains_again_and_says_so(tmp_path, capsys):
    """Issue 70: the same job under one key gave other metrics on 1 and 2 threads, and --resume mixed them
    silently. Rows record their count; a resume on another count trains the job again, saying so (the plan too)."""
    before, SHORT = torch.get_num_threads(), ["--set", "bprmf:max_epochs=2"]
    try:
        assert run(["--models", "pop", "bprmf", *SHORT, "--threads", "1"], tmp_path, capsys)[0] == 0
        keys = {row["key"] for row in rows(tmp_path)}
        assert {row_threads(row) for row in rows(tmp_path)} == {1}
        out = run(["--models", "pop", "bprmf", *SHORT, "--threads", "2", "--resume", "--dry-run"], tmp_path, capsys)[1]
        assert out.count("run again (its rows were trained on 1 CPU thread(s), this run uses 2") == 2
        code, out, _ = run(["--models", "pop", "bprmf", *SHORT, "--threads", "2", "--resume"], tmp_path, capsys)
        assert code == 0 and "synthetic/bprmf/seed0: its rows in results.jsonl were trained on 1 CPU thread(s), " \
                             "this run uses 2" in out and "already in results.jsonl" not in out
        assert {row["key"] for row in rows(tmp_path)} == keys and len(rows(tmp_path)) == 4  # replaced, same keys
        assert {row_threads(row) for row in rows(tmp_path)} == {2}
        out = run(["--models", "pop", "bprmf", *SHORT, "--threads", "2", "--resume"], tmp_path, capsys)[1]
        assert out.count("already in results.jsonl") == 2
    finally:
        torch.set_num_threads(before)


def test_a_checkpoint_is_resumed_only_on_the_thread_count_that_trained_it(tmp_path, capsys, monkeypatch):
    """Issue 70: a resume on another thread count would go on with other arithmetic under the same key."""
    before = torch.get_num_threads()
    try:
        interrupt_training_at_validation(monkeypatch, 2)
        argv = ["--models", "sasrec", *TINY, "--set", "sasrec:max_epochs=3"]
        assert run([*argv, "--threads", "1"], tmp_path, capsys)[0] == 1  # stopped after epoch 1, its checkpoint kept
        monkeypatch.undo()
        code, _, err = run([*argv, "--threads", "2", "--resume"], tmp_path, capsys)
        assert code == 2 and ("error: 1 interrupted job(s) were trained on another CPU thread count than this run's "
                              "2, with which a seed's figures differ: rerun with --threads 1 to continue them") in err
        assert "synthetic/sasrec/seed0: 1 thread(s)" in err
        code, out, _ = run([*argv, "--resume"], tmp_path, capsys)  # without --threads: the checkpoint's count
        assert code == 0 and "; 1 CPU thread(s) per job, the count this folder's checkpoints were trained with" in out
        assert {row["resumed_from_epoch"] for row in rows(tmp_path)} == {1}
    finally:
        torch.set_num_threads(before)


def test_a_checkpoint_is_resumed_only_by_its_own_settings(tmp_path, capsys, monkeypatch):
    """A run interrupted during training and resumed with another learning rate must start afresh."""
    interrupt_training_at_validation(monkeypatch, 2)
    argv = ["--models", "sasrec", *TINY, "--set", "sasrec:max_epochs=4"]
    assert run(argv, tmp_path, capsys)[0] == 1  # the job failed after epoch 1; its checkpoint is kept
    assert len(list((tmp_path / "out" / "checkpoints").glob("*.pt"))) == 1
    monkeypatch.undo()
    code, _, _ = run([*argv, "--set", "sasrec:lr=0.05", "--resume"], tmp_path, capsys)
    assert code == 0
    (fresh,) = {row["key"]: row for row in rows(tmp_path)}.values()
    assert fresh["resumed_from_epoch"] is None and fresh["train_settings"]["lr"] == 0.05
    code, _, _ = run([*argv, "--resume"], tmp_path, capsys)  # the original settings resume their checkpoint
    resumed = [row for row in rows(tmp_path) if row["train_settings"]["lr"] != 0.05]
    assert code == 0 and {row["resumed_from_epoch"] for row in resumed} == {1}
    assert not list((tmp_path / "out" / "checkpoints").glob("*.pt"))  # finished jobs keep only their results


def test_a_rerun_without_resume_refuses_to_discard_an_interrupted_job_and_the_plan_says_where_it_stands(
        tmp_path, capsys, monkeypatch):
    """Hours of converge-profile training sit in a checkpoint: a rerun that forgets --resume must not delete
    it. It fails before anything runs, naming the job, where its training stands and the two ways on."""
    interrupt_training_at_validation(monkeypatch, 3)
    argv = ["--models", "pop", "sasrec", *TINY, "--set", "sasrec:max_epochs=4"]
    assert run(argv, tmp_path, capsys)[0] == 1  # POP finished; SASRec stopped after epoch 2, its checkpoint kept
    monkeypatch.undo()
    (checkpoint,) = (tmp_path / "out" / "checkpoints").glob("*sasrec*.pt")
    saved, manifest = checkpoint.read_bytes(), (tmp_path / "out" / "manifest.jsonl").read_text()
    state = torch.load(checkpoint, weights_only=False)["state"]
    where = (f"epoch 2 of at most 4, best validation NDCG@10 {state['best_metric']:.4f} at epoch "
             f"{state['best_epoch']} ({state['bad_validations']} validation")
    code, out, err = run(argv, tmp_path, capsys)
    assert code == 2 and "[1/2]" not in out  # no job started, not even POP's
    assert err.splitlines()[0].startswith("error: ") and "holds the training of 1 interrupted job(s)" in err
    assert "rerun with --resume (resume=True from Python) to continue them, or delete their checkpoint files" in err
    assert f"synthetic/sasrec/seed0: {where}" in err and f"({checkpoint.name})" in err
    assert checkpoint.read_bytes() == saved and (tmp_path / "out" / "manifest.jsonl").read_text() == manifest
    code, out, _ = run([*argv, "--dry-run"], tmp_path, capsys)
    assert code == 0 and f"refused without --resume (its checkpoint: {where}" in out
    code, out, _ = run([*argv, "--dry-run", "--resume"], tmp_path, capsys)
    assert code == 0 and f"resume from {where}" in out and "skip (done)" in out
    # the plan's time estimate: the steps the job has left, none for the finished POP
    code, out, _ = run([*argv, "--dry-run", "--resume", "--estimate"], tmp_path, capsys)
    (left,) = re.findall(r"estimated training left: .*?([\d,]+) steps ×", out)
    assert code == 0 and "estimated training: " not in out and "estimated training in all: " in out
    code, out, _ = run([*argv, "--dry-run", "--estimate"], tmp_path, capsys)  # without --resume it starts afresh
    (planned,) = re.findall(r"estimated training: .*?([\d,]+) steps ×", out)
    assert int(planned) == 2 * state["step"] and int(left) == int(planned) - state["step"]
    assert run([*argv, "--resume"], tmp_path, capsys)[0] == 0  # the interrupted job continues from epoch 2
    assert {row["resumed_from_epoch"] for row in rows(tmp_path) if row["model"] == "sasrec"} == {2}


def test_a_resumed_row_counts_the_training_time_of_every_session(tmp_path, capsys, monkeypatch):
    """A long run is resumed across sessions; its row's wall-clock and CPU training time are the sums over all of
    them, not the last session's (the CPU figure was the last session's alone: 1,203 s for an 11.6-hour run)."""
    interrupt_training_at_validation(monkeypatch, 3)
    argv = ["--models", "sasrec", *TINY, "--set", "sasrec:max_epochs=4"]
    assert run(argv, tmp_path, capsys)[0] == 1  # stopped after epoch 2, its checkpoint kept
    monkeypatch.undo()
    (checkpoint,) = (tmp_path / "out" / "checkpoints").glob("*.pt")
    saved = torch.load(checkpoint, weights_only=False)
    saved["state"]["train_seconds"] += 3600.0  # as if the first session had trained an hour
    saved["state"]["cpu_seconds"] += 3000.0
    saved["state"]["paused_seconds"] += 1200.0  # and had stood stopped for 20 minutes
    torch.save(saved, checkpoint)
    assert run([*argv, "--resume"], tmp_path, capsys)[0] == 0
    (row, *_) = rows(tmp_path)
    assert row["resumed_from_epoch"] == 2
    assert 3600.0 < row["train_seconds"] < 3600.0 + 600 and 3000.0 < row["train_cpu_seconds"] < 3000.0 + 600
    assert row["train_paused_seconds"] == pytest.approx(1200.0, abs=1.0)  # this session stood still no longer
    from recbench.reports import generate_report  # the report marks the resumed job (issue 70)

    assert "- Resumed from a checkpoint after an interruption: synthetic/sasrec/seed0 (from epoch 2)." in \
        generate_report(tmp_path / "out").read_text()


def test_the_time_left_counts_a_resumed_jobs_earlier_sessions_and_guesses_nothing_for_untimed_models(
        tmp_path, capsys, monkeypatch):
    """The grid's time left: a job resumed near its end took its earlier sessions too (it was estimated from the
    last session's seconds: 1.8 min left for a grid of hours), and a model without a finished job gets no guess
    from the others' times (BPR-MF's minutes said nothing of FPMC's half hour)."""
    interrupt_training_at_validation(monkeypatch, 3)
    tiny = [*TINY, "--set", "sasrec:max_epochs=4"]
    assert run(["--models", "sasrec", *tiny], tmp_path, capsys)[0] == 1  # stopped after epoch 2, checkpoint kept
    monkeypatch.undo()
    (checkpoint,) = (tmp_path / "out" / "checkpoints").glob("*.pt")
    saved = torch.load(checkpoint, weights_only=False)
    saved["state"]["train_seconds"] += 3600.0  # as if the first session had trained an hour
    torch.save(saved, checkpoint)
    code, out, err = run(["--models", "sasrec", "bprmf", "--seeds", "0", "1", *tiny, "--resume"], tmp_path, capsys)
    lines = [line for line in (out + err).splitlines() if line.startswith("[")]
    assert code == 0 and [line.split()[1] for line in lines] == [
        "synthetic/sasrec/seed0", "synthetic/sasrec/seed1", "synthetic/bprmf/seed0", "synthetic/bprmf/seed1"]
    assert lines[0].endswith(")")  # nothing timed yet: no guess
    # sasrec seed 0 took an hour over its two sessions (and the seconds both really trained, which a busy machine
    # stretches), so its seed 1 is expected to; BPR-MF is not timed yet
    left = re.search(r", about (\d+\.\d) h left for the 1 job of models timed so far, 2 more of models not yet "
                     r"timed$", lines[1])
    assert left and float(left.group(1)) >= 1.0, lines[1]
    # every model timed: the estimate alone (seconds, or minutes where a busy machine stretched BPR-MF's seed 0)
    assert re.search(r", about (\d+ s|\d+\.\d min) left$", lines[3]), lines[3]


def test_the_time_left_takes_the_plans_estimates_where_there_are_some():
    """Table 5's variants differ threefold in a step's time, so the mean of a model's finished jobs misjudges the
    rest; a study's plan has timed every job, and the run's time left is that plan's figure for the jobs left, shared
    among the jobs at once but never under the longest job. A job neither estimated nor timed stays apart."""
    from types import SimpleNamespace

    from recbench.benchmarks.estimate import Estimate
    from recbench.benchmarks.grid_progress import GridProgress

    def job(key, model):
        return SimpleNamespace(key=key, run_id=f"ml-1m/{model}/{key}/seed0",
                               job=SimpleNamespace(model=model, dataset="ml-1m"))

    planned = [job("L=4", "bert4rec"), job("L=1", "bert4rec"), job("w/o PE", "bert4rec"), job("default", "sasrec")]
    estimates = {"L=4": Estimate(9 * 3600.0, 100, 1.0, False, expected=5 * 3600.0),
                 "L=1": Estimate(4 * 3600.0, 100, 1.0, False, expected=2 * 3600.0),
                 "w/o PE": Estimate(6 * 3600.0, 100, 1.0, False, expected=3 * 3600.0),
                 "default": Estimate(50 * 3600.0, 100, 1.0, False)}  # only its cap: no converged run to go by
    lines = []
    clock = GridProgress(planned, planned, 2, lines.append, estimates)
    clock.started(planned[0])
    assert lines[-1].endswith("(key L=4), about 5.0 h left for the 3 jobs of models timed so far, 1 more of models "
                              "not yet timed")  # (5 + 2 + 3) / 2 = 5 h, the longest job's 5 h
    rows = [{"protocol": "full", "train_seconds": 7200.0, "eval_seconds": 5.0, "metrics": {}}]
    clock.started(planned[1])
    clock.began["L=1"] -= 1800.0  # L = 1 has run half an hour of its two
    # resumed at its end: this session's ten minutes, and the two hours of training its rows record
    clock.done(SimpleNamespace(key="L=4", status="finished", trained=True, rows=rows, seconds=600.0))
    assert lines[-1].startswith("  done [1/4] ml-1m/bert4rec/L=4/seed0 in 2.0 h")
    clock.done(SimpleNamespace(key="default", status="finished", trained=True, rows=rows, seconds=7205.0))
    assert lines[-1].endswith("about 3.0 h left")  # L = 1 and w/o PE by the plan, not by L = 4's two hours
    clock.began["L=1"] -= 3 * 3600.0  # past its estimate: none of it is counted, w/o PE's three hours are
    clock.started(planned[2])
    assert lines[-1].endswith("about 3.0 h left")


def test_the_time_left_scales_a_models_time_on_one_dataset_to_another_datasets_steps(monkeypatch):
    """ML-1m then Beauty: a model's mean time on ML-1m stood for its Beauty jobs, whose epochs are of another length,
    and the grid said a third of the time left. A job of a model finished on its own dataset takes that mean; on
    another dataset only, the model's seconds per step times the job's own steps: the epochs the finished jobs ran,
    each of this job's length, within its caps."""
    from types import SimpleNamespace

    from recbench.benchmarks import grid_progress
    from recbench.benchmarks.trainer import TrainSettings

    examples = {"ml-1m": 6_400, "beauty": 19_200}  # an epoch of 256-batches: 25 steps on ML-1m, 75 on Beauty
    counted = []
    monkeypatch.setattr(grid_progress, "training_example_count",
                        lambda job, data: counted.append(job.job.dataset) or examples[data])

    def job(dataset, seed, max_epochs=200):
        return SimpleNamespace(key=f"{dataset}{seed}", run_id=f"{dataset}/sasrec/seed{seed}",
                               job=SimpleNamespace(model="sasrec", dataset=dataset),
                               config=SimpleNamespace(model="d=64", train=TrainSettings(max_epochs=max_epochs)))

    planned = [job("ml-1m", 0), job("ml-1m", 1), job("beauty", 0), job("beauty", 1, max_epochs=10)]
    lines = []
    clock = grid_progress.GridProgress(planned, planned, 1, lines.append, datasets={name: name for name in examples})
    rows = [{"protocol": "full", "train_seconds": 1000.0, "eval_seconds": 0.0, "steps_run": 1000, "epochs_run": 40,
             "metrics": {}}]  # 1 s a step, 40 epochs of 25 steps
    clock.done(SimpleNamespace(key="ml-1m0", status="finished", trained=True, rows=rows, seconds=1000.0))
    clock.started(planned[1])
    # ML-1m's seed 1: the finished job's 1000 s; Beauty: 40 epochs of 75 steps, 3000 s, and 10 epochs at most, 750 s
    assert lines[-1].endswith("about 1.3 h left")  # 1000 + 3000 + 750 s one after another
    assert counted == ["beauty"]  # each dataset's examples counted once, and only where a model's time is scaled
    clock.started(planned[2])
    assert counted == ["beauty"]


def test_a_failing_rerun_deletes_nothing_and_the_grid_goes_on(tmp_path, capsys, monkeypatch):
    assert run(["--models", "pop", "bprmf", "fpmc"], tmp_path, capsys)[0] == 0
    before = {(row["model"], row["protocol"]): row for row in rows(tmp_path)}
    files = sorted(p.name for p in (tmp_path / "out" / "per_user").iterdir())
    from recbench.models.bprmf import BPRMF

    monkeypatch.setattr(BPRMF, "loss", lambda *args: (_ for _ in ()).throw(TypeError("simulated bug")))
    code, out, err = run(["--models", "pop", "bprmf", "fpmc"], tmp_path, capsys)  # no --resume: rerun all
    assert code == 1
    assert "1 of 3 job(s) failed" in err and "synthetic/bprmf/seed0" in err and "TypeError: simulated bug" in err
    assert "Traceback" not in err
    after = {(row["model"], row["protocol"]): row for row in rows(tmp_path)}
    assert after.keys() == before.keys() and len(rows(tmp_path)) == len(before)  # nothing lost, nothing doubled
    assert after[("bprmf", "full")] == before[("bprmf", "full")]  # the finished result survived the failure
    # The jobs after it ran again: the rerun's manifest entry records POP and FPMC as finished, BPR-MF as failed.
    rerun = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()][-1]
    assert rerun["event"] == "end" and not rerun["skipped"]
    assert set(rerun["finished"]) == {after[(model, "full")]["key"] for model in ("pop", "fpmc")}
    assert rerun["failed"] == [after[("bprmf", "full")]["key"]]
    assert sorted(p.name for p in (tmp_path / "out" / "per_user").iterdir()) == files
    (failure,) = [json.loads(line) for line in (tmp_path / "out" / "failed.jsonl").read_text().splitlines()]
    assert failure["run_id"] == "synthetic/bprmf/seed0" and failure["error_type"] == "TypeError"
    monkeypatch.undo()
    assert run(["--models", "bprmf"], tmp_path, capsys)[0] == 0
    assert (tmp_path / "out" / "failed.jsonl").read_text() == ""  # the key finished again: its failure is gone


def test_a_diverging_job_is_a_failed_row_not_a_crash(tmp_path, capsys):
    code, _, err = run(["--models", "pop", "bprmf", "--set", "bprmf:lr=1e30", "--set", "bprmf:reg=1e30"],
                       tmp_path, capsys)
    assert code == 1 and "training loss became nan" in err and "lower the learning rate" in err
    assert {row["model"] for row in rows(tmp_path)} == {"pop"}


@requires_shared_data
def test_missing_data_is_found_before_anything_is_prepared(tmp_path, capsys):
    code, _, err = run(["--datasets", "beauty", "steam", "--data-dir", str(SHARED_DATA)], tmp_path, capsys)
    assert code == 2
    assert "dataset 'steam'" in err and "steam.txt" in err and "steam_reviews.json" in err
    assert "beauty" not in err.split("dataset 'steam'")[0].replace("--datasets", "")
    assert not (tmp_path / "cache" / "prepared").exists()  # Beauty was not even parsed
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written


def test_offline_without_data_names_every_missing_dataset(tmp_path, capsys, monkeypatch):
    from recbench.datasets import registry

    with socket.socket() as closed:  # a port nobody listens on: every download fails at once
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setattr(registry, "URLS", {name: f"{dead}/{name}" for name in registry.URLS})
    monkeypatch.delenv("RECBENCH_DATA_DIR", raising=False)
    code, _, err = run(["--datasets", "beauty", "ml-1m"], tmp_path, capsys)
    assert code == 2 and "dataset 'beauty'" in err and "dataset 'ml-1m'" in err


@pytest.mark.parametrize("setting, message", [
    ("hidden=abc", "bprmf: hidden='abc' must be an integer"),
    ("lr=fast", "pop, bprmf: lr='fast' must be a number"),
    ("lr=true", "pop, bprmf: lr=true must be a number"),
    ("batch_size=64.0", "pop, bprmf: batch_size=64.0 must be an integer"),
    ("lr=-1", "pop, bprmf: lr=-1.0 must be > 0"),
    ("foo:hidden=4", "--set 'foo:hidden=4': unknown model 'foo'; expected one of pop, bprmf, "),
    ("bprmf:layers=2", "--set 'bprmf:layers=2': unknown field 'layers'; expected one of batch_size, betas, "),
    # Issue 29: a trainer setting for the one model that is not trained was accepted and changed nothing.
    ("pop:lr=0.1", "--set 'pop:lr=0.1': pop is fitted without gradient training, so the trainer setting 'lr' would "
                   "change nothing; drop it"),
    ("bprmf:hidden=-4", "bprmf: hidden=-4 must be >= 1"),
    ("gru4rec:loss=xyz", "gru4rec: loss='xyz' must be one of top1, bpr"),
    ("sasrec:heads=3", "sasrec: heads=3 must divide hidden=64"),
    ("caser:negatives=0", "caser: negatives=0 must be >= 1"),
])
def test_bad_settings_fail_before_training_in_one_line(setting, message, tmp_path, capsys):
    models = ["pop", "bprmf", *(name for name in ("gru4rec", "sasrec", "caser") if setting.startswith(name))]
    code, _, err = run(["--models", *models, "--set", setting], tmp_path, capsys)
    assert code == 2
    assert err.strip() == f"error: {message}" or err.strip().startswith(f"error: {message}")
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (["--models", "bprmf", "--set", "valid_metric=AUC"],
     "synthetic/bprmf/seed0: valid_metric='AUC' is a relevance metric, but bprmf is selected on ranking the "
     "validation targets (full); use HR@k, NDCG@k or MRR"),
    (["--models", "bprmf", "--set", "valid_protocol=pop100", "--set", "valid_metric=HR@101"],
     "synthetic/bprmf/seed0: valid_metric='HR@101' must have k below the 101 candidates of "
     "valid_protocol='pop100' (at k = 101 every model scores 1)"),
    (["--models", "bprmf", "--set", "max_steps=10", "--set", "warmup_steps=50"],
     "bprmf: warmup_steps=50 must be at most max_steps=10 (else the learning rate never reaches lr)"),
    (["--task", "relevance", "--models", "lstm-rel", "--set", "valid_metric=NDCG@10"],
     "synthetic/lstm-rel/relevance/seed0: valid_metric='NDCG@10' cannot select lstm-rel, a model trained for "
     "relevance, on the validation pairs; use one of accuracy, AUC"),
])
def test_rules_across_settings_fail_before_training_in_one_line(argv, message, tmp_path, capsys):
    code, _, err = run(argv, tmp_path, capsys)
    assert code == 2 and err.strip() == f"error: {message}"
    assert not (tmp_path / "out").exists()


def test_any_ranking_metric_can_select_the_checkpoint(tmp_path, capsys):
    """NDCG@20 is not among the reported metrics; validation computes it, and it selects the best epoch."""
    code, _, _ = run(["--models", "bprmf", "--set", "valid_metric=NDCG@20", "--set", "max_epochs=4",
                      "--set", "valid_every=1"], tmp_path, capsys)
    assert code == 0
    (row, _) = read_results(tmp_path / "out" / "results.jsonl")
    curve = [epoch["valid_NDCG@20"] for epoch in row["curve"]]
    assert row["valid_metric"] == "NDCG@20 under full" and row["best_valid"] == max(curve)
    assert row["best_epoch"] == curve.index(max(curve)) + 1 and len(curve) == 4


@pytest.mark.parametrize("flags, used", [(set(), "fp32"), ({"avx512_bf16"}, "bf16")])
def test_rows_record_the_profile_and_the_precision_the_run_really_used(flags, used, tmp_path, capsys, monkeypatch):
    from recbench.benchmarks import provenance

    monkeypatch.setattr(provenance, "cpu_flags", lambda cpuinfo=None: flags)
    code, _, err = run(["--models", "pop", "bprmf", "sasrec", "--profile", "converge", *TINY, "--set",
                        "bprmf:max_epochs=2", "--set", "precision=bf16"], tmp_path, capsys)
    assert code == 0 and ("no native bf16" in err) == (used == "fp32")
    by_model = {row["model"]: row for row in rows(tmp_path) if row["protocol"] == "full"}
    assert {row["profile"] for row in by_model.values()} == {"converge"}
    assert by_model["sasrec"]["precision"] == used and by_model["sasrec"]["train_settings"]["precision"] == "bf16"
    assert by_model["pop"]["precision"] is None  # no gradient training, no precision
    # the device words name the bf16 units the trainer's decision read, or their absence
    assert by_model["sasrec"]["device"].endswith("avx512_bf16)" if used == "bf16" else "no native bf16)")
    # BPR-MF's scores are elementwise: autocast runs nothing of it in bf16, so it is fp32 in fact, and says so
    assert by_model["bprmf"]["precision"] == "fp32" and by_model["bprmf"]["train_settings"]["precision"] == "bf16"
    assert ("bprmf: precision=bf16 asked for, but no operation of its training step runs in bf16" in err) == (
        used == "bf16")


def test_user_errors_are_one_or_two_lines_and_debug_shows_the_traceback(tmp_path, capsys):
    code, _, err = run(["--models", "pop", "--device", "tpu"], tmp_path, capsys)
    assert code == 2 and err.strip() == "error: unknown device 'tpu'; expected one of auto, cpu, cuda, cuda:N"
    with pytest.raises(Exception, match="unknown device"):
        run(["--models", "pop", "--device", "tpu", "--debug"], tmp_path)


def test_bad_data_file_is_one_error_naming_file_and_line(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "beauty.txt").write_text("1 1\n1 2\n1 x\n")
    code, _, err = run(["--datasets", "beauty", "--data-dir", str(data)], tmp_path, capsys)
    assert code == 2 and "beauty.txt" in err and "line 3" in err and len(err.strip().splitlines()) <= 2


def test_dry_run_prints_jobs_with_settings_and_keys_and_runs_nothing(tmp_path, capsys):
    code, out, _ = run(["--models", "pop", "sasrec", "--seeds", "0", "1", "--dry-run"], tmp_path, capsys)
    assert code == 0 and out.count(" key ") == 4 and "model: max_len=" in out and "train: optimizer=" in out
    assert "train: (no training)" in out  # POP
    assert not (tmp_path / "out").exists()


def test_a_run_with_estimate_times_its_jobs_first_and_states_its_time_left_from_them(tmp_path, capsys):
    """A grid of models that differ a hundredfold gets no time left from finished jobs until each model has one;
    with --estimate the run times every job first (seconds, which a smoke run would notice, so only when asked),
    prints the total and gives each start line the time left of the jobs not yet done."""
    # without early stopping BPR-MF's steps are known exactly (a bare upper bound would give no time left)
    code, out, _ = run(["--models", "pop", "bprmf", "--set", "patience=none", "--estimate"], tmp_path, capsys)
    assert code == 0 and "estimated training in all: " in out
    starts = [line for line in out.splitlines() if line.startswith("[")]
    assert len(starts) == 2 and all(re.search(r"\), about (\d+ s|\d+\.\d min) left$", line) for line in starts), out
    assert len(rows(tmp_path)) == 4  # and it ran: two models, two protocols


def test_every_invocation_accumulates_in_the_manifest_and_config(tmp_path, capsys):
    run(["--models", "pop"], tmp_path, capsys)
    run(["--models", "bprmf", "--seeds", "0", "1"], tmp_path, capsys)
    manifest = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    assert [entry["event"] for entry in manifest] == ["start", "end", "start", "end"]
    assert [len(entry["jobs"]) for entry in manifest if entry["event"] == "start"] == [1, 2]
    assert all(entry["command"] for entry in manifest if entry["event"] == "start")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert sorted(job["model"] for job in config["jobs"]) == ["bprmf", "bprmf", "pop"]
    assert config["invocations"] == 2


def test_two_jobs_at_once_give_the_metrics_of_one_at_a_time(tmp_path, capsys):
    argv = ["--models", "pop", "bprmf", "fpmc", "sasrec", *TINY, "--threads", "1"]
    assert run([*argv, "--jobs", "1"], tmp_path, capsys, output="serial")[0] == 0
    code, out, _ = run([*argv, "--jobs", "2"], tmp_path, capsys, output="parallel")
    assert code == 0 and "done [4/4]" in out

    def metrics(output):
        return {(row["model"], row["protocol"]): row["metrics"] for row in rows(tmp_path, output)}

    assert metrics("parallel") == metrics("serial") and len(metrics("serial")) == 8


@pytest.mark.parametrize("threads, jobs, busy, warned", [
    (2, 1, 0.0, False),  # both cores to one job on a quiet machine
    (1, 2, 0.0, False),  # one each to two jobs
    (1, 1, 1.0, False),  # the free core to a job beside another run
    (2, 1, 1.0, True),   # two threads beside a run that keeps one core busy: the case measured in README
    (1, 2, 1.0, True),
    (2, 2, 0.0, True),   # more threads than cores on a quiet machine
])
def test_threads_beyond_the_free_cores_are_warned_about(threads, jobs, busy, warned):
    from recbench.benchmarks.execution import shared_cores_warning
    warning = shared_cores_warning(threads, jobs, 2, busy)
    assert bool(warning) == warned
    if warned:
        assert f"{jobs} job(s) × {threads} torch thread(s) on 2 core(s), {busy:.1f} of them busy" in warning


def test_a_run_beside_busy_cores_says_so_before_it_trains(tmp_path, capsys, monkeypatch):
    from recbench.benchmarks import execution
    monkeypatch.setattr(execution, "busy_cores", lambda: 2.0)
    monkeypatch.setattr(execution, "cpu_threads", lambda: 2)
    code, out, err = run(["--models", "pop", *TINY, "--threads", "1"], tmp_path, capsys)
    text = out + err
    assert code == 0 and len(rows(tmp_path)) == 2
    assert "warning: this run starts 1 job(s) × 1 torch thread(s) on 2 core(s), 2.0 of them busy" in text


def test_compile_on_the_cpu_says_once_that_it_trains_slower(tmp_path, capsys, monkeypatch):
    from recbench.benchmarks import execution, trainer
    monkeypatch.setattr(trainer.torch, "compile", lambda function, **options: function)  # the note, not inductor
    code, out, err = run(["--models", "pop", "bprmf", *TINY, "--compile"], tmp_path, capsys)
    assert code == 0 and (out + err).count(execution.COMPILE_ON_CPU) == 1
    code, out, err = run(["--models", "bprmf", *TINY], tmp_path / "eager", capsys)
    assert code == 0 and execution.COMPILE_ON_CPU not in out + err
    named = re.search(r"results/reference/[\w.-]+\.json", execution.COMPILE_ON_CPU).group()
    assert (Path(execution.__file__).resolve().parents[1] / named).is_file()  # the note names its measurement


def test_busy_cores_reads_the_processors_idle_time():
    from recbench.benchmarks.execution import busy_cores
    busy = busy_cores(0.05)
    assert busy is None or 0.0 <= busy <= len(os.sched_getaffinity(0))


# ------------------------------------------------------------------------------------ separate processes

def cli(tmp_path, *argv, output="out", wrapper=(), quiet=True):
    """``python run_all.py`` in a new process group (so that a signal reaches only it and its workers), started
    by the ``wrapper`` command (e.g. ``timeout 600``) when one is given; its output in ``<output>.log``."""
    env = {**os.environ, "RECBENCH_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / f"{output}.log", "w")
    # SIGINT as a terminal delivers it: a suite started in the background by a non-interactive shell ignores SIGINT,
    # and a child would inherit that and never see the tests' Ctrl-C.
    return subprocess.Popen([*wrapper, sys.executable, "run_all.py", *argv, "--output", str(tmp_path / output),
                             *(["--quiet"] if quiet else []), "--no-report"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def lock_is_free(path: Path) -> bool:
    """Whether no process holds the lock of the claim file ``path`` (``benchmarks.store.claimed``)."""
    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def children(pid: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(status.parent.name))
    return found


SLOW_JOBS = ["--models", "pop", "sasrec", "fpmc", "--set", "time_budget_s=none", "--set", "sasrec:max_epochs=6",
             "--set", "sasrec:max_len=30", "--set", "sasrec:patience=100", "--set", "fpmc:max_epochs=6"]


def assert_each_result_once(tmp_path, output="out"):
    found = [(row["model"], row["protocol"]) for row in rows(tmp_path, output)]
    assert sorted(found) == sorted({(model, protocol) for model in ("pop", "sasrec", "fpmc")
                                    for protocol in ("full", "pop100")})


def test_jobs_side_by_side_each_log_a_line_an_epoch_named_by_its_run(tmp_path):
    """Table 5's ablation runs two five-hour jobs at once: the log must show how far each has come, and say which
    job a line is about (both are BERT4Rec), where the workers' bars used to be switched off and nothing showed."""
    process = cli(tmp_path, "--models", "bprmf", "fpmc", "--set", "time_budget_s=none", "--set", "max_epochs=3",
                  "--set", "patience=none", "--jobs", "2", "--threads", "1", quiet=False)
    assert process.wait(timeout=300) == 0, (tmp_path / "out.log").read_text()
    log = (tmp_path / "out.log").read_text()
    for model in ("bprmf", "fpmc"):
        lines = [line for line in log.splitlines() if line.startswith(f"synthetic/{model}/seed0: step ")]
        assert [re.search(r"epoch (\d+)/3", line)[1] for line in lines] == ["1", "2", "3"], log
        assert lines[-1].endswith("stopped: max epochs")
    assert "\r" not in log  # no bars


def test_killing_a_worker_loses_and_duplicates_nothing(tmp_path):
    process = cli(tmp_path, *SLOW_JOBS, "--jobs", "2", "--threads", "1")
    checkpoints = tmp_path / "out" / "checkpoints"
    wait_for(lambda: any(checkpoints.glob("*sasrec*.pt")), process)
    workers = [pid for pid in children(process.pid) if b"loky" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert workers
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    assert process.wait(timeout=300) == 0, (tmp_path / "out.log").read_text()
    assert "a worker process died" in (tmp_path / "out.log").read_text()
    assert_each_result_once(tmp_path)
    sasrec = next(row for row in rows(tmp_path) if row["model"] == "sasrec")
    assert sasrec["resumed_from_epoch"] >= 1  # training went on from its checkpoint


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_killing_the_driver_then_resume_loses_and_duplicates_nothing(tmp_path, jobs):
    process = cli(tmp_path, *SLOW_JOBS, "--jobs", jobs, "--threads", "1")
    checkpoints = tmp_path / "out" / "checkpoints"
    wait_for(lambda: any(checkpoints.glob("*sasrec*.pt")), process)
    workers = children(process.pid)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in workers):  # orphaned workers end themselves
        assert time.monotonic() < deadline, "worker processes outlived the killed driver"
        time.sleep(0.1)
    finished_before = {(row["model"], row["protocol"]) for row in rows(tmp_path)} if (
        tmp_path / "out" / "results.jsonl").exists() else set()
    assert ("sasrec", "full") not in finished_before
    again = cli(tmp_path, *SLOW_JOBS, "--jobs", jobs, "--threads", "1", "--resume", output="out")
    assert again.wait(timeout=300) == 0, (tmp_path / "out.log").read_text()
    assert_each_result_once(tmp_path)
    sasrec = next(row for row in rows(tmp_path) if row["model"] == "sasrec")
    assert sasrec["resumed_from_epoch"] >= 1


def test_a_claim_waits_a_moment_for_a_dying_holder_and_refuses_a_live_one(tmp_path):
    """A killed process frees its claim only when its last thread has exited: a claim taken in that moment waits
    for it (here the holder lets go after 0.5 s) instead of refusing the job; a holder that stays is named."""
    path = tmp_path / "job.claim"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, sys, time
handle = open({str(path)!r}, "a+"); fcntl.flock(handle, fcntl.LOCK_EX); handle.write("process 1 on host")
handle.flush(); print("held", flush=True); time.sleep(float(sys.argv[1]))""", "0.5"], stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    with claimed(path, "me"):
        assert path.read_text() == "me"
    holder.wait(timeout=30)
    stays = subprocess.Popen(holder.args[:-1] + ["60"], stdout=subprocess.PIPE)
    try:
        assert stays.stdout.readline() == b"held\n"
        started = time.monotonic()
        with pytest.raises(ClaimedElsewhere, match="^process 1 on host$"):
            with claimed(path, "me", patience_s=0.3):
                pass
        assert time.monotonic() - started >= 0.3
    finally:
        stays.kill()
        stays.wait(timeout=30)


def test_a_resume_beside_a_run_still_going_leaves_it_the_job_and_then_resumes_it(tmp_path, capsys):
    """Issue 29: kill -9 of the command one started kills a wrapper (here ``timeout``), not the Python process that
    trains. A --resume beside that process must not train the job from the checkpoint it keeps writing (its rows
    would later replace the resumed rows, saying "not resumed"); once that process is ended, the job resumes and
    its rows record the epoch of the checkpoint it continued from."""
    argv = ["--models", "sasrec", "--set", "time_budget_s=none", "--set", "sasrec:max_epochs=6", "--set",
            "sasrec:max_len=30", "--set", "sasrec:patience=100", "--threads", "1"]
    wrapper = cli(tmp_path, *argv, wrapper=("timeout", "600"))
    checkpoints = tmp_path / "out" / "checkpoints"
    wait_for(lambda: any(checkpoints.glob("*sasrec*.pt")) and children(wrapper.pid), wrapper)
    (trainer,) = children(wrapper.pid)
    os.kill(trainer, signal.SIGSTOP)  # it holds its job as a running process does, without finishing it meanwhile
    os.kill(wrapper.pid, signal.SIGKILL)
    wrapper.wait(timeout=30)
    try:
        assert Path(f"/proc/{trainer}").exists()  # the training process outlived the command that started it
        code, _, err = run([*argv, "--resume"], tmp_path, capsys)
        assert code == 1 and f"another run is training this job now: process {trainer} on" in err
        assert "end that process, then rerun with --resume" in err
        assert not (tmp_path / "out" / "results.jsonl").exists() or not rows(tmp_path)
    finally:
        os.kill(trainer, signal.SIGKILL)  # a stopped process dies of it too
    # The claim's lock goes with the last of the killed process's threads, not with its main thread: that one shows
    # "zombie" while torch's threads may still be exiting (a loaded CI resumed in that moment and was refused).
    (claim,) = checkpoints.glob("*sasrec*.claim")
    deadline = time.monotonic() + 30
    while not lock_is_free(claim):
        assert time.monotonic() < deadline, "the training process outlived kill -9"
        time.sleep(0.1)
    (checkpoint,) = checkpoints.glob("*sasrec*.pt")
    epoch = torch.load(checkpoint, weights_only=False)["state"]["epoch"]
    code, out, err = run([*argv, "--resume"], tmp_path, capsys)
    assert code == 0, out[-2000:] + err[-2000:]  # it failed once in a loaded full suite: say why next time
    assert {(row["resumed_from_epoch"], row["epochs_run"]) for row in rows(tmp_path)} == {(epoch, 6)}
    assert (tmp_path / "out" / "failed.jsonl").read_text() == ""  # the refused attempt's failure is gone
    assert not list(checkpoints.iterdir())  # neither the checkpoint nor its claim is left


def test_ctrl_c_stops_with_one_line_saying_how_to_resume(tmp_path):
    # SASRec trains far longer than the test waits, so that the signal always lands during training.
    process = cli(tmp_path, *SLOW_JOBS, "--set", "sasrec:max_epochs=1000")
    wait_for(lambda: any((tmp_path / "out" / "checkpoints").glob("*sasrec*.pt")), process)
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(timeout=60) == 130
    log = (tmp_path / "out.log").read_text()
    assert "Traceback" not in log
    assert log.strip().splitlines()[-1].startswith("interrupted: finished jobs are recorded in")
    assert "--resume" in log.strip().splitlines()[-1]


def test_a_dask_cluster_on_this_machine_runs_the_grid(tmp_path, capsys):
    pytest.importorskip("distributed")
    with dask_cluster({"RECBENCH_CACHE_DIR": str(tmp_path / "cache")}) as address:
        argv = ["--models", "pop", "bprmf", "fpmc", "--threads", "1"]
        code, out, _ = run([*argv, "--dask-scheduler", address], tmp_path, capsys, output="dask")
        assert code == 0 and "done [3/3]" in out
        assert run(argv, tmp_path, capsys, output="local")[0] == 0

        def metrics(output):
            return {(row["model"], row["protocol"]): row["metrics"] for row in rows(tmp_path, output)}

        assert metrics("dask") == metrics("local") and len(metrics("dask")) == 6
