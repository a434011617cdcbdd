"""Experiment tracking (``--track tensorboard``, ``--track mlflow``; ``pip install -e ".[track]"``): every job's
training curve and final figures in the tools researchers watch runs in, beside ``results.jsonl``, which stays the
record the tables are built from.

What each job writes, under the run's results folder by default:

- while it trains, after every validation: the epoch's mean training loss (``train/loss``) and every validation
  metric (``valid/NDCG@10``, ...), at the epoch as step: a :class:`EpochLog`, which the worker's trainer calls as
  its ``on_validation`` (it pickles to worker processes and opens its writer there);
- when it has finished, from its rows: the loss of the epochs without a validation, each protocol's test metrics
  (``test/full/NDCG@10``, ...), and its settings (the model's hyper-parameters and the trainer's settings, its key,
  dataset, model, seed and profile).

TensorBoard: one event folder per job, ``<results>/tensorboard/<run id>/<key>`` (``tensorboard --logdir
<results>/tensorboard``), its settings as TensorBoard's hparams. MLflow: one MLflow run per job in the experiment
named after the results folder, in the tracking store ``$MLFLOW_TRACKING_URI`` names, else a local SQLite file,
``<results>/mlflow.db`` (``mlflow ui --backend-store-uri sqlite:///<results>/mlflow.db``; MLflow 3 refuses its
older folder store unless told to). MLflow's names allow no ``@``: ``NDCG@10`` is logged as ``NDCG_at_10``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

TRACKERS = ("tensorboard", "mlflow")
EXTRA = 'pip install -e ".[track]"'


def missing(kind: str) -> str | None:
    """One line when ``--track kind`` cannot work (an unknown tool, or its library not installed), else None."""
    if kind not in TRACKERS:
        return f"--track {kind}: must be one of {', '.join(TRACKERS)}"
    module = {"tensorboard": "tensorboard", "mlflow": "mlflow"}[kind]
    try:
        __import__(module)
    except ImportError:
        return f"--track {kind} needs the {module} package: {EXTRA}"
    return None


def _mlflow_name(name: str) -> str:
    return name.replace("@", "_at_")


def _mlflow_client(folder: Path):
    from mlflow.tracking import MlflowClient  # optional: the track extra

    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(folder / 'mlflow.db').resolve()}"
    return MlflowClient(tracking_uri=uri)


@dataclass
class EpochLog:
    """The worker side of one job's tracking: called after each validation (``TrainRun.on_validation``) with
    its :class:`benchmarks.trainer.Validation`; writes the epoch's loss and validation metrics. Its writer is
    opened in the process that trains, on the first call."""

    kind: str
    folder: str  # the results folder
    where: str  # TensorBoard: the job's event folder; MLflow: the MLflow run's id
    _writer: object = field(default=None, repr=False, compare=False)

    def __getstate__(self):
        return {**self.__dict__, "_writer": None}  # a writer holds open files: each process opens its own

    def __call__(self, validation) -> None:
        values = {f"valid/{name}": value for name, value in validation.metrics.items()}
        if getattr(validation, "loss", None) is not None:
            values["train/loss"] = validation.loss
        _write(self, values, validation.epoch)
        return None


def _write(log: EpochLog, values: dict, step: int) -> None:
    if log.kind == "tensorboard":
        if log._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (the track extra)

            log._writer = SummaryWriter(log.where)
        for name, value in values.items():
            log._writer.add_scalar(name, value, step)
        log._writer.flush()
    else:
        if log._writer is None:
            log._writer = _mlflow_client(Path(log.folder))
        for name, value in values.items():
            log._writer.log_metric(log.where, _mlflow_name(name), float(value), step=step)


class Tracker:
    """The driver side: a job's tracking opened before it runs (:meth:`start`, whose :class:`EpochLog` the worker
    calls) and completed from its rows when it has finished (:meth:`finish`)."""

    def __init__(self, kind: str, folder: Path):
        problem = missing(kind)
        if problem:
            raise ValueError(problem)
        self.kind, self.folder = kind, Path(folder)
        self.logs: dict[str, EpochLog] = {}
        if kind == "mlflow":
            self.client = _mlflow_client(self.folder)
            found = self.client.get_experiment_by_name(self.folder.name)
            self.experiment = found.experiment_id if found else self.client.create_experiment(
                self.folder.name, artifact_location=(self.folder / "mlflow-artifacts").resolve().as_uri())

    def start(self, job) -> EpochLog:
        """The :class:`EpochLog` of planned job ``job``, its MLflow run created."""
        if self.kind == "tensorboard":
            where = str(self.folder / "tensorboard" / job.run_id / job.key[:12])
        else:
            where = self.client.create_run(self.experiment, run_name=job.run_id,
                                           tags={"recbench.key": job.key, "recbench.run_id": job.run_id}).info.run_id
        self.logs[job.key] = EpochLog(self.kind, str(self.folder), where)
        return self.logs[job.key]

    def finish(self, outcome) -> None:
        """A finished job's test metrics, settings and the loss of its epochs without a validation, from its rows;
        a failed job's MLflow run marked failed."""
        log = self.logs.pop(outcome.key, None)
        if log is None:
            return
        if outcome.status != "finished" or not outcome.rows:
            if self.kind == "mlflow":
                self.client.set_terminated(log.where, status="FAILED")
            return
        first = outcome.rows[0]
        for entry in first.get("curve") or []:
            if not any(name.startswith("valid_") for name in entry):  # validated epochs were logged as they ended
                _write(log, {"train/loss": entry["loss"]}, entry["epoch"])
        final = {f"test/{row['protocol']}/{name}": value for row in outcome.rows
                 for name, value in row["metrics"].items()}
        settings = {"key": first["key"], "dataset": first["dataset"], "model": first["model"], "seed": first["seed"],
                    "profile": first.get("profile"),
                    **{f"model.{name}": value for name, value in (first.get("hyperparameters") or {}).items()},
                    **{f"train.{name}": value for name, value in (first.get("train_settings") or {}).items()}}
        if self.kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (the track extra)

            with SummaryWriter(log.where) as writer:
                writer.add_hparams({name: value if isinstance(value, (int, float, str, bool)) else str(value)
                                    for name, value in settings.items()}, final, run_name=".")
        else:
            for name, value in settings.items():
                self.client.log_param(log.where, name, value)
            for name, value in final.items():
                self.client.log_metric(log.where, _mlflow_name(name), float(value))
            self.client.set_terminated(log.where)
