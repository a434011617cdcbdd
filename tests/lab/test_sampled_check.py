"""The acceptance check of the expected sampled metrics (benchmarks/experiments/sampled_check.py) end to end on the
synthetic data: it trains, rebuilds each model from its kept weights, redraws both sampled protocols through the
evaluator and writes its figures with the command that produced them."""
import json

from benchmarks.experiments import sampled_check
from recbench.benchmarks.metrics import RankCounts
from recbench.benchmarks.store import read_results


def test_the_check_writes_expected_and_realised_values(tmp_path):
    assert sampled_check.main(["--dataset", "synthetic", "--data-dir", str(tmp_path), "--models", "pop", "bprmf",
                               "--draws", "4", "--pop-draws", "2", "--output", str(tmp_path / "runs"),
                               "--reference", str(tmp_path / "reference")]) == 0
    found = json.loads((tmp_path / "reference" / "sampled-check-synthetic.json").read_text())
    assert found["command"].startswith("python -m benchmarks.experiments.sampled_check --dataset synthetic")
    assert [model["model"] for model in found["models"]] == ["pop", "bprmf"]
    for model in found["models"]:
        uni = model["uni100"]["NDCG@10"]
        assert len({uni["realised"]["min"], uni["realised"]["max"]}) == 2  # the draws differ
        # four draws: their mean lies within 4 standard errors of the expectation
        assert abs(uni["expected_minus_realised_mean"]) < 4 * uni["expected_draw_std"] / 2
        assert model["pop100"]["NDCG@10"]["approximation"] < uni["expected"]  # popular negatives are harder
    rows = read_results(tmp_path / "runs" / "results.jsonl")
    full = next(row for row in rows if row["protocol"] == "full" and row["model"] == "bprmf")
    assert RankCounts.load(tmp_path / "runs" / full["per_user_file"]).candidates is not None
    assert (tmp_path / "runs" / "weights").is_dir()
