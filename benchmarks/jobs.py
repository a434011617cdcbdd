"""Jobs and their keys (``ARCHITECTURE.md``, "The run layer").

A :class:`Job` is what a caller asks for: a model on a dataset with a seed, optionally a study's variant of it,
with ``--set`` overrides. A :class:`PlannedJob` is that job resolved for one run: the profile's and the
overrides' values applied, the prepared data's hash known. Its **key** is a hash of everything that determines
its result: dataset name and prepared-data hash, model, every resolved model and trainer setting, task,
protocols, evaluation rules, seed, profile, and the study labels the result row carries; for a model from outside
the suite also the sha256 of its source file (the suite's own code is named by its commit in every row); for a
split other than the paper's leave-one-out, the split (its cut times and the hash of the times it cuts; a
leave-one-out job's key has no split entry, so the keys of existing results stay as they were). Result rows,
checkpoints and per-user files are keyed by it, so a changed setting can never reuse an old result or resume
an old checkpoint, and the old result stays beside the new one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field

from recbench.benchmarks.config import ResolvedConfig
from recbench.benchmarks.metrics import DEFAULT_METRICS
from recbench.benchmarks.negatives import PAIRS
from recbench.benchmarks.relevance import TASK as RELEVANCE
from recbench.datasets.errors import unknown
from recbench.datasets.sequences import LeaveOneOutSplit, SequenceData
from recbench.datasets.splits import TemporalSplit, split_from_record
from recbench.models import model_class
from recbench.models.base import NeuralRecommender

TASKS = ("next-item", RELEVANCE)
# Bump when the key's contents change, so that old keys never match new jobs. 2: the trainer's settings hold only
# what a run computes (seed, progress, checkpoint and compile left them; amp became precision). 3: every field is
# always present (cpu_budget_s, tuned_from, model_source_sha256 were left out when unset).
KEY_VERSION = 3
TIE_POLICY = "expected"  # the evaluator's tie policy for every result the worker writes (PROTOCOL.md, "Rank and ties")


class GridError(ValueError):
    """The grid cannot start: each line of the message is one problem (a bad setting, a missing dataset)."""


class GridInterrupted(KeyboardInterrupt):
    """Ctrl-C during a grid; finished jobs are recorded and checkpoints kept."""


@dataclass(frozen=True)
class Job:
    """One training run: a model on a dataset with a seed, optionally a study's variant of it."""

    dataset: str
    model: str
    seed: int
    study: str = "main"
    variant: str | None = None  # the study's row label, e.g. "w/o PE"
    sweep: dict | None = field(default=None, hash=False)  # {"param": ..., "value": ...} for sensitivity
    overrides: tuple = ()  # "field=value" strings applied after the profile
    task: str = "next-item"  # or "relevance"

    def __post_init__(self):
        if self.task not in TASKS:
            raise unknown("task", self.task, TASKS)

    def _parts(self) -> list[str]:
        return ([self.dataset, self.model] + ([self.variant] if self.variant else [])
                + ([self.task] if self.task != "next-item" else []) + [f"seed{self.seed}"])

    def protocols(self, ranking: tuple) -> tuple:
        """The protocols of this job's result rows: the given ranking protocols, or the relevance pairs."""
        return (PAIRS,) if self.task == RELEVANCE else tuple(ranking)

    @property
    def run_id(self) -> str:
        """A readable name, ``<dataset>/<model>[/<variant>][/relevance]/seed<seed>``; not unique across
        settings (the key is)."""
        return "/".join(self._parts())

    @property
    def file_stem(self) -> str:
        """``run_id`` as a file name: parts joined by ``__``, other characters than [A-Za-z0-9_.=+-] as ``-``."""
        return "__".join(re.sub(r"[^A-Za-z0-9_.=+-]+", "-", part) for part in self._parts())


@dataclass(frozen=True)
class PlannedJob:
    """A job resolved for one run: its settings, its protocols and the hash of the data it trains on."""

    job: Job
    profile: str
    protocols: tuple
    config: ResolvedConfig
    data_sha256: str
    model_source: dict | None = None  # a model from outside the suite: models.model_origin and its commit
    split: dict | None = None  # the temporal split's record (datasets.splits.split_record); None: leave-one-out

    @property
    def trains(self) -> bool:
        """Whether the model has gradient training (POP has none, so trainer settings do not concern it)."""
        return issubclass(model_class(self.job.model), NeuralRecommender)

    def identity(self) -> dict:
        """Everything that determines this job's result rows; the key hashes it."""
        train = dataclasses.asdict(self.config.train) if self.trains else None
        return {
            "key_version": KEY_VERSION, "dataset": self.job.dataset, "data_sha256": self.data_sha256,
            "model": self.job.model, "hyperparameters": dataclasses.asdict(self.config.model),
            "train_settings": train, "task": self.job.task, "protocols": sorted(self.protocols),
            "tie_policy": TIE_POLICY, "metrics": list(DEFAULT_METRICS), "seed": self.job.seed,
            "profile": self.profile, "study": self.job.study, "variant": self.job.variant,
            "sweep": self.job.sweep, "tuned_from": self.config.tuned_from,
            "model_source_sha256": self.model_source["sha256"] if self.model_source else None,
            **({"split": self.split} if self.split is not None else {}),
        }

    def data_split(self, data: SequenceData) -> LeaveOneOutSplit | TemporalSplit:
        """The split of ``data`` this job trains, selects and tests on."""
        return split_from_record(data, self.split)

    @property
    def key(self) -> str:
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def run_id(self) -> str:
        return self.job.run_id

    @property
    def file_stem(self) -> str:
        """The job's file name: its readable stem and the key's first 12 hex digits."""
        return f"{self.job.file_stem}__{self.key[:12]}"

    def describe(self) -> dict:
        """The job as ``config.json`` and ``--dry-run`` show it: labels, key and every resolved setting."""
        settings = self.config.as_dict()
        if not self.trains:
            settings["train_settings"] = None
        return {"key": self.key, "run_id": self.run_id, **dataclasses.asdict(self.job), "profile": self.profile,
                "protocols": list(self.protocols), "data_sha256": self.data_sha256, **settings,
                **({"model_source": self.model_source} if self.model_source else {}),
                **({"split": self.split} if self.split else {})}
