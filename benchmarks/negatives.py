"""Sampled candidate lists for the ``pop100`` and ``uni100`` protocols (``PROTOCOL.md``, "Negatives"), and the
one uniform negative per user of the relevance task's ``pairs`` (``PROTOCOL.md``, "Relevance prediction").

Negatives are drawn once per (dataset, split, protocol, seed), never include any item of the user's whole
sequence, are stored next to the prepared dataset and are reused by every model. Under the temporal split they are
drawn for the users the part evaluates only, from the items seen before the part's cut, and ``pop100`` weighs them
by their interactions before it (``PROTOCOL.md``, "Temporal split").

Sampling without replacement with weights ``w`` is done as sequential draws *with* replacement from ``w``
in which repeats and excluded items are discarded: the first surviving draw is distributed as ``w``
restricted to the allowed items, the next as ``w`` restricted to the allowed items not yet taken, and so on,
which is exactly weighted sampling without replacement. It is vectorised over a chunk of users and only the
rows still short of ``n`` negatives are drawn again.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from recbench.benchmarks.store import write_atomic
from recbench.datasets.errors import unknown
from recbench.datasets.progress import progress_bar
from recbench.datasets.sequences import Histories, LeaveOneOutSplit, SequenceData
from recbench.datasets.splits import TemporalSplit, split_record

SAMPLED_PROTOCOLS = {"pop100": "popularity", "uni100": "uniform"}
PAIRS = "pairs"  # relevance prediction: one uniform negative per user (benchmarks.relevance)
_SPLIT_CODES = {"valid": 1, "test": 2}
_PROTOCOL_CODES = {"pop100": 1, "uni100": 2, PAIRS: 3}


def candidate_weights(split: LeaveOneOutSplit | TemporalSplit, part: str, protocol: str) -> np.ndarray:
    """Sampling weight of each item id 0..n_items for ``part`` of ``split`` (padding has weight 0): ``pop100`` the
    split's popularity (leave-one-out: every interaction of the dataset; temporal: those before the part's cut,
    none for the items first seen after it), the others the same weight for every candidate item (under the
    temporal split, every item seen before the part's cut)."""
    if protocol == "pop100":
        return split.popularity(part).astype(np.float64)
    if protocol in ("uni100", PAIRS):
        weights = np.ones(split.n_items + 1, dtype=np.float64)
        weights[0] = 0.0
        weights[split.new_items(part)] = 0.0
        return weights
    raise unknown("sampled protocol", protocol, sorted(_PROTOCOL_CODES))


def sample_negatives(data: SequenceData, weights: np.ndarray, n: int, rng: np.random.Generator,
                     chunk_users: int = 2048, progress: bool = True, desc: str = "negatives",
                     rows: np.ndarray | None = None) -> np.ndarray:
    """``(n_users, n)`` item ids, per user drawn ∝ ``weights`` without replacement, avoiding the user's items.

    A progress bar (unless ``progress`` is False) counts the users done once sampling has run for
    a few seconds. ``rows``: each user's row in the dataset ``data`` was taken from, for messages."""
    n_users, n_slots = data.n_users, data.n_items + 1
    positive = weights > 0
    user_of = data.user_index()
    seen_positive = np.bincount(user_of, weights=positive[data.items], minlength=n_users).astype(np.int64)
    allowed = int(positive.sum()) - seen_positive
    if n_users and allowed.min() < n:
        user = int(np.argmin(allowed))
        raise ValueError(f"dataset {data.name!r}: user row {user if rows is None else rows[user]} leaves only "
                         f"{allowed[user]} items to draw {n} negatives from; use a dataset with more items or fewer "
                         f"negatives")
    cdf = np.cumsum(weights / weights.sum())
    cdf[-1] = 1.0
    out = np.zeros((n_users, n), dtype=np.int64)
    bar = progress_bar(n_users, desc, progress, unit=" users", unit_scale=True)
    for start in range(0, n_users, chunk_users):
        stop = min(start + chunk_users, n_users)
        rows = stop - start
        taken = np.zeros((rows, n_slots), dtype=bool)  # the user's items, then the negatives already drawn
        local = user_of[data.offsets[start]:data.offsets[stop]] - start
        taken[local, data.items[data.offsets[start]:data.offsets[stop]]] = True
        filled = np.zeros(rows, dtype=np.int64)
        pending = np.arange(rows)
        draws = 2 * n + 16
        while len(pending):
            drawn = np.searchsorted(cdf, rng.random((len(pending), draws)), side="right")
            drawn = np.minimum(drawn, n_slots - 1)
            row_of = np.repeat(pending, draws)
            flat = drawn.ravel()
            fresh = ~taken[row_of, flat]
            keys = row_of[fresh] * n_slots + flat[fresh]
            _, first = np.unique(keys, return_index=True)  # first occurrence of each (row, item) in draw order
            first.sort()
            positions = np.flatnonzero(fresh)[first]
            rows_hit, items_hit = row_of[positions], flat[positions]
            rank_in_row = np.arange(len(rows_hit)) - np.searchsorted(rows_hit, rows_hit, side="left")
            slot = filled[rows_hit] + rank_in_row
            keep = slot < n
            out[start + rows_hit[keep], slot[keep]] = items_hit[keep]
            taken[rows_hit[keep], items_hit[keep]] = True
            np.add.at(filled, rows_hit[keep], 1)
            pending = np.flatnonzero(filled < n)
            draws *= 2  # the rows still short are the ones whose allowed items carry little weight
        bar.update(rows)
    bar.close()
    return out


def load_or_sample(split: LeaveOneOutSplit | TemporalSplit, part: str, protocol: str, seed: int,
                   cache_dir: Path | None, n: int = 100, progress: bool = True) -> np.ndarray:
    """The stored negatives ``(n_users, n)`` for (dataset, split, part, protocol, seed), drawing and saving them
    the first time (with a progress bar when that takes more than a few seconds, unless ``progress`` is False).
    Under the temporal split only the rows of the users ``part`` evaluates are drawn; the others stay 0."""
    if part not in _SPLIT_CODES:
        raise unknown("split", part, sorted(_SPLIT_CODES))
    data = split.data
    weights = candidate_weights(split, part, protocol)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / (f"negatives-{data.content_sha256()[:16]}-{_scheme_tag(split)}{part}-{protocol}"
                                  f"-n{n}-seed{seed}.npy")
        if path.exists():
            cached = np.load(path, allow_pickle=False)
            if cached.shape == (data.n_users, n):
                return cached
    rng = np.random.default_rng([seed, _PROTOCOL_CODES[protocol], _SPLIT_CODES[part]])
    users = split.view(part).users  # under leave-one-out every user, in order: the draws of the whole dataset
    whole = Histories(data.items, data.offsets, np.arange(data.n_users)).subset(users)  # their whole sequences
    negatives = np.zeros((data.n_users, n), dtype=np.int64)
    negatives[users] = sample_negatives(SequenceData(data.name, whole.items, whole.offsets, data.n_items), weights,
                                        n, rng, progress=progress, desc=f"{data.name}: sampling {protocol} {part} "
                                                                          f"negatives", rows=users)
    if path is not None:
        buffer = io.BytesIO()
        np.save(buffer, negatives)
        write_atomic(path, buffer.getvalue())
    return negatives


def _scheme_tag(split: LeaveOneOutSplit | TemporalSplit) -> str:
    """What a stored list's name adds for a split other than leave-one-out (whose names stay as they were): the
    scheme, the cut times and the times' hash, which the data's hash in the name does not cover."""
    record = split_record(split)
    if record is None:
        return ""
    first, second = record["cut_times"]
    return f"{record['scheme']}-{first}-{second}-{record['times_sha256'][:8]}-"
