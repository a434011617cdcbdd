"""Time-ordered user sequences stored as CSR, and the leave-one-out split (``PROTOCOL.md``, "Split").

Every dataset, whatever its source, ends up as one :class:`SequenceData`: a flat ``int64`` array of item ids
(``1..n_items``; 0 is reserved for padding) plus ``offsets`` so that user ``u``'s sequence is
``items[offsets[u]:offsets[u + 1]]`` in chronological order. Users are numbered ``0..n_users-1``. Where the source
keeps each interaction's time, ``times`` holds it beside ``items`` (the global temporal split needs it,
``datasets/splits.py``); the authors' preprocessed files keep only the order, and their ``times`` is None.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recbench.datasets.errors import unknown

PAD = 0


@dataclass(frozen=True)
class SequenceData:
    """All users' chronological item sequences in CSR form."""

    name: str
    items: np.ndarray  # int64, ids in 1..n_items
    offsets: np.ndarray  # int64, length n_users + 1, offsets[0] == 0
    n_items: int
    provenance: dict = field(default_factory=dict)  # source file, its sha256, preprocessing settings
    times: np.ndarray | None = None  # int64 beside items: each interaction's time (None: the source has none)

    def __post_init__(self):
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
            raise ValueError(f"{self.name}: offsets must be a 1-d array starting at 0")
        if self.offsets[-1] != len(self.items) or np.any(np.diff(self.offsets) < 0):
            raise ValueError(f"{self.name}: offsets must be non-decreasing and end at len(items)")
        if len(self.items) and (self.items.min() < 1 or self.items.max() > self.n_items):
            raise ValueError(f"{self.name}: item ids must lie in 1..{self.n_items} (0 is padding)")
        if self.times is not None:
            self._check_times()

    def _check_times(self) -> None:
        """``times`` lies beside ``items`` and runs forward within each user, as the sequences do."""
        if self.times.shape != self.items.shape:
            raise ValueError(f"{self.name}: times must have one entry per item ({len(self.items)}), not "
                             f"{len(self.times)}")
        backwards = np.flatnonzero(np.diff(self.times) < 0) + 1  # positions whose time is before the previous one
        backwards = backwards[~np.isin(backwards, self.offsets)]  # a user's first position follows another user
        if len(backwards):
            user = int(np.searchsorted(self.offsets, backwards[0], side="right")) - 1
            raise ValueError(f"{self.name}: times must not decrease within a user's sequence; user row {user} goes "
                             f"back in time at position {backwards[0] - self.offsets[user]}")

    @classmethod
    def from_sequences(cls, name: str, sequences: list, n_items: int | None = None,
                       provenance: dict | None = None, times: list | None = None) -> "SequenceData":
        """From one list of item ids per user (and, optionally, one list of times per user beside them)."""
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        items = _flat(sequences)
        if n_items is None:
            n_items = int(items.max()) if len(items) else 0
        return cls(name, items, offsets, int(n_items), dict(provenance or {}),
                   None if times is None else _flat(times))

    @property
    def n_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_actions(self) -> int:
        return len(self.items)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def sequence(self, user: int) -> np.ndarray:
        return self.items[self.offsets[user]:self.offsets[user + 1]]

    def user_index(self) -> np.ndarray:
        """The user of every position of ``items`` (same length as ``items``)."""
        return np.repeat(np.arange(self.n_users, dtype=np.int64), self.lengths)

    def tied_in_time(self) -> np.ndarray:
        """Per position of ``items``: whether another interaction of the same user has the same time, so that the
        order of the file placed it among them (PROTOCOL.md, "Split"). Needs ``times``."""
        if self.times is None:
            raise ValueError(f"{self.name}: no interaction times, so no ties in time")
        same_as_next = np.zeros(len(self.items), dtype=bool)
        same_as_next[:-1] = self.times[1:] == self.times[:-1]
        same_as_next[self.offsets[1:][self.lengths > 0] - 1] = False  # a user's last item: the next user follows
        same_as_previous = np.zeros_like(same_as_next)
        same_as_previous[1:] = same_as_next[:-1]
        return same_as_next | same_as_previous

    def item_counts(self) -> np.ndarray:
        """Interactions per item id, indexed 0..n_items (index 0, padding, is always 0)."""
        return np.bincount(self.items, minlength=self.n_items + 1).astype(np.int64)

    def content_sha256(self) -> str:
        """Hash of the prepared sequences themselves, so results name exactly the data they used."""
        digest = hashlib.sha256()
        digest.update(np.int64(self.n_items).tobytes())
        digest.update(np.ascontiguousarray(self.offsets, dtype=np.int64).tobytes())
        digest.update(np.ascontiguousarray(self.items, dtype=np.int64).tobytes())
        return digest.hexdigest()

    def stats(self, holdout: int = 0) -> dict:
        """The columns of the paper's Table 1, computed on the whole sequences.

        ``holdout=2`` gives the variant behind Table 1's ML-1m row (``PAPER.md``, "Datasets"): avg length and density
        computed without each user's last two items (validation and test targets); users, items and
        actions stay whole-data counts.
        """
        users, items, actions = self.n_users, self.n_items, self.n_actions
        counted = actions - holdout * users
        return {
            "users": users,
            "items": items,
            "actions": actions,
            "avg_length": counted / users if users else 0.0,
            "density": counted / (users * items) if users and items else 0.0,
        }

    def times_sha256(self) -> str | None:
        """Hash of the interactions' times (None without them): ``content_sha256`` leaves them out, so that data
        with and without times split by leave-one-out keep one hash; a temporal split's key adds this one."""
        if self.times is None:
            return None
        return hashlib.sha256(np.ascontiguousarray(self.times, dtype=np.int64).tobytes()).hexdigest()

    def save(self, path: Path) -> None:
        """Write atomically to ``path`` (``.npz``); the provenance travels as JSON inside it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        times = {} if self.times is None else {"times": self.times}
        # A unique temporary name, so that two processes preparing the same dataset never mix their writes.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp.npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, items=self.items, offsets=self.offsets, n_items=np.int64(self.n_items),
                         name=np.array(self.name), provenance=np.array(json.dumps(self.provenance)), **times)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path) -> "SequenceData":
        with np.load(path, allow_pickle=False) as f:
            items, offsets = (f[key].astype(np.int64, copy=False) for key in ("items", "offsets"))
            times = f["times"].astype(np.int64, copy=False) if "times" in f.files else None
            return cls(str(f["name"]), items, offsets, int(f["n_items"]), json.loads(str(f["provenance"])), times)


def _flat(lists: list) -> np.ndarray:
    """One int64 array of the concatenated ``lists``."""
    return np.concatenate([np.asarray(x, dtype=np.int64) for x in lists]) if len(lists) else np.zeros(0, np.int64)


@dataclass(frozen=True)
class Histories:
    """A batch-able view: each user's input history (CSR) and, for evaluation, the held-out target.

    ``targets`` is ``None`` for the training view. ``users`` are row ids into the parent dataset.
    """

    items: np.ndarray
    offsets: np.ndarray
    users: np.ndarray
    targets: np.ndarray | None = None

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.users)

    def flat(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every history item of ``rows`` as parallel arrays (position of the row in ``rows``, item id)."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.offsets[rows]
        lengths = self.offsets[rows + 1] - starts
        row_of = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
        first_position = np.cumsum(lengths) - lengths  # where each row's run begins in the output
        index = starts[row_of] + np.arange(len(row_of), dtype=np.int64) - first_position[row_of]
        return row_of, self.items[index]

    def subset(self, rows: np.ndarray) -> "Histories":
        """The histories of ``rows`` only, in that order (a training view of some users: speed measurements)."""
        row_of, items = self.flat(rows)
        offsets = np.r_[0, np.cumsum(np.bincount(row_of, minlength=len(rows)))]
        return Histories(items, offsets, self.users[rows], None if self.targets is None else self.targets[rows])

    def padded(self, rows: np.ndarray, max_len: int) -> np.ndarray:
        """Left-padded ``(len(rows), max_len)`` matrix of the last ``max_len`` items of each history.

        Built with one vectorised gather: position ``j`` of row ``r`` holds item
        ``end_r - max_len + j`` when that index is inside the history, else PAD.
        """
        rows = np.asarray(rows, dtype=np.int64)
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        index = ends[:, None] - max_len + np.arange(max_len, dtype=np.int64)[None, :]
        valid = index >= starts[:, None]
        out = np.where(valid, self.items[np.where(valid, index, 0)] if len(self.items) else PAD, PAD)
        return out.astype(np.int64, copy=False)


@dataclass(frozen=True)
class LeaveOneOutSplit:
    """The protocol's split: train ``s[:-2]``; valid ``s[:-2] -> s[-2]``; test ``s[:-1] -> s[-1]``. Its interface
    is the one every split gives the harness (``datasets/splits.py``)."""

    data: SequenceData
    scheme = "leave-one-out"

    def __post_init__(self):
        short = np.flatnonzero(self.data.lengths < 3)
        if len(short):
            raise ValueError(
                f"dataset {self.data.name!r}: {len(short)} user(s) have fewer than 3 interactions "
                f"(first: user row {short[0]} with {self.data.lengths[short[0]]}); leave-one-out needs "
                f"at least 3 per user. Filter users with min_user_interactions >= 3 when preparing it.")

    @property
    def n_items(self) -> int:
        return self.data.n_items

    def _prefix(self, drop_last: int, targets: bool) -> Histories:
        data = self.data
        keep = np.ones(data.n_actions, dtype=bool)
        ends = data.offsets[1:]
        for k in range(1, drop_last + 1):
            keep[ends - k] = False
        offsets = data.offsets - drop_last * np.arange(data.n_users + 1, dtype=np.int64)
        users = np.arange(data.n_users, dtype=np.int64)
        target = data.items[ends - drop_last] if targets else None
        return Histories(data.items[keep], offsets, users, target)

    def train(self) -> Histories:
        """Training sequences ``s[:-2]``; never contain the validation or test item."""
        return self._prefix(2, targets=False)

    def valid(self) -> Histories:
        """Input ``s[:-2]``, target ``s[-2]``."""
        return self._prefix(2, targets=True)

    def test(self) -> Histories:
        """Input ``s[:-1]``, target ``s[-1]``: the only view in which the test item exists."""
        return self._prefix(1, targets=True)

    def view(self, split: str) -> Histories:
        if split == "valid":
            return self.valid()
        if split == "test":
            return self.test()
        raise unknown("split", split, ("valid", "test"))

    def new_items(self, split: str) -> np.ndarray:
        """Item ids that are no candidates of ``split``: none, every item is."""
        return np.zeros(0, dtype=np.int64)

    def popularity(self, split: str) -> np.ndarray:
        """What ``pop100`` draws by: each item's interaction count over the whole dataset (``PROTOCOL.md``,
        "Negatives")."""
        return self.data.item_counts()
