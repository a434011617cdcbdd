"""End to end through the grid (run_all.py, run_jobs): result rows carry the schema, a rerun resumes, bad names
are explained."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.jobs import Job
from recbench.benchmarks.metrics import RankCounts, per_user_metrics
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.store import ResultStore, read_results
from recbench.datasets.sequences import SequenceData

REQUIRED_KEYS = {"dataset", "model", "seed", "protocol", "metrics", "dataset_info", "hyperparameters", "task",
                 "tie_policy", "split", "users_evaluated", "epochs_run", "best_epoch", "train_seconds",
                 "eval_seconds", "peak_memory_mb", "device", "versions", "commit", "per_user_file", "run_id"}


@pytest.fixture(scope="module")
def chain_data():
    """Each user walks a fixed item chain from a random start: item i is followed by i+1 (mod n)."""
    rng = np.random.default_rng(0)
    n_items = 150
    starts = rng.integers(0, n_items, size=120)
    sequences = [(start + np.arange(12)) % n_items + 1 for start in starts]
    return SequenceData.from_sequences("chain", sequences, n_items=n_items)


def options(tmp_path, **changes) -> RunOptions:
    return RunOptions(output=tmp_path / "out", protocols=("full", "pop100"), profile="smoke", device="cpu",
                      cache_dir=tmp_path / "cache", progress=False, **changes)


def run(tmp_path, chain_data, jobs, **kwargs):
    return run_jobs(jobs, options(tmp_path, **kwargs), preloaded={"chain": chain_data}, log=lambda *a: None).rows


def test_rows_follow_the_schema_and_per_user_counts_reproduce_metrics(tmp_path, chain_data):
    rows = run(tmp_path, chain_data, [Job("chain", "pop", 0), Job("chain", "bprmf", 0)])
    assert len(rows) == 4
    stored = read_results(tmp_path / "out" / "results.jsonl")
    assert [r["run_id"] for r in stored] == [r["run_id"] for r in rows]
    for row in stored:
        assert REQUIRED_KEYS <= set(row)
        lists = {f"{kind}@{k}" for kind in ("Coverage", "Gini", "ARP", "APLT", "Novelty", "Personalization")
                 for k in (1, 5, 10)}
        assert set(row["metrics"]) == {"HR@1", "HR@5", "HR@10", "NDCG@5", "NDCG@10", "MRR"} | (
            lists if row["protocol"] == "full" else set())  # the top-k lists exist under full ranking only
        assert row["users_evaluated"] == chain_data.n_users
        assert row["dataset_info"]["sha256"] == chain_data.content_sha256()
        counts = RankCounts.load(tmp_path / "out" / row["per_user_file"])
        again = per_user_metrics(counts.greater, counts.ties)
        assert np.mean(again["NDCG@10"]) == pytest.approx(row["metrics"]["NDCG@10"])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {job["model"] for job in config["jobs"]} == {"pop", "bprmf"}
    assert config["jobs"][1]["model"] == "bprmf" and config["jobs"][1]["hyperparameters"]["hidden"] == 64
    assert config["jobs"][1]["train_settings"]["max_epochs"] == 5  # the smoke profile's value


def test_resume_skips_finished_jobs(tmp_path, chain_data):
    run(tmp_path, chain_data, [Job("chain", "pop", 0)])
    log = []
    rows = run_jobs([Job("chain", "pop", 0), Job("chain", "pop", 1)], options(tmp_path, resume=True),
                    preloaded={"chain": chain_data}, log=log.append).rows
    assert [r["seed"] for r in rows] == [1, 1]
    assert any("already in results.jsonl" in line for line in log)
    assert len(read_results(tmp_path / "out" / "results.jsonl")) == 4


def test_rows_under_an_older_key_version_are_kept_and_said_to_run_again(tmp_path, chain_data):
    """A user upgrading the suite reruns with --resume: rows written under an older job key no longer match, so the
    job trains again, and the run says why instead of silently ignoring the rows it finds."""
    run(tmp_path, chain_data, [Job("chain", "pop", 0)])
    results = tmp_path / "out" / "results.jsonl"
    old = [{**row, "key": "0" * 64, "key_version": 1} for row in read_results(results)]
    results.write_text("".join(json.dumps(row) + "\n" for row in old))
    log = []
    rows = run_jobs([Job("chain", "pop", 0)], options(tmp_path, resume=True), preloaded={"chain": chain_data},
                    log=log.append).rows
    assert [row["seed"] for row in rows] == [0, 0]  # trained again, both protocols
    (note,) = [line for line in log if line.startswith("note: ")]
    assert "1 job(s) have results" in note and "e.g. chain/pop/seed0" in note and "the old rows are kept" in note
    assert len(read_results(results)) == 4


def test_corrupt_results_file_names_the_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"a": 1}\n{broken\n')
    with pytest.raises(ValueError, match="results.jsonl, line 2"):
        read_results(path)


def test_two_stores_on_one_folder_keep_each_others_rows(tmp_path):
    """Two runs writing into one output folder (two processes) must not overwrite each other's rows."""
    first, second = ResultStore(tmp_path), ResultStore(tmp_path)
    first.commit("a", [{"key": "a", "protocol": "full"}], {})
    second.commit("b", [{"key": "b", "protocol": "full"}], {})
    first.commit("a", [{"key": "a", "protocol": "full", "v": 2}, {"key": "a", "protocol": "pop100"}], {})
    assert [(r["key"], r["protocol"], r.get("v")) for r in read_results(tmp_path / "results.jsonl")] == [
        ("b", "full", None), ("a", "full", 2), ("a", "pop100", None)]
    jobs = [SimpleNamespace(key=key, protocols=["full", "pop100"]) for key in ("a", "b", "c")]
    assert second.finished(jobs) == {"a"}  # b lacks its pop100 row, c has none


def test_unknown_model_in_job_is_explained(tmp_path, chain_data):
    with pytest.raises(ValueError, match="unknown model 'nope'; expected one of pop, "):
        run(tmp_path, chain_data, [Job("chain", "nope", 0)])
