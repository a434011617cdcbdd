"""--track tensorboard and --track mlflow (issue 70): what a run writes is read back with each tool's own reader,
as a researcher's TensorBoard or MLflow UI would show it: every epoch's training loss, each validation's metrics at
its epoch, each protocol's test metrics and the job's settings."""
import pytest

import run_all
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.store import read_results

pytestmark = pytest.mark.usefixtures("one_thread")

# BPR-MF validates every second epoch and at its last: epochs 2 and 3 live, epoch 1's loss from its row at the end.
ARGV = ["--models", "pop", "bprmf", "--set", "bprmf:max_epochs=3", "--set", "bprmf:hidden=8", "--threads", "1",
        "--quiet", "--no-report"]


def tracked(tmp_path, tool: str) -> dict:
    assert run_all.main([*ARGV, "--track", tool, "--output", str(tmp_path / "out"),
                         "--cache-dir", str(tmp_path / "cache")]) == 0
    rows = read_results(tmp_path / "out" / "results.jsonl")
    return {(row["model"], row["protocol"]): row for row in rows}


def test_tensorboard_holds_each_epochs_loss_each_validation_and_the_final_figures_and_settings(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    rows = tracked(tmp_path, "tensorboard")
    row = rows[("bprmf", "full")]
    events = EventAccumulator(str(tmp_path / "out" / "tensorboard" / "synthetic" / "bprmf" / "seed0" /
                                  row["key"][:12])).Reload()
    scalars = {tag: {event.step: event.value for event in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    curve = {entry["epoch"]: entry for entry in row["curve"]}
    assert scalars["train/loss"] == pytest.approx({epoch: entry["loss"] for epoch, entry in curve.items()})
    assert scalars["valid/NDCG@10"] == pytest.approx({2: curve[2]["valid_NDCG@10"], 3: curve[3]["valid_NDCG@10"]})
    assert scalars["test/full/NDCG@10"] == pytest.approx({0: row["metrics"]["NDCG@10"]})
    assert scalars["test/pop100/HR@10"] == pytest.approx({0: rows[("bprmf", "pop100")]["metrics"]["HR@10"]})
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["model.hidden"].number_value == 8 and hparams["key"].string_value == row["key"]
    assert hparams["train.lr"].number_value == pytest.approx(row["train_settings"]["lr"])
    pop = tmp_path / "out" / "tensorboard" / "synthetic" / "pop" / "seed0" / rows[("pop", "full")]["key"][:12]
    assert "test/full/HR@10" in EventAccumulator(str(pop)).Reload().Tags()["scalars"]  # fitted: its figures


def test_mlflow_holds_each_epochs_loss_each_validation_and_the_final_figures_and_settings(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rows = tracked(tmp_path, "mlflow")
    row = rows[("bprmf", "full")]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("out")
    runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"synthetic/pop/seed0", "synthetic/bprmf/seed0"}
    run = runs["synthetic/bprmf/seed0"]
    assert run.info.status == "FINISHED" and run.data.tags["recbench.key"] == row["key"]

    def history(name):
        return {metric.step: metric.value for metric in client.get_metric_history(run.info.run_id, name)}

    curve = {entry["epoch"]: entry for entry in row["curve"]}
    assert history("train/loss") == pytest.approx({epoch: entry["loss"] for epoch, entry in curve.items()})
    assert history("valid/NDCG_at_10") == pytest.approx({2: curve[2]["valid_NDCG@10"], 3: curve[3]["valid_NDCG@10"]})
    assert run.data.metrics["test/full/NDCG_at_10"] == pytest.approx(row["metrics"]["NDCG@10"])
    assert run.data.params["model.hidden"] == "8" and run.data.params["seed"] == "0"


def test_an_unknown_tool_or_a_missing_library_is_one_line_before_anything_runs(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *args, **kwargs: (
        (_ for _ in ()).throw(ImportError(name)) if name == "mlflow" else real(name, *args, **kwargs)))
    assert RunOptions(output=tmp_path, track="mlflow").problems() == [
        '--track mlflow needs the mlflow package: pip install -e ".[track]"']
    assert RunOptions(output=tmp_path, track="wandb").problems() == [
        "--track wandb: must be one of tensorboard, mlflow"]
