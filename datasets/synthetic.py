"""Synthetic sequences with known structure, for quick runs, tests and scale tests.

The generating process (every draw from one seeded generator, so equal arguments give equal data):

- **popularity**: items get Zipf popularity ``pop(rank) ∝ rank^-zipf``, ranks assigned to ids at random;
- **genres**: the items are split at random into ``n_genres`` genres of (nearly) equal size, and every user
  has one favourite genre, drawn uniformly;
- **transitions**: the items of a genre sit on a ring in random order, and the successors of the item at
  ring position ``p`` are the items at ``p + o_1, ..., p + o_k`` (``k = n_successors``, the offsets ``o_j``
  distinct and shared by all genres). Each offset is a permutation of the genre, so every item has exactly
  ``k`` successors *and* exactly ``k`` predecessors, all in its own genre;
- **a user's walk**: the first item is a jump; each next item is, with probability ``follow``, one of the
  previous item's successors, chosen in proportion to their popularity, and otherwise a jump. A jump is a
  popularity draw from the user's favourite genre with probability ``taste``, else from all items;
- an item never repeats within a user (as in real data after deduplication): a draw that hits one of the
  user's items is replaced by a jump, and after a few tries by a uniform draw;
- lengths are ``min_length`` plus a log-normal amount, with mean ``mean_length``, capped at ``max_length``.

What each kind of model can exploit:

- POP: popularity. Jumps and the popularity-weighted choice among successors make the popular items
  frequent, but which item comes next is mostly decided by the last item, so POP is a weak baseline (on
  real data too: on ML-1m POP's full-ranking NDCG@10 is about a tenth of SASRec's).
- BPR-MF (and other user-taste models): the user's favourite genre. Walks stay in the genre they are in
  and jumps return to the favourite genre, so a user's items concentrate in a few genres.
- Sequential models (FPMC, GRU4Rec, Caser, SASRec, ...): the transitions. The next item is, most of the time,
  one of ``k`` successors of the last item, which neither popularity nor taste can tell apart from the rest
  of the genre.
- Bidirectional models (BERT4Rec): the same transitions read backwards. Every item has exactly ``k``
  predecessors, so the item after a position says as much about it as the item before it: a masked item of
  a training sequence is a successor of its left neighbour and a predecessor of its right one. On the
  default data, guessing a middle item from transition counts hits 37% of them with the left neighbour
  alone, 40% with the right one alone and 50% with both (``tests/test_datasets_synthetic.py``). Next-item
  prediction at test time has left context only; the right context is a training signal, which is what the
  Cloze objective adds.

Generation is vectorised across users: it walks time steps, each step drawing the next item of every user
still active, for chunks of users whose "already seen" bitmap fits in ``2**26`` cells. Users are processed
longest first, so the active users of a step are a prefix.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from recbench.datasets.progress import progress_bar
from recbench.datasets.sequences import SequenceData

GENERATOR_VERSION = 3  # 3: genres and user taste; successors on genre rings chosen by popularity
_CHUNK_CELLS = 1 << 26  # users per chunk x (n_items + 1) booleans: 64 MiB
_JUMP_RETRIES = 8  # jumps tried after a repeat before falling back to uniform draws


@dataclass(frozen=True)
class GeneratorSettings:
    """The generating process's settings (the module docstring), checked when made. ``max_length`` None is
    ``n_items // 2`` (there must be unseen items left to draw)."""

    n_users: int
    n_items: int
    mean_length: float
    seed: int = 0
    min_length: int = 5
    max_length: int | None = None
    n_successors: int = 3
    follow: float = 0.8
    zipf: float = 1.0
    n_genres: int = 10
    taste: float = 0.8
    length_sigma: float = 1.0

    def __post_init__(self):
        if self.max_length is None:
            object.__setattr__(self, "max_length", self.n_items // 2)
        if not 3 <= self.min_length < self.mean_length <= self.max_length < self.n_items:
            raise ValueError(f"need 3 <= min_length ({self.min_length}) < mean_length ({self.mean_length}) <= "
                             f"max_length ({self.max_length}) < n_items ({self.n_items})")
        if self.n_users < 1:
            raise ValueError(f"n_users={self.n_users} must be >= 1")
        if not 1 <= self.n_genres <= self.n_items:
            raise ValueError(f"n_genres={self.n_genres} must be in 1..n_items ({self.n_items})")
        if not 1 <= self.n_successors < self.n_items // self.n_genres:
            raise ValueError(f"n_successors={self.n_successors} must be >= 1 and smaller than the smallest genre "
                             f"({self.n_items // self.n_genres} items)")
        for label, value in (("follow", self.follow), ("taste", self.taste)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{label}={value} must be in [0, 1]")


def generate(n_users: int, n_items: int, mean_length: float, seed: int = 0, *, name: str = "synthetic",
             progress: bool = False, **settings) -> SequenceData:
    """``n_users`` sequences over items ``1..n_items``; identical for identical arguments. ``settings``: the other
    fields of :class:`GeneratorSettings` (``min_length``, ``max_length``, ``n_successors``, ``follow``, ``zipf``,
    ``n_genres``, ``taste``, ``length_sigma``). With ``progress``, a bar counts the users generated once generation
    has taken a few seconds.
    """
    process = GeneratorSettings(n_users, n_items, mean_length, seed, **settings)
    rng = np.random.default_rng(seed)
    world = _World.draw(process, rng)
    # log-normal excess over min_length with the requested mean: E[exp(N(mu, s))] = exp(mu + s^2 / 2)
    mu = np.log(mean_length - process.min_length) - process.length_sigma ** 2 / 2
    lengths = np.minimum(process.min_length + np.rint(rng.lognormal(mu, process.length_sigma, n_users)).astype(
        np.int64), process.max_length)
    offsets = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    items = np.empty(offsets[-1], dtype=np.int64)
    longest_first = np.argsort(-lengths, kind="stable")
    chunk = max(1, _CHUNK_CELLS // (n_items + 1))
    bar = progress_bar(n_users, f"generating {name}", progress, unit=" users", unit_scale=True)
    for start in range(0, n_users, chunk):
        users = longest_first[start:start + chunk]
        world.walk(rng, lengths[users], offsets[users], users, items)
        bar.update(len(users))
    bar.close()
    return SequenceData(name, items, offsets, n_items, {"source": "synthetic",
                                                       "generator": dataclasses.asdict(process),
                                                       "generator_version": GENERATOR_VERSION})


@dataclass
class _World:
    """The items' popularity, genres and successors and the users' favourite genres, drawn once; then the users'
    walks through them, chunk by chunk."""

    process: GeneratorSettings
    successors: np.ndarray  # (n_items + 1, k): the successors of each item on its genre's ring
    successor_cdf: np.ndarray  # each item's successors' cumulative popularity, normalised
    jump: _Jumps
    favourite: np.ndarray  # each user's favourite genre

    @classmethod
    def draw(cls, process: GeneratorSettings, rng: np.random.Generator) -> _World:
        n_items = process.n_items
        popularity = np.zeros(n_items + 1)
        popularity[1:] = rng.permutation(np.arange(1, n_items + 1, dtype=np.float64) ** -process.zipf)
        genres = np.array_split(rng.permutation(n_items) + 1, process.n_genres)  # each genre's items in ring order
        successors = _ring_successors(rng, genres, n_items, process.n_successors)
        successor_cdf = np.cumsum(popularity[successors], axis=1)
        successor_cdf /= successor_cdf[:, -1:].clip(min=1e-300)  # row 0 (padding) is never used
        jump = _Jumps(popularity, genres)
        favourite = rng.integers(0, process.n_genres, process.n_users)
        return cls(process, successors, successor_cdf, jump, favourite)

    def jumps(self, rng: np.random.Generator, genre: np.ndarray) -> np.ndarray:
        """One jump per user whose favourite genre is ``genre``: within it with probability ``taste``."""
        drawn = self.jump.anywhere(rng, len(genre))
        own = np.flatnonzero(rng.random(len(genre)) < self.process.taste)
        drawn[own] = self.jump.within(rng, genre[own])
        return drawn

    def walk(self, rng: np.random.Generator, lengths: np.ndarray, base: np.ndarray, users: np.ndarray,
             items: np.ndarray) -> None:
        """The walks of ``users`` (longest first), of ``lengths``, written into ``items`` from their offsets
        ``base``: time step by time step, each step drawing the next item of every user still walking."""
        n_items, k = self.process.n_items, self.process.n_successors
        genre = self.favourite[users]
        seen = np.zeros((len(users), n_items + 1), dtype=bool)
        previous = self.jumps(rng, genre)
        seen[np.arange(len(users)), previous] = True
        items[base] = previous
        for step in range(1, int(lengths[0])):
            active = int(np.searchsorted(-lengths, -step, side="left"))  # users longer than `step`
            rows = np.arange(active)
            last = previous[:active]
            which = (rng.random(active)[:, None] > self.successor_cdf[last]).sum(axis=1)
            candidate = self.successors[last, np.minimum(which, k - 1)]
            jumping = np.flatnonzero(rng.random(active) >= self.process.follow)
            candidate[jumping] = self.jumps(rng, genre[jumping])
            clash = np.flatnonzero(seen[rows, candidate])
            retries = 0
            while len(clash):
                candidate[clash] = (self.jumps(rng, genre[clash]) if retries < _JUMP_RETRIES
                                    else rng.integers(1, n_items + 1, len(clash)))
                clash = clash[seen[clash, candidate[clash]]]
                retries += 1
            seen[rows, candidate] = True
            items[base[:active] + step] = candidate
            previous[:active] = candidate


def _ring_successors(rng: np.random.Generator, genres: list[np.ndarray], n_items: int, k: int) -> np.ndarray:
    """``(n_items + 1, k)`` table: row ``i`` holds the items ``o_1..o_k`` places after ``i`` on its genre's
    ring; row 0 (padding) is unused. The offsets are distinct and below the smallest genre's size, so the
    ``k`` successors are distinct, never ``i`` itself, and each column is a permutation of every genre."""
    smallest = min(len(g) for g in genres)
    ring_offsets = rng.choice(np.arange(1, smallest), size=k, replace=False)
    table = np.zeros((n_items + 1, k), dtype=np.int64)
    for ring in genres:
        position = np.arange(len(ring))
        table[ring] = ring[(position[:, None] + ring_offsets[None, :]) % len(ring)]
    return table


class _Jumps:
    """Popularity draws from all items or from one genre (inverse-CDF sampling, vectorised)."""

    def __init__(self, popularity: np.ndarray, genres: list[np.ndarray]):
        cdf = np.cumsum(popularity[1:])
        self.cdf = cdf / cdf[-1]
        self.cdf[-1] = 1.0
        # All genres' cumulative popularity in one array: genre g's items occupy values (g, g + 1].
        self.by_genre = np.concatenate(genres)
        sizes = np.array([len(ring) for ring in genres])
        self.last = np.cumsum(sizes) - 1  # index of each genre's last item in by_genre
        self.first = self.last - sizes + 1
        parts = []
        for index, ring in enumerate(genres):
            within = np.cumsum(popularity[ring])
            within /= within[-1]
            within[-1] = 1.0
            parts.append(index + within)
        self.genre_cdf = np.concatenate(parts)

    def anywhere(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.searchsorted(self.cdf, rng.random(n), side="right") + 1

    def within(self, rng: np.random.Generator, genre: np.ndarray) -> np.ndarray:
        index = np.searchsorted(self.genre_cdf, genre + rng.random(len(genre)), side="right")
        # g + u can round up to g + 1 for u close to 1: keep the draw inside its genre.
        return self.by_genre[np.clip(index, self.first[genre], self.last[genre])]
