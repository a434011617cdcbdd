"""How a dataset is split into training, validation and test views (``PROTOCOL.md``, "Split" and "Temporal split").

Two schemes, behind one interface (``data``, ``n_items``, ``train()``, ``valid()``, ``test()``, ``view(part)``, and
what a part's candidates and sampled negatives may be: ``new_items(part)``, ``popularity(part)``):

- ``leave-one-out``, the paper's: :class:`datasets.sequences.LeaveOneOutSplit`;
- ``temporal``: :class:`TemporalSplit`, a global temporal split at two cut times c₁ < c₂. The models train on the
  interactions before c₁; the validation target of a user is their first interaction in [c₁, c₂), judged after their
  interactions before c₁; the test target is their first interaction at or after c₂, judged after their
  interactions before c₂. An interaction at exactly a cut time belongs to the later period. Items first seen at or
  after a part's cut are no candidates of that part (a target of such an item is dropped), and a user with a target
  but nothing before the cut is skipped.

:class:`SplitSpec` is a grid's choice of scheme and cuts (``--split``, ``--cut-quantiles``, ``--cut-times``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from recbench.datasets.errors import unknown
from recbench.datasets.sequences import Histories, LeaveOneOutSplit, SequenceData

LEAVE_ONE_OUT, TEMPORAL = "leave-one-out", "temporal"
SCHEMES = (LEAVE_ONE_OUT, TEMPORAL)
DEFAULT_QUANTILES = (0.8, 0.9)  # the cuts at the 80% and 90% quantiles of the interaction times
PARTS = ("valid", "test")


def without_times(name: str, why: str) -> str:
    """The one line that refuses a dataset without interaction times for the temporal split, naming those with."""
    return (f"dataset {name!r} {why}, which the temporal split needs; split it with --split leave-one-out, or use a "
            f"dataset with times: ml-100k, ml-latest-small, the raw files of ml-1m, ml-20m, beauty and steam, or a "
            f"log of your own with a time column")


def quantile_time(times: np.ndarray, quantile: float) -> int:
    """The time of the interaction at 0-based position ⌊q·N⌋ of the N interactions sorted by time: without ties,
    exactly ⌊q·N⌋ interactions come before it (with ties at it, fewer; they belong to the later period)."""
    position = min(math.floor(quantile * len(times)), len(times) - 1)
    return int(np.partition(times, position)[position])


@dataclass(frozen=True)
class Holdout:
    """One part (validation or test) of a temporal split: its view and the users and targets it left out."""

    view: Histories
    users_skipped: int  # a target after the cut, but no interaction before it
    targets_dropped: int  # the target's item was first seen at or after the cut: no candidate


@dataclass(frozen=True)
class TemporalSplit:
    """The global temporal split at ``cuts`` = (c₁, c₂) (module docstring); ``quantiles``, when the cuts are the
    interaction times' quantiles, is recorded beside them."""

    data: SequenceData
    cuts: tuple[int, int]
    quantiles: tuple[float, float] | None = None
    scheme = TEMPORAL

    def __post_init__(self):
        if self.data.times is None:
            raise ValueError(without_times(self.data.name, "holds no interaction times"))
        first, second = self.cuts
        if not first < second:
            raise ValueError(f"dataset {self.data.name!r}: the cut times must rise, c1 < c2; got {first} and {second}"
                             + (f" (the {self.quantiles[0]:g} and {self.quantiles[1]:g} quantiles of the interaction "
                                f"times coincide: choose quantiles further apart)" if self.quantiles else ""))

    @classmethod
    def at_quantiles(cls, data: SequenceData, quantiles: tuple[float, float] = DEFAULT_QUANTILES) -> "TemporalSplit":
        """Cuts at ``quantiles`` of the interaction times (:func:`quantile_time`)."""
        if data.times is None:
            raise ValueError(without_times(data.name, "holds no interaction times"))
        if not len(data.times):
            raise ValueError(f"dataset {data.name!r} has no interactions to split")
        return cls(data, tuple(quantile_time(data.times, q) for q in quantiles), tuple(quantiles))

    @property
    def n_items(self) -> int:
        return self.data.n_items

    def cut(self, part: str) -> int:
        """The cut a part's targets follow: c₁ for validation, c₂ for test."""
        if part not in PARTS:
            raise unknown("split", part, PARTS)
        return self.cuts[PARTS.index(part)]

    @cached_property
    def _user_of(self) -> np.ndarray:
        return self.data.user_index()

    def _before(self, cut: int) -> np.ndarray:
        """Per user, how many interactions come before ``cut`` (a prefix: each user's times run forward)."""
        return np.bincount(self._user_of[self.data.times < cut], minlength=self.data.n_users)

    @cached_property
    def _first_seen(self) -> np.ndarray:
        """Per item id 0..n_items, the time of its first interaction (padding: never)."""
        first = np.full(self.n_items + 1, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, self.data.items, self.data.times)
        return first

    def _prefixes(self, lengths: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The first ``lengths[u]`` items of each user row in ``rows`` (ascending), as CSR (items, offsets)."""
        data = self.data
        position = np.arange(data.n_actions, dtype=np.int64) - data.offsets[self._user_of]
        chosen = np.zeros(data.n_users, dtype=bool)
        chosen[rows] = True
        keep = chosen[self._user_of] & (position < lengths[self._user_of])
        return data.items[keep], np.r_[0, np.cumsum(lengths[rows])].astype(np.int64)

    def train(self) -> Histories:
        """Every user's interactions before c₁, for the users who have any."""
        lengths = self._before(self.cuts[0])
        rows = np.flatnonzero(lengths > 0)
        items, offsets = self._prefixes(lengths, rows)
        return Histories(items, offsets, rows)

    @cached_property
    def _holdouts(self) -> dict:
        return {}

    def holdout(self, part: str) -> Holdout:
        """The part's view (history: the user's interactions before the part's cut; target: their first
        interaction at or after it, and before c₂ for validation) and the users and targets left out."""
        if part not in self._holdouts:
            self._holdouts[part] = self._holdout(part)
        return self._holdouts[part]

    def _holdout(self, part: str) -> Holdout:
        cut, data = self.cut(part), self.data
        end = self.cuts[1] if part == "valid" else None
        lengths = self._before(cut)
        first_after = data.offsets[:-1] + lengths  # the position of each user's first interaction at or after the cut
        has_next = first_after < data.offsets[1:]
        position = np.where(has_next, first_after, 0)
        in_period = has_next & ((data.times[position] < end) if end is not None else True)
        skipped = in_period & (lengths == 0)
        new = in_period & ~skipped & (self._first_seen[data.items[position]] >= cut)
        rows = np.flatnonzero(in_period & ~skipped & ~new)
        items, offsets = self._prefixes(lengths, rows)
        view = Histories(items, offsets, rows, data.items[position[rows]])
        return Holdout(view, int(skipped.sum()), int(new.sum()))

    def valid(self) -> Histories:
        return self.holdout("valid").view

    def test(self) -> Histories:
        return self.holdout("test").view

    def view(self, part: str) -> Histories:
        return self.holdout(part).view

    def new_items(self, part: str) -> np.ndarray:
        """The item ids first seen at or after the part's cut: no candidates of that part."""
        return np.flatnonzero(self._first_seen[1:] >= self.cut(part)).astype(np.int64) + 1

    def popularity(self, part: str) -> np.ndarray:
        """Interactions per item id 0..n_items before the part's cut (``pop100`` draws by them; 0 for new items)."""
        before = self.data.times < self.cut(part)
        return np.bincount(self.data.items[before], minlength=self.n_items + 1).astype(np.int64)

    def problems(self) -> list[str]:
        """One line per view that is empty at these cuts (the grid cannot train, select or test on it)."""
        name, (first, second) = self.data.name, self.cuts
        found = []
        if not len(self.train()):
            found.append(f"dataset {name!r}: no interaction comes before the first cut time {first}, so nothing is "
                         f"left to train on; move the cuts later")
        for part, what in (("valid", f"between the cut times {first} and {second}"),
                           ("test", f"at or after the second cut time {second}")):
            if not len(self.view(part)):
                found.append(f"dataset {name!r}: no user has a {part} target {what} (with a history and an item seen "
                             f"before it); move the cuts")
        return found

    def summary(self, part: str) -> dict:
        """What a result row records of the split for ``part``: the cuts and what the part left out."""
        holdout, train = self.holdout(part), self.train()
        return {"cut_times": list(self.cuts), "quantiles": None if self.quantiles is None else list(self.quantiles),
                "part": part, "train_users": len(train), "train_interactions": len(train.items),
                "users_skipped": holdout.users_skipped, "targets_dropped": holdout.targets_dropped,
                "items_excluded": len(self.new_items(part))}


@dataclass(frozen=True)
class SplitSpec:
    """A grid's split: the scheme, and for the temporal one its cuts, at ``quantiles`` of the interaction times
    (default :data:`DEFAULT_QUANTILES`) or at ``cut_times`` (in the data's time unit: unix seconds for MovieLens
    and Amazon, days for Steam, a log's own numbers)."""

    scheme: str = LEAVE_ONE_OUT
    quantiles: tuple[float, float] | None = None
    cut_times: tuple[int, int] | None = None

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise unknown("split", self.scheme, SCHEMES)
        if self.scheme == LEAVE_ONE_OUT and (self.quantiles or self.cut_times):
            raise ValueError("cut quantiles and cut times apply to --split temporal only")
        if self.quantiles is not None and self.cut_times is not None:
            raise ValueError("give the cuts as quantiles or as times, not both")
        if self.quantiles is not None and not (len(self.quantiles) == 2 and 0 < self.quantiles[0] < self.quantiles[1]
                                               < 1):
            raise ValueError(f"cut quantiles={list(self.quantiles)} must be two numbers with 0 < q1 < q2 < 1")
        if self.cut_times is not None and not (len(self.cut_times) == 2 and self.cut_times[0] < self.cut_times[1]):
            raise ValueError(f"cut times={list(self.cut_times)} must be two times with t1 < t2")

    @property
    def temporal(self) -> bool:
        return self.scheme == TEMPORAL

    def build(self, data: SequenceData) -> LeaveOneOutSplit | TemporalSplit:
        """The split of ``data`` this spec asks for; a dataset without times is refused (:func:`without_times`)."""
        if not self.temporal:
            return LeaveOneOutSplit(data)
        if data.times is None:
            source = data.provenance.get("source")
            why = ("is a log without a time column (name it with --columns time=COLUMN)"
                   if source in ("file", "DataFrame") else "holds no interaction times")
            raise ValueError(without_times(data.name, why))
        if self.cut_times is not None:
            return TemporalSplit(data, tuple(int(t) for t in self.cut_times))
        return TemporalSplit.at_quantiles(data, self.quantiles or DEFAULT_QUANTILES)


def split_record(split: LeaveOneOutSplit | TemporalSplit) -> dict | None:
    """What a job's key holds of its split: nothing for leave-one-out (its keys stay as they were), else the scheme,
    the cut times (and the quantiles they came from) and the hash of the times they cut."""
    if split.scheme == LEAVE_ONE_OUT:
        return None
    return {"scheme": split.scheme, "cut_times": list(split.cuts),
            "quantiles": None if split.quantiles is None else list(split.quantiles),
            "times_sha256": split.data.times_sha256()}


def split_from_record(data: SequenceData, record: dict | None) -> LeaveOneOutSplit | TemporalSplit:
    """The split a job's record (:func:`split_record`) names, rebuilt on its data (in a worker)."""
    if record is None:
        return LeaveOneOutSplit(data)
    quantiles = record.get("quantiles")
    return TemporalSplit(data, tuple(record["cut_times"]), None if quantiles is None else tuple(quantiles))
