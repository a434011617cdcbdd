"""BERT4Rec: Cloze masking with the official mask counts, masks drawn once or afresh, last-item samples,
windows, positions counted as the official code counts them, [MASK] at inference, the output layer and optimiser
groups of the official code, and learning a chain better than POP."""
import re
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest
import torch

from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.optim import build_optimizer
from recbench.benchmarks.trainer import Trainer, TrainRun, TrainSettings
from recbench.datasets.sequences import Histories, LeaveOneOutSplit
from recbench.models.bert4rec import BERT4Rec, BERT4Rec1Mask, BERT4RecConfig
from recbench.models.pop import Pop
from recbench.models.transformer import SequenceEncoder
from tests.helpers import chain_data, histories

pytestmark = pytest.mark.usefixtures("one_thread")

N_ITEMS = 40


def model(**changes) -> BERT4Rec:
    torch.manual_seed(0)
    base = dict(max_len=10, hidden=16, heads=2, max_predictions=4, mask_proportion=0.3)
    return BERT4Rec(5, N_ITEMS, BERT4RecConfig(**{**base, **changes}))


def train_view(sequences) -> Histories:
    lengths = [len(s) for s in sequences]
    return Histories(np.concatenate(sequences), np.r_[0, np.cumsum(lengths)], np.arange(len(sequences)))


# ---------------------------------------------------------------------------------------------- masking
def python2_round(x: float) -> int:
    """Python 2's ``round`` of a float to an integer: the exact binary value, halves away from zero."""
    return int(Decimal(x).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def test_mask_counts_are_python2_rounding_of_rho_n_for_every_rho_and_length():
    n = torch.arange(1, 201)
    for tenth in range(1, 10):
        rho = tenth / 10  # as the flag masked_lm_prob is read: a double
        counts = model(max_len=200, max_predictions=200, mask_proportion=rho).mask_counts(n).tolist()
        expected = [max(1, python2_round(length * rho)) for length in range(1, 201)]  # gen_data_fin.py
        assert counts == expected, rho
    # By hand: 5·0.5 = 2.5 → 3, 25·0.1 = 2.5 → 3, 15·0.3 = 4.5 → 5, 15·0.7 = 10.5 → 11 (half to even: 2, 2, 4, 10);
    # 15·0.1 = 1.5000000000000002 → 2 either way.
    for rho, length, count in [(0.5, 5, 3), (0.1, 25, 3), (0.3, 15, 5), (0.7, 15, 11), (0.1, 15, 2)]:
        m = model(max_len=200, max_predictions=200, mask_proportion=rho)
        assert m.mask_counts(torch.tensor([length])).item() == count


def test_each_window_gets_exactly_its_mask_count_within_the_cap():
    m = model(max_len=50, max_predictions=6, mask_proportion=0.3)
    lengths = [1, 2, 5, 9, 14, 30, 50]
    items = histories([list(range(1, n + 1)) for n in lengths], width=50)
    last = torch.zeros(len(lengths), dtype=torch.bool)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        masked = m.draw_masks(items, last, generator)
        expected = [min(6, max(1, python2_round(0.3 * n))) for n in lengths]  # official: round(n·ρ), >= 1, <= cap
        assert masked.sum(1).tolist() == expected
        assert not masked[items == 0].any()


def test_masks_are_uniform_over_positions_and_fresh_for_every_batch():
    m = model(max_len=10, mask_proportion=0.2, max_predictions=10)
    items = histories([list(range(1, 11))] * 4000, width=10)
    generator = torch.Generator().manual_seed(1)
    first = m.draw_masks(items, torch.zeros(4000, dtype=torch.bool), generator)
    second = m.draw_masks(items, torch.zeros(4000, dtype=torch.bool), generator)
    assert not torch.equal(first, second)
    rate = first.float().mean(0)  # 2 of 10 positions per row
    assert torch.allclose(rate, torch.full((10,), 0.2), atol=0.03)
    replay = m.draw_masks(items, torch.zeros(4000, dtype=torch.bool), torch.Generator().manual_seed(1))
    assert torch.equal(first, replay)  # the trainer's generator fixes every draw


def test_last_item_samples_mask_only_the_most_recent_item():
    m = model()
    items = histories([[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]], width=10)
    masked = m.draw_masks(items, torch.tensor([True, True]), torch.Generator().manual_seed(0))
    assert masked.tolist() == [[False] * 9 + [True]] * 2


def test_official_scheme_uses_only_mask_tokens_and_bert_scheme_80_10_10():
    items = histories([list(range(1, 11))] * 3000, width=10)
    masked = torch.rand(items.shape, generator=torch.Generator().manual_seed(0)) < 0.5
    cloze = torch.zeros(3000, dtype=torch.bool)
    official = model().corrupt(items, masked, cloze, torch.Generator().manual_seed(0))
    assert torch.all(official[masked] == N_ITEMS + 1) and torch.equal(official[~masked], items[~masked])
    bert = model(mask_token_prob=0.8).corrupt(items, masked, cloze, torch.Generator().manual_seed(1))
    assert torch.equal(bert[~masked], items[~masked])
    became_mask = (bert[masked] == N_ITEMS + 1).float().mean()
    kept = (bert[masked] == items[masked]).float().mean()
    assert abs(became_mask - 0.8) < 0.01 and abs(kept - 0.1 - 0.1 / N_ITEMS) < 0.01  # random may draw itself
    assert bert[masked].max() <= N_ITEMS + 1 and bert[masked].min() >= 1
    last_only = model(mask_token_prob=0.0).corrupt(items, masked, ~cloze, torch.Generator().manual_seed(2))
    assert torch.all(last_only[masked] == N_ITEMS + 1)  # force_last: a last-item sample always reads [MASK]


# ------------------------------------------------------------------------------------- training examples
def test_training_examples_are_windows_copied_dupe_factor_times_plus_last_item_samples():
    m = model(max_len=4, window_step=0.5, dupe_factor=3, fresh_masks=True)
    examples = m.training_examples(train_view([np.arange(1, 8), np.array([20, 21])]))
    windows = [[4, 5, 6, 7], [2, 3, 4, 5], [1, 2, 3, 4], [0, 0, 20, 21]]  # 7 items: begins 3, 1, 0 (step 2)
    assert m.windows.tolist() == windows and examples["window"].tolist() == [0, 1, 2, 3] * 4
    assert examples["last"].tolist() == [False] * 12 + [True] * 4
    assert examples.keys() == {"window", "last"}  # masks are drawn per batch


def test_window_step_is_truncated_as_the_official_int():
    m = model(max_len=5, window_step=0.7)  # step int(3.5) = 3 (round would give 4)
    m.training_examples(train_view([np.arange(1, 11)]))  # 10 items: windows begin at 5, 2 and 0
    assert m.windows.tolist() == [[6, 7, 8, 9, 10], [3, 4, 5, 6, 7], [1, 2, 3, 4, 5]]


def fixed_batch(m, examples, rows):
    return {key: value[rows] for key, value in examples.items()}


def test_official_masks_are_drawn_once_and_the_same_copies_come_back_every_epoch():
    m = model(max_len=10, dupe_factor=4, mask_proportion=0.3, max_predictions=3, mask_token_prob=0.5)
    torch.manual_seed(3)
    examples = m.training_examples(train_view([np.arange(1, 11), np.arange(11, 15)]))
    assert examples["masked_columns"].shape == (10, 3) and examples["masked_tokens"].shape == (10, 3)
    generator = torch.Generator().manual_seed(0)
    rows = torch.arange(10)
    first = m.masked_inputs(fixed_batch(m, examples, rows), generator)
    again = m.masked_inputs(fixed_batch(m, examples, rows.flip(0)), generator)  # a later epoch, reshuffled
    for a, b in zip(first, again):
        assert torch.equal(a, b.flip(0))
    items, masked, inputs = first
    assert masked.sum(1).tolist() == [3, 1] * 4 + [1, 1]  # round(0.3·10) = 3, round(0.3·4) = 1; last-item rows
    assert torch.equal(inputs[~masked], items[~masked])
    assert masked[-2:, -1].all() and torch.all(inputs[-2:, -1] == N_ITEMS + 1)  # the last-item samples
    copies = [tuple(masked[i].nonzero().flatten().tolist()) for i in range(0, 8, 2)]
    assert len(set(copies)) > 1  # the dupe_factor copies of a window are masked differently
    fresh = model(max_len=10, dupe_factor=4, mask_proportion=0.3, max_predictions=3, fresh_masks=True)
    fresh_examples = fresh.training_examples(train_view([np.arange(1, 11), np.arange(11, 15)]))
    a = fresh.masked_inputs(fixed_batch(fresh, fresh_examples, rows), generator)[1]
    b = fresh.masked_inputs(fixed_batch(fresh, fresh_examples, rows), generator)[1]
    assert not torch.equal(a, b)


def test_fixed_masks_follow_the_seed_of_the_run():
    def columns(seed):
        m = model(dupe_factor=3)
        torch.manual_seed(seed)  # the harness seeds the global RNG per run
        return m.training_examples(train_view([np.arange(1, 31)]))["masked_columns"]

    assert torch.equal(columns(0), columns(0)) and not torch.equal(columns(0), columns(1))


# ------------------------------------------------------------------------------------------- positions
def test_positions_are_counted_from_the_window_start_as_the_official_code():
    m = model(max_len=10)
    items = histories([[3, 9, 27], list(range(1, 11)), [5]], width=10)
    ids = m.encoder.position_ids(items != 0)
    for row, n in enumerate([3, 10, 1]):  # official: right padding, input ids at columns 0..n-1 get P[0..n-1]
        assert ids[row, 10 - n:].tolist() == list(range(n))
    appended = m.append_mask(histories([[3, 9, 27]], width=9))  # inference: [MASK] after n = 3 items gets P[3]
    assert m.encoder.position_ids(appended != 0)[0, -4:].tolist() == [0, 1, 2, 3]
    end = model(max_len=10, positions="end").encoder.position_ids(items != 0)
    assert end[0, -3:].tolist() == [7, 8, 9]  # counted from the right end instead


def test_left_padded_windows_give_the_official_right_padded_hidden_states():
    """Our left padding with positions from the start equals the official layout (items first, padding after,
    positions 0..T-1 by column); counting from the end does not."""
    left = histories([[3, 9, 27, 4], [8, 1]], width=7)
    right = torch.tensor([[3, 9, 27, 4, 0, 0, 0], [8, 1, 0, 0, 0, 0, 0]])
    for positions, equal in [("start", True), ("end", False)]:
        m = model(max_len=7, positions=positions, dropout=0.0, attention_dropout=0.0).eval()
        ours = SequenceEncoder.hidden_states(m.encoder, left)[0][left != 0]
        official_positions = torch.arange(7).expand(2, 7)  # modeling.py: tf.slice(position table, [0, 0], [T, -1])
        x = m.encoder.item_embedding(right) + m.encoder.position_embedding(official_positions) + m.encoder.token_type[0]
        x = m.encoder.embedding_norm(x)
        mask = torch.zeros(2, 1, 7, 7).masked_fill((right == 0)[:, None, None, :], -10000.0)  # official adder
        for block in m.encoder.blocks:
            x, _ = block(x, mask)
        assert torch.allclose(ours, x[right != 0], atol=1e-5) == equal, positions


def test_one_mask_variant_trains_only_on_last_item_samples():
    torch.manual_seed(0)
    m = BERT4Rec1Mask(5, N_ITEMS, BERT4Rec1Mask.Config(max_len=4))
    examples = m.training_examples(train_view([np.arange(1, 8)]))
    assert m.name == "bert4rec-1mask" and examples["last"].all() and len(examples["last"]) == 3


def test_logits_only_at_masked_positions(monkeypatch):
    m = model(max_len=10, max_predictions=3, mask_proportion=0.5)
    examples = m.training_examples(train_view([np.arange(1, 11), np.arange(11, 15)]))
    seen = []
    m.projection.register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    batch = {key: value[:2] for key, value in examples.items()}  # two Cloze rows: 3 + 2 masked items
    loss = m.loss(batch, torch.Generator().manual_seed(0))
    assert seen == [torch.Size([5, 16])] and loss.ndim == 0 and torch.isfinite(loss)


# -------------------------------------------------------------------------------------------- inference
def test_mask_token_is_appended_after_the_last_n_minus_1_items():
    m = model(max_len=5)
    assert m.history_length == 4
    inputs = m.append_mask(histories([[1, 2, 3, 4, 5, 6], [7]], width=6))
    assert inputs.tolist() == [[3, 4, 5, 6, N_ITEMS + 1], [0, 0, 0, 7, N_ITEMS + 1]]


@pytest.mark.parametrize("classes", ["vocabulary", "items"])
def test_scores_come_from_the_mask_position_through_eq7(classes):
    m = model(softmax_classes=classes).eval()
    with torch.no_grad():
        m.output_bias.normal_()
    history = histories([[3, 9, 27]], width=9)
    hidden, _ = m.encoder(m.append_mask(history))  # packed: 3 items and [MASK]
    h = m.head_norm(torch.nn.functional.gelu(m.projection(hidden[-1:])))
    expected = h @ m.encoder.item_embedding.weight[:N_ITEMS + 1].T + m.output_bias[:N_ITEMS + 1]
    assert torch.allclose(m.score(torch.tensor([0]), history, None), expected, atol=1e-5)


def test_output_layer_scores_each_item_with_its_input_embedding_row():
    """Eq. 7's E is the input item embedding: changing an item's row changes that item's score and no other
    (the item is not in the history, so the hidden state is unchanged), by the transformed hidden vector · Δ."""
    m = model().eval()
    users, history = torch.tensor([0]), histories([[3, 9, 27]], width=9)
    with torch.no_grad():
        before = m.score(users, history, None)
        hidden, _ = m.encoder(m.append_mask(history))
        h = m.head_norm(torch.nn.functional.gelu(m.projection(hidden[-1:])))[0]
        m.encoder.item_embedding.weight[5] += 1.0
        after = m.score(users, history, None)
    changed = torch.nonzero(after[0] != before[0]).flatten().tolist()
    assert changed == [5]
    assert (after[0, 5] - before[0, 5]).item() == pytest.approx(h.sum().item(), abs=1e-4)


def test_output_layer_spans_the_official_vocabulary():
    m = model()  # the official vocabulary: padding, items, [MASK] and two unused special tokens
    assert m.encoder.item_embedding.weight.shape == (N_ITEMS + 4, 16) and m.output_bias.shape == (N_ITEMS + 4,)
    assert not any(p.shape == (N_ITEMS, 16) or p.shape == (16, N_ITEMS) for p in m.parameters())
    items_only = model(softmax_classes="items")
    assert items_only.encoder.item_embedding.weight.shape == (N_ITEMS + 2, 16)  # padding, items and [MASK]
    assert items_only.output_bias.shape == (N_ITEMS + 1,)


@pytest.mark.parametrize("classes, rows", [("vocabulary", slice(0, N_ITEMS + 4)), ("items", slice(1, N_ITEMS + 1))])
def test_cloze_loss_is_the_softmax_over_its_classes_at_the_masked_positions(classes, rows):
    m = model(softmax_classes=classes, dropout=0.0, attention_dropout=0.0, fresh_masks=True)
    with torch.no_grad():
        m.output_bias.normal_()
    examples = m.training_examples(train_view([np.arange(1, 11), np.arange(11, 15)]))
    batch = {key: value[:2] for key, value in examples.items()}
    loss = m.loss(batch, torch.Generator().manual_seed(0))
    items, masked, inputs = m.masked_inputs(batch, torch.Generator().manual_seed(0))  # the same draws
    hidden = SequenceEncoder.hidden_states(m.encoder, inputs)[0]
    h = m.head_norm(torch.nn.functional.gelu(m.projection(hidden[masked])))
    logits = h @ m.encoder.item_embedding.weight[rows].T + m.output_bias[rows]
    expected = torch.nn.functional.cross_entropy(logits, items[masked] - rows.start)
    assert torch.allclose(loss, expected, atol=1e-5)


# --------------------------------------------------------------------------------------------- optimiser
def test_weight_decay_spares_biases_and_layernorm_as_the_official_optimizer():
    m = model()
    optimizer = build_optimizer(TrainSettings(optimizer="adamw", weight_decay=0.01), m)
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.01 for p in g["params"]}
    names = {name for name, p in m.named_parameters() if id(p) in decayed}
    assert "encoder.item_embedding.weight" in names and "encoder.position_embedding.weight" in names
    assert "projection.weight" in names and "encoder.blocks.0.ffn.inner.weight" in names
    assert not any("bias" in n or "norm" in n for n in names)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(m.parameters()))


@pytest.mark.parametrize("changes, message", [
    ({"mask_proportion": 0.0}, "mask_proportion=0.0 must be in (0, 1]"),
    ({"dupe_factor": 0, "mask_last": False}, "mask_last=false must be true when dupe_factor=0"),
    ({"hidden": 16, "heads": 3}, "heads=3 must divide hidden=16"),
    ({"max_len": 1}, "max_len=1 must be >= 2"),
    ({"max_predictions": 0}, "max_predictions=0 must be >= 1"),
    ({"mask_token_prob": 1.5}, "mask_token_prob=1.5 must be in [0, 1]"),
    ({"dupe_factor": -1}, "dupe_factor=-1 must be >= 0"),
    ({"window_step": 0.01, "max_len": 50}, "window_step=0.01 must be in (0, 1]"),
    ({"positions": "left"}, "positions='left' must be one of start, end"),
    ({"dropout": 1.0}, "dropout=1.0 must be in [0, 1)"),
    ({"attention_dropout": -0.1}, "attention_dropout=-0.1 must be in [0, 1)"),
    ({"layers": 0}, "layers=0 must be >= 1"),
    ({"hidden": 0}, "hidden=0 must be >= 1"),
    ({"init_std": 0.0}, "init_std=0.0 must be > 0"),
    ({"layer_norm_eps": 0.0}, "layer_norm_eps=0.0 must be > 0"),
])
def test_config_errors_say_what_to_fix(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        BERT4RecConfig(**changes)


# ---------------------------------------------------------------------------------- learning a chain fast
def test_bert4rec_learns_the_chain_far_better_than_pop():
    data = chain_data()
    split = LeaveOneOutSplit(data)
    evaluator = Evaluator(split, seed=0)
    pop = Pop(data.n_users, data.n_items)
    pop.fit(split.train())
    torch.manual_seed(0)
    m = BERT4Rec(data.n_users, data.n_items, BERT4RecConfig(
        max_len=20, hidden=32, dropout=0.1, attention_dropout=0.1, mask_proportion=0.3, dupe_factor=4))
    settings = TrainSettings(optimizer="adamw", lr=5e-3, weight_decay=0.01, batch_size=64, max_epochs=15,
                             warmup_steps=10, decay="linear")
    Trainer(settings, TrainRun(progress=False)).fit(m, split.train(), None)
    ndcg = evaluator.evaluate(m, "test", "pop100").metrics["NDCG@10"]
    baseline = evaluator.evaluate(pop, "test", "pop100").metrics["NDCG@10"]
    assert ndcg > baseline + 0.3, (ndcg, baseline)
