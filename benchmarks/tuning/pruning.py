"""A trial's validation values reported to its study, and the pruner's answer, in whichever process trains it.

The driver asks Optuna for a trial and hands its job to a worker (this process, a joblib worker process or a Dask
worker); the worker's trainer calls :class:`TrialReporter` after every validation. Driver and workers meet in the
study's database (:func:`open_storage`), so the reporter carries only names: the storage URL, the study and the
trial's number. Optuna is used through its public API only: a trial outside the process that asked for it is
reached by its number (:func:`trial_by_number`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import optuna
from sqlalchemy.engine import make_url

PRUNED = "pruned"  # the stop reason TrialReporter gives the trainer

_STORAGES: dict[str, object] = {}  # one database connection pool per URL and process


def open_storage(url: str):
    """Optuna's storage for ``url``, once per process; SQLite waits up to a minute for a lock held by another
    process (the driver and local workers write to one file)."""
    if url not in _STORAGES:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        _STORAGES[url] = optuna.storages.RDBStorage(url, engine_kwargs=engine)
    return _STORAGES[url]


def shown_storage(url: str) -> str:
    """The storage URL without a password (it goes into rows and files)."""
    return make_url(url).render_as_string(hide_password=True)


def trial_by_number(study, storage, number: int):
    """Trial ``number`` of ``study`` (kept in ``storage``) as an Optuna ``Trial``, to report to or to label from
    any process: the storage finds its database id by the study's name and the trial's number."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return optuna.trial.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, number))


def make_pruner(name: str, first_epoch: int):
    """Optuna's pruner, never before ``first_epoch`` (the second validation: one value says little): ``median``
    stops a trial whose value is below the median of the earlier trials' at the same epoch (once 4 trials have
    finished); ``hyperband`` is Li et al.'s bandit over successive halvings; ``none`` never stops one."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=first_epoch)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=first_epoch, reduction_factor=3)
    return optuna.pruners.NopPruner()


@dataclass
class TrialReporter:
    """A trial's ``TrainRun.on_validation``: reports each validation's value to the study at its epoch and stops
    the run ("pruned") when the study's pruner says so (unless not ``prunable``). Only names travel with it, so it
    pickles to any worker."""

    storage: str
    study_name: str
    trial_number: int
    pruner: str
    first_epoch: int  # the pruner's first epoch (make_pruner)
    prunable: bool = True  # False: report every value, never stop (the defaults' trial)
    _trial: object = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_trial": None}

    def __call__(self, validation) -> str | None:
        if self._trial is None:
            storage = open_storage(self.storage)
            study = optuna.load_study(study_name=self.study_name, storage=storage,
                                      pruner=make_pruner(self.pruner, self.first_epoch))
            self._trial = trial_by_number(study, storage, self.trial_number)
        self._trial.report(validation.value, validation.epoch)
        return PRUNED if self.prunable and self._trial.should_prune() else None
