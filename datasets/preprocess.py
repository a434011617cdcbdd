"""Raw interactions -> filtered, time-ordered, densely numbered sequences (the paper's preprocessing).

Steps, in this order (all vectorised; the order is part of the cache key through ``PIPELINE_VERSION``):

1. Every rating or review is implicit feedback 1; rating values are ignored.
2. Group by user and sort each user's rows by time with a *stable* sort, so equal timestamps keep file order
   (the authors' ``user item`` files carry no time: their file order is the time order).
3. Drop repeated (user, item) pairs, keeping the earliest.
4. Drop items with fewer than ``min_item_interactions`` interactions, then users with fewer than
   ``min_user_interactions``, one pass each (not iterated to a fixed point). This is the order of the
   BERT4Rec/SASRec preprocessing for ML-1m: items < 5 dropped, then users (README of the staged data);
   on ML-1m the user pass removes nobody, as every user keeps 18 or more ratings.
5. Renumber items 1..n_items and users 0..n_users-1 in ascending order of their original ids (or of the
   sorted original strings), so a file that is already dense keeps its ids.

A file with times keeps each interaction's time beside its item (``SequenceData.times``), for the global temporal
split; the sequences themselves do not depend on whether the times are kept.

Leave-one-out needs at least 3 interactions per user; a user left with fewer is an error that names the
file and the line of that user's first interaction.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from recbench.datasets.errors import DatasetFormatError
from recbench.datasets.readers import Interactions
from recbench.datasets.sequences import SequenceData

PIPELINE_VERSION = 1
MIN_SPLIT_LENGTH = 3  # training item(s) + validation + test


@dataclass(frozen=True)
class Preprocessing:
    """The per-dataset filter thresholds (0 disables a filter)."""

    min_item_interactions: int = 0
    min_user_interactions: int = 5

    def __post_init__(self):
        for name in ("min_item_interactions", "min_user_interactions"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (0 turns the filter off)")

    def describe(self) -> dict:
        """The settings plus the fixed steps, as recorded in provenance and the cache key."""
        return {
            **asdict(self),
            "feedback": "implicit: every rating/review counts as 1",
            "order": "stable sort by time within user; ties keep file order",
            "duplicates": "repeated (user, item) dropped, earliest kept",
            "filters": "items first, then users, one pass each",
            "pipeline_version": PIPELINE_VERSION,
        }


def prepare(interactions: Interactions, settings: Preprocessing, name: str,
            provenance: dict | None = None) -> SequenceData:
    """Apply the steps of the module docstring; ``provenance`` gains the row counts after each step (and the
    users before the user filter)."""
    if len(interactions) == 0:
        raise DatasetFormatError(interactions.where, None, "at least one interaction", found="none")
    user = pd.factorize(interactions.user, sort=True)[0].astype(np.int64)
    item = pd.factorize(interactions.item, sort=True)[0].astype(np.int64)
    row = np.lexsort((interactions.time, user))  # lexsort is stable: ties keep file order
    user, item = user[row], item[row]
    counts = {"rows": len(user)}

    user, item, row = _keep(_first_occurrences(user * (int(item.max()) + 1) + item), user, item, row)
    counts["after_duplicates"] = len(user)
    if settings.min_item_interactions:
        keep = np.bincount(item)[item] >= settings.min_item_interactions
        user, item, row = _keep(keep, user, item, row)
    counts["after_item_filter"] = len(user)
    per_user = np.bincount(user)
    counts["users_before_user_filter"] = int((per_user > 0).sum())
    if settings.min_user_interactions:
        user, item, row = _keep(per_user[user] >= settings.min_user_interactions, user, item, row)
    counts["after_user_filter"] = len(user)
    if not len(user):
        raise _nothing_left(interactions.where, settings, int(per_user.max(initial=0)))

    lengths = np.bincount(user)
    lengths = lengths[lengths > 0]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    short = np.flatnonzero(lengths < MIN_SPLIT_LENGTH)
    if len(short):
        raise DatasetFormatError(
            interactions.where, interactions.line(int(row[offsets[short[0]]])),
            f"at least {MIN_SPLIT_LENGTH} interactions per user for the leave-one-out split, but the user of "
            f"this {interactions.unit} has {lengths[short[0]]} after preprocessing ({len(short)} such user(s)); "
            f"set min_user_interactions >= {MIN_SPLIT_LENGTH} to drop them", unit=interactions.unit)

    present = np.zeros(int(item.max()) + 1, dtype=bool)
    present[item] = True
    new_id = np.cumsum(present)  # ids 1..n_items in ascending original order
    record = dict(provenance or {}, preprocessing=settings.describe(), counts=counts)
    data = SequenceData(name, new_id[item], offsets, int(new_id[-1]), record,
                        interactions.time[row] if interactions.timed else None)
    if data.times is not None:  # whose test item the file's order among equal times chose (PROTOCOL.md, "Split")
        counts["users_with_a_tied_test_item"] = int(np.count_nonzero(data.tied_in_time()[offsets[1:] - 1]))
    return data


def _nothing_left(where: str, settings: Preprocessing, longest: int) -> DatasetFormatError:
    """The error when the filters leave no interaction: which filter removed them all and what to set instead
    (``longest``: the most interactions a user had after the item filter)."""
    if not longest:
        return DatasetFormatError(where, None, f"items left after min_item_interactions="
                                  f"{settings.min_item_interactions} (no item has that many interactions); lower it "
                                  f"with --filters min_item_interactions=N")
    fix = (f"lower it with --filters min_user_interactions={longest}" if longest >= MIN_SPLIT_LENGTH else
           f"the leave-one-out split needs {MIN_SPLIT_LENGTH} per user, so this log cannot be split")
    return DatasetFormatError(where, None, f"users left after min_user_interactions={settings.min_user_interactions} "
                              f"(the most interactions a user has after the item filter is {longest}); {fix}")


def _first_occurrences(key: np.ndarray) -> np.ndarray:
    """Mask of the first occurrence of each value of ``key`` (a stable sort; faster than hashing 20m keys)."""
    by_key = np.argsort(key, kind="stable")
    sorted_key = key[by_key]
    first = np.ones(len(key), dtype=bool)
    first[by_key[1:][sorted_key[1:] == sorted_key[:-1]]] = False
    return first


def _keep(mask: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """``arrays`` restricted to ``mask``, without copying when it keeps everything."""
    return arrays if mask.all() else tuple(array[mask] for array in arrays)
