"""Ranking metrics from per-user rank counts (``PROTOCOL.md``, "Rank and ties" and "Metrics").

For each user the evaluator keeps two numbers: ``greater`` (candidates scored strictly above the target) and
``ties`` (other candidates scored exactly like it). Every metric follows from them. Under the ``expected`` tie
policy the target's rank is uniform on ``greater+1 … greater+ties+1`` and each metric is its mean over those
ranks, so a constant scorer gets exactly the random-ranking value:

- HR@k   = P(rank ≤ k)
- NDCG@k = E[1/log2(rank+1) · 1{rank ≤ k}]   (one relevant item, so IDCG = 1)
- MRR    = E[1/rank]                         (over all candidates, not truncated)

The reports recompute metrics and paired tests from the stored counts with these same functions.

Under full ranking the evaluator also hands over each user's top-k list, and :class:`TopLists` measures what the
lists show beyond the target (``PROTOCOL.md``, "Beyond accuracy"): catalogue coverage, the Gini index of exposure,
average recommendation popularity, the long tail's share and novelty, from the training view's popularity, and
personalisation, how little two users' lists share.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recbench.benchmarks.store import npz_bytes, write_atomic
from recbench.datasets.errors import unknown

TIE_POLICIES = ("expected", "pessimistic", "optimistic")
DEFAULT_METRICS = ("HR@1", "HR@5", "HR@10", "NDCG@5", "NDCG@10", "MRR")  # the paper's Table 2 rows


@dataclass
class RankCounts:
    """Per evaluated user: its row, how many candidates beat the target and how many tie with it, and how many
    candidates it was ranked among besides the target (``candidates``; None in files written before it was kept),
    from which the expected sampled metrics follow (``benchmarks.sampled_metrics``)."""

    users: np.ndarray
    greater: np.ndarray
    ties: np.ndarray
    candidates: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a per-user file holds (``candidates`` only where known)."""
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}

    def save(self, path: Path) -> None:
        write_atomic(path, npz_bytes(self.arrays()))

    @classmethod
    def load(cls, path: Path) -> "RankCounts":
        with np.load(path, allow_pickle=False) as f:
            return cls(f["users"], f["greater"], f["ties"], f["candidates"] if "candidates" in f.files else None)


def parse_metric(name: str) -> tuple[str, int | None]:
    """(kind, cutoff) of a metric name: ``("NDCG", 10)`` for ``NDCG@10``, ``("MRR", None)`` for ``MRR``."""
    kind, _, cutoff = name.partition("@")
    if kind == "MRR" and not cutoff:
        return kind, None
    if kind in ("HR", "NDCG") and cutoff.isdigit() and int(cutoff) > 0:
        return kind, int(cutoff)
    raise unknown("metric", name, ["HR@k", "NDCG@k (k a positive integer)", "MRR"])


def check_metric_name(name: str) -> bool:
    """Whether ``name`` is a ranking metric the evaluator computes (HR@k, NDCG@k, MRR)."""
    try:
        parse_metric(name)
    except ValueError:
        return False
    return True


def check_tie_policy(tie_policy: str) -> None:
    if tie_policy not in TIE_POLICIES:
        raise unknown("tie policy", tie_policy, TIE_POLICIES)


def per_user_metrics(greater: np.ndarray, ties: np.ndarray, metrics=DEFAULT_METRICS,
                     tie_policy: str = "expected") -> dict[str, np.ndarray]:
    """Each metric (``HR@k``, ``NDCG@k``, ``MRR``) for each user from its (greater, ties) counts."""
    parsed = [parse_metric(name) for name in metrics]
    check_tie_policy(tie_policy)
    greater = np.asarray(greater, dtype=np.int64)
    ties = np.asarray(ties, dtype=np.int64)
    if tie_policy == "pessimistic":  # every tied candidate ranks above the target
        greater, ties = greater + ties, np.zeros_like(ties)
    elif tie_policy == "optimistic":  # the target ranks above every tied candidate
        ties = np.zeros_like(ties)
    worst = greater + ties + 1  # the lowest rank the target can take
    width = (ties + 1).astype(np.float64)  # number of equally likely ranks
    ranks = np.arange(1, int(worst.max(initial=1)) + 1, dtype=np.float64)
    gain_sum = np.r_[0.0, np.cumsum(1.0 / np.log2(ranks + 1.0))]  # gain_sum[n] = Σ_{r≤n} 1/log2(r+1)
    reciprocal_sum = np.r_[0.0, np.cumsum(1.0 / ranks)]  # reciprocal_sum[n] = Σ_{r≤n} 1/r
    out = {}
    for name, (kind, k) in zip(metrics, parsed):
        if kind == "HR":
            out[name] = np.clip(k - greater, 0, ties + 1) / width
        elif kind == "NDCG":
            out[name] = (gain_sum[np.minimum(worst, k)] - gain_sum[np.minimum(greater, k)]) / width
        else:
            out[name] = (reciprocal_sum[worst] - reciprocal_sum[greater]) / width
    return out


def summarize(per_user: dict[str, np.ndarray]) -> dict[str, float]:
    """The mean of each metric over the users (NaN when there are none)."""
    return {name: float(values.mean()) if len(values) else float("nan") for name, values in per_user.items()}


# ------------------------------------------------------------------------- beyond accuracy: the top-k lists
# What the lists show besides the target (PROTOCOL.md, "Beyond accuracy"), by the names rows store them under.
LIST_METRICS = ("Coverage", "Gini", "ARP", "APLT", "Novelty", "Personalization")
LIST_CUTOFF = 10  # always computed, beside every cutoff of the run's ranking metrics
SHORT_HEAD_SHARE = 0.2  # of the catalogue: the most interacted-with items of the training view


def parse_list_metric(name: str) -> tuple[str, int]:
    """(kind, cutoff) of a beyond-accuracy metric name: ``("ARP", 10)`` for ``ARP@10``."""
    kind, _, cutoff = name.partition("@")
    if kind in LIST_METRICS and cutoff.isdigit() and int(cutoff) > 0:
        return kind, int(cutoff)
    raise unknown("beyond-accuracy metric", name, [f"{kind}@k" for kind in LIST_METRICS])


def is_list_metric(name: str) -> bool:
    """Whether ``name`` is a beyond-accuracy metric of the top-k lists (``Coverage@k``, ``Gini@k``, ...)."""
    try:
        parse_list_metric(name)
    except ValueError:
        return False
    return True


def list_metric_names(metrics=DEFAULT_METRICS) -> tuple[str, ...]:
    """Every beyond-accuracy metric at ``LIST_CUTOFF`` and at each cutoff of the ranking ``metrics``."""
    cutoffs = {LIST_CUTOFF} | {k for k in (parse_metric(name)[1] for name in metrics) if k is not None}
    return tuple(f"{kind}@{k}" for kind in LIST_METRICS for k in sorted(cutoffs))


@dataclass(frozen=True)
class TrainingPopularity:
    """How popular each item id (0 = padding) is in the interactions a model trained on: ``interactions`` counts
    every one (a user's repeats too), ``users`` the training users who interacted with it at least once, of
    ``n_users`` training users with any interaction. Only the training view counts: the held-out targets are what
    is being predicted (``pop100`` draws its negatives from whole-dataset counts, ``benchmarks.negatives``)."""

    interactions: np.ndarray
    users: np.ndarray
    n_users: int

    @classmethod
    def of(cls, train, n_items: int) -> "TrainingPopularity":
        """From a training view (``Histories``: flat ``items`` and ``offsets`` per user) over ids 1..n_items."""
        n_slots = n_items + 1
        lengths = np.diff(train.offsets)
        user_of = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        # Each (user, item) once: sorted, then the first of each run (numpy's hashing np.unique took seconds on
        # ML-1m's million pairs, a sort a tenth of one).
        pairs = np.sort(user_of * n_slots + train.items)
        pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]]
        return cls(np.bincount(train.items, minlength=n_slots).astype(np.int64),
                   np.bincount(pairs % n_slots, minlength=n_slots).astype(np.int64), int(np.count_nonzero(lengths)))

    def short_head(self) -> np.ndarray:
        """Per item id: whether it belongs to the short head, i.e. has training interactions and fewer than
        ``SHORT_HEAD_SHARE`` of the catalogue's items have more (items tied at the boundary are all in it)."""
        counts = self.interactions[1:]
        more = len(counts) - np.searchsorted(np.sort(counts), counts, side="right")  # items with a higher count
        return np.r_[False, (counts > 0) & (more < SHORT_HEAD_SHARE * len(counts))]

    def self_information(self) -> np.ndarray:
        """Per item id: −log2 of the share of training users who interacted with it; an item no training user
        has is counted as one user's, the rarest an item can be, so that it does not make a mean infinite."""
        return -np.log2(np.maximum(self.users, 1) / max(self.n_users, 1))


def gini(values: np.ndarray) -> float:
    """Gini index of non-negative ``values``: the mean absolute difference of every ordered pair over twice the
    mean, Σ_j (2j − n − 1) x_(j) / (n Σ x) with x sorted ascending (0: all equal; (n − 1)/n: one holds all)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n, total = len(x), x.sum()
    if n == 0 or total == 0:
        return float("nan")
    return float(np.sum((2 * np.arange(1, n + 1) - n - 1) * x) / (n * total))


def list_weights(user: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Each entry's probability of being in its user's top-k list. ``user`` numbers the users 0, 1, ... in
    order and each user's entries come best first; a user with fewer than k entries gets them all. Entries
    scored above the list's last place are in it; the t entries tied with that place share the r places left,
    each with probability r/t (the ``expected`` tie rule); lower ones are out."""
    size = np.bincount(user)
    first = np.cumsum(size) - size
    length = np.minimum(k, size)
    boundary = scores[first + length - 1][user]  # the score at each list's last place
    above, tied = scores > boundary, scores == boundary
    left = length - np.bincount(user[above], minlength=len(size))  # places left for the tied entries
    share = left / np.bincount(user[tied], minlength=len(size))
    return np.where(above, 1.0, np.where(tied, share[user], 0.0))


class TopLists:
    """The top-k lists of the evaluated users under full ranking, at several cutoffs, kept as what the
    beyond-accuracy metrics need: how often each item is shown and each list's mean popularity.

    A list holds the user's k highest-scored candidates. When candidates tie across its end, the tie rule of
    the rank counts (``expected``) applies: the tied candidates are in a uniformly random order, so each of the
    t tied ones fills the r places left with probability r/t, and every metric takes its expectation under
    independent draws per user. ``add`` receives, per user, every candidate scored at least as high as its
    ``depth``-th best (all its candidates when it has fewer), which determines the lists at every cutoff."""

    def __init__(self, cutoffs, popularity: TrainingPopularity, excluded=None):
        self.cutoffs = tuple(sorted(set(cutoffs)))
        n_slots = len(popularity.interactions)
        # The catalogue Coverage and Gini count over: every item id but padding and ``excluded``, the items no list
        # may hold (the temporal split's items first seen at or after its cut).
        self.catalogue = np.ones(n_slots, dtype=bool)
        self.catalogue[0] = False
        if excluded is not None:
            self.catalogue[np.asarray(excluded)] = False
        # Per item id and cutoff: expected exposure (number of lists), its squares over the lists (for the expected
        # overlap of two users' lists), shown for certain in some list, and Σ log(1 − w) over the lists that show
        # it with a probability w between 0 and 1.
        self.exposure = np.zeros((len(self.cutoffs), n_slots))
        self.exposure_squares = np.zeros((len(self.cutoffs), n_slots))
        self.certain = np.zeros((len(self.cutoffs), n_slots), dtype=bool)
        self.log_unshown = np.zeros((len(self.cutoffs), n_slots))
        # Per list measure (item popularity, in the long tail, self-information) and cutoff: Σ over lists of the
        # list's expected mean.
        self.item_measures = np.stack([popularity.interactions.astype(np.float64), ~popularity.short_head(),
                                       popularity.self_information()])
        self.list_sums = np.zeros((len(self.cutoffs), len(self.item_measures)))
        self.n_lists = 0

    @property
    def depth(self) -> int:
        """How deep a user's candidates must be handed to ``add``: the largest cutoff."""
        return self.cutoffs[-1]

    def add(self, rows: np.ndarray, items: np.ndarray, scores: np.ndarray) -> None:
        """Entries of some users' lists, as parallel arrays: a key per user (``rows``), item id, score. Every
        entry of a user comes in one call."""
        if not len(rows):
            return
        order = np.lexsort((-np.asarray(scores, dtype=np.float64), rows))  # by user, best first
        _, user = np.unique(np.asarray(rows)[order], return_inverse=True)
        items, scores = np.asarray(items)[order], np.asarray(scores)[order]
        n_users = int(user[-1]) + 1
        length = np.bincount(user)
        for index, k in enumerate(self.cutoffs):
            w = list_weights(user, scores, k)
            self.exposure[index] += np.bincount(items, weights=w, minlength=self.exposure.shape[1])
            self.exposure_squares[index] += np.bincount(items, weights=w * w, minlength=self.exposure.shape[1])
            self.certain[index, items[w == 1]] = True
            partly = (w > 0) & (w < 1)
            np.add.at(self.log_unshown[index], items[partly], np.log1p(-w[partly]))
            for measure, values in enumerate(self.item_measures):
                per_list = np.bincount(user, weights=w * values[items], minlength=n_users) / np.minimum(k, length)
                self.list_sums[index, measure] += per_list.sum()
        self.n_lists += n_users

    def metrics(self, names) -> dict[str, float]:
        """The requested beyond-accuracy metrics (``Coverage@k`` ...) at cutoffs this instance kept; NaN without
        any list, as a mean over no users."""
        out = {}
        for name in names:
            kind, k = parse_list_metric(name)
            index = self.cutoffs.index(k)
            if not self.n_lists:
                out[name] = float("nan")
            elif kind == "Coverage":  # expected share of the catalogue shown in at least one list
                shown = np.where(self.certain[index], 1.0, -np.expm1(self.log_unshown[index]))
                out[name] = float(shown[self.catalogue].sum() / self.catalogue.sum())
            elif kind == "Gini":
                out[name] = gini(self.exposure[index, self.catalogue])
            elif kind == "Personalization":
                out[name] = self.personalization(index, k)
            else:
                measure = ("ARP", "APLT", "Novelty").index(kind)
                out[name] = float(self.list_sums[index, measure] / self.n_lists)
        return out

    def personalization(self, index: int, k: int) -> float:
        """1 − the mean share of k that two users' top-k lists hold in common, over every pair of lists (NaN
        with fewer than two). Lists of different users draw their ties independently, so two lists' expected
        overlap is Σ_i w_ui w_vi, and over all pairs Σ_i (e_i² − Σ_u w_ui²) / 2 with the exposures e_i = Σ_u w_ui:
        one pass over the items instead of one over the pairs of users."""
        n = self.n_lists
        if n < 2:
            return float("nan")
        overlap = np.sum(self.exposure[index] ** 2 - self.exposure_squares[index]) / (n * (n - 1))
        return float(1 - overlap / k)
