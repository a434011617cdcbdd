"""The BERT4Rec probes (benchmarks/experiments/bert4rec_probes.py): each probe changes exactly the settings it names
against the converge profile, a misspelt or ineffective setting is refused before anything runs, and a rehearsal
writes the summary a device would bring back."""
import json
import tarfile

import pytest

from benchmarks.experiments import bert4rec_probes
from recbench.benchmarks.config import ConfigError
from recbench.reports import names


def test_every_probe_changes_what_it_says_and_nothing_else():
    expected = {"fp32": {}, "bf16": {"precision": ("fp32", "bf16")},
                "dropout-0.1": {"dropout": (0.2, 0.1), "attention_dropout": (0.2, 0.1)},
                "cloze-only": {"mask_last": (True, False)}, "positions-end": {"positions": ("start", "end")},
                "no-overlap": {"window_step": (0.5, 1.0)}, "no-weight-decay": {"weight_decay": (0.01, 0.0)},
                "linear-decay": {"decay": ("none", "linear"), "max_steps": (None, 20000)},
                "copies-10": {"dupe_factor": (1, 10), "patience": (20, 2)},
                "wo-rc": {"use_residual": (True, False), "dropout": (0.2, 0.1), "attention_dropout": (0.2, 0.1)},
                "wo-rc-lr1e-4": {"use_residual": (True, False), "dropout": (0.2, 0.1), "attention_dropout": (0.2, 0.1),
                                 "lr": (0.001, 0.0001)},
                "batch-64": {"batch_size": (128, 64), "dropout": (0.2, 0.1), "attention_dropout": (0.2, 0.1)}}
    found = {probe.name: {name: (change["profile"], change["probe"])
                          for name, change in bert4rec_probes.changed(probe, "ml-1m").items()}
             for probe in bert4rec_probes.PROBES}
    assert found == expected


def test_a_probe_that_changes_nothing_or_names_no_setting_is_refused():
    same = bert4rec_probes.Probe("same", "the profile's own dropout", ("bert4rec:dropout=0.2",))
    with pytest.raises(ConfigError, match="probe same: bert4rec:dropout=0.2 leave"):
        bert4rec_probes.changed(same, "ml-1m")
    with pytest.raises(ConfigError, match="droput"):
        bert4rec_probes.changed(bert4rec_probes.Probe("typo", "", ("bert4rec:droput=0.1",)), "ml-1m")


def test_the_dry_run_prints_each_probes_command_and_starts_nothing(tmp_path, capsys):
    assert bert4rec_probes.main(["--out", str(tmp_path / "out"), "--data-dir", "DATA", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("run_all.py --datasets ml-1m --models bert4rec --profile converge") == len(
        bert4rec_probes.PROBES)
    assert "--seeds 0 1 --jobs 2" in printed and "--set bert4rec:mask_last=false" in printed
    assert not (tmp_path / "out").exists() and "--output WORK_DIR/cloze-only" in printed
    assert bert4rec_probes.main(["--out", str(tmp_path / "out"), "--dry-run", "--only", "dropout-0.1", "--seeds", "0",
                                 "1", "--dataset", "beauty"]) == 0
    printed = capsys.readouterr().out
    assert "dropout-0.1: {'dropout': {'profile': 0.5, 'probe': 0.1}, 'attention_dropout': {'profile': 0.2" in printed
    assert "--datasets beauty --models bert4rec --profile converge --seeds 0 1 --jobs 2" in printed


@pytest.mark.slow
def test_a_rehearsal_on_synthetic_data_writes_the_summary_and_the_archive_and_nothing_else(tmp_path, capsys):
    out = tmp_path / "out"
    assert bert4rec_probes.main(["--dataset", "synthetic", "--out", str(out), "--work-dir", str(tmp_path / "runs"),
                                 "--device", "cpu", "--budget-s", "2", "--only", "cloze-only"]) == 0
    # A lent device returns at most 8 files: the runs' folders stay in the work folder.
    assert sorted(path.name for path in out.rglob("*")) == ["probes.json", "probes.tar.gz"]
    assert "cloze-only: seed 0, " in capsys.readouterr().out
    report = json.loads((out / "probes.json").read_text())
    assert report["what"].startswith(f"BERT4Rec on {names.dataset_name('synthetic')} under")  # not the ML-1m default
    (probe,) = report["probes"]
    assert probe["changed"] == {"mask_last": {"profile": True, "probe": False}} and probe["exit"] == 0
    (seed,) = probe["seeds"]
    assert seed["seed"] == 0 and seed["stopped_by"] in ("time budget", "early stopping")
    assert 0 <= seed["full NDCG@10"] <= seed["full HR@10"] <= 1
    with tarfile.open(out / "probes.tar.gz") as archive:
        assert set(archive.getnames()) == {"cloze-only/results.jsonl", "cloze-only/manifest.jsonl", "cloze-only.log"}
