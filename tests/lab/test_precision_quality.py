"""bf16 against fp32 in quality (benchmarks/experiments/precision_quality.py): the figures are the rows' own, the
verdict follows the stated rule, and folders that differ in more than precision are refused in one line."""
import json

import numpy as np
import pytest

import run_all
from benchmarks.experiments import precision_quality
from recbench.benchmarks import provenance
from recbench.benchmarks.store import read_results

# SASRec, small: its matrix products are what bf16 autocast changes (BPR-MF's elementwise scores stay fp32)
JOBS = ["--models", "pop", "sasrec", "--seeds", "0", "1", "--set", "time_budget_s=none", "--set", "sasrec:max_len=20",
        "--set", "sasrec:hidden=16", "--set", "sasrec:max_epochs=2", "--quiet", "--no-report"]


def run(tmp_path, monkeypatch, name, flags, *settings):
    """The two seeds of SASRec (and POP) on the synthetic data into tmp_path/name, on a CPU with ``flags``."""
    monkeypatch.setattr(provenance, "cpu_flags", lambda cpuinfo=None: flags)
    assert run_all.main([*JOBS, *settings, "--output", str(tmp_path / name), "--cache-dir",
                         str(tmp_path / "cache")]) == 0
    return tmp_path / name


def test_each_figure_is_the_rows_own_and_the_verdict_follows_the_rule(tmp_path, monkeypatch, capsys):
    fp32 = run(tmp_path, monkeypatch, "fp32", set())
    bf16 = run(tmp_path, monkeypatch, "bf16", {"amx_bf16"}, "--set", "precision=bf16")
    assert precision_quality.main([str(fp32), str(bf16), "--output", str(tmp_path / "ref")]) == 0
    report = json.loads((tmp_path / "ref" / "precision-quality-synthetic.json").read_text())
    (model,) = report["models"]  # POP trains nothing: no precision to compare
    assert model["model"] == "sasrec" and model["seeds"] == [0, 1]
    rows = {name: {(row["seed"], row["protocol"]): row for row in read_results(folder / "results.jsonl")
                   if row["model"] == "sasrec"}
            for name, folder in (("fp32", fp32), ("bf16", bf16))}
    assert {row["precision"] for row in rows["bf16"].values()} == {"bf16"}
    assert rows["bf16"][0, "full"]["metrics"] != rows["fp32"][0, "full"]["metrics"]  # bf16 products really ran
    verdicts = []
    for entry in model["quality"]:
        per_seed = {name: [rows[name][seed, entry["protocol"]]["metrics"][entry["metric"]] for seed in (0, 1)]
                    for name in rows}
        assert entry["fp32_per_seed"] == per_seed["fp32"] and entry["bf16_per_seed"] == per_seed["bf16"]
        difference = np.mean(per_seed["bf16"]) - np.mean(per_seed["fp32"])
        spread = max(abs(values[0] - values[1]) for values in per_seed.values())
        assert entry["difference"] == pytest.approx(difference) and entry["seeds_spread"] == pytest.approx(spread)
        assert entry["within_spread"] == (abs(difference) <= spread)
        assert entry["paired_test"]["users"] == rows["fp32"][0, entry["protocol"]]["users_evaluated"]
        if entry["metric"] == "NDCG@10":
            verdicts.append(entry["within_spread"])
    assert model["as_good"] == all(verdicts) and len(verdicts) == 2  # pop100 and full
    training = model["training"]["bf16"]["0"]
    assert training["epochs_run"] == 2 and training["wall_seconds_per_step"] > 0
    assert "sasrec (seeds 0, 1): as good:" in capsys.readouterr().out


def test_a_bf16_folder_that_fell_back_to_fp32_or_changed_a_setting_is_refused_in_one_line(tmp_path, monkeypatch):
    fp32 = run(tmp_path, monkeypatch, "fp32", set())
    fell_back = run(tmp_path, monkeypatch, "fell-back", {"avx2"}, "--set", "precision=bf16")
    with pytest.raises(SystemExit, match=r"fell-back: sasrec seed 0 trained in fp32, not bf16 \(this CPU has no "
                                         r"native bf16.*: nothing to compare$"):
        precision_quality.main([str(fp32), str(fell_back), "--output", str(tmp_path / "ref")])
    other = run(tmp_path, monkeypatch, "other", {"amx_bf16"}, "--set", "precision=bf16", "--set", "sasrec:lr=0.01")
    with pytest.raises(SystemExit, match=r"^sasrec seed 0: the fp32 and bf16 runs differ in train_settings.lr, not "
                                         r"only in precision"):
        precision_quality.main([str(fp32), str(other), "--output", str(tmp_path / "ref")])
    with pytest.raises(SystemExit, match=r"nowhere is not a folder; pass the results folder of a run"):
        precision_quality.main([str(fp32), str(tmp_path / "nowhere"), "--output", str(tmp_path / "ref")])
    assert not (tmp_path / "ref").exists()  # nothing written for a refused comparison
