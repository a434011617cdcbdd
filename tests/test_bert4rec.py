"""BERT4Rec: Cloze masking on the device, last-item samples, windows, [MASK] at inference, the output layer
and optimiser groups of the official code, and learning a chain better than POP."""
import numpy as np
import pytest
import torch

from benchmarks.evaluator import Evaluator
from benchmarks.trainer import Trainer, TrainSettings
from datasets.sequences import Histories, LeaveOneOutSplit
from models.bert4rec import BERT4Rec, BERT4Rec1Mask, BERT4RecConfig
from models.pop import Pop
from tests.test_transformers import chain_data, histories, one_thread  # noqa: F401 (autouse fixture)

N_ITEMS = 40


def model(**changes) -> BERT4Rec:
    torch.manual_seed(0)
    base = dict(max_len=10, hidden=16, heads=2, max_predictions=4, mask_proportion=0.3)
    return BERT4Rec(5, N_ITEMS, BERT4RecConfig(**{**base, **changes}))


def train_view(sequences) -> Histories:
    lengths = [len(s) for s in sequences]
    return Histories(np.concatenate(sequences), np.r_[0, np.cumsum(lengths)], np.arange(len(sequences)))


# ---------------------------------------------------------------------------------------------- masking
def test_each_window_gets_exactly_rho_n_masks_within_the_cap():
    m = model(max_len=50, max_predictions=6, mask_proportion=0.3)
    lengths = [1, 2, 5, 9, 14, 30, 50]
    items = histories([list(range(1, n + 1)) for n in lengths], width=50)
    last = torch.zeros(len(lengths), dtype=torch.bool)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        masked = m.draw_masks(items, last, generator)
        expected = [min(6, max(1, round(0.3 * n))) for n in lengths]  # official: round(n·ρ), >= 1, <= cap
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
    official = model().corrupt(items, masked, torch.Generator().manual_seed(0))
    assert torch.all(official[masked] == N_ITEMS + 1) and torch.equal(official[~masked], items[~masked])
    bert = model(mask_token_prob=0.8).corrupt(items, masked, torch.Generator().manual_seed(1))
    assert torch.equal(bert[~masked], items[~masked])
    became_mask = (bert[masked] == N_ITEMS + 1).float().mean()
    kept = (bert[masked] == items[masked]).float().mean()
    assert abs(became_mask - 0.8) < 0.01 and abs(kept - 0.1 - 0.1 / N_ITEMS) < 0.01  # random may draw itself
    assert bert[masked].max() <= N_ITEMS + 1 and bert[masked].min() >= 1


# ------------------------------------------------------------------------------------- training examples
def test_training_examples_are_windows_copied_dupe_factor_times_plus_last_item_samples():
    m = model(max_len=4, window_step=0.5, dupe_factor=3)
    examples = m.training_examples(train_view([np.arange(1, 8), np.array([20, 21])]))
    windows = [[4, 5, 6, 7], [2, 3, 4, 5], [1, 2, 3, 4], [0, 0, 20, 21]]  # 7 items: begins 3, 1, 0 (step 2)
    assert m.windows.tolist() == windows and examples["window"].tolist() == [0, 1, 2, 3] * 4
    assert examples["last"].tolist() == [False] * 12 + [True] * 4


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


def test_scores_come_from_the_mask_position_through_eq7():
    m = model().eval()
    history = histories([[3, 9, 27]], width=9)
    hidden, _ = m.encoder(m.append_mask(history))  # packed: 3 items and [MASK]
    h = m.head_norm(torch.nn.functional.gelu(m.projection(hidden[-1:])))
    expected = h @ m.encoder.item_embedding.weight[:N_ITEMS + 1].T + m.output_bias
    assert torch.allclose(m.score(torch.tensor([0]), history, None), expected, atol=1e-5)


def test_output_layer_shares_the_item_embedding():
    m = model()
    assert m.encoder.item_embedding.weight.shape == (N_ITEMS + 2, 16)  # items, padding and [MASK]
    assert m.output_bias.shape == (N_ITEMS + 1,)
    assert not any(p.shape == (N_ITEMS, 16) or p.shape == (16, N_ITEMS) for p in m.parameters())


# --------------------------------------------------------------------------------------------- optimiser
def test_weight_decay_spares_biases_and_layernorm_as_the_official_optimizer():
    m = model()
    optimizer = Trainer(TrainSettings(optimizer="adamw", weight_decay=0.01))._optimizer(m)
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.01 for p in g["params"]}
    names = {name for name, p in m.named_parameters() if id(p) in decayed}
    assert "encoder.item_embedding.weight" in names and "encoder.position_embedding.weight" in names
    assert "projection.weight" in names and "encoder.blocks.0.ffn.inner.weight" in names
    assert not any("bias" in n or "norm" in n for n in names)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(m.parameters()))


def test_config_errors_say_what_to_fix():
    with pytest.raises(ValueError, match="mask_proportion"):
        BERT4RecConfig(mask_proportion=0.0)
    with pytest.raises(ValueError, match="mask_last"):
        BERT4RecConfig(dupe_factor=0, mask_last=False)
    with pytest.raises(ValueError, match="divisible by heads"):
        model(hidden=16, heads=3)


# ---------------------------------------------------------------------------------- learning a chain fast
def test_bert4rec_learns_the_chain_far_better_than_pop():
    data = chain_data()
    split = LeaveOneOutSplit(data)
    evaluator = Evaluator(split, seed=0)
    pop = Pop(data.n_users, data.n_items)
    pop.fit(split.train())
    torch.manual_seed(0)
    m = BERT4Rec(data.n_users, data.n_items, BERT4RecConfig(
        max_len=20, hidden=32, dropout=0.1, attention_dropout=0.1, mask_proportion=0.3, dupe_factor=2))
    Trainer(TrainSettings(optimizer="adamw", lr=5e-3, weight_decay=0.01, batch_size=64,
                                             max_epochs=15, warmup_steps=10, decay="linear", progress=False)).fit(m, split.train(), None)
    ndcg = evaluator.evaluate(m, "test", "pop100").metrics["NDCG@10"]
    baseline = evaluator.evaluate(pop, "test", "pop100").metrics["NDCG@10"]
    assert ndcg > baseline + 0.3, (ndcg, baseline)
