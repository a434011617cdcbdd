"""The shared leave-one-out evaluator: every model is scored here and nowhere else (``protocol.md``).

For each user the evaluator counts ``greater`` (candidates scored strictly above the target) and ``ties``
(other candidates scored exactly like it). Every metric follows from those two numbers:
with the ``expected`` tie policy the target's rank is uniform on ``greater+1 … greater+ties+1`` and each metric
is its mean over those ranks, so a constant scorer gets exactly the random-ranking value.

- HR@k   = P(rank ≤ k)
- NDCG@k = E[1/log2(rank+1) · 1{rank ≤ k}]   (one relevant item, so IDCG = 1)
- MRR    = E[1/rank]                         (over all candidates, not truncated)

Scoring is batched: one ``score`` call per chunk of users (as many as the device's memory allows, see
:func:`chunk_users`), then vectorised comparisons with the target's score (no sorting). Under full ranking the
comparisons run over every column, and the excluded columns (padding, the user's history) are taken back out
of the counts afterwards, so the evaluator never writes into the scores a model returned (a model may hand back
its own tensor or a broadcast view of it). On the CPU, a model whose scores are a product q_u · e_i + b_i
(``models.base.ScoreFactors``) is ranked tile by tile instead (:meth:`Evaluator._tiled_full_counts`), with the
same counts. The per-user counts are kept so that every metric and paired tests can be recomputed later.
"""
from __future__ import annotations

import dataclasses
import math
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from recbench.benchmarks.negatives import SAMPLED_PROTOCOLS, load_or_sample
from recbench.benchmarks.store import npz_bytes, write_atomic
from recbench.datasets.progress import progress_bar
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.models.base import Recommender

PROTOCOLS = ("full", *SAMPLED_PROTOCOLS)
TIE_POLICIES = ("expected", "pessimistic", "optimistic")
DEFAULT_METRICS = ("HR@1", "HR@5", "HR@10", "NDCG@5", "NDCG@10", "MRR")  # the paper's Table 2 rows


# Memory one scoring chunk may take: scores, comparison masks and the model's activations (``chunk_users``).
CPU_CHUNK_BYTES = 128 * 2**20
CUDA_FREE_SHARE = 0.5  # of the CUDA device's free memory
# Per user, besides its row of scores, a model's activations are taken as at most this many floats per pair of
# history positions and per position: an attention model holds a T × T mask and weights per head (BERT4Rec and
# SASRec at T = 200, h = 2 measured 4.3 T² floats per user in all), a recurrent one a few states per position.
ACTIVATION_FLOATS_PER_POSITION_PAIR = 8
ACTIVATION_FLOATS_PER_POSITION = 512
# On the CPU, score rows are compared a slice at a time so that each slice is read from the cache, not memory.
CPU_SLICE_BYTES = 2**18
# Users per seeded draw of the sampled protocols' candidate order (the evaluator's former fixed chunk size).
ORDER_BLOCK = 256
# Full ranking of a product-score model on the CPU: items per tile (a tile of TILE_USERS × TILE_ITEMS float32
# scores, 1 MiB, stays in a core's cache while it is counted) and users per product.
TILE_ITEMS = 1024
TILE_USERS = 256
# Scores bounded below this in magnitude are finite, and so is their difference with the target's.
FINITE_SCORE_BOUND = 2.0 ** 126


def chunk_users(device: torch.device, n_columns: int, history_length: int) -> int:
    """How many users one ``score`` call gets: as many as fit the memory budget (CPU: ``CPU_CHUNK_BYTES``;
    CUDA: ``CUDA_FREE_SHARE`` of the free device memory), at least one, a multiple of ``ORDER_BLOCK`` when
    more than one block fits. A user costs its ``n_columns`` float32
    scores with two bytes of comparison masks each, and the model's activations for ``history_length``
    positions (see ``ACTIVATION_FLOATS_PER_POSITION_PAIR``)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # Blocks torch's caching allocator holds but does not use are free to it, though not to the driver.
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        budget = CUDA_FREE_SHARE * free
    else:
        budget = CPU_CHUNK_BYTES
    T = max(history_length, 1)
    per_user = 6 * n_columns + 4 * (ACTIVATION_FLOATS_PER_POSITION_PAIR * T * T + ACTIVATION_FLOATS_PER_POSITION * T)
    users = max(1, int(budget // per_user))
    # Whole blocks of the sampled protocols' candidate order, each drawn once; on the CPU this also keeps Beauty's
    # and Steam's chunks as they were (a network's scores can change in the last bit with its batch's width).
    return users - users % ORDER_BLOCK if users >= ORDER_BLOCK else users


def compare_rows(scores: torch.Tensor, reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """For each row of ``scores`` (B, C): how many entries are above its ``reference`` (B, 1) and how many equal
    it, as int64 (B,) tensors, and the largest entry of all (NaN if any entry is NaN). Reads ``scores`` (any
    layout, e.g. a broadcast view) and compares in float32; never writes into it.

    On the CPU the rows are compared a slice of ``CPU_SLICE_BYTES`` at a time, while the slice is in the cache,
    and counted by numpy: torch's row count of a bool matrix is five times slower there (its uint8 → int32 sum
    is not vectorised), and comparing a whole chunk at once reads it from memory twice more."""
    reference = reference.float()
    if scores.device.type != "cpu":
        return (scores > reference).sum(1), (scores == reference).sum(1), float(scores.max())
    B, C = scores.shape
    above, equal = np.empty(B, dtype=np.int64), np.empty(B, dtype=np.int64)
    rows = max(1, CPU_SLICE_BYTES // (4 * max(C, 1)))
    mask = np.empty((min(rows, B), C), dtype=bool)
    highest = -np.inf
    for start in range(0, B, rows):
        part = scores[start:start + rows].float().numpy()
        threshold, hits = reference[start:start + rows].numpy(), mask[:len(part)]
        highest = np.maximum(highest, part.max(initial=-np.inf))  # NaN propagates
        above[start:start + rows] = np.count_nonzero(np.greater(part, threshold, out=hits), axis=1)
        equal[start:start + rows] = np.count_nonzero(np.equal(part, threshold, out=hits), axis=1)
    return torch.from_numpy(above), torch.from_numpy(equal), float(highest)


@contextmanager
def evaluation_mode(model):
    """Dropout off and autograd off while scoring; the model's training mode is restored afterwards."""
    was_training = getattr(model, "training", False)
    if was_training:
        model.eval()
    try:
        with torch.inference_mode():
            yield model
    finally:
        if was_training:
            model.train()


def history_batches(model, view, rows: np.ndarray, batch_size: int):
    """Chunks of ``rows`` of ``view`` as (start, rows of the chunk, users, left-padded histories) on the model's
    device, with as many history items as the model reads."""
    history_length = max(model.history_length, 1)
    device = model.device
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        yield (start, chunk, torch.from_numpy(view.users[chunk]).to(device),
               torch.from_numpy(view.padded(chunk, history_length)).to(device))


def denormals_kept() -> bool:
    """Whether float32 arithmetic keeps subnormal numbers (``torch.set_flush_denormal(True)`` flushes them)."""
    return bool(torch.tensor(2.0 ** -126) / 2 != 0)


class ScoreError(ValueError):
    """A model returned scores the evaluator refuses to rank (NaN, +inf, wrong shape)."""


@dataclass
class RankCounts:
    """Per evaluated user: its row, how many candidates beat the target and how many tie with it."""

    users: np.ndarray
    greater: np.ndarray
    ties: np.ndarray

    def save(self, path: Path) -> None:
        write_atomic(path, npz_bytes(dataclasses.asdict(self)))

    @classmethod
    def load(cls, path: Path) -> "RankCounts":
        with np.load(path, allow_pickle=False) as f:
            return cls(f["users"], f["greater"], f["ties"])


def _parse_metric(name: str) -> tuple[str, int | None]:
    kind, _, cutoff = name.partition("@")
    if kind == "MRR" and not cutoff:
        return kind, None
    if kind in ("HR", "NDCG") and cutoff.isdigit() and int(cutoff) > 0:
        return kind, int(cutoff)
    raise ValueError(f"unknown metric {name!r}; expected HR@k, NDCG@k (k a positive integer) or MRR")


def check_metric_name(name: str) -> bool:
    """Whether ``name`` is a ranking metric the evaluator computes (HR@k, NDCG@k, MRR)."""
    try:
        _parse_metric(name)
    except ValueError:
        return False
    return True


def per_user_metrics(greater: np.ndarray, ties: np.ndarray, metrics=DEFAULT_METRICS,
                     tie_policy: str = "expected") -> dict[str, np.ndarray]:
    """Each metric (``HR@k``, ``NDCG@k``, ``MRR``) for each user from its (greater, ties) counts."""
    parsed = [_parse_metric(name) for name in metrics]
    greater = np.asarray(greater, dtype=np.int64)
    ties = np.asarray(ties, dtype=np.int64)
    if tie_policy == "pessimistic":  # every tied candidate ranks above the target
        greater, ties = greater + ties, np.zeros_like(ties)
    elif tie_policy == "optimistic":  # the target ranks above every tied candidate
        ties = np.zeros_like(ties)
    elif tie_policy != "expected":
        raise ValueError(f"unknown tie policy {tie_policy!r}; expected one of {TIE_POLICIES}")
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
    return {name: float(values.mean()) if len(values) else float("nan") for name, values in per_user.items()}


@dataclass
class Evaluation:
    """One model scored on one split under one protocol."""

    protocol: str
    split: str
    tie_policy: str
    metrics: dict[str, float]
    counts: RankCounts
    seconds: float


class Evaluator:
    """Scores any :class:`Recommender` on the validation or test view of one leave-one-out split.

    ``batch_size``: users per ``score`` call, or None to size each chunk to the device's memory
    (:func:`chunk_users`); the counts do not depend on it. ``progress``: a bar of users scored, with the time
    left, for every evaluation (``evaluate(progress=...)`` overrides it for one call). ``tiled``: rank a
    product-score model on the CPU tile by tile (False: through its full score matrix, as any other model;
    the counts are the same)."""

    def __init__(self, split: LeaveOneOutSplit, seed: int, cache_dir: Path | None = None,
                 batch_size: int | None = None, metrics=DEFAULT_METRICS, tie_policy: str = "expected",
                 progress: bool = False, tiled: bool = True):
        if tie_policy not in TIE_POLICIES:
            raise ValueError(f"unknown tie policy {tie_policy!r}; expected one of {TIE_POLICIES}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1 (or None: sized to the device's memory)")
        self.split = split
        self.seed = seed
        self.cache_dir = cache_dir
        self.batch_size = batch_size
        self.metrics = tuple(metrics)
        for name in self.metrics:
            _parse_metric(name)  # fail now, not after training
        self.tie_policy = tie_policy
        self.progress = progress
        self.tiled = tiled
        self._views = {}
        self._negatives = {}

    def view(self, split: str):
        if split not in self._views:
            self._views[split] = self.split.view(split)
        return self._views[split]

    def negatives(self, split: str, protocol: str) -> np.ndarray:
        key = (split, protocol)
        if key not in self._negatives:
            self._negatives[key] = load_or_sample(self.split.data, split, protocol, self.seed, self.cache_dir)
        return self._negatives[key]

    def evaluate(self, model: Recommender, split: str, protocol: str, model_name: str | None = None,
                 users: np.ndarray | None = None, progress: bool | None = None) -> Evaluation:
        """Rank each user's target among the protocol's candidates; ``users`` restricts to some rows."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; expected one of {PROTOCOLS}")
        started = time.perf_counter()
        counts = self.rank_counts(model, split, protocol, model_name or type(model).__name__, users, progress)
        per_user = per_user_metrics(counts.greater, counts.ties, self.metrics, self.tie_policy)
        return Evaluation(protocol, split, self.tie_policy, summarize(per_user), counts,
                          time.perf_counter() - started)

    def rank_counts(self, model: Recommender, split: str, protocol: str, model_name: str,
                    users: np.ndarray | None = None, progress: bool | None = None) -> RankCounts:
        view = self.view(split)
        rows = np.arange(len(view), dtype=np.int64) if users is None else np.asarray(users, dtype=np.int64)
        negatives = self.negatives(split, protocol) if protocol != "full" else None
        n_columns = self.split.n_items + 1 if negatives is None else negatives.shape[1] + 1
        batch_size = self.batch_size or chunk_users(model.device, n_columns, model.history_length)
        # Full ranking takes the users in order of history length, so that a chunk holds little padding; the
        # counts are returned in the order of ``rows``.
        order = np.arange(len(rows)) if negatives is not None else np.argsort(view.lengths[rows], kind="stable")
        scored = rows[order]
        label = f"{model_name} {split} {protocol}"
        bar = progress_bar(len(rows), label, self.progress if progress is None else progress, unit="user")
        with evaluation_mode(model), bar:
            tiled = (self.tiled and negatives is None and model.device.type == "cpu"
                     and hasattr(model, "score_factors"))
            greater, ties = ((tiled and self._tiled_full_counts(model, view, scored, batch_size, bar, label))
                             or self._chunk_counts(model, model_name, view, rows, scored, negatives, batch_size, bar))
        in_order = np.empty_like(order)
        in_order[order] = np.arange(len(order))
        return RankCounts(view.users[rows], greater[in_order], ties[in_order])

    def _chunk_counts(self, model, model_name, view, rows, scored, negatives, batch_size: int, bar):
        """(greater, ties) of the users ``scored`` (``rows`` in scoring order), one ``score`` call per chunk."""
        greater = np.zeros(len(scored), dtype=np.int64)
        ties = np.zeros(len(scored), dtype=np.int64)
        for start, chunk, users_t, histories in history_batches(model, view, scored, batch_size):
            targets = torch.from_numpy(view.targets[chunk]).to(histories.device)
            if negatives is None:
                g, t = self._full_counts(model, model_name, view, chunk, users_t, histories, targets)
            else:
                order = self._candidate_order(rows, start, start + len(chunk), negatives.shape[1] + 1)
                chosen = torch.from_numpy(negatives[view.users[chunk]]).to(targets.device)
                g, t = self._sampled_counts(model, model_name, users_t, histories, targets, order.to(targets.device),
                                            chosen)
            greater[start:start + len(chunk)] = g.cpu().numpy()
            ties[start:start + len(chunk)] = t.cpu().numpy()
            bar.update(len(chunk))
        return greater, ties

    def _check_shape(self, scores: torch.Tensor, shape: tuple, model_name: str) -> None:
        if tuple(scores.shape) != shape:
            raise ScoreError(f"model {model_name!r} on dataset {self.split.data.name!r}: score() returned shape "
                             f"{tuple(scores.shape)}, expected {shape}")

    def _check_highest(self, highest: float, model_name: str) -> None:
        """``highest``, the largest score, is NaN if any score is and +inf if any score is."""
        if math.isnan(highest) or highest == math.inf:
            raise ScoreError(f"model {model_name!r} on dataset {self.split.data.name!r}: scores contain NaN or "
                             f"+inf; the model diverged or has a bug (check its learning rate and inputs)")

    def _full_counts(self, model, model_name, view, chunk, users_t, histories, targets):
        n_slots = self.split.n_items + 1
        scores = model.score(users_t, histories, None)
        self._check_shape(scores, (len(chunk), n_slots), model_name)
        target_scores = scores.gather(1, targets[:, None]).float()
        above, equal, highest = compare_rows(scores, target_scores)
        self._check_highest(highest, model_name)
        # The counts covered every column. Taken back out: padding (column 0) and each distinct item of the input
        # history (except the target, which stays a candidate when it was consumed before), plus the target
        # itself, which equals its own score.
        history_rows, history_items = view.flat(chunk)
        kept = history_items != view.targets[chunk][history_rows]
        padding = np.arange(len(chunk), dtype=np.int64) * n_slots
        keys = np.concatenate([padding, history_rows[kept] * n_slots + history_items[kept]])
        keys = torch.unique(torch.from_numpy(keys).to(scores.device))  # a repeated history item counts once
        rows, items = keys // n_slots, keys % n_slots
        excluded, reference = scores[rows, items].float(), target_scores[rows, 0]
        above, equal = above.to(scores.device), equal.to(scores.device)
        greater = above - torch.bincount(rows[excluded > reference], minlength=len(chunk))
        ties = equal - 1 - torch.bincount(rows[excluded == reference], minlength=len(chunk))
        return greater, ties

    def _tiled_full_counts(self, model, view, rows: np.ndarray, batch_size: int, bar, label: str):
        """Full-ranking (greater, ties) of a product-score model without its (B, n_items + 1) score matrix, or
        None when its scores are not all finite or subnormals are flushed (the caller then scores it in full).

        The queries come first, in the general path's chunks. The users are then grouped by the tile of
        ``TILE_ITEMS`` items their target falls in, and ``TILE_USERS`` of a group at a time are scored against
        one tile after another, their target's tile first: the target's score comes from the same product as the
        scores it is compared with, and each tile is counted while it is in the cache (the parts run on
        ``torch.get_num_threads()`` threads, one thread each). A tile is counted with d = sign(s − s_target): for
        finite float32 scores the difference is 0 exactly when they are equal and has the sign of their order
        otherwise (IEEE subtraction keeps subnormals), so Σ d and Σ |d| give the counts above and equal. Excluded
        columns (padding, the user's history except the target, the last tile's columns past n_items) are set to
        −inf, below every finite target score."""
        if not len(rows):
            return None
        bar.set_description_str(f"{label} (queries)")
        queries, items, bias = [], None, None
        for _, chunk, users_t, histories in history_batches(model, view, rows, batch_size):
            factors = model.score_factors(users_t, histories)
            queries.append(factors.queries.float())
            items, bias = factors.items, factors.bias
            bar.update(len(chunk))
        queries = torch.cat(queries)
        n_slots = self.split.n_items + 1
        n_tiles = -(-n_slots // TILE_ITEMS)
        E = torch.zeros(n_tiles * TILE_ITEMS, items.shape[1])  # every tile TILE_ITEMS wide, one shape of product
        E[1:n_slots] = items[1:n_slots].float()
        b = None if bias is None else F.pad(bias[:n_slots].float(), (0, n_tiles * TILE_ITEMS - n_slots))
        largest = queries.norm(dim=1).max() * E.norm(dim=1).max() + (0 if b is None else b.abs().max())
        if not (float(largest) < FINITE_SCORE_BOUND and denormals_kept()):  # |q · e + b| ≤ ‖q‖ ‖e‖ + |b|
            return None

        targets = torch.from_numpy(view.targets[rows])
        target_tile = targets // TILE_ITEMS
        order = torch.argsort(target_tile, stable=True)
        group_ends = torch.bincount(target_tile, minlength=n_tiles).cumsum(0).tolist()
        tile_starts = torch.arange(n_tiles + 1) * TILE_ITEMS
        sums = torch.zeros(2, len(rows), dtype=torch.float64)  # per user: Σ d and Σ |d| over every tile

        def rank(first_tile: int, part: torch.Tensor) -> torch.Tensor:
            q, target = queries[part], targets[part]
            history_rows, history_items = view.flat(rows[part.numpy()])
            kept = history_items != target.numpy()[history_rows]
            excluded_items, by_item = torch.from_numpy(history_items[kept]).sort(stable=True)
            excluded_rows = torch.from_numpy(history_rows[kept])[by_item]
            excluded_bounds = torch.searchsorted(excluded_items, tile_starts).tolist()
            scores, reference = torch.empty(len(part), TILE_ITEMS), None
            part_sums = torch.zeros(2, len(part), dtype=torch.float64)
            for tile in [first_tile, *(t for t in range(n_tiles) if t != first_tile)]:
                lo, hi = tile * TILE_ITEMS, (tile + 1) * TILE_ITEMS
                torch.matmul(q, E[lo:hi].T, out=scores)
                if b is not None:
                    scores.add_(b[lo:hi])
                if reference is None:
                    reference = scores.gather(1, (target - lo)[:, None])
                cut = slice(excluded_bounds[tile], excluded_bounds[tile + 1])
                scores[excluded_rows[cut], excluded_items[cut] - lo] = -math.inf
                scores[:, max(0, n_slots - lo):] = -math.inf  # past n_items (last tile only)
                if tile == 0:
                    scores[:, 0] = -math.inf  # padding
                part_sums[0] += scores.sub_(reference).sign_().sum(1)
                part_sums[1] += scores.abs_().sum(1)
            return part_sums

        parts = [(tile, order[start:min(start + TILE_USERS, end)])
                 for tile, (begin, end) in enumerate(zip([0, *group_ends], group_ends))
                 for start in range(begin, end, TILE_USERS)]
        bar.reset()
        bar.set_description_str(f"{label} (ranking)")
        # One part per thread, each single-threaded: splitting every small tile operation between threads makes
        # them wait for each other thousands of times, which costs seconds once another process takes a core.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(threads) as pool:
                for (_, part), part_sums in zip(parts, pool.map(lambda job: rank(*job), parts)):
                    sums[:, part] = part_sums
                    bar.update(len(part))
        finally:
            torch.set_num_threads(threads)
        signs, magnitudes = sums
        greater = ((signs + magnitudes) / 2).long().numpy()
        ties = (n_tiles * TILE_ITEMS - magnitudes).long().numpy() - 1  # the target equals itself
        return greater, ties

    def _candidate_order(self, rows: np.ndarray, start: int, stop: int, width: int) -> torch.Tensor:
        """Column order of the candidates of ``rows[start:stop]``: one random permutation per user, drawn in
        blocks of ``ORDER_BLOCK`` users from a generator seeded by the seed and the block's first user, so that
        it does not depend on how the users are chunked."""
        first = start - start % ORDER_BLOCK
        orders = []
        for block in range(first, stop, ORDER_BLOCK):
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + int(rows[block]))
            orders.append(torch.rand(len(rows[block:block + ORDER_BLOCK]), width, generator=generator).argsort(1))
        return torch.cat(orders)[start - first:stop - first]

    def _sampled_counts(self, model, model_name, users_t, histories, targets, order, negatives):
        # The target goes to a random column (fixed by seed) so no model can learn where it sits.
        candidates = torch.cat([targets[:, None], negatives], 1).gather(1, order)
        target_column = (order == 0).float().argmax(1, keepdim=True)
        scores = model.score(users_t, histories, candidates)
        self._check_shape(scores, tuple(candidates.shape), model_name)
        scores = scores.float()
        self._check_highest(float(scores.max()), model_name)
        target_scores = scores.gather(1, target_column)
        others = torch.ones_like(scores, dtype=torch.bool).scatter_(1, target_column, False)
        greater = ((scores > target_scores) & others).sum(1)
        ties = ((scores == target_scores) & others).sum(1)
        return greater, ties
