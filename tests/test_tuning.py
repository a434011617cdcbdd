"""Tuning as a user meets it (issue 21): a search on validation only that never touches the test split before its
final runs, trials keyed by their settings, pruning from the validation curve, a study that survives a killed
driver, parallel and distributed trials, one-line errors for bad spaces, and chosen settings that reproduce."""
import importlib.metadata
import json
import os
import pickle
import signal
import subprocess
import sys
import tomllib
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement

# Before the suite's tuning modules, which import Optuna: without it the file is skipped, not a collection error
# that stops `pytest -m cuda` (a bare GPU machine has no Optuna). Hence the imports below it (ruff: E402).
# ruff: noqa: E402
optuna = pytest.importorskip("optuna")

import run_all
from recbench.benchmarks import tune, worker
from recbench.benchmarks.config import resolve, toml_value
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.trainer import TrainSettings, Validation
from recbench.benchmarks.tuning.pruning import TrialReporter, open_storage
from recbench.benchmarks.tuning.space import declared_space
from recbench.benchmarks.tuning.study import Context, SearchSettings, Study, default_values
from recbench.models import model_names
from recbench.reports import generate_report
from tests.helpers import ROOT, dask_cluster, wait_for


def test_the_installed_optuna_is_in_the_range_pyproject_states():
    """The suite states the Optuna versions it supports (pyproject.toml); the tests run on one of them, so a new
    major release is not used untried (the tuning tests passed on the range's first and last: 3.6.2 and 5.0.0)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    stated = next(Requirement(text) for text in project["dependencies"] if text.startswith("optuna"))
    installed = importlib.metadata.version("optuna")
    assert stated.specifier and stated.specifier.contains(installed), (installed, stated)


FAST = ["--budget-epochs", "6", "--threads", "1", "--quiet", "--no-report"]  # BPR-MF: about a CPU-second a trial


def tune_cli(tmp_path, *argv, output="out"):
    """``python -m benchmarks.tune`` in this process; returns its exit code."""
    return tune.main([*argv, "--output", str(tmp_path / output), "--cache-dir", str(tmp_path / "cache")])


def study(folder, name="tune-synthetic-bprmf"):
    return optuna.load_study(study_name=name, storage=open_storage(f"sqlite:///{folder / 'tuning.db'}"))


def trained(trials) -> list:
    """The trials that trained (neither reused another's result nor were interrupted)."""
    return [t for t in trials if t.state.is_finished() and "reused_from" not in t.user_attrs
            and not t.user_attrs.get("interrupted") and "seconds" in t.user_attrs]


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    """The issue's command, three trials of BPR-MF on synthetic data, with every evaluation and training logged:
    ``(folder, calls)``, calls in order: ("evaluate", split), ("train", study label), ("final", None)."""
    folder = tmp_path_factory.mktemp("tune")
    calls = []
    original_evaluate, original_train = Evaluator.evaluate, worker.train_and_test

    def evaluate(self, model, split, *args, **kwargs):
        calls.append(("evaluate", split))
        return original_evaluate(self, model, split, *args, **kwargs)

    def train_and_test(payload, *args, **kwargs):
        calls.append(("train", payload.planned.job.study))
        return original_train(payload, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Evaluator, "evaluate", evaluate)
        patch.setattr(worker, "train_and_test", train_and_test)
        code = tune_cli(folder, "--datasets", "synthetic", "--models", "bprmf", "--trials", "3", "--threads", "1",
                        "--quiet")
    assert code == 0
    return folder / "out", calls


def test_a_search_computes_no_test_metric_before_the_final_runs(search):
    folder, calls = search
    trials = [call for call in calls if call == ("train", "tuning")]
    assert len(trials) == 1 + 3 + 2  # the defaults' trial, three more, the tuned and the default final runs
    first_test = calls.index(("evaluate", "test"))
    assert calls[:first_test].count(("train", "tuning")) == 5  # every trial, and the first final run, trained
    assert ("evaluate", "valid") in calls[:first_test]
    assert {split for kind, split in calls if kind == "evaluate"} == {"valid", "test"}
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    assert sorted((row["variant"], row["protocol"]) for row in rows) == [
        ("default", "full"), ("default", "pop100"), ("tuned", "full"), ("tuned", "pop100")]
    assert all(row["split"] == "test" for row in rows)
    assert [t.state.name for t in study(folder).trials] == ["COMPLETE"] * 4


def test_the_same_command_with_resume_runs_nothing_again(search, tmp_path, monkeypatch):
    folder, _ = search
    ran = []
    monkeypatch.setattr(worker, "train_and_test", lambda *args, **kwargs: ran.append(args) or ([], {}, False))
    def settings():  # the chosen settings, without the header's command line
        return [line for line in (folder / "tuned.toml").read_text().splitlines() if not line.startswith("# command")]

    before = settings()
    code = tune.main(["--datasets", "synthetic", "--models", "bprmf", "--trials", "3", "--threads", "1", "--quiet",
                      "--output", str(folder), "--cache-dir", str(folder.parent / "cache"), "--resume"])
    assert code == 0 and ran == []
    assert len(study(folder).trials) == 4 and settings() == before
    # without --resume an existing study is an error rather than a silent second search
    assert tune.main(["--datasets", "synthetic", "--models", "bprmf", "--trials", "3", "--quiet",
                      "--output", str(folder), "--cache-dir", str(folder.parent / "cache")]) == 2


def test_the_chosen_settings_reproduce_the_best_trial_through_run_all(search, tmp_path):
    folder, _ = search
    best = max(study(folder).get_trials(states=(optuna.trial.TrialState.COMPLETE,)), key=lambda t: t.value)
    (summary,) = json.loads((folder / "tuning.json").read_text())["studies"]
    code = run_all.main(["--datasets", "synthetic", "--models", "bprmf", "--config", str(folder / "tuned.toml"),
                         "--threads", "1", "--protocols", "full", "--output", str(tmp_path / "again"), "--quiet",
                         "--no-report", "--cache-dir", str(tmp_path / "cache")])
    assert code == 0
    (row,) = [json.loads(line) for line in (tmp_path / "again" / "results.jsonl").read_text().splitlines()]
    assert row["best_valid"] == best.value  # the same number, not a close one
    assert row["tuned_from"]["trial"] == best.number and row["tuned_from"]["study"] == "tune-synthetic-bprmf"
    assert row["tuned_from"]["storage"].endswith("tuning.db")
    assert {name: row["hyperparameters"][name] for name in ("hidden", "reg", "sample_alpha")} == \
        {name: summary["best"]["params"][name] for name in ("hidden", "reg", "sample_alpha")}
    # the summary gives the best trial's every searched value (the defaults' trial's parameters are those inside
    # the space only)
    assert summary["best"]["number"] == best.number
    assert all(summary["best"]["params"][name] == value for name, value in best.params.items())


def test_the_report_has_a_tuning_section_with_holm_corrected_marks(search):
    folder, _ = search
    report = generate_report(folder).read_text()
    assert "Tuning studies (validation split)" in report and "Parameter importance" in report
    assert "Default against tuned settings, protocol pop100" in report
    assert "Holm's correction for the 6 comparisons of this table" in report
    assert (folder / "figures" / "tuning_best_so_far.png").exists()


def test_trials_with_equal_settings_run_once(tmp_path):
    """Two points in the space, five trials, two parallel workers: two trainings; the rest reuse or wait (and the
    defaults' trial, d = 64, trains). No pruner: which trial the median stops depends on the workers' timing."""
    argv = ["--datasets", "synthetic", "--models", "bprmf", "--trials", "5", "--jobs", "2", "--no-final",
            "--pruner", "none", "--space", "hidden=[8, 16]",
            *(f"--space={name}=none" for name in ("lr", "reg", "sample_alpha")), *FAST]
    assert tune_cli(tmp_path, *argv) == 0
    trials = study(tmp_path / "out").trials
    assert len(trials) == 6 and all(t.state.name == "COMPLETE" for t in trials)
    assert sorted(t.params.get("hidden", 64) for t in trained(trials)) == [8, 16, 64]
    for trial in trials:
        source = next(t for t in trained(trials) if t.params == trial.params)
        assert trial.value == source.value and trial.user_attrs["key"] == source.user_attrs["key"]


def test_a_model_of_the_users_own_is_tuned_by_its_import_path(tmp_path, own):
    # A model outside the suite has no [search] table of ours: its space comes from --space.
    model = own.model
    assert tune_cli(tmp_path, "--datasets", "synthetic", "--models", model, "--trials", "2", "--space",
                    "hidden=[8, 12]", "--sampler", "grid", *FAST) == 0
    trials = study(tmp_path / "out", f"tune-synthetic-{model}").trials
    # the defaults' trial (its TOML's d = 12, inside the space), then the grid's points, 12 reusing its result
    assert [t.params["hidden"] for t in trials][0] == 12 and trials[0].user_attrs["defaults"]
    assert sorted(t.params["hidden"] for t in trials[1:]) == [8, 12] and len(trained(trials)) == 2
    tuned = tomllib.loads((tmp_path / "out" / "tuned.toml").read_text())
    assert tuned[model]["model"]["synthetic"]["hidden"] in (8, 12)
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    finals = [row for row in rows if row["study"] == "tuning" and row["split"] == "test"]
    assert {row["variant"] for row in finals} == {"tuned", "default"}
    assert all(row["model_source"]["import_path"] == model for row in finals)


def test_the_grid_sampler_runs_every_point_of_the_grid_to_the_end(tmp_path, capsys):
    argv = ["--datasets", "synthetic", "--models", "bprmf", "--sampler", "grid", "--no-final", "--space",
            "hidden=[8, 16]", "--space", "reg=[0.01, 0.001]", "--space", "lr=none", "--space", "sample_alpha=none",
            "--budget-epochs", "2", "--threads", "1", "--quiet", "--no-report"]
    assert tune_cli(tmp_path, *argv) == 0
    defaults, *grid = study(tmp_path / "out").trials
    assert sorted((t.params["hidden"], t.params["reg"]) for t in grid) == [(8, 0.001), (8, 0.01), (16, 0.001),
                                                                           (16, 0.01)]
    assert defaults.user_attrs["defaults"] and defaults.params == {}  # d = 64, reg = 1e-5: outside the grid
    assert "[trial 5/5]" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--space", "hiden=[8, 16]"], "error: --space 'hiden=[8, 16]': unknown field 'hiden'; expected one of "),
    (["--space", "bprmf:dropout=[0.1]"], "error: --space 'bprmf:dropout=[0.1]': bprmf has no field 'dropout' to "
                                         "search"),
    (["--space", "hidden=[]"], "error: bprmf: --space 'hidden=[]': an empty range; give at least one value"),
    (["--space", "lr={low=1e-2, high=1e-4}"], "error: bprmf: --space 'lr={low=1e-2, high=1e-4}': an empty range "
                                              "(low 0.01 > high 0.0001)"),
    (["--space", "reg=[-1.0, 0.1]"], "error: bprmf: --space 'reg=[-1.0, 0.1]': reg=-1.0 must be >= 0"),
    (["--space", "hidden=[8, 2.5]"], "error: bprmf: --space 'hidden=[8, 2.5]': hidden=2.5 must be an integer"),
    (["--space", "lr={low=1e-4}"], "error: bprmf: --space 'lr={low=1e-4}': a range is {low = ..., high = ...}, "
                                   "optionally with log = true or a step"),
    (["--set", "hidden=32"], "error: bprmf: benchmarks/configs/bprmf.toml [search]: hidden=[16, 32, 64, 128, 256]: "
                             "hidden is also fixed by --set; search it or fix it, not both"),
    (["--budget-epochs", "0"], "error: bprmf: max_epochs=0 must be >= 1"),
    (["--sampler", "grid"], "error: bprmf: the grid sampler needs values, not ranges (lr={low=0.0001, high=0.01, "
                            "log=true}): give a list or a step with --space, or leave the field out with --space "
                            "FIELD=none"),
    (["--models", "pop"], "error: pop: has no training, so nothing to tune"),
])
def test_every_bad_space_is_one_line_before_any_trial(argv, message, tmp_path, capsys):
    models = [] if "--models" in argv else ["--models", "bprmf"]
    code = tune_cli(tmp_path, "--datasets", "synthetic", *models, *argv, "--quiet")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(message), err
    assert not (tmp_path / "out").exists()


def test_a_config_file_narrows_the_space_and_tied_settings_follow_d_and_rho(tmp_path, capsys):
    overlay = tmp_path / "space.toml"
    overlay.write_text("[bert4rec.search]\nhidden = [16, 128]\nmask_proportion = [0.6]\n")
    code = tune_cli(tmp_path, "--datasets", "synthetic", "--models", "bert4rec", "sasrec", "--config", str(overlay),
                    "--dry-run", "--quiet")
    out = capsys.readouterr().out
    assert code == 0 and "    hidden=[16, 128]    (" in out and "heads = max(1, hidden // 32)    (tied)" in out
    from recbench.benchmarks.config import read_overlay
    from recbench.models import model_names

    tables = read_overlay(overlay, model_names())
    space = declared_space("bert4rec", "ml-1m", [tables], config_files=[overlay])
    base = resolve("bert4rec", "ml-1m", "paper")
    assert space.overrides({"hidden": 16, "mask_proportion": 0.6}, base) == (
        "hidden=16", "mask_proportion=0.6", "heads=1", "max_predictions=120")  # ⌈0.6 · 200⌉
    assert "heads=4" in space.overrides({"hidden": 128}, base)
    assert "heads=2" not in declared_space("sasrec", "ml-1m").overrides({"hidden": 64}, resolve("sasrec", "ml-1m"))
    assert declared_space("bert4rec", "ml-1m", specs=["hidden=[64]"]).overrides({"hidden": 64}, base, {"heads"}) \
        == ("hidden=64",)  # a head count the user set is left alone


def test_the_trial_reporter_pickles_and_prunes_a_trial_below_the_median(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    made = optuna.create_study(study_name="s", storage=open_storage(url), direction="maximize")
    for value in (0.1, 0.2, 0.3, 0.4):
        trial = made.ask()
        for epoch in (1, 2, 3):
            trial.report(value * epoch, epoch)
        made.tell(trial, value * 3)
    good, bad = (pickle.loads(pickle.dumps(TrialReporter(url, "s", made.ask().number, "median", first_epoch=2)))
                 for _ in range(2))

    def shown(epoch, value):
        return Validation(epoch, epoch * 10, {"NDCG@10": value}, value, value, improved=True)

    assert bad(shown(1, 0.0)) is None  # the pruner acts from the first epoch it is given on
    assert bad(shown(2, 0.45)) == "pruned"  # below the median of 0.2, 0.4, 0.6, 0.8 at epoch 2
    assert good(shown(2, 0.9)) is None and good(shown(3, 1.3)) is None
    assert [t.intermediate_values for t in made.trials[4:]] == [{2: 0.9, 3: 1.3}, {1: 0.0, 2: 0.45}]
    assert pickle.loads(pickle.dumps(good))._trial is None  # only names travel


def test_the_defaults_trial_reports_its_curve_but_is_never_pruned(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    made = optuna.create_study(study_name="s", storage=open_storage(url), direction="maximize")
    for value in (0.1, 0.2, 0.3, 0.4):
        trial = made.ask()
        trial.report(value, 2)
        made.tell(trial, value)
    low = Validation(2, 20, {"NDCG@10": 0.0}, 0.0, 0.0, improved=True)  # below every earlier trial at epoch 2
    kept = TrialReporter(url, "s", made.ask().number, "median", first_epoch=2, prunable=False)
    assert kept(low) is None and made.trials[4].intermediate_values == {2: 0.0}
    assert TrialReporter(url, "s", made.ask().number, "median", first_epoch=2)(low) == "pruned"


@pytest.mark.parametrize("model", [name for name in model_names() if declared_space(name, "ml-1m").dimensions])
def test_every_declared_space_asks_for_the_defaults_first(model, tmp_path):
    """The paper profile on ML-1m, where the paper's ℓ2 grid leaves out 10 of 13 models' own ℓ2: each study's
    first trial is the defaults', with every default that lies inside the space as its parameters."""
    space = declared_space(model, "ml-1m")
    context = Context(RunOptions(output=tmp_path, profile="paper"), SearchSettings(),
                      f"sqlite:///{tmp_path / 'tuning.db'}", SimpleNamespace(parallelism=1), {}, [], "commit")
    made = Study(context, "ml-1m", model, space)
    made.open()
    trial = made.optuna.ask(made._distributions())
    assert trial.user_attrs == {"defaults": True} and made.target == 20 + 1
    defaults = default_values(space, resolve(model, "ml-1m", "paper"))
    assert space.values(trial.params) == {name: value for name, value in defaults.items()
                                          if space.dimensions[name].contains(value)}


@pytest.mark.slow  # about a minute: one epoch of two trials for each of 13 models on the synthetic data
def test_every_declared_space_finishes_the_defaults_trial_and_chooses_no_worse(tmp_path):
    models = [name for name in model_names() if declared_space(name, "synthetic").dimensions]
    assert tune_cli(tmp_path, "--datasets", "synthetic", "--models", *models, "--trials", "1", "--sampler", "random",
                    "--pruner", "none", "--budget-epochs", "1", "--no-final", "--threads", "1", "--quiet",
                    "--no-report") == 0
    tuned = tomllib.loads((tmp_path / "out" / "tuned.toml").read_text())
    for model in models:
        trials = study(tmp_path / "out", f"tune-synthetic-{model}").trials
        defaults = defaults_trial(trials)
        assert defaults.state.name == "COMPLETE" and len(trials) == 2, model
        chosen = tuned[model]["tuned_from"]["synthetic"]
        finished = [t.value for t in trials if t.value is not None]
        assert chosen["value"] >= defaults.value and chosen["value"] == max(finished)


def defaults_trial(trials):
    (found,) = [trial for trial in trials if trial.user_attrs.get("defaults")]
    return found


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid"])
def test_the_defaults_are_a_finished_trial_and_the_choice_is_never_below_them(sampler, tmp_path):
    """Issue 29: the paper's ℓ2 grid leaves out BPR-MF's own reg = 1e-5, the defaults' trial was dropped, and the
    search chose settings below the defaults on its own criterion. Here the space's points (reg 1 and 0.1, d = 8)
    are all below the defaults; the defaults are a finished trial that ran the defaults as they are, the choice is
    the best finished trial, and (with the final runs) the default final run trains to the same validation value."""
    final = [] if sampler == "tpe" else ["--no-final"]
    argv = ["--datasets", "synthetic", "--models", "bprmf", "--sampler", sampler, "--trials", "2", "--space",
            "reg=[1.0, 0.1]", "--space", "hidden=[8]", "--space", "lr=none", "--space", "sample_alpha=none",
            "--pruner", "hyperband", *final, *FAST]
    assert tune_cli(tmp_path, *argv) == 0
    trials = study(tmp_path / "out").trials
    defaults = defaults_trial(trials)
    assert len(trials) == 3 and defaults.state.name == "COMPLETE" and defaults.params == {}
    assert defaults.user_attrs["overrides"] == ["max_epochs=6"]  # no searched value: the defaults as they are
    searched = [t.value for t in trials if t is not defaults and t.state.name == "COMPLETE"]
    assert searched and max(searched) < defaults.value  # what the old search chose from
    chosen = tomllib.loads((tmp_path / "out" / "tuned.toml").read_text())["bprmf"]
    assert chosen["tuned_from"]["synthetic"]["value"] == defaults.value >= max(searched)
    assert chosen["model"]["synthetic"]["reg"] == 1e-5
    if not final:
        rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
        assert {row["best_valid"] for row in rows if row["variant"] == "default"} == {defaults.value}


def test_a_search_says_what_profile_and_budget_its_settings_are_tuned_for(search, capsys):
    folder, _ = search
    header = (folder / "tuned.toml").read_text().split("\n[")[0]
    assert "# Tuned for the smoke profile's training (per-trial budget: the profile's own)" in header
    assert tomllib.loads((folder / "tuned.toml").read_text())["bprmf"]["tuned_from"]["synthetic"]["profile"] == "smoke"
    assert tune_cli(folder.parent, "--datasets", "synthetic", "--models", "bprmf", "--budget-epochs", "4",
                    "--dry-run", output="dry") == 0
    out = capsys.readouterr().out
    assert out.startswith("profile smoke: every trial and final run trains under the smoke profile's settings with "
                          "max_epochs=4, so the chosen settings are the best for that budget")
    assert "    and the defaults' trial: hidden=64 reg=1e-05 lr=0.005 sample_alpha=0.0\n" in out


def test_a_cpu_seconds_budget_stops_training(tmp_path):
    from recbench.benchmarks.trainer import Trainer
    from recbench.datasets import load_dataset
    from recbench.datasets.sequences import LeaveOneOutSplit
    from recbench.models import model_class

    split = LeaveOneOutSplit(load_dataset("synthetic", cache_dir=tmp_path))
    config = resolve("bprmf", "synthetic", "smoke").model
    model = model_class("bprmf")(split.data.n_users, split.data.n_items, config)
    settings = TrainSettings(max_epochs=10_000, batch_size=64, cpu_budget_s=0.5, patience=None)
    report = Trainer(settings).fit(model, split.train(), None)
    assert report.stopped_by == "cpu budget" and report.epochs_run < 10_000
    with pytest.raises(ValueError, match="cpu_budget_s=0 must be > 0"):
        TrainSettings(cpu_budget_s=0)
    assert toml_value(None) == '"none"' and toml_value((64, 32)) == "[64, 32]" and toml_value("a\"b") == '"a\\"b"'


# ------------------------------------------------------------------------------------ separate processes

def tune_process(tmp_path, *argv):
    """``python -m benchmarks.tune`` in a new process group; its output in ``tmp_path/out.log``."""
    env = {**os.environ, "RECBENCH_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "out.log", "a")
    return subprocess.Popen([sys.executable, "-m", "benchmarks.tune", *argv, "--output", str(tmp_path / "out")],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_killing_the_driver_mid_search_then_resume_loses_and_duplicates_nothing(tmp_path):
    argv = ["--datasets", "synthetic", "--models", "bprmf", "--trials", "6", "--pruner", "none", "--no-final",
            "--budget-epochs", "10", "--threads", "1", "--quiet"]
    process = tune_process(tmp_path, *argv)
    log = tmp_path / "out.log"
    wait_for(lambda: log.read_text().count("[trial ") >= 2, process)
    # Kill it while a trial runs (its job's claim exists from its start to its end): a kill between two trials
    # would leave the interrupted-trial checks below with nothing to check (issue 29).
    while True:
        os.kill(process.pid, signal.SIGSTOP)
        if any((tmp_path / "out" / "checkpoints").glob("*.claim")):
            break
        os.kill(process.pid, signal.SIGCONT)
        wait_for(lambda: any((tmp_path / "out" / "checkpoints").glob("*.claim")), process)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    before = {t.number: (t.value, t.datetime_complete) for t in study(tmp_path / "out").trials
              if t.state.name == "COMPLETE"}
    assert len(before) >= 2
    again = tune_process(tmp_path, *argv, "--resume")
    assert again.wait(timeout=300) == 0, log.read_text()
    trials = study(tmp_path / "out").trials
    after = {t.number: (t.value, t.datetime_complete) for t in trials if t.state.name == "COMPLETE"}
    assert {number: after[number] for number in before} == before  # nothing lost, nothing redone
    assert len(after) == 7  # the defaults' and six more; the interrupted trial does not count, it ran again
    interrupted = [t for t in trials if t.user_attrs.get("interrupted")]
    assert len(interrupted) == 1 and interrupted[0].state.name == "FAIL"
    retried = {t.user_attrs["retry_of"]: t for t in trials if "retry_of" in t.user_attrs}
    assert sorted(retried) == sorted(t.number for t in interrupted)
    # queued with the settings it had (a driver killed while Optuna drew them may have left only some)
    assert all(retried[t.number].params[name] == value for t in interrupted for name, value in t.params.items())
    keys = [t.user_attrs["key"] for t in trained(trials)]
    assert len(keys) == len(set(keys))  # no settings trained twice


@pytest.mark.slow  # half a minute: a cluster to start (the grid's Dask test covers the executor in the default tier)
def test_a_dask_cluster_on_this_machine_runs_a_search(tmp_path):
    pytest.importorskip("distributed")
    with dask_cluster({"RECBENCH_CACHE_DIR": str(tmp_path / "cache")}) as address:
        code = tune_cli(tmp_path, "--datasets", "synthetic", "--models", "bprmf", "--trials", "4", "--no-final",
                        "--dask-scheduler", address, "--budget-epochs", "6", "--quiet", "--no-report")
    assert code == 0
    trials = study(tmp_path / "out").trials
    assert len(trials) == 5 and all(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
    assert all(t.intermediate_values for t in trained(trials))  # the workers reported to the shared study
    assert (tmp_path / "out" / "tuned.toml").exists()
