"""GRU4Rec: a GRU over the item sequence, scores from its hidden state, trained with a pairwise ranking loss on
session-parallel mini-batches.

Hidasi, Karatzoglou, Baltrunas & Tikk, "Session-based Recommendations with Recurrent Neural Networks",
ICLR 2016 (arXiv 1511.06939); built as the authors' Theano code (``hidasib/GRU4Rec``, the 2018 version the
BERT4Rec paper could run) builds it with the 2016 paper's settings. A user's training sequence is a session.

- Input (§3.1): the item at step t as a 1-of-N code, so the first layer's input weights are one vector of 3·d
  gate inputs per item (``embedding = 0``, the code's default); ``embedding > 0`` looks the item up in an
  embedding of that size first, then multiplies by the input weights; ``constrained_embedding`` uses the output
  item vectors w_i as that embedding. Dropout ``dropout_embed`` on the embedding (not on a 1-of-N code).
- GRU (§3, the code's equations): r_t = σ(W_r x_t + U_r h_{t-1} + b_r),  z_t = σ(W_z x_t + U_z h_{t-1} + b_z),
  ĥ_t = tanh(W x_t + U (r_t ⊙ h_{t-1}) + b),  h_t = (1 − z_t) h_{t-1} + z_t ĥ_t;  then dropout on h_t
  (``dropout_hidden``, §4.2). In training the dropped-out h_t is also the state the next step reads, as in the
  code. Biases on the input side only; stacked ``layers`` feed h_t upwards.
- Output (§3.1): r̂_i = f(h_t · w_i + b_i) for the scored items, f = ``final_act`` (the code: tanh with the
  TOP1 and BPR losses in the 2016 version). Scores for ranking are the pre-activations (f is monotone).
- Session-parallel mini-batches (§3.1.1, ``training = "session-parallel"``): B = ``session_batch`` sessions are
  stepped in parallel, each lane taking the next session (in user order) when its own ends, its hidden state reset
  to zero then; one step is one update (the trainer's ``batch_size = 1``), the state carried to the next step
  without gradient. The epoch ends when fewer than two lanes remain (one, with additional samples).
- Negatives (§3.1.2, "sampling on the output"): the other lanes' targets of the same step, so negatives follow
  popularity; an item that is also another lane's target counts as a negative, as in the code.
- Losses (§3.1.3 and the code), with the C scored columns of a step (the B targets, then any additional samples),
  the example's own column j = i left out of the sums:
    TOP1:  L_i = 1/C Σ_{j≠i} σ(r̂_j − r̂_i) + σ(r̂_j²)         BPR:  L_i = −1/C Σ_{j≠i} log σ(r̂_i − r̂_j)
  A step's loss is the mean over its M active lanes, times M / B (the code's cost scaling for short steps).
- Initialisation (the code): every weight block of shape (fan_in, d) uniform in ±√(6 / (fan_in + d)), biases
  and the initial state zero. Optimiser: Adagrad (``benchmarks.optim.GRU4RecAdagrad``).

``training = "windows"`` (our earlier choice, kept as a switch) instead cuts each training sequence into
right-padded windows of ``max_len`` items (``models.recurrent``), back-propagates through a whole window,
shuffles windows, and draws each batch's negatives as ``session_batch`` of the batch's targets without
replacement (a negative equal to an example's target is left out for that example).
Scoring reads the last ``max_len`` items of a history (the code reads the whole session).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import require, require_choice
from recbench.models.recurrent import RecurrentRecommender
from recbench.models.sampling import dropout

TRAINING = ("session-parallel", "windows")
FINAL_ACTIVATIONS = {"linear": lambda x: x, "tanh": torch.tanh}


@dataclass
class GRU4RecConfig:
    hidden: int = 64  # d: GRU units per layer
    layers: int = 1  # stacked GRU layers (the paper's best runs use one)
    embedding: int = 0  # 0: 1-of-N input (the code's default); > 0: an item embedding of this size
    constrained_embedding: bool = False  # the output item vectors w_i serve as the input embedding
    dropout_hidden: float = 0.5  # on h_t of every layer (the 2016 paper's best TOP1 setting)
    dropout_embed: float = 0.0  # on the input embedding, with embedding > 0 or constrained_embedding
    final_act: str = "tanh"  # f of r̂_i = f(h · w_i + b_i) in the loss: "tanh" or "linear"
    loss: str = "top1"  # "top1" or "bpr" (§3.1.3)
    session_batch: int = 50  # B: sessions stepped in parallel, whose targets are each other's negatives
    training: str = "session-parallel"  # or "windows" (see the module docstring)
    max_len: int = 200  # history items read when scoring; steps per training window with training = "windows"

    losses = ("top1", "bpr")

    def __post_init__(self):
        for field in ("hidden", "layers", "session_batch", "max_len"):
            require(self, getattr(self, field) >= 1, field, "be >= 1")
        require(self, self.embedding >= 0, "embedding", "be >= 0 (0: 1-of-N input)")
        require(self, not (self.constrained_embedding and self.embedding), "constrained_embedding",
                "be false when embedding > 0 (the constrained embedding is the output layer, of size hidden)")
        for field in ("dropout_hidden", "dropout_embed"):
            require(self, 0 <= getattr(self, field) < 1, field, "be in [0, 1)")
        require_choice(self, "final_act", tuple(FINAL_ACTIVATIONS))
        require_choice(self, "loss", self.losses)
        require_choice(self, "training", TRAINING)


def glorot_blocks_(weight: torch.Tensor, fan_in: int, block: int) -> None:
    """The code's initialisation of a matrix made of (fan_in, block) blocks: each uniform in ±√(6/(fan_in+block))."""
    limit = math.sqrt(6.0 / (fan_in + block))
    nn.init.uniform_(weight, -limit, limit)


class GRULayer(nn.Module):
    """One GRU layer in the code's form. Its input weights live outside (a 1-of-N table or a matrix), so a step
    takes the input's gate pre-activations W x_t + b as ``[candidate | reset | update]`` columns."""

    def __init__(self, hidden: int):
        super().__init__()
        self.recurrent_gates = nn.Parameter(torch.empty(hidden, 2 * hidden))  # [U_r | U_z]
        self.recurrent_candidate = nn.Parameter(torch.empty(hidden, hidden))  # U
        glorot_blocks_(self.recurrent_gates, hidden, hidden)
        glorot_blocks_(self.recurrent_candidate, hidden, hidden)

    def forward(self, gates_in: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        d = state.shape[1]
        reset_update = torch.sigmoid(gates_in[:, d:] + state @ self.recurrent_gates)
        r, z = reset_update[:, :d], reset_update[:, d:]
        candidate = torch.tanh((state * r) @ self.recurrent_candidate + gates_in[:, :d])
        return (1 - z) * state + z * candidate


def session_parallel_schedule(train: Histories, lanes: int, min_active: int) -> dict[str, np.ndarray]:
    """The code's session-parallel mini-batches as ``(steps, lanes)`` arrays: ``inputs`` and ``targets`` (PAD
    where a lane is idle) and ``starts`` (the lane begins a session at this step: its state is reset first).
    Sessions with at least two items are taken in row order, each by the lane that frees first (ties: lowest
    lane); the schedule stops at the first step with fewer than ``min_active`` active lanes."""
    sessions = np.flatnonzero(train.lengths >= 2)
    steps_of = train.lengths[sessions] - 1
    lane_of = np.zeros(len(sessions), dtype=np.int64)
    first_step = np.zeros(len(sessions), dtype=np.int64)
    free = [(0, lane) for lane in range(lanes)]
    for s, n in enumerate(steps_of):
        step, lane = heapq.heappop(free)
        lane_of[s], first_step[s] = lane, step
        heapq.heappush(free, (step + int(n), lane))
    total = int((first_step + steps_of).max()) if len(sessions) else 0
    session = np.repeat(np.arange(len(sessions)), steps_of)
    k = np.arange(len(session)) - np.repeat(np.cumsum(steps_of) - steps_of, steps_of)
    step, lane = first_step[session] + k, lane_of[session]
    source = train.offsets[sessions][session] + k
    inputs = np.full((total, lanes), PAD, dtype=np.int64)
    targets = np.full((total, lanes), PAD, dtype=np.int64)
    starts = np.zeros((total, lanes), dtype=bool)
    inputs[step, lane] = train.items[source]
    targets[step, lane] = train.items[source + 1]
    starts[step[k == 0], lane[k == 0]] = True
    active = (targets != PAD).sum(1)
    end = int(np.argmax(active < min_active)) if (active < min_active).any() else total
    return {"inputs": inputs[:end], "targets": targets[:end], "starts": starts[:end]}


def ranking_loss(kind: str, positive: torch.Tensor, negative: torch.Tensor, valid: torch.Tensor,
                 bpreg: float = 0.0) -> torch.Tensor:
    """Per-example loss from the positive's score ``(P,)`` and the C scored columns ``(P, C)`` of which ``valid``
    are its negatives (TOP1 and BPR normalised by C as the code; the ranking-max losses weigh by a softmax over
    the valid columns)."""
    positive = positive.float()[:, None]
    negative = negative.float()
    if kind in ("top1", "bpr"):
        if kind == "top1":
            terms = torch.sigmoid(negative - positive) + torch.sigmoid(negative.pow(2))
        else:
            terms = -F.logsigmoid(positive - negative)
        return (terms * valid).sum(1) / negative.shape[1]
    s = torch.softmax(negative.masked_fill(~valid, -torch.inf), dim=1).nan_to_num(0.0)  # an all-invalid row: 0
    if kind == "bpr-max":
        return (-torch.log((s * torch.sigmoid(positive - negative)).sum(1) + 1e-24)
                + bpreg * (s * negative.pow(2)).sum(1))
    return (s * (torch.sigmoid(negative - positive) + torch.sigmoid(negative.pow(2)))).sum(1)  # top1-max


class GRU4Rec(RecurrentRecommender):
    name = "gru4rec"
    Config = GRU4RecConfig

    def __init__(self, n_users: int, n_items: int, config: GRU4RecConfig):
        super().__init__(n_users, n_items, config, config.hidden)
        d = config.hidden
        if config.embedding == 0 and not config.constrained_embedding:
            self.input_gates = nn.Embedding(n_items + 1, 3 * d)  # 1-of-N input: W_x's row of each item
            glorot_blocks_(self.input_gates.weight, n_items, d)
            self.item_embedding = None
        else:
            width = config.embedding or d
            self.item_embedding = None if config.constrained_embedding else nn.Embedding(n_items + 1, width)
            if self.item_embedding is not None:
                glorot_blocks_(self.item_embedding.weight, n_items, width)
            self.input_gates = nn.Linear(width, 3 * d, bias=False)
            glorot_blocks_(self.input_gates.weight, width, d)
        self.upper_gates = nn.ModuleList(nn.Linear(d, 3 * d, bias=False) for _ in range(config.layers - 1))
        for layer in self.upper_gates:
            glorot_blocks_(layer.weight, d, d)
        self.gate_bias = nn.Parameter(torch.zeros(config.layers, 3 * d))
        self.grus = nn.ModuleList(GRULayer(d) for _ in range(config.layers))
        self.lane_state: list[torch.Tensor] | None = None  # session-parallel training: each lane's hidden state

    @property
    def ordered_examples(self) -> bool:
        return self.config.training == "session-parallel"

    @property
    def n_sample(self) -> int:
        """Additional shared negatives per step (GRU4Rec+); none here."""
        return 0

    def step(self, items: torch.Tensor, state: list[torch.Tensor], generator: torch.Generator | None):
        """One time step of every layer for ``items`` ``(B,)``: the new states (dropout applied in training),
        the last of which is the output h_t."""
        if self.item_embedding is None and not self.config.constrained_embedding:
            x = self.input_gates(items)
        else:
            table = self.output if self.config.constrained_embedding else self.item_embedding
            x = self.input_gates(dropout(table(items), self.config.dropout_embed, generator))
        new_state = []
        for layer, gru in enumerate(self.grus):
            if layer:
                x = self.upper_gates[layer - 1](new_state[-1])
            h = gru(x + self.gate_bias[layer], state[layer])
            new_state.append(dropout(h, self.config.dropout_hidden, generator))
        return new_state

    def zero_state(self, batch: int, device: torch.device) -> list[torch.Tensor]:
        return [torch.zeros(batch, self.config.hidden, device=device) for _ in range(self.config.layers)]

    def encode(self, sequences, generator):
        state = self.zero_state(len(sequences), sequences.device)
        outputs = []
        for t in range(sequences.shape[1]):
            state = self.step(sequences[:, t], state, generator)
            outputs.append(state[-1])
        return torch.stack(outputs, 1)

    def training_examples(self, train: Histories) -> dict[str, torch.Tensor]:
        if self.config.training == "windows":
            return super().training_examples(train)
        schedule = session_parallel_schedule(train, self.config.session_batch, 1 if self.n_sample else 2)
        return {key: torch.from_numpy(value) for key, value in schedule.items()}

    def extra_negatives(self, generator: torch.Generator) -> torch.Tensor | None:
        """Additional negatives shared by a step's (or a batch's) examples; GRU4Rec has none."""
        return None

    def ranking(self, positive: torch.Tensor, negative: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Per-example ``config.loss`` (:func:`ranking_loss`)."""
        return ranking_loss(self.config.loss, positive, negative, valid)

    def scores(self, states: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """f(h · w_j + b_j) for ``states`` ``(P, d)`` and ``items`` ``(C,)`` shared by every row."""
        return FINAL_ACTIVATIONS[self.config.final_act](self.item_scores(states, items))

    def step_loss(self, states: torch.Tensor, targets: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Session-parallel: the summed loss of one step's M active lanes; each lane's target is a negative of the
        others (its own column left out), then the additional samples."""
        columns = targets
        extra = self.extra_negatives(generator)
        if extra is not None:
            columns = torch.cat([targets, extra])
        scores = self.scores(states, columns)
        own = torch.arange(len(targets), device=targets.device)
        valid = torch.ones_like(scores, dtype=torch.bool)
        valid[own, own] = False
        return self.ranking(scores[own, own], scores, valid).sum()

    def session_parallel_loss(self, batch, generator) -> torch.Tensor:
        """The mean over the batch's steps of each step's loss, scaled by M / B as the code; the lanes' state
        runs on from the previous batch (reset where a session starts) and is detached after it."""
        lanes = self.config.session_batch
        if self.lane_state is None or self.lane_state[0].shape[0] != lanes:
            self.lane_state = self.zero_state(lanes, batch["inputs"].device)
        state, total = self.lane_state, 0.0
        for inputs, targets, starts in zip(batch["inputs"], batch["targets"], batch["starts"]):
            state = [torch.where(starts[:, None], 0.0, s) for s in state]
            state = self.step(inputs, state, generator)
            active = targets != PAD
            total = total + self.step_loss(state[-1][active], targets[active], generator) / lanes
        self.lane_state = [s.detach() for s in state]
        return total / len(batch["inputs"])

    def windows_loss(self, batch, generator) -> torch.Tensor:
        states, targets = self.positions(batch, generator)
        pick = torch.randperm(len(targets), generator=generator, device=targets.device)
        negatives = targets[pick[:self.config.session_batch]]
        extra = self.extra_negatives(generator)
        if extra is not None:
            negatives = torch.cat([negatives, extra])
        positive = FINAL_ACTIVATIONS[self.config.final_act](self.item_scores(states, targets[:, None])[:, 0])
        negative = self.scores(states, negatives)
        return self.ranking(positive, negative, negatives[None, :] != targets[:, None]).mean()

    def loss(self, batch, generator):
        if self.config.training == "windows":
            return self.windows_loss(batch, generator)
        return self.session_parallel_loss(batch, generator)
