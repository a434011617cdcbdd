"""The collapse measurement (benchmarks/experiments/representation_collapse.py): a model that gives every user the
same query is told apart from one that does not, a checkpoint is matched to its job by the key its name ends
with, and wrong input gets one line."""
import dataclasses
import json

import pytest
import torch

from benchmarks.experiments import representation_collapse
from recbench.datasets import load_dataset
from recbench.models.bert4rec import BERT4Rec, BERT4RecConfig

pytestmark = pytest.mark.usefixtures("one_thread")
KEY = "0123456789ab" + "c" * 52


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A results folder with one BERT4Rec job on the synthetic data and a checkpoint of it whose output transform
    ignores its input: every user's query is the same vector."""
    folder = tmp_path_factory.mktemp("ablation")
    data = load_dataset("synthetic", cache_dir=folder / "cache", progress=False)
    config = BERT4RecConfig(max_len=20, hidden=16, layers=1, heads=2)
    job = {"key": KEY, "run_id": "synthetic/bert4rec/w/o RC/seed0", "dataset": "synthetic", "model": "bert4rec",
           "seed": 0, "hyperparameters": dataclasses.asdict(config), "train_settings": {"valid_metric": "NDCG@10"}}
    (folder / "config.json").write_text(json.dumps({"jobs": [job]}))
    model = BERT4Rec(data.n_users, data.n_items, config)
    with torch.no_grad():
        model.projection.weight.zero_()
        model.projection.bias.normal_()
    (folder / "checkpoints").mkdir()
    history = [{"epoch": 1, "loss": 7.71234, "valid_NDCG@10": 0.01812}, {"epoch": 2, "loss": 7.5, "valid_HR@10": 0.1}]
    torch.save({"model": model.state_dict(), "state": {"epoch": 7, "best_epoch": 3, "best_metric": 0.02,
                                                       "history": history}},
               folder / "checkpoints" / f"synthetic__bert4rec__w-o-RC__seed0__{KEY[:12]}.pt")
    return folder


def test_one_query_for_everyone_is_measured_as_collapse_and_the_start_is_not(folder, tmp_path):
    assert representation_collapse.main([str(folder), "--data-dir", str(tmp_path), "--cache-dir",
                                         str(folder / "cache"), "--users", "200", "--init", "--output",
                                         str(tmp_path)]) == 0
    report = json.loads((tmp_path / f"representation-collapse-{folder.name}.json").read_text())
    (run,) = report["runs"]
    assert (run["run_id"], run["epoch"], run["best_epoch"]) == ("synthetic/bert4rec/w/o RC/seed0", 7, 3)
    trained, start = run["trained"], run["at_initialisation"]
    assert trained["mean_cosine_between_users"] == pytest.approx(1.0, abs=1e-4)
    assert trained["share_with_the_most_common_top1"] == 1.0 and trained["distinct_top1_items"] == 1
    assert start["mean_cosine_between_users"] < 0.99 and start["distinct_top1_items"] > 1
    # One order for everyone: its lists differ only by each user's history, as POP's do; at initialisation they
    # differ more.
    assert trained["validation_Personalization@10"] < start["validation_Personalization@10"]
    assert 0 < report["pop"]["validation_Personalization@10"] < start["validation_Personalization@10"]
    assert set(report["pop"]) == {"validation_NDCG@10", "validation_Coverage@10", "validation_Personalization@10"}
    assert report["users"] == 200 and "--init" in report["command"]
    assert run["curve"] == [{"epoch": 1, "loss": 7.7123, "valid_NDCG@10": 0.0181}]  # the job's validation metric


def test_wrong_input_gets_one_line(folder, tmp_path):
    with pytest.raises(SystemExit, match="config.json: not found"):
        representation_collapse.main([str(tmp_path), "--data-dir", str(tmp_path)])
    stray = tmp_path / "synthetic__bert4rec__default__seed0__ffffffffffff.pt"
    stray.write_bytes(b"")
    with pytest.raises(SystemExit, match="its name ends in no job key"):
        representation_collapse.main([str(folder), "--checkpoints", str(stray), "--data-dir", str(tmp_path)])
