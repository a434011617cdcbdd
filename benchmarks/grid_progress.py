"""What a grid shows while it runs: one line per started and finished job, with the time its jobs have left
(:class:`GridProgress`)."""
from __future__ import annotations

import math
import time

import numpy as np

from recbench.benchmarks.estimate import at_once, duration, planned_steps, training_example_count
from recbench.benchmarks.jobs import PlannedJob
from recbench.benchmarks.worker import JobOutcome


def _job_seconds(outcome: JobOutcome) -> float:
    """How long a finished job took: its training as its rows record it, summed over a resumed run's sessions (the
    process saw only the last: a job resumed at its end took seconds there), and its evaluations."""
    rows = outcome.rows
    return (rows[0].get("train_seconds") or 0.0) + sum(row.get("eval_seconds") or 0.0 for row in rows)


class GridProgress:
    """One line per started and finished job, with the time left: where the plan estimated a job's training
    (``estimates``, :mod:`benchmarks.estimate`: timed steps to where a converged run of its model stopped), that
    figure; else as long as the finished jobs of its model on its dataset took on average; else, where its model
    has finished on other datasets only, their seconds per step times this job's own steps: their mean epochs run,
    each of this job's length on its data (``datasets``), within its caps. A model's time on one dataset does not
    stand for another's: ML-1m's epochs and Beauty's differ in length several times over. Jobs without training
    (POP) take seconds, and models differ a hundredfold under the converge profile (BPR-MF minutes, BERT4Rec
    hours), so a job of a model neither estimated nor timed gets no guess: the line counts it apart. The variants of
    a study differ threefold in a step's time (Table 5's L = 1 and h = 8), which a model's mean does not see and the
    plan does."""

    def __init__(self, planned: list[PlannedJob], pending: list[PlannedJob], parallelism: int, log,
                 estimates: dict | None = None, datasets: dict | None = None):
        self.pending = {job.key: job for job in pending}
        self.number = {job.key: number for number, job in enumerate(planned, start=1)}
        self.total = len(planned)
        self.parallelism = max(1, parallelism)
        self.log = log
        # A bare upper bound (early stopping may end the job anywhere before its cap) is no time left: such a job
        # counts as untimed until a job of its model has finished.
        self.estimated = {key: estimate.likely or 0.0 for key, estimate in (estimates or {}).items()
                          if not estimate.bound_only}
        self.datasets = datasets or {}
        self.seconds: dict[tuple, list[float]] = {}  # (model, dataset) -> seconds of its finished jobs that trained
        self.per_step: dict[str, list[tuple]] = {}  # model -> (seconds per step, epochs run) of its finished jobs
        self.examples: dict[tuple, int] = {}  # a job's training examples, counted once per dataset and model
        self.began: dict[str, float] = {}  # key -> when a job was handed out (time.monotonic)

    def started(self, job: PlannedJob) -> None:
        self.began[job.key] = time.monotonic()
        self.log(f"[{self.number[job.key]}/{self.total}] {job.run_id} (key {job.key[:12]}){self._left()}")

    def done(self, outcome: JobOutcome) -> None:
        job = self.pending.pop(outcome.key)
        if outcome.trained:
            seconds, first = _job_seconds(outcome), outcome.rows[0]
            self.seconds.setdefault((job.job.model, job.job.dataset), []).append(seconds)
            if first.get("steps_run") and first.get("epochs_run"):
                self.per_step.setdefault(job.job.model, []).append((seconds / first["steps_run"], first["epochs_run"]))
        if outcome.status == "failed":
            self.log(f"  FAILED {job.run_id} (key {job.key[:12]}): {outcome.error}")
        elif self.parallelism > 1:
            metrics = "; ".join(f"{row['protocol']} NDCG@10 {row['metrics']['NDCG@10']:.4f}"
                                for row in outcome.rows if "NDCG@10" in row["metrics"])
            # a resumed job's earlier sessions count too (this one may have trained its last minutes only)
            took = duration(_job_seconds(outcome) if outcome.trained else outcome.seconds)
            self.log(f"  done [{self.number[job.key]}/{self.total}] {job.run_id} in {took}"
                     f"{': ' + metrics if metrics else ''}{self._left()}")

    def _left(self) -> str:
        now, left = time.monotonic(), []
        for job in self.pending.values():
            expected = self._expected(job)
            if expected is None:
                continue
            # a running job has spent part of it (one that runs past it counts none)
            left.append(max(0.0, expected - (now - self.began.get(job.key, now))))
        untimed = len(self.pending) - len(left)
        if not left:
            return ""
        text = f"about {duration(at_once(left, self.parallelism))} left"
        if untimed:
            text += (f" for the {len(left)} job{'s' if len(left) > 1 else ''} of models timed so far, "
                     f"{untimed} more of models not yet timed")
        return ", " + text

    def _expected(self, job: PlannedJob) -> float | None:
        """The seconds ``job`` is expected to take (the class docstring's rules), or None where nothing says."""
        if job.key in self.estimated:
            return self.estimated[job.key]
        same = self.seconds.get((job.job.model, job.job.dataset))
        if same:
            return float(np.mean(same))
        timed = self.per_step.get(job.job.model)
        if not timed or job.job.dataset not in self.datasets:
            return None
        signature = (job.job.dataset, job.job.model, repr(job.config.model))
        if signature not in self.examples:
            self.examples[signature] = training_example_count(job, self.datasets[job.job.dataset])
        n_examples, train = self.examples[signature], job.config.train
        cap, _ = planned_steps(train, n_examples)
        per_step, epochs = np.mean(timed, axis=0)
        return float(per_step * min(cap, epochs * math.ceil(n_examples / train.batch_size)))
