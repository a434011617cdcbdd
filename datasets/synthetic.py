"""Synthetic sequences with real sequential structure, for quick runs, tests and scale tests.

The generating process is a first-order Markov chain mixed with popularity:

- items get Zipf popularity ``p(rank) ∝ rank^-zipf``, ranks assigned to ids at random;
- every item has ``n_successors`` distinct successor items, also drawn by popularity (a long tail, as
  in real data);
- a user's first item is drawn by popularity; each next item is, with probability ``follow``, one of the
  previous item's successors (the j-th with weight ``2^-j``), otherwise a popularity draw;
- an item never repeats within a user (like real data after deduplication): a draw that hits one of the
  user's items is redrawn by popularity, and after a few tries uniformly;
- lengths are ``min_length`` plus a log-normal amount, with mean ``mean_length``, capped at ``max_length``.

So "predict a successor of the last item" beats "predict the most popular item" by a wide margin, and any
sequential model must clearly beat POP. Generation is vectorised across users: it walks time steps, each
step drawing the next item of every user still active, for chunks of users whose "already seen" bitmap
fits in ``2**26`` cells. Users are processed longest first, so the active users of a step are a prefix.
"""
from __future__ import annotations

import numpy as np

from datasets.sequences import SequenceData

GENERATOR_VERSION = 2
_CHUNK_CELLS = 1 << 26  # users per chunk x (n_items + 1) booleans: 64 MiB
_POPULAR_RETRIES = 8  # popularity redraws before falling back to uniform ones


def generate(n_users: int, n_items: int, mean_length: float, seed: int = 0, *, min_length: int = 5,
             max_length: int | None = None, n_successors: int = 3, follow: float = 0.8, zipf: float = 1.0,
             length_sigma: float = 1.0, name: str = "synthetic") -> SequenceData:
    """``n_users`` sequences over items ``1..n_items``; identical for identical arguments.

    ``max_length`` defaults to ``n_items // 2`` (there must be unseen items left to draw).
    """
    max_length = n_items // 2 if max_length is None else max_length
    if not 3 <= min_length < mean_length <= max_length < n_items:
        raise ValueError(f"need 3 <= min_length ({min_length}) < mean_length ({mean_length}) <= max_length "
                         f"({max_length}) < n_items ({n_items})")
    if n_users < 1 or not 1 <= n_successors < n_items or not 0.0 <= follow <= 1.0:
        raise ValueError(f"need n_users >= 1, 1 <= n_successors < n_items and 0 <= follow <= 1; got "
                         f"{n_users}, {n_successors}, {follow}")
    params = dict(n_users=n_users, n_items=n_items, mean_length=mean_length, seed=seed, min_length=min_length,
                  max_length=max_length, n_successors=n_successors, follow=follow, zipf=zipf,
                  length_sigma=length_sigma)
    rng = np.random.default_rng(seed)
    popularity_cdf = _popularity_cdf(rng, n_items, zipf)
    successors = _successors(rng, popularity_cdf, n_successors)
    successor_cdf = np.cumsum(0.5 ** np.arange(n_successors))
    successor_cdf /= successor_cdf[-1]

    # log-normal excess over min_length with the requested mean: E[exp(N(mu, s))] = exp(mu + s^2 / 2)
    mu = np.log(mean_length - min_length) - length_sigma ** 2 / 2
    lengths = np.minimum(min_length + np.rint(rng.lognormal(mu, length_sigma, n_users)).astype(np.int64),
                         max_length)
    offsets = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    items = np.empty(offsets[-1], dtype=np.int64)

    def popular(k: int) -> np.ndarray:
        return np.searchsorted(popularity_cdf, rng.random(k), side="right") + 1  # cdf ends at exactly 1.0

    longest_first = np.argsort(-lengths, kind="stable")
    chunk = max(1, _CHUNK_CELLS // (n_items + 1))
    for start in range(0, n_users, chunk):
        users = longest_first[start:start + chunk]
        chunk_lengths, base = lengths[users], offsets[users]
        seen = np.zeros((len(users), n_items + 1), dtype=bool)
        previous = popular(len(users))
        seen[np.arange(len(users)), previous] = True
        items[base] = previous
        for step in range(1, int(chunk_lengths[0])):
            active = int(np.searchsorted(-chunk_lengths, -step, side="left"))  # users longer than `step`
            rows = np.arange(active)
            which = np.searchsorted(successor_cdf, rng.random(active), side="right")
            chained = successors[previous[:active], which]
            candidate = np.where(rng.random(active) < follow, chained, popular(active))
            clash = np.flatnonzero(seen[rows, candidate])
            retries = 0
            while len(clash):
                candidate[clash] = (popular(len(clash)) if retries < _POPULAR_RETRIES
                                    else rng.integers(1, n_items + 1, len(clash)))
                clash = clash[seen[clash, candidate[clash]]]
                retries += 1
            seen[rows, candidate] = True
            items[base[:active] + step] = candidate
            previous[:active] = candidate
    return SequenceData(name, items, offsets, n_items,
                        {"source": "synthetic", "generator": params, "generator_version": GENERATOR_VERSION})


def _popularity_cdf(rng: np.random.Generator, n_items: int, zipf: float) -> np.ndarray:
    """Cumulative popularity over item ids 1..n (index 0 is id 1), Zipf ranks shuffled over the ids."""
    weights = np.arange(1, n_items + 1, dtype=np.float64) ** -zipf
    cdf = np.cumsum(rng.permutation(weights))
    return cdf / cdf[-1]


def _successors(rng: np.random.Generator, popularity_cdf: np.ndarray, k: int) -> np.ndarray:
    """``(n_items + 1, k)`` table: row ``i`` holds item ``i``'s k distinct successors, drawn by popularity
    and never ``i`` itself; row 0 is unused. Rows that drew a repeat are drawn again until none does."""
    n_items = len(popularity_cdf)
    table = np.zeros((n_items + 1, k), dtype=np.int64)
    pending = np.arange(1, n_items + 1)
    while len(pending):
        draws = np.searchsorted(popularity_cdf, rng.random((len(pending), k)), side="right") + 1
        ordered = np.sort(draws, axis=1)
        bad = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1) | (draws == pending[:, None]).any(axis=1)
        table[pending[~bad]] = draws[~bad]
        pending = pending[bad]
    return table
