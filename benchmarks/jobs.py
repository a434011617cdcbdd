"""A job: one training run of a model on a dataset with a seed, optionally a study's variant of it."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from benchmarks.negatives import PAIRS
from benchmarks.relevance import TASK as RELEVANCE

TASKS = ("next-item", RELEVANCE)


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
            raise ValueError(f"unknown task {self.task!r}; expected one of {TASKS}")

    def _parts(self) -> list[str]:
        return ([self.dataset, self.model] + ([self.variant] if self.variant else [])
                + ([self.task] if self.task != "next-item" else []) + [f"seed{self.seed}"])

    def protocols(self, ranking: tuple) -> tuple:
        """The protocols of this job's result rows: the given ranking protocols, or the relevance pairs."""
        return (PAIRS,) if self.task == RELEVANCE else tuple(ranking)

    @property
    def run_id(self) -> str:
        return "/".join(self._parts())

    @property
    def file_stem(self) -> str:
        """``run_id`` as a file name: parts joined by ``__``, other characters than [A-Za-z0-9_.=+-] as ``-``."""
        return "__".join(re.sub(r"[^A-Za-z0-9_.=+-]+", "-", part) for part in self._parts())
