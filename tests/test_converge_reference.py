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
    with pytest.raises(SystemExit, match=rf"converge-{dataset} already holds results.jsonl; --restore writes a new"):
        converge_reference.main(["--restore", str(committed), str(folder)])


def test_restoring_from_a_file_that_is_no_reference_is_one_line(tmp_path):
    from benchmarks.experiments import converge_reference

    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(SystemExit, match=r"other.json: not a reference file of this module \(KeyError: "
                                         r"'invocations'\); pass results/reference/converge-<dataset>.json"):
        converge_reference.main(["--restore", str(tmp_path / "other.json"), str(tmp_path / "folder")])
    assert not (tmp_path / "folder").exists()
