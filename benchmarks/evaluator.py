"""The shared evaluator: every model is scored here and nowhere else (``PROTOCOL.md``).

This file is the protocol: which candidates each user's target is ranked among (``full``: every item but the
user's history, padding and, under the temporal split, the items first seen at or after the part's cut;
``pop100``/``uni100``: the stored sampled negatives, in a seeded random column
order), how the ranks are counted (``greater``: candidates scored strictly above the target; ``ties``: others
scored exactly like it, :mod:`benchmarks.metrics` turns them into HR, NDCG and MRR), which candidates make each
user's top-k list under full ranking (for the beyond-accuracy metrics, when asked for) and what is refused (NaN or
+inf scores, wrong shapes). Scoring is batched: one ``score`` call per chunk of users, then vectorised
comparisons with the target's score (no sorting). Under full ranking the comparisons run over every column, and
the excluded columns are taken back out of the counts afterwards, so the evaluator never writes into the scores
a model returned (a model may hand back its own tensor or a broadcast view of it).

How fast that runs is :mod:`benchmarks.evaluator_fast`'s business: chunk sizes that fit the device's memory,
the comparisons with the target's score (on the CPU in cache-sized slices), the top lists read slice by slice, and
the tiled full ranking of a model whose scores are a product q_u · e_i + b_i (``models.base.ScoreFactors``) on the
CPU, with its progress bars. Each gives exactly this file's counts.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recbench.benchmarks.evaluator_fast import chunk_users, compare_rows, list_entries, tiled_counts
from recbench.benchmarks.metrics import (
    DEFAULT_METRICS,
    RankCounts,
    TopLists,
    TrainingPopularity,
    check_tie_policy,
    is_list_metric,
    parse_list_metric,
    parse_metric,
    per_user_metrics,
    summarize,
)
from recbench.benchmarks.negatives import SAMPLED_PROTOCOLS, load_or_sample
from recbench.datasets.errors import unknown
from recbench.datasets.progress import progress_bar
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.datasets.splits import TemporalSplit
from recbench.models.base import Recommender

PROTOCOLS = ("full", *SAMPLED_PROTOCOLS)
# Users per seeded draw of the sampled protocols' candidate order (the evaluator's former fixed chunk size).
ORDER_BLOCK = 256


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


class ScoreError(ValueError):
    """A model returned scores the evaluator refuses to rank (NaN, +inf, wrong shape)."""


@dataclass
class Evaluation:
    """One model scored on one split under one protocol."""

    protocol: str
    split: str
    tie_policy: str
    metrics: dict[str, float]
    counts: RankCounts
    seconds: float


@dataclass(frozen=True)
class FullPass:
    """What a full-ranking pass takes beyond the scores: ``excluded``, the items no user of the view may get (the
    temporal split's items first seen at or after its cut; None under leave-one-out), and ``lists``, the top lists
    to fill (None without beyond-accuracy metrics)."""

    excluded: torch.Tensor | None = None
    lists: TopLists | None = None


class Evaluator:
    """Scores any :class:`Recommender` on the validation or test view of one split (leave-one-out or temporal).

    ``batch_size``: users per ``score`` call, or None to size each chunk to the device's memory
    (:func:`benchmarks.evaluator_fast.chunk_users`); the counts do not depend on it. ``progress``: a bar of users
    scored, with the time left, for every evaluation (``evaluate(progress=...)`` overrides it for one call).
    ``tiled``: rank a product-score model on the CPU tile by tile (False: through its full score matrix, as any
    other model; the counts are the same)."""

    def __init__(self, split: LeaveOneOutSplit | TemporalSplit, seed: int, cache_dir: Path | None = None,
                 batch_size: int | None = None, metrics=DEFAULT_METRICS, tie_policy: str = "expected",
                 progress: bool = False, tiled: bool = True):
        check_tie_policy(tie_policy)
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1 (or None: sized to the device's memory)")
        self.split = split
        self.seed = seed
        self.cache_dir = cache_dir
        self.batch_size = batch_size
        self.metrics = tuple(metrics)
        for name in self.metrics:
            if not is_list_metric(name):
                parse_metric(name)  # fail now, not after training
        self.tie_policy = tie_policy
        self.progress = progress
        self.tiled = tiled
        self._views = {}
        self._negatives = {}
        self._popularity = None
        self._excluded = {}

    def view(self, split: str):
        if split not in self._views:
            self._views[split] = self.split.view(split)
        return self._views[split]

    def popularity(self) -> TrainingPopularity:
        """Item popularity in the split's training view, which the beyond-accuracy metrics measure lists by."""
        if self._popularity is None:
            self._popularity = TrainingPopularity.of(self.split.train(), self.split.n_items)
        return self._popularity

    def negatives(self, split: str, protocol: str) -> np.ndarray:
        key = (split, protocol)
        if key not in self._negatives:
            self._negatives[key] = load_or_sample(self.split, split, protocol, self.seed, self.cache_dir)
        return self._negatives[key]

    def excluded(self, split: str) -> torch.Tensor | None:
        """The items that are no candidates of ``split`` for any user (the temporal split's items first seen at or
        after the cut; never a history item or a target), or None when every item is one (leave-one-out)."""
        if split not in self._excluded:
            items = self.split.new_items(split)
            self._excluded[split] = torch.from_numpy(items) if len(items) else None
        return self._excluded[split]

    def evaluate(self, model: Recommender, split: str, protocol: str, model_name: str | None = None,
                 users: np.ndarray | None = None, progress: bool | None = None, metrics=None) -> Evaluation:
        """Rank each user's target among the protocol's candidates; ``users`` restricts to some rows,
        ``metrics`` replaces the evaluator's list of metrics for this call. Beyond-accuracy metrics among them
        (``Coverage@k`` ...) come from the users' top-k lists, under full ranking only."""
        if protocol not in PROTOCOLS:
            raise unknown("protocol", protocol, PROTOCOLS)
        names = tuple(metrics or self.metrics)
        on_lists = [name for name in names if is_list_metric(name)]
        if on_lists and protocol != "full":
            raise ValueError(f"{', '.join(on_lists)}: beyond-accuracy metrics come from the top-k lists of full "
                             f"ranking; protocol {protocol!r} ranks sampled candidates only (ask for them under "
                             f"'full')")
        started = time.perf_counter()
        lists = (TopLists([parse_list_metric(name)[1] for name in on_lists], self.popularity(), self.excluded(split))
                 if on_lists else None)
        counts = self.rank_counts(model, split, protocol, model_name or type(model).__name__, users, progress,
                                  lists)
        per_user = per_user_metrics(counts.greater, counts.ties, [n for n in names if n not in on_lists],
                                    self.tie_policy)
        values = {**summarize(per_user), **(lists.metrics(on_lists) if lists else {})}
        return Evaluation(protocol, split, self.tie_policy, {name: values[name] for name in names}, counts,
                          time.perf_counter() - started)

    def rank_counts(self, model: Recommender, split: str, protocol: str, model_name: str,
                    users: np.ndarray | None = None, progress: bool | None = None,
                    lists: TopLists | None = None) -> RankCounts:
        """The users' (greater, ties); under full ranking ``lists``, when given, also receives their top lists."""
        view = self.view(split)
        rows = np.arange(len(view), dtype=np.int64) if users is None else np.asarray(users, dtype=np.int64)
        negatives = self.negatives(split, protocol) if protocol != "full" else None
        n_columns = self.split.n_items + 1 if negatives is None else negatives.shape[1] + 1
        batch_size = self.batch_size or chunk_users(model.device, n_columns, model.history_length, ORDER_BLOCK)
        # Full ranking takes the users in order of history length, so that a chunk holds little padding; the
        # counts are returned in the order of ``rows``.
        order = np.arange(len(rows)) if negatives is not None else np.argsort(view.lengths[rows], kind="stable")
        scored = rows[order]
        label = f"{model_name} {split} {protocol}"
        bar = progress_bar(len(rows), label, self.progress if progress is None else progress,
                           unit=" users", unit_scale=True)
        full = FullPass(self.excluded(split), lists) if negatives is None else None
        with evaluation_mode(model), bar:
            tiled = self.tiled and negatives is None and model.device.type == "cpu"
            batches = history_batches(model, view, scored, batch_size)
            greater, ties = ((tiled and tiled_counts(model, batches, view, scored, self.split.n_items + 1, bar, label,
                                                     full))
                             or self._chunk_counts(model, model_name, view, scored, negatives, batch_size, bar, full))
        in_order = np.empty_like(order)
        in_order[order] = np.arange(len(order))
        others = (np.full(len(rows), negatives.shape[1], dtype=np.int64) if negatives is not None
                  else self._full_candidates(view, rows, split))
        return RankCounts(view.users[rows], greater[in_order], ties[in_order], others)

    def _full_candidates(self, view, rows: np.ndarray, split: str) -> np.ndarray:
        """Per row: the candidates besides the target under full ranking, every item but the distinct items of
        the input history (the target excepted, which stays a candidate), the items no user of the view may get,
        and the target itself."""
        history_rows, history_items = view.flat(rows)
        kept = history_items != view.targets[rows][history_rows]
        n_slots = self.split.n_items + 1
        distinct = np.unique(history_rows[kept] * n_slots + history_items[kept]) // n_slots
        excluded = self.excluded(split)
        return (self.split.n_items - (0 if excluded is None else len(excluded)) - 1
                - np.bincount(distinct, minlength=len(rows)))

    def _chunk_counts(self, model, model_name, view, scored, negatives, batch_size: int, bar, full: FullPass | None):
        """(greater, ties) of the rows ``scored`` of ``view`` (in scoring order: the sampled protocols score them
        in the caller's order), one ``score`` call per chunk."""
        greater = np.zeros(len(scored), dtype=np.int64)
        ties = np.zeros(len(scored), dtype=np.int64)
        for start, chunk, users_t, histories in history_batches(model, view, scored, batch_size):
            targets = torch.from_numpy(view.targets[chunk]).to(histories.device)
            if negatives is None:
                g, t = self._full_counts(model, model_name, view, chunk, users_t, histories, targets, full)
            else:
                order = self._candidate_order(scored, start, start + len(chunk), negatives.shape[1] + 1)
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

    def _full_counts(self, model, model_name, view, chunk, users_t, histories, targets, full: FullPass):
        n_slots = self.split.n_items + 1
        scores = model.score(users_t, histories, None)
        self._check_shape(scores, (len(chunk), n_slots), model_name)
        target_scores = scores.gather(1, targets[:, None]).float()
        above, equal, highest = compare_rows(scores, target_scores)
        self._check_highest(highest, model_name)
        # The counts covered every column. Taken back out: padding (column 0), each distinct item of the input
        # history (except the target, which stays a candidate when it was consumed before) and the items no user
        # of the view may get (the temporal split's new items), plus the target itself, which equals its own score.
        history_rows, history_items = view.flat(chunk)
        kept = history_items != view.targets[chunk][history_rows]
        padding = np.arange(len(chunk), dtype=np.int64) * n_slots
        keys = [padding, history_rows[kept] * n_slots + history_items[kept]]
        if full.excluded is not None:
            keys.append((padding[:, None] + full.excluded.numpy()[None, :]).reshape(-1))
        keys = torch.unique(torch.from_numpy(np.concatenate(keys)).to(scores.device))  # a repeated item counts once
        rows, items = keys // n_slots, keys % n_slots
        excluded_scores, reference = scores[rows, items].float(), target_scores[rows, 0]
        above, equal = above.to(scores.device), equal.to(scores.device)
        greater = above - torch.bincount(rows[excluded_scores > reference], minlength=len(chunk))
        ties = equal - 1 - torch.bincount(rows[excluded_scores == reference], minlength=len(chunk))
        if full.lists is not None:  # the lists are drawn from the same candidates as the target's rank
            full.lists.add(*list_entries(scores, rows, items, full.lists.depth))
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
