"""Attention heat maps for the report (paper Fig. 2): the average over the test users, as the paper drew it, and
one user's map, both from the model's ``attention_weights`` hook (``models/base.py``).

:func:`average_attention` averages, for every layer and head, the attention weights among the last ``last`` = 10
positions of each test user's scored input (BERT4Rec: the last N − 1 history items and the [MASK] it scores,
which is the last position; SASRec: its last items). Inputs are aligned at their end: offset −1 is every user's
last position, −2 the one before, and so on. A user whose input has fewer than ``last`` positions contributes to
the cells of the positions it has only: each cell is the mean over the users that have both of its positions,
and ``users`` counts them. The weights are the model's own: a query's weights sum to 1 over every position it
attends to, so within the window a row sums to less where earlier positions took some of it; nothing is
renormalised.

The worker stores :func:`attention_arrays` as the job's ``attention/<job file name>.npz`` (``results/README.md``).
"""
from __future__ import annotations

import numpy as np
import torch

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import wrong_return

LAST_POSITIONS = 10  # paper Fig. 2: the last 10 positions, the last of them [mask]


def average_attention(model, view: Histories, last: int = LAST_POSITIONS,
                      batch_size: int = 64) -> dict[str, np.ndarray]:
    """Attention among the last ``last`` positions averaged over every user of ``view`` (the evaluator's test
    view), for a model with ``attention_weights(histories) -> (items (B, T), weights (B, layers, heads, T, T))``.

    Returns ``weights`` (layers, heads, last, last) float32, the mean over users (NaN where no user has both
    positions); ``users`` (last, last), how many users each cell averages; ``offsets`` (last,), −last … −1, each
    position's place from the input's end; ``mask_last``, whether the last position is the model's [MASK]."""
    sums = counts = None
    mask_last = False
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(view), batch_size):
            rows = np.arange(start, min(len(view), start + batch_size))
            histories = torch.from_numpy(view.padded(rows, model.history_length)).to(model.device)
            items, weights = model.attention_weights(histories)
            if sums is None:
                sums = torch.zeros(*weights.shape[1:3], last, last, dtype=torch.float64)
                counts = torch.zeros(last, last, dtype=torch.int64)
            k = min(last, items.shape[1])
            present = items[:, -k:] != PAD  # (B, k)
            pairs = present[:, :, None] & present[:, None, :]  # users that have both positions of a cell
            window = weights[..., -k:, -k:].double() * pairs[:, None, None]
            sums[..., -k:, -k:] += window.sum(0).cpu()
            counts[-k:, -k:] += pairs.sum(0).cpu()
            mask_last = bool(getattr(model, "mask_token", None) is not None
                             and (items[:, -1] == model.mask_token).all())
    mean = sums / counts.clamp(min=1)
    mean[..., counts == 0] = float("nan")
    return {"weights": mean.float().numpy(), "users": counts.numpy(), "offsets": np.arange(-last, 0),
            "mask_last": np.array(mask_last)}


def attention_arrays(model, view: Histories, user: int = 0) -> dict[str, np.ndarray] | None:
    """A job's attention file: :func:`average_attention` over the users of ``view`` and the map of its row
    ``user`` (``user_weights`` (layers, heads, T, T), ``user_items`` (T,) with its padding, ``user``); None for a
    model without attention."""
    if isinstance(model, torch.nn.Module):
        model.eval()
    history = torch.from_numpy(view.padded(np.array([user]), max(model.history_length, 1))).to(model.device)
    with torch.inference_mode():
        one = model.attention_weights(history)
    if one is None:
        return None
    if not (isinstance(one, tuple) and len(one) == 2 and all(isinstance(part, torch.Tensor) for part in one)
            and one[0].dim() == 2 and one[1].dim() == 5 and one[1].shape[-2:] == (one[0].shape[1],) * 2
            and len(one[0]) == len(one[1]) == 1):
        raise wrong_return(model, "attention_weights(histories)", one, "(items (B, T), weights (B, layers, heads, T, "
                                                                       "T)), or None for a model without attention")
    items, weights = one
    return {**average_attention(model, view), "user_weights": weights[0].float().cpu().numpy(),
            "user_items": items[0].cpu().numpy(), "user": np.array(user)}
