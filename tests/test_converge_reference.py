"""The reproduction's reference files: what a shorter patience would have given, read off a run's own curve."""
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
    from recbench.benchmarks import trainer

    monkeypatch.setattr(trainer, "cpu_flags", lambda: {"amx_bf16"})
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
    assert all(store.done(row["key"], ["full", "pop100"]) for row in before["rows"])
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
    folder = tmp_path / "converge-ml-1m"
    converge_reference.main(["--restore", str(reference / "converge-ml-1m.json"), str(folder)])
    assert converge_reference.main([str(folder), "--output", str(output)]) == 0
    table = converge_reference.table_lines((output / "converge" / "reproduced.md").read_text())
    assert table == converge_reference.table_lines((reference / "converge" / "reproduced.md").read_text())
    assert [line.split("|")[1].strip() for line in table[2:]].index("ML-1m") > 0  # the paper's order: Beauty first


def test_the_readmes_table_is_the_reference_table_and_its_update_touches_nothing_else(tmp_path):
    from benchmarks.experiments import converge_reference

    reference = converge_reference.ROOT / "results" / "reference" / "converge" / "reproduced.md"
    readme = converge_reference.ROOT / "README.md"
    shown = converge_reference.table_lines(readme.read_text()[readme.read_text().index("## Reproduced here"):])
    assert shown == converge_reference.table_lines(reference.read_text()), \
        "README's Reproduced here table differs from the reference: run converge_reference on the results folders"
    copy = tmp_path / "README.md"
    copy.write_text("# T\n\n| a |\n|---|\n\n## Reproduced here\n\nSo far:\n\n| old |\n|-----|\n| 1 |\n\nAfter.\n")
    (tmp_path / "new.md").write_text("**Title**\n\n| new |\n|-----|\n| 2 |\n| 3 |\n\nNotes.\n")
    converge_reference.update_readme(copy, tmp_path / "new.md")
    assert copy.read_text() == ("# T\n\n| a |\n|---|\n\n## Reproduced here\n\nSo far:\n\n"
                                "| new |\n|-----|\n| 2 |\n| 3 |\n\nAfter.\n")


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
