"""The evaluator's engineering, apart from its protocol (``benchmarks/evaluator.py``): how many users one
``score`` call gets, how score rows are compared with the target's (on the CPU while they are in the cache), how the
top lists are read slice by slice, and the tiled full ranking of a product-score model on the CPU with its progress
bars (:func:`tiled_counts`). Each gives exactly the counts of the protocol's plain reading
(``tests/test_evaluator.py`` holds them equal on hand-made ties, subnormal differences and real ML-1m users).
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from recbench.datasets.progress import progress_bar
from recbench.models.base import Recommender, ScoreFactors, wrong_return

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
# Full ranking of a product-score model on the CPU: items per tile (a tile of TILE_USERS × TILE_ITEMS float32
# scores, 1 MiB, stays in a core's cache while it is counted) and users per product.
TILE_ITEMS = 1024
TILE_USERS = 256
# The top-k lists of full ranking (:func:`list_entries`) mask a copy of this many bytes of scores at a time.
LIST_SLICE_BYTES = 2**24
# Scores bounded below this in magnitude are finite, and so is their difference with the target's.
FINITE_SCORE_BOUND = 2.0 ** 126


def chunk_users(device: torch.device, n_columns: int, history_length: int, align: int) -> int:
    """How many users one ``score`` call gets: as many as fit the memory budget (CPU: ``CPU_CHUNK_BYTES``;
    CUDA: ``CUDA_FREE_SHARE`` of the free device memory), at least one, a multiple of ``align`` when more than
    ``align`` fit. A user costs its ``n_columns`` float32 scores with two bytes of comparison masks each, and
    the model's activations for ``history_length`` positions (see ``ACTIVATION_FLOATS_PER_POSITION_PAIR``)."""
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
    return users - users % align if users >= align else users


def count_rows_on_cpu(scores: torch.Tensor, reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """:func:`compare_rows` on the CPU: the rows are compared a slice of
    ``CPU_SLICE_BYTES`` at a time, while the slice is in the cache, and counted by numpy (torch's row count of a
    bool matrix is five times slower there: its uint8 → int32 sum is not vectorised; comparing a whole chunk at
    once reads it from memory twice more)."""
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


def denormals_kept() -> bool:
    """Whether float32 arithmetic keeps subnormal numbers (``torch.set_flush_denormal(True)`` flushes them)."""
    return bool(torch.tensor(2.0 ** -126) / 2 != 0)


class TiledRanking:
    """Full-ranking (greater, ties) of a product-score model, s(u, i) = q_u · e_i + b_i, without its
    (users, n_items + 1) score matrix.

    The users are grouped by the tile of ``TILE_ITEMS`` items their target falls in, and ``TILE_USERS`` of a
    group at a time are scored against one tile after another, their target's tile first: the target's score
    comes from the same product as the scores it is compared with, and each tile is counted while it is in the
    cache (the parts run on ``torch.get_num_threads()`` threads, one thread each). A tile is counted with
    d = sign(s − s_target): for finite float32 scores the difference is 0 exactly when they are equal and has the
    sign of their order otherwise (IEEE subtraction keeps subnormals), so Σ d and Σ |d| give the counts above and
    equal. Excluded columns (padding, the user's history except the target, the items no user may get under the
    temporal split, the last tile's columns past n_items) are set to −inf, below every finite target score.

    With a :class:`benchmarks.metrics.TopLists`, each user's best ``depth + 1`` scores are kept from tile to tile
    as well; a user whose list ends in a tie (or who has fewer candidates than ``depth``) has its tiles scored a
    second time, the same products, to find every tied candidate.
    """

    def __init__(self, queries: torch.Tensor, items: torch.Tensor, bias: torch.Tensor | None, n_slots: int):
        self.queries = queries.float()
        self.n_slots = n_slots
        self.n_tiles = -(-n_slots // TILE_ITEMS)
        width = self.n_tiles * TILE_ITEMS  # every tile TILE_ITEMS wide: one shape of product
        self.items = torch.zeros(width, items.shape[1])
        self.items[1:n_slots] = items[1:n_slots].float()
        self.bias = None if bias is None else F.pad(bias[:n_slots].float(), (0, width - n_slots))
        self.excluded = None  # sorted item ids that no user may get (set by counts)

    def exact(self) -> bool:
        """Whether the sign test is exact here: every score finite (|q · e + b| ≤ ‖q‖ ‖e‖ + |b|) and
        subnormals kept. Else the caller ranks through the full score matrix."""
        largest = (self.queries.norm(dim=1).max() * self.items.norm(dim=1).max()
                   + (0 if self.bias is None else self.bias.abs().max()))
        return float(largest) < FINITE_SCORE_BOUND and denormals_kept()

    def counts(self, view, rows: np.ndarray, bar, lists=None,
               excluded: torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(greater, ties) of ``rows`` of ``view`` (the rows of ``self.queries``, in order); ``bar`` counts users;
        ``lists``, when given, receives their top lists; ``excluded``: item ids that are no candidates of any user
        (never a history item or a target)."""
        self.excluded = None if excluded is None else excluded.sort().values
        targets = torch.from_numpy(view.targets[rows])
        target_tile = targets // TILE_ITEMS
        order = torch.argsort(target_tile, stable=True)
        group_ends = torch.bincount(target_tile, minlength=self.n_tiles).cumsum(0).tolist()
        parts = [(tile, order[start:min(start + TILE_USERS, end)])
                 for tile, (begin, end) in enumerate(zip([0, *group_ends], group_ends))
                 for start in range(begin, end, TILE_USERS)]
        sums = torch.zeros(2, len(rows), dtype=torch.float64)  # per user: Σ d and Σ |d| over every tile
        # One part per thread, each single-threaded: splitting every small tile operation between threads makes
        # them wait for each other thousands of times, which costs seconds once another process takes a core.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        depth = lists.depth if lists is not None else 0
        try:
            with ThreadPoolExecutor(threads) as pool:
                results = pool.map(lambda job: self._rank_part(view, rows, targets, *job, depth), parts)
                for (_, part), (part_sums, entries) in zip(parts, results):
                    sums[:, part] = part_sums
                    if entries is not None:
                        positions, items, scores = entries
                        lists.add(part.numpy()[positions], items, scores)
                    bar.update(len(part))
        finally:
            torch.set_num_threads(threads)
        signs, magnitudes = sums
        greater = ((signs + magnitudes) / 2).long().numpy()
        ties = (self.n_tiles * TILE_ITEMS - magnitudes).long().numpy() - 1  # the target equals itself
        return greater, ties

    def _rank_part(self, view, rows: np.ndarray, targets: torch.Tensor, first_tile: int, part: torch.Tensor,
                   depth: int = 0) -> tuple[torch.Tensor, tuple | None]:
        """Σ d and Σ |d| of the users ``part`` (positions in ``rows``), whose targets lie in ``first_tile``; with
        a ``depth``, also their list entries (:meth:`_list_entries`), else None."""
        q, target = self.queries[part], targets[part]
        history_rows, history_items = view.flat(rows[part.numpy()])
        kept = history_items != target.numpy()[history_rows]
        excluded_items, by_item = torch.from_numpy(history_items[kept]).sort(stable=True)
        excluded_rows = torch.from_numpy(history_rows[kept])[by_item]
        tile_starts = torch.arange(self.n_tiles + 1) * TILE_ITEMS
        excluded = (excluded_rows, excluded_items, torch.searchsorted(excluded_items, tile_starts).tolist())
        scores, reference, best = torch.empty(len(part), TILE_ITEMS), None, None
        part_sums = torch.zeros(2, len(part), dtype=torch.float64)
        for tile in [first_tile, *(t for t in range(self.n_tiles) if t != first_tile)]:
            self._tile_scores(q, tile, excluded, scores)
            if reference is None:  # the target is never an excluded column
                reference = scores.gather(1, (target - tile * TILE_ITEMS)[:, None])
            if depth:
                best = _keep_best(best, scores, tile * TILE_ITEMS, depth + 1)
            part_sums[0] += scores.sub_(reference).sign_().sum(1)
            part_sums[1] += scores.abs_().sum(1)
        return part_sums, (self._list_entries(q, excluded, best, depth) if depth else None)

    def _tile_scores(self, q: torch.Tensor, tile: int, excluded: tuple, out: torch.Tensor) -> None:
        """Scores of the users ``q`` against the items of ``tile`` into ``out``, −inf at excluded columns."""
        lo, hi = tile * TILE_ITEMS, (tile + 1) * TILE_ITEMS
        torch.matmul(q, self.items[lo:hi].T, out=out)
        if self.bias is not None:
            out.add_(self.bias[lo:hi])
        excluded_rows, excluded_items, excluded_bounds = excluded
        cut = slice(excluded_bounds[tile], excluded_bounds[tile + 1])
        out[excluded_rows[cut], excluded_items[cut] - lo] = -math.inf
        out[:, max(0, self.n_slots - lo):] = -math.inf  # past n_items (last tile only)
        if tile == 0:
            out[:, 0] = -math.inf  # padding
        if self.excluded is not None:
            out[:, self._in_tile(lo, hi)] = -math.inf

    def _in_tile(self, lo: int, hi: int) -> torch.Tensor:
        """The columns of tile [lo, hi) that hold an excluded item."""
        bounds = torch.searchsorted(self.excluded, torch.tensor([lo, hi])).tolist()
        return self.excluded[bounds[0]:bounds[1]] - lo

    def _list_entries(self, q: torch.Tensor, excluded: tuple, best: tuple, depth: int) -> tuple:
        """:func:`list_entries` for the users ``q``, from their best ``depth + 1`` (values, columns): as
        numpy (position in ``q``, item, score). Every real score is finite here (:meth:`exact`): −inf is an
        excluded column."""
        settled, opened, threshold = settled_lists(*best, depth)
        found = [settled]
        if len(opened):
            scores = torch.empty(len(q), TILE_ITEMS)
            for tile in range(self.n_tiles):  # the same products of the same shapes: the same scores
                self._tile_scores(q, tile, excluded, scores)
                chosen = scores[opened]
                at = ((chosen >= threshold) & torch.isfinite(chosen)).nonzero()
                found.append((opened[at[:, 0]], at[:, 1] + tile * TILE_ITEMS, chosen[at[:, 0], at[:, 1]]))
        return tuple(torch.cat(parts).numpy() for parts in zip(*found))


def settled_lists(values: torch.Tensor, columns: torch.Tensor, depth: int) -> tuple:
    """From each row's best ``depth + 1`` (values, columns), best first: the list entries (row, column, score) of
    the rows whose ``depth + 1``-th best is below the ``depth``-th (their first ``depth``, exactly); and the other
    rows (a tie across the list's end, or no ``depth + 1``-th column) with the score their entries must reach
    (the ``depth``-th best, or the last there is), as a column, for the caller to read in full."""
    width = values.shape[1]
    if width > depth:
        read_in_full = values[:, depth] == values[:, depth - 1]
    else:
        read_in_full = torch.ones(len(values), dtype=torch.bool, device=values.device)
    closed, opened = (~read_in_full).nonzero()[:, 0], read_in_full.nonzero()[:, 0]
    settled = (closed.repeat_interleave(depth), columns[closed, :depth].reshape(-1), values[closed, :depth].reshape(-1))
    return settled, opened, values[opened, min(depth, width) - 1][:, None]


def _keep_best(best: tuple | None, scores: torch.Tensor, first_column: int, width: int) -> tuple:
    """The ``width`` best (values, columns) of each row among ``best`` so far and the tile ``scores`` whose first
    column is ``first_column``."""
    values, columns = scores.topk(min(width, scores.shape[1]), dim=1)
    columns = columns + first_column
    if best is not None:
        values, columns = torch.cat([best[0], values], 1), torch.cat([best[1], columns], 1)
        values, at = values.topk(min(width, values.shape[1]), dim=1)
        columns = columns.gather(1, at)
    return values, columns


def compare_rows(scores: torch.Tensor, reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """For each row of ``scores`` (B, C): how many entries are above its ``reference`` (B, 1) and how many equal
    it, as int64 (B,) tensors, and the largest entry of all (NaN if any entry is NaN). Reads ``scores`` (any
    layout, e.g. a broadcast view) and compares in float32; never writes into it."""
    reference = reference.float()
    if scores.device.type == "cpu":
        return count_rows_on_cpu(scores, reference)
    return (scores > reference).sum(1), (scores == reference).sum(1), float(scores.max())


def check_factors(model: Recommender, factors, rows: int, n_slots: int) -> None:
    """``score_factors`` of ``rows`` histories, refused in one line unless they are :class:`ScoreFactors` whose
    shapes make a ``(rows, n_slots)`` score matrix."""
    expected = (f"ScoreFactors(queries ({rows}, d), items ({n_slots}, d), bias ({n_slots},) or None) "
                f"(recbench.models.base), or None when the scores are no such product")
    if not isinstance(factors, ScoreFactors):
        raise wrong_return(model, "score_factors(users, histories)", factors, expected)
    queries, items, bias = factors
    if not (isinstance(queries, torch.Tensor) and isinstance(items, torch.Tensor) and queries.dim() == items.dim() == 2
            and queries.shape == (rows, items.shape[1]) and len(items) == n_slots
            and (bias is None or isinstance(bias, torch.Tensor) and tuple(bias.shape) == (n_slots,))):
        raise wrong_return(model, "score_factors(users, histories)", tuple(factors), expected)


def list_entries(scores: torch.Tensor, excluded_rows: torch.Tensor, excluded_items: torch.Tensor,
                 depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What :class:`benchmarks.metrics.TopLists` needs of each row's top-``depth`` list under full ranking: every
    candidate (a column other than the excluded (row, column) pairs, ``excluded_rows`` in ascending order) scored
    at least as high as the row's ``depth``-th best candidate, or all of the row's candidates when it has fewer,
    as numpy (row, column, score). Reads ``scores``, never writes into it.

    A row whose ``depth + 1``-th best score is below its ``depth``-th has exactly its first ``depth``; any other
    (ties across the list's end, too few finite candidates) is read in full."""
    n_rows, n_columns = scores.shape
    step = max(1, LIST_SLICE_BYTES // (4 * n_columns))
    bounds = torch.searchsorted(excluded_rows, torch.arange(0, n_rows + step, step, device=scores.device)).tolist()
    found = []
    for slice_index, start in enumerate(range(0, n_rows, step)):
        cut = slice(bounds[slice_index], bounds[slice_index + 1])
        rows, items = excluded_rows[cut] - start, excluded_items[cut]
        masked = scores[start:start + step].float().clone()  # a copy: the model's scores stay as returned
        masked[rows, items] = -math.inf
        settled, opened, threshold = settled_lists(*masked.topk(min(depth + 1, n_columns), dim=1), depth)
        found.append((settled[0] + start, *settled[1:]))
        if len(opened):  # −inf may be a real score here: the candidates are told apart by their columns
            candidate = torch.ones_like(masked, dtype=torch.bool)
            candidate[rows, items] = False
            chosen = masked[opened]
            at = (candidate[opened] & (chosen >= threshold)).nonzero()
            found.append((opened[at[:, 0]] + start, at[:, 1], chosen[at[:, 0], at[:, 1]]))
    return tuple(torch.cat(parts).cpu().numpy() for parts in zip(*found))


def tiled_counts(model, batches, view, rows: np.ndarray, n_slots: int, bar, label: str, full):
    """Full-ranking (greater, ties) of the ``rows`` of ``view`` for a product-score model through
    :class:`TiledRanking` (``full``: the pass's ``excluded`` items, which no user may get, and its ``lists``, which,
    when given, also receive the users' top lists: ``benchmarks.evaluator.FullPass``), or None when the model's
    scores are not a product (``score_factors`` returns None) or the tiled counts would not be exact (the caller then
    ranks the full score matrix). The queries come in the general path's chunks (``batches``:
    ``benchmarks.evaluator.history_batches`` of ``rows``)."""
    if not len(rows):
        return None
    queries, factors = [], None
    bar.set_description_str(f"{label} (queries)", refresh=False)  # shown once the bar's delay has passed
    for _, chunk, users_t, histories in batches:
        factors = model.score_factors(users_t, histories)
        if factors is None:
            return None
        check_factors(model, factors, len(chunk), n_slots)
        queries.append(factors.queries)
        bar.update(len(chunk))
    ranking = TiledRanking(torch.cat(queries), factors.items, factors.bias, n_slots)
    if not ranking.exact():
        bar.reset()  # the general path counts the users again
        bar.set_description_str(label)
        return None
    shown = not bar.disable
    bar.close()  # the ranking is a second pass over the users, with a bar (and a delay) of its own
    with progress_bar(len(rows), f"{label} (ranking)", shown, unit=" users", unit_scale=True) as ranking_bar:
        return ranking.counts(view, rows, ranking_bar, full.lists, full.excluded)
