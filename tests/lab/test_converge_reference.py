"""The reproduction's reference files: what a shorter patience would have given, read off a run's own curve."""
from types import SimpleNamespace

import pytest

from benchmarks.experiments.converge_reference import paper_value, shorter_patience
from recbench.reports.published import load_published
from recbench.reports.results import Row

# Validation NDCG@10 per epoch, validated every epoch but the second (valid_every-style gaps are skipped).
CURVE = [{"epoch": 1, "valid_NDCG@10": 0.1}, {"epoch": 2}, {"epoch": 3, "valid_NDCG@10": 0.3},
         {"epoch": 4, "valid_NDCG@10": 0.2}, {"epoch": 5, "valid_NDCG@10": 0.3},  # equal is no new best
         {"epoch": 6, "valid_NDCG@10": 0.35}, {"epoch": 7, "valid_NDCG@10": 0.3}, {"epoch": 8, "valid_NDCG@10": 0.3},
         {"epoch": 9, "valid_NDCG@10": 0.34}]


def test_a_shorter_patience_stops_where_the_trainers_rule_would_have():
    # patience 2: epochs 4 and 5 are not better than .3 (epoch 3), so the run ends at epoch 5 with epoch 3's weights
    assert shorter_patience(CURVE, "NDCG@10", 2) == {"stop_epoch": 5, "best_epoch": 3, "best_valid": 0.3}
    # patience 3: epoch 6 is a new best before the third miss; epochs 7, 8, 9 then end it
    assert shorter_patience(CURVE, "NDCG@10", 3) == {"stop_epoch": 9, "best_epoch": 6, "best_valid": 0.35}
    assert shorter_patience(CURVE, "NDCG@10", 4) is None  # never four misses in a row: it would have run on
    assert shorter_patience(CURVE, "HR@10", 1) is None  # a metric the curve does not hold


def test_it_agrees_with_the_trainer_run_with_that_patience():
    from tests.test_trainer import new_model, scripted_validator, toy_split, trainer

    values = [0.1, 0.3, 0.2, 0.3, 0.35, 0.3, 0.3, 0.34, 0.2, 0.2]
    longer = trainer(patience=5, max_epochs=10).fit(new_model(), toy_split().train(), scripted_validator(values)[0])
    for patience in (1, 2, 3):
        short = trainer(patience=patience, max_epochs=10).fit(new_model(), toy_split().train(),
                                                               scripted_validator(values)[0])
        assert short.stopped_by == "early stopping"
        assert shorter_patience(longer.curve, "NDCG@10", patience) == {
            "stop_epoch": short.epochs_run, "best_epoch": short.best_epoch, "best_valid": round(short.best_valid, 4)}


def test_a_folder_of_bf16_runs_is_refused_in_one_line_so_it_never_overwrites_the_fp32_reference(tmp_path,
                                                                                                 monkeypatch):
    import pytest

    import run_all
    from benchmarks.experiments import converge_reference
    from recbench.benchmarks import provenance

    monkeypatch.setattr(provenance, "cpu_flags", lambda cpuinfo=None: {"amx_bf16"})
    assert run_all.main(["--models", "sasrec", "--profile", "converge", "--set", "precision=bf16", "--set",
                         "sasrec:max_len=20", "--set", "sasrec:hidden=16", "--set", "sasrec:max_epochs=1",
                         "--output", str(tmp_path / "bf16"), "--cache-dir", str(tmp_path / "cache"), "--quiet",
                         "--no-report"]) == 0
    with pytest.raises(SystemExit, match=r"bf16: holds bf16 rows; .*\.precision_quality compares a bf16 folder"):
        converge_reference.main([str(tmp_path / "bf16"), "--output", str(tmp_path / "reference")])
    assert not (tmp_path / "reference").exists()


@pytest.mark.parametrize("model, dataset, expected", [
    ("caser", "ml-1m", (0.4268, "Table 2")),          # Table 2's Caser row on ML-1m
    ("caser", "beauty", (0.1360, "Table 2")),         # Table 2's Caser row on Beauty
    ("lstm", "ml-1m", (None, "not in the paper")),    # no row of the paper at all: never labelled Table 2
    ("sasrec-ce", "beauty", (None, "not in the paper")),
])
def test_the_reproduced_table_names_the_paper_row_only_where_the_paper_has_the_model(model, dataset, expected):
    row = Row(line=1, study="main", variant=None, sweep_param=None, sweep_value=None, dataset=dataset, model=model,
              task="next-item", protocol="pop100", seed=0, metrics={}, raw={"hyperparameters": {"hidden": 64}})
    assert paper_value(row, load_published()[0], "NDCG@10") == expected


@pytest.mark.parametrize("dataset, metric, expected", [
    ("ml-1m", "NDCG@10", (0.4759, "Table 5 (default)")),
    ("ml-1m", "HR@10", (0.6955, "Table 4 (N=200)")),   # Table 5 gives NDCG@10 only
    ("beauty", "HR@10", (0.3047, "Table 4 (N=50)")),
    ("steam", "HR@10", (None, "")),                    # Table 4 has no Steam column: no published HR@10
])
def test_bert4rec_at_d_64_takes_the_hr_that_table_5_lacks_from_table_4_at_the_datasets_n(dataset, metric, expected):
    published = load_published()[0]
    row = Row(line=1, study="main", variant=None, sweep_param=None, sweep_value=None, dataset=dataset,
              model="bert4rec", task="next-item", protocol="pop100", seed=0, metrics={},
              raw={"hyperparameters": {"hidden": 64}})
    assert paper_value(row, published, metric) == expected
    # the premise: Table 4's column at the dataset's N is Table 5's default configuration, the same NDCG@10
    if expected[1].startswith("Table 4"):
        column = expected[1][len("Table 4 ("):-1]
        ndcg = {(e.table, e.variant): e.value for e in published
                if (e.dataset, e.model, e.metric) == (dataset, "bert4rec", "NDCG@10")}
        assert ndcg[("Table 4", column)] == ndcg[("Table 5", "default")]


def test_a_folder_of_runs_off_the_profile_or_no_folder_at_all_is_refused_in_one_line(tmp_path):
    import run_all
    from benchmarks.experiments import converge_reference

    assert run_all.main(["--models", "sasrec", "--profile", "converge", "--set", "sasrec:max_len=20", "--set",
                         "sasrec:hidden=16", "--set", "sasrec:max_epochs=1", "--output", str(tmp_path / "off"),
                         "--cache-dir", str(tmp_path / "cache"), "--quiet", "--no-report"]) == 0
    with pytest.raises(SystemExit, match=r"off: rows trained with settings other than the converge profile's "
                                         r"\(sasrec seed 0: hidden, max_epochs, max_len\); the reproduction's"):
        converge_reference.main([str(tmp_path / "off"), "--output", str(tmp_path / "reference")])
    with pytest.raises(SystemExit, match=r"missing is not a folder; pass the results folder of a run"):
        converge_reference.main([str(tmp_path / "missing"), "--output", str(tmp_path / "reference")])
    assert not (tmp_path / "reference").exists()


def test_a_kept_probe_folder_is_restored_with_its_rows_and_a_resume_skips_its_jobs(tmp_path, capsys):
    """A probe's folder (settings off the profile) survives a lost work tree: --keep, then --restore."""
    import json

    import run_all
    from benchmarks.experiments import converge_reference
    from recbench.benchmarks.store import ResultStore

    probe = ["--models", "bprmf", "--profile", "converge", "--set", "bprmf:max_epochs=2", "--set", "bprmf:hidden=8",
             "--cache-dir", str(tmp_path / "cache"), "--quiet", "--no-report"]
    assert run_all.main([*probe, "--output", str(tmp_path / "probe-bprmf")]) == 0
    assert converge_reference.main(["--keep", str(tmp_path / "probe-bprmf"), "--output", str(tmp_path / "ref")]) == 0
    kept = json.loads((tmp_path / "ref" / "rows-probe-bprmf.json").read_text())
    original = ResultStore(tmp_path / "probe-bprmf").rows
    assert kept["rows"] == original and len(original) == 2
    (run,) = kept["invocations"]
    assert run["jobs"] == [original[0]["run_id"]]
    # the per-user files, which the report's paired tests read, are kept beside the reference and come back
    names = sorted(row["per_user_file"] for row in original)
    kept_copies = tmp_path / "ref" / "per-user" / "rows-probe-bprmf"
    assert sorted(path.name for path in kept_copies.iterdir()) == [name.split("/")[-1] for name in names]
    restored = tmp_path / "lost" / "probe-bprmf"
    assert converge_reference.main(["--restore", str(tmp_path / "ref" / "rows-probe-bprmf.json"), str(restored)]) == 0
    assert ResultStore(restored).rows == original
    for name in names:
        assert (restored / name).read_bytes() == (tmp_path / "probe-bprmf" / name).read_bytes()
    # a folder that lost one: kept again where its copy is, nothing is missing; kept elsewhere, it says so
    (tmp_path / "probe-bprmf" / names[0]).unlink()
    capsys.readouterr()
    assert converge_reference.main(["--keep", str(tmp_path / "probe-bprmf"), "--output", str(tmp_path / "ref")]) == 0
    assert "(2 rows; 1 per-user files kept)" in capsys.readouterr().out
    # a copy no row names any more (its job run again under another key) goes; the rows' own copies stay
    (kept_copies / "bprmf-of-an-older-key.npz").write_bytes(b"stale")
    assert converge_reference.main(["--keep", str(tmp_path / "probe-bprmf"), "--output", str(tmp_path / "ref")]) == 0
    assert "(2 rows; 1 per-user files kept, 1 of rows no longer in the reference removed)" in capsys.readouterr().out
    assert sorted(path.name for path in kept_copies.iterdir()) == [name.split("/")[-1] for name in names]
    assert converge_reference.main(["--keep", str(tmp_path / "probe-bprmf"), "--output", str(tmp_path / "new")]) == 0
    assert "(2 rows; 1 per-user files kept, 1 missing from the folder)" in capsys.readouterr().out
    capsys.readouterr()
    assert run_all.main([*probe, "--output", str(restored), "--resume", "--dry-run"]) == 0
    assert "skip (done)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"empty: no results.jsonl rows to keep; pass the results folder"):
        converge_reference.main(["--keep", str(tmp_path / "empty"), "--output", str(tmp_path / "ref")])


@pytest.mark.parametrize("dataset", ["ml-1m", "beauty"])
def test_a_restored_folder_gives_back_the_committed_reference_and_resume_skips_its_jobs(dataset, tmp_path):
    import json

    from benchmarks.experiments import converge_reference
    from recbench.benchmarks.store import ResultStore

    committed = converge_reference.ROOT / "results" / "reference" / f"converge-{dataset}.json"
    folder = tmp_path / f"converge-{dataset}"
    assert converge_reference.main(["--restore", str(committed), str(folder)]) == 0
    assert converge_reference.main([str(folder), "--output", str(tmp_path / "reference")]) == 0
    before, after = json.loads(committed.read_text()), json.loads((tmp_path / "reference" / committed.name).read_text())
    assert after["rows"] == before["rows"] and after["summary"] == before["summary"]
    assert after["invocations"] == before["invocations"]  # the restore's own manifest line is not an invocation
    store = ResultStore(folder)
    restored = [SimpleNamespace(key=row["key"], protocols=["full", "pop100"]) for row in before["rows"]]
    assert store.finished(restored) == {row["key"] for row in before["rows"]}
    with pytest.raises(SystemExit, match=rf"converge-{dataset} already holds results.jsonl; --restore fills a folder "):
        converge_reference.main(["--restore", str(committed), str(folder)])


def test_a_restore_after_the_run_started_keeps_the_runs_manifest_and_its_later_rows(tmp_path):
    """A fresh clone that launched ``run_all.py --resume`` before restoring: the run's own start line stays, the
    restored invocations come back in time order, and the run's row, written after the restore, is kept."""
    import json

    from benchmarks.experiments import converge_reference
    from recbench.benchmarks.store import ResultStore

    committed = converge_reference.ROOT / "results" / "reference" / "converge-ml-1m.json"
    before = json.loads(committed.read_text())
    folder = tmp_path / "converge-ml-1m"
    folder.mkdir()
    late = dict(before["rows"][0], key="k-new", run_id="r-new", seed=7)
    started = {"event": "start", "time": "2099-01-01T00:00:00+00:00", "command": ["run_all.py", "--resume"],
               "commit": "c0ffee", "jobs": [{"key": "k-new", "run_id": "r-new", "action": "run"}]}
    (folder / "manifest.jsonl").write_text(json.dumps(started) + "\n")
    assert converge_reference.main(["--restore", str(committed), str(folder)]) == 0
    assert json.loads((folder / "manifest.jsonl").read_text().splitlines()[0]) == started
    ResultStore(folder).commit("k-new", [late], {})
    found = converge_reference.invocations(folder, {row["key"] for row in before["rows"]} | {"k-new"})
    assert found[:-1] == before["invocations"]
    assert found[-1]["jobs"] == ["r-new"] and found[-1]["commit"] == "c0ffee"
    assert len(ResultStore(folder).rows) == len(before["rows"]) + 1


def test_the_table_keeps_every_dataset_with_a_reference_file_when_one_folder_is_rewritten(tmp_path):
    import shutil

    from benchmarks.experiments import converge_reference

    reference = converge_reference.ROOT / "results" / "reference"
    output = tmp_path / "reference"
    output.mkdir()
    for name in ("converge-beauty.json", "converge-ml-1m-caser-patience3.json"):  # the second is no dataset's file
        shutil.copy(reference / name, output / name)
    for chosen in reference.glob("chosen-on-validation-*.json"):  # rows chosen before: kept, their rule checked again
        shutil.copy(chosen, output / chosen.name)
    folder = tmp_path / "converge-ml-1m"
    converge_reference.main(["--restore", str(reference / "converge-ml-1m.json"), str(folder)])
    assert converge_reference.main([str(folder), "--output", str(output)]) == 0
    table = converge_reference.table_lines((output / "converge" / "reproduced.md").read_text())
    assert table == converge_reference.table_lines((reference / "converge" / "reproduced.md").read_text())
    assert [line.split("|")[1].strip() for line in table[2:]].index("ML-1m") > 0  # the paper's order: Beauty first


def test_writing_the_references_prints_the_table_and_touches_no_document(tmp_path, capsys):
    """The lab writes results files only: the table goes to the console and to results/reference/converge/, never
    into README.md or another document of the checkout."""
    from benchmarks.experiments import converge_reference

    reference = converge_reference.ROOT / "results" / "reference"
    documents = {path: path.stat().st_mtime_ns for path in converge_reference.ROOT.rglob("*.md")
                 if ".git" not in path.parts and not path.is_relative_to(converge_reference.ROOT / "results")}
    folder = tmp_path / "converge-ml-1m"
    converge_reference.main(["--restore", str(reference / "converge-ml-1m.json"), str(folder)])
    capsys.readouterr()
    assert converge_reference.main([str(folder), "--output", str(tmp_path / "reference")]) == 0
    printed = capsys.readouterr().out
    table = converge_reference.table_lines((tmp_path / "reference" / "converge" / "reproduced.md").read_text())
    assert "\n".join(table) in printed
    assert {path: path.stat().st_mtime_ns for path in documents} == documents


def test_restoring_from_a_file_that_is_no_reference_is_one_line(tmp_path):
    from benchmarks.experiments import converge_reference

    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(SystemExit, match=r"other.json: not a reference file of this module \(KeyError: "
                                         r"'invocations'\); pass results/reference/converge-<dataset>.json"):
        converge_reference.main(["--restore", str(tmp_path / "other.json"), str(tmp_path / "folder")])
    assert not (tmp_path / "folder").exists()


def test_restoring_into_a_folder_whose_results_are_not_json_names_the_line_to_fix(tmp_path):
    from benchmarks.experiments import converge_reference

    committed = converge_reference.ROOT / "results" / "reference" / "converge-ml-1m.json"
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "results.jsonl").write_text('{"model": "pop"}\n{"model": "sasr\n')  # a write cut short by hand
    with pytest.raises(SystemExit, match=r"folder/results.jsonl, line 2: not valid JSON \(.*\); fix or delete that "
                                         r"line"):
        converge_reference.main(["--restore", str(committed), str(folder)])
    assert (folder / "results.jsonl").read_text().count("\n") == 2  # nothing written over it


def _variant(tmp_path, name: str, raise_by: dict, **settings):
    """A folder holding the committed ML-1m BERT4Rec rows as if run with ``settings`` (hyper-parameters or trainer
    settings) and each seed's best validation value raised by ``raise_by[seed]``; and the profile's best values."""
    import json

    from benchmarks.experiments import converge_reference
    from recbench.benchmarks.store import ResultStore

    committed = json.loads((converge_reference.ROOT / "results" / "reference" / "converge-ml-1m.json").read_text())
    rows, profile = [], {}
    for row in committed["rows"]:
        if row["model"] != "bert4rec" or row["seed"] not in raise_by:
            continue
        profile[row["seed"]] = row["best_valid"]
        model = {k: v for k, v in settings.items() if k in row["hyperparameters"]}
        train = {k: v for k, v in settings.items() if k in row["train_settings"]}
        rows.append(dict(row, key=row["key"] + name, hyperparameters={**row["hyperparameters"], **model},
                         train_settings={**row["train_settings"], **train},
                         best_valid=row["best_valid"] + raise_by[row["seed"]]))
    start = {"event": "start", "time": "2026-11-28T00:00:00+00:00", "command": ["run_all.py", "--set", name],
             "commit": "c0ffee", "jobs": [{"key": row["key"], "run_id": row["run_id"], "action": "run"}
                                          for row in rows if row["protocol"] == "full"]}
    converge_reference.adopt(ResultStore(tmp_path / name), rows, [start])
    return tmp_path / name, {seed: profile[seed] for seed in sorted(profile)}


def _restored_ml_1m(tmp_path):
    from benchmarks.experiments import converge_reference

    folder = tmp_path / "converge-ml-1m"
    converge_reference.main(["--restore", str(converge_reference.ROOT / "results" / "reference" /
                                              "converge-ml-1m.json"), str(folder)])
    return folder


def test_settings_validation_chooses_are_a_row_of_their_own_labelled_and_checked_again_later(tmp_path):
    import json

    from benchmarks.experiments import converge_reference
    from recbench.reports.results import load_results

    profile_folder = _restored_ml_1m(tmp_path)
    variant, profile = _variant(tmp_path, "dropout", {0: 0.004, 1: -0.002}, dropout=0.1, attention_dropout=0.1)
    output = tmp_path / "reference"
    assert converge_reference.main([str(profile_folder), "--chosen-on-validation", str(variant),
                                    "--output", str(output)]) == 0
    written = json.loads((output / "chosen-on-validation-ml-1m.json").read_text())
    choice = written["chosen_on_validation"]["bert4rec"]
    assert choice["settings"] == {"dropout": 0.1, "attention_dropout": 0.1}
    assert choice["seeds"] == [0, 1]
    assert choice["profile_mean_best_valid"] == round((profile[0] + profile[1]) / 2, 4)
    assert choice["mean_best_valid"] == round((profile[0] + 0.004 + profile[1] - 0.002) / 2, 4)  # +.001: chosen
    assert len(written["rows"]) == 4 and written["invocations"][0]["command"] == "python run_all.py --set dropout"
    table = converge_reference.table_lines((output / "converge" / "reproduced.md").read_text())
    models = [line.split("|")[2].strip() for line in table[2:]]
    assert models[-2:] == ["BERT4Rec", "BERT4Rec, dropout 0.1, attention dropout 0.1"]
    # held against the same published rows as the profile's BERT4Rec: Table 5's, and Table 4's for HR@10
    assert table[-1].split("|")[11].strip() == "Table 5 (default); HR@10: Table 4 (N=200)"
    # its curves are drawn beside the profile's Transformers, under its own name, also when it alone is given
    curves = converge_reference.transformer_curves(load_results(profile_folder), load_results(variant), "ml-1m")
    assert {row.model for row in curves.rows} == {"sasrec", "sasrec-ce", "bert4rec",
                                                  "BERT4Rec, dropout 0.1, attention dropout 0.1"}
    (output / "converge" / "curves_ml-1m.png").unlink()
    assert converge_reference.main(["--chosen-on-validation", str(variant), "--output", str(output)]) == 0
    assert (output / "converge" / "curves_ml-1m.png").exists()

    # rewriting the profile's reference keeps the row chosen before, checked again against the profile's rows ...
    assert converge_reference.main([str(profile_folder), "--output", str(output)]) == 0
    assert (converge_reference.table_lines((output / "converge" / "reproduced.md").read_text())[-1]
            == table[-1])
    # ... and a profile whose rows now validate better refuses it in one line, writing nothing
    better = tmp_path / "better"
    better.mkdir()
    (better / "results.jsonl").write_text("".join(
        json.dumps(dict(row, best_valid=row["best_valid"] + 0.01) if row["model"] == "bert4rec" else row) + "\n"
        for row in map(json.loads, (profile_folder / "results.jsonl").read_text().splitlines())))
    (better / "manifest.jsonl").write_text((profile_folder / "manifest.jsonl").read_text())
    before = (output / "converge-ml-1m.json").read_text()
    with pytest.raises(SystemExit, match=r"chosen-on-validation-ml-1m.json: bert4rec: mean best validation NDCG@10 "
                                         r"under full 0\.\d{4} over seeds \[0, 1\] against the profile's 0\.\d{4}; "
                                         r"validation keeps the profile's settings"):
        converge_reference.main([str(better), "--output", str(output)])
    assert (output / "converge-ml-1m.json").read_text() == before


@pytest.mark.parametrize("raise_by, settings, refusal", [
    ({0: 0.002, 1: -0.003}, {"dropout": 0.1}, r"variant: bert4rec: mean best validation NDCG@10 under full 0\.\d{4} "
                                              r"over seeds \[0, 1\] against the profile's 0\.\d{4}; validation keeps"),
    ({0: 0.01}, {"dropout": 0.1}, r"variant: bert4rec: seeds \[0\] against the profile row's \[0, 1\]; run the "
                                  r"profile row's seeds"),
    ({0: 0.01, 1: 0.01}, {"dropout": 0.1, "max_len": 100},
     r"variant: bert4rec: settings other than the profile's \['dropout', 'max_len'\]; a row chosen on validation "
     r"differs from the profile only in dropout, attention_dropout, weight_decay"),
    ({0: 0.01, 1: 0.01}, {}, r"variant: bert4rec: settings other than the profile's none"),
])
def test_a_variant_validation_does_not_choose_is_refused_in_one_line_before_anything_is_written(
        tmp_path, raise_by, settings, refusal):
    from benchmarks.experiments import converge_reference

    profile_folder = _restored_ml_1m(tmp_path)
    variant, _ = _variant(tmp_path, "variant", raise_by, **settings)
    with pytest.raises(SystemExit, match=refusal):
        converge_reference.main([str(profile_folder), "--chosen-on-validation", str(variant),
                                 "--output", str(tmp_path / "reference")])
    assert not (tmp_path / "reference").exists()


def test_retraced_rows_lend_their_per_user_files_only_where_the_metrics_agree(tmp_path, capsys):
    """A reference row kept without its per-user file takes the file of a retraining of the same job; a retraining
    whose metrics differ is named with both values and changes nothing, unless --replace puts it in the row's place."""
    import json

    import run_all
    from benchmarks.experiments import converge_reference
    from recbench.benchmarks.store import ResultStore

    grid = ["--models", "bprmf", "--profile", "converge", "--set", "bprmf:max_epochs=2", "--set", "bprmf:hidden=8",
            "--cache-dir", str(tmp_path / "cache"), "--quiet", "--no-report", "--threads", "1"]
    assert run_all.main([*grid, "--output", str(tmp_path / "first")]) == 0
    assert converge_reference.main(["--keep", str(tmp_path / "first"), "--output", str(tmp_path / "ref")]) == 0
    reference = tmp_path / "ref" / "rows-first.json"
    copies = tmp_path / "ref" / "per-user" / "rows-first"
    for path in copies.iterdir():  # as a reference kept before its per-user files were
        path.unlink()
    assert run_all.main([*grid, "--output", str(tmp_path / "again")]) == 0  # the same jobs, the same seed
    assert ResultStore(tmp_path / "again").rows[0]["metrics"] == json.loads(reference.read_text())["rows"][0]["metrics"]
    assert converge_reference.main(["--retraced", str(tmp_path / "again"), "--output", str(tmp_path / "ref")]) == 0
    assert "2 reference rows took their per-user files" in capsys.readouterr().out
    kept = json.loads(reference.read_text())["rows"]
    for row in kept:
        assert (copies / row["per_user_file"].split("/")[-1]).read_bytes() == \
            (tmp_path / "again" / row["per_user_file"]).read_bytes()
    # another run whose metrics differ: named, nothing changed; with --replace it takes the row's place
    for path in copies.iterdir():
        path.unlink()
    retrained = ResultStore(tmp_path / "again").rows
    moved = [{**row, "metrics": {**row["metrics"], "NDCG@10": row["metrics"]["NDCG@10"] + 0.01}} for row in retrained]
    (tmp_path / "again" / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in moved))
    assert converge_reference.main(["--retraced", str(tmp_path / "again"), "--output", str(tmp_path / "ref")]) == 1
    out = capsys.readouterr().out
    assert "0 reference rows took their per-user files" in out and "NDCG@10" in out and "stored" in out
    assert json.loads(reference.read_text())["rows"] == kept and not list(copies.iterdir())
    assert converge_reference.main(["--retraced", str(tmp_path / "again"), "--output", str(tmp_path / "ref"),
                                    "--replace"]) == 0
    replaced = json.loads(reference.read_text())["rows"]
    assert [row["metrics"] for row in replaced] == [row["metrics"] for row in moved]
    assert [row["replaced"]["metrics"] for row in replaced] == [row["metrics"] for row in kept]
    # a study's row that reused the job (Table 5's default, the main grid's run) takes the file under its own name
    study_row = {**kept[0], "key": "another-key", "study": "ablation", "variant": "default",
                 "per_user_file": "per_user/the-default.npz", "reused_from": {"key": kept[0]["key"]}}
    (tmp_path / "ref" / "rows-ablation.json").write_text(json.dumps({"rows": [study_row]}))
    (tmp_path / "again" / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in retrained))
    assert converge_reference.main(["--retraced", str(tmp_path / "again"), "--output", str(tmp_path / "ref")]) == 0
    assert (tmp_path / "ref" / "per-user" / "rows-ablation" / "the-default.npz").read_bytes() == \
        (tmp_path / "again" / kept[0]["per_user_file"]).read_bytes()
    with pytest.raises(SystemExit):
        converge_reference.main(["--replace"])
    assert "--replace goes with --retraced" in capsys.readouterr().err
