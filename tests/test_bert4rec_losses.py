"""The loss family on BERT4Rec's network (models/bert4rec_losses.py, gBERT4Rec): the full softmax is BERT4Rec's own
loss, the sampled losses are taken at the masked positions only and score them as eq. 7 does, and the registered
settings are bert4rec's with gBCE added."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from recbench.benchmarks.config import ConfigError, resolve
from recbench.benchmarks.trainer import TrainSettings
from recbench.datasets.sequences import PAD, Histories
from recbench.models.base import SettingError
from recbench.models.bert4rec import BERT4RecConfig
from recbench.models.losses import binary_cross_entropy, gbce_beta
from tests.helpers import small

# Three users on 40 items; with max_len 5 the first and last histories are cut into several windows.
TRAIN = Histories(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 5, 7, 9, 2, 4, 6]), np.array([0, 6, 11, 18]),
                  np.array([0, 1, 2]))


def loss_at(model, examples, seed: int) -> float:
    torch.manual_seed(seed)  # the encoder's dropout draws from the global RNG
    return model.loss(examples, torch.Generator().manual_seed(seed)).item()


@pytest.mark.parametrize("fresh_masks", [False, True])
def test_the_softmax_setting_is_bert4recs_own_loss(fresh_masks):
    bert4rec = small("bert4rec", max_len=5, fresh_masks=fresh_masks, mask_token_prob=0.8).train()
    family = small("gbert4rec", max_len=5, fresh_masks=fresh_masks, mask_token_prob=0.8, loss="softmax").train()
    family.load_state_dict(bert4rec.state_dict())
    torch.manual_seed(7)  # fixed masks are drawn from the global RNG
    expected = bert4rec.training_examples(TRAIN)
    torch.manual_seed(7)
    ours = family.training_examples(TRAIN)
    for seed in (0, 1):
        assert loss_at(family, ours, seed) == loss_at(bert4rec, expected, seed)


def hand_model(**changes):
    """gBERT4Rec on 40 items, N = 5, whose every masked position scores item i with its output bias b_i = i / 10:
    W^P and b^P are zero, so GELU(0) = 0 and the head's LayerNorm gives 0, the query of every position."""
    m = small("gbert4rec", max_len=5, dropout=0.0, attention_dropout=0.0, negatives=2, **changes)
    m.training_examples(TRAIN)
    with torch.no_grad():
        m.projection.weight.zero_()
        m.projection.bias.zero_()
        m.output_bias.copy_(torch.arange(len(m.output_bias)) / 10)
    return m


def hand_batch(m, window: list[int]) -> dict:
    """One Cloze copy of ``window`` with columns 2 and 4 masked (items window[2] and window[4])."""
    m.windows = torch.tensor([window])
    return {"window": torch.tensor([0]), "last": torch.tensor([False]), "users": torch.tensor([0]),
            "masked_columns": torch.tensor([[2, 4]], dtype=torch.int16),
            "masked_tokens": torch.full((1, 2), m.mask_token, dtype=torch.int32)}


def fixed_negatives(monkeypatch, m):
    """Negatives 3 and 8 for the first masked position, 1 and 10 for the second."""
    monkeypatch.setattr(m, "_negatives", lambda shape, users, generator: torch.tensor([[3, 8], [1, 10]]))


def log_sigmoid(x: float) -> float:
    return -math.log(1 + math.exp(-x))


@pytest.mark.parametrize("loss", ["bce", "gbce"])
def test_bce_and_gbce_at_the_masked_positions_by_hand(monkeypatch, loss):
    m = hand_model(loss=loss, gbce_t=0.5)
    fixed_negatives(monkeypatch, m)
    # Positives 7 (s = 0.7) against 3 and 8, and 11 (s = 1.1) against 1 and 10; β of gBCE for k = 2 of 40 items,
    # t = 0.5: α = 2/39, β = α(0.5(1 − 1/α) + 1/α) = 0.5 + α/2.
    beta = 1.0 if loss == "bce" else 0.5 + 1 / 39
    assert beta == pytest.approx(gbce_beta(2, 40, 0.5) if loss == "gbce" else 1.0)
    by_hand = np.mean([-(beta * log_sigmoid(0.7) + log_sigmoid(-0.3) + log_sigmoid(-0.8)) / 3,
                       -(beta * log_sigmoid(1.1) + log_sigmoid(-0.1) + log_sigmoid(-1.0)) / 3])
    assert m.loss(hand_batch(m, [5, 6, 7, 9, 11]), torch.Generator()).item() == pytest.approx(by_hand, rel=1e-6)


def test_the_sampled_softmax_at_the_masked_positions_by_hand(monkeypatch):
    m = hand_model(loss="sampled-softmax")
    fixed_negatives(monkeypatch, m)
    by_hand = np.mean([-(0.7 - math.log(math.exp(0.7) + math.exp(0.3) + math.exp(0.8))),
                       -(1.1 - math.log(math.exp(1.1) + math.exp(0.1) + math.exp(1.0)))])
    assert m.loss(hand_batch(m, [5, 6, 7, 9, 11]), torch.Generator()).item() == pytest.approx(by_hand, rel=1e-6)


def test_the_log_q_correction_uses_the_popularity_of_the_training_items(monkeypatch):
    """TRAIN holds items 7 and 3 twice, 11, 8, 1 and 10 once, of 18 items: Q(i) = count / 18, each logit less
    log(k·Q(i)) with k = 2."""
    m = hand_model(loss="sampled-softmax", sampler="popularity", logq=True)
    fixed_negatives(monkeypatch, m)

    def corrected(score, count):
        return score - math.log(2 * count / 18)

    first = [corrected(0.7, 2), corrected(0.3, 2), corrected(0.8, 1)]
    second = [corrected(1.1, 1), corrected(0.1, 1), corrected(1.0, 1)]
    by_hand = np.mean([-(row[0] - math.log(sum(math.exp(v) for v in row))) for row in (first, second)])
    assert m.loss(hand_batch(m, [5, 6, 7, 9, 11]), torch.Generator()).item() == pytest.approx(by_hand, rel=1e-6)


@pytest.mark.parametrize("loss", ["bce", "gbce", "sampled-softmax"])
def test_the_items_at_unmasked_positions_are_no_targets(monkeypatch, loss):
    m = hand_model(loss=loss)
    fixed_negatives(monkeypatch, m)
    masked_alike = [m.loss(hand_batch(m, window), torch.Generator()).item()
                    for window in ([5, 6, 7, 9, 11], [30, 31, 7, 32, 11], [PAD, 2, 7, 4, 11])]
    assert masked_alike == pytest.approx([masked_alike[0]] * 3, rel=1e-6)


@pytest.mark.parametrize("loss", ["bce", "gbce", "sampled-softmax", "softmax"])
def test_the_outputs_at_unmasked_positions_do_not_contribute(loss):
    """Every unmasked position's hidden state moved far away: the loss stays what it was."""
    m = small("gbert4rec", max_len=5, dropout=0.0, attention_dropout=0.0, negatives=4, loss=loss)
    examples = m.training_examples(TRAIN)
    expected = m.loss(examples, torch.Generator().manual_seed(2)).item()

    def move_unmasked(module, args, output):
        inputs = args[0]
        unmasked = inputs[inputs != PAD] != m.mask_token
        hidden, weights = output
        return hidden + 100.0 * unmasked[:, None], weights

    m.encoder.register_forward_hook(move_unmasked)
    assert m.loss(examples, torch.Generator().manual_seed(2)).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("softmax_classes", ["vocabulary", "items"])
@pytest.mark.parametrize("negatives_per", ["position", "sequence"])
def test_the_scores_are_eq_7_before_the_softmax(monkeypatch, softmax_classes, negatives_per):
    """s_i = GELU(h W^P + b^P) · E_i + b^O_i over the training softmax's classes, the negatives drawn per masked
    position or once per Cloze copy."""
    from recbench.models import loss_family as module

    seen = {}

    def recording(positive, negatives, beta=1.0):
        seen["positive"], seen["negatives"] = positive, negatives
        return binary_cross_entropy(positive, negatives, beta)

    monkeypatch.setattr(module, "binary_cross_entropy", recording)
    m = small("gbert4rec", max_len=5, dropout=0.0, attention_dropout=0.0, negatives=6,
              softmax_classes=softmax_classes, negatives_per=negatives_per)
    examples = m.training_examples(TRAIN)
    m.loss(examples, torch.Generator().manual_seed(1))
    queries, targets, rows = m.masked_outputs(examples, None)  # fixed masks: no draw
    weight, bias, offset = m.softmax_classes()
    logits = queries @ weight.T + bias  # every class of the training softmax
    draws = torch.randint(1, 41, (len(rows) if negatives_per == "position" else len(examples["window"]), 6),
                          generator=torch.Generator().manual_seed(1))
    draws = draws if negatives_per == "position" else draws[rows]
    assert torch.allclose(seen["positive"], logits.gather(1, (targets - offset)[:, None]).squeeze(1), atol=1e-5)
    assert torch.allclose(seen["negatives"], logits.gather(1, draws - offset), atol=1e-5)


def test_the_item_embedding_head_scores_the_encoders_output_against_the_item_embedding_alone():
    """output_head = "item-embedding", as the authors' gBERT4Rec code: s_i = h · E_i, in training and inference,
    with no W^P, LayerNorm or output bias; BERT4Rec's head is eq. 7."""
    m = small("gbert4rec", max_len=5, dropout=0.0, attention_dropout=0.0, output_head="item-embedding").eval()
    with torch.no_grad():
        m.output_bias.fill_(3.0)  # would move every score if it were used
    histories = torch.tensor([[0, 3, 4, 5], [1, 2, 3, 4]])
    factors = m.score_factors(None, histories)
    hidden, _ = m.encoder(m.append_mask(histories), last_only=True)
    assert torch.allclose(factors.full(), hidden @ m.encoder.item_embedding.weight[:m.n_items + 1].T)
    weight, bias, _ = m.softmax_classes()
    assert torch.equal(bias, torch.zeros_like(bias)) and weight is m.encoder.item_embedding.weight
    head = small("gbert4rec", max_len=5, dropout=0.0, attention_dropout=0.0).eval()
    head.load_state_dict(m.state_dict())
    assert not torch.allclose(head.score_factors(None, histories).full(), factors.full())
    with pytest.raises(SettingError, match="output_head"):
        small("gbert4rec", output_head="linear")


def test_each_example_carries_its_windows_user():
    m = small("gbert4rec", max_len=5, exclude_seen=True)
    examples = m.training_examples(TRAIN)
    for window, user in zip(examples["window"], examples["users"]):
        items = set(m.windows[window].tolist()) - {PAD}
        assert items <= set(TRAIN.items[TRAIN.offsets[user]:TRAIN.offsets[user + 1]].tolist())
    draws = m._negatives((len(examples["users"]), 4), examples["users"], torch.Generator().manual_seed(0))
    assert not m.seen.contains(examples["users"][:, None].expand_as(draws), draws).any()


@pytest.mark.parametrize("changes, message", [
    ({"loss": "hinge"}, "loss='hinge' must be one of bce, gbce, sampled-softmax, softmax"),
    ({"loss": "gbce", "logq": True}, "logq=true must be false unless loss='sampled-softmax'"),
    ({"negatives": 0}, "negatives=0 must be an integer ≥ 1"),
    ({"negatives_per": "batch"}, "negatives_per='batch' must be one of position, sequence"),
])
def test_settings_that_cannot_train_say_so_in_one_line(changes, message):
    with pytest.raises(SettingError, match=message.replace("[", r"\[").replace("]", r"\]")) as raised:
        small("gbert4rec", **changes)
    assert "\n" not in str(raised.value)
    with pytest.raises(ConfigError) as raised:  # the same line from the command line's --set
        resolve("gbert4rec", "ml-1m", "converge", overrides=[f"gbert4rec:{k}={v!r}".replace("True", "true")
                                                             for k, v in changes.items()])
    assert "\n" not in str(raised.value) and message in str(raised.value)


@pytest.mark.parametrize("profile", ["paper", "converge", "smoke"])
def test_the_registered_settings_are_bert4recs_with_gbce_added(profile):
    """BERT4Rec's network and schedule, but for the converge profile's stopping: gBCE's plateau outlasts BERT4Rec's
    patience, so gBERT4Rec waits as gSASRec does (gbert4rec.toml)."""
    waits = {"valid_every", "patience", "max_epochs"} if profile == "converge" else set()
    for dataset in ("beauty", "ml-1m", "ml-20m", "steam", "synthetic"):
        ours, bert4rec = resolve("gbert4rec", dataset, profile), resolve("bert4rec", dataset, profile)
        for field in (f.name for f in dataclasses.fields(BERT4RecConfig)):
            assert getattr(ours.model, field) == getattr(bert4rec.model, field), (dataset, field)
        for field in (f.name for f in dataclasses.fields(TrainSettings)):
            if field not in waits:
                assert getattr(ours.train, field) == getattr(bert4rec.train, field), (dataset, field)
        if waits:
            gsasrec = resolve("gsasrec", dataset, profile).train
            waited = (ours.train.valid_every, ours.train.patience, ours.train.max_epochs)
            assert waited == (gsasrec.valid_every, gsasrec.patience, gsasrec.max_epochs) == (2, 50, 1000)
        loss = ours.model
        assert (loss.loss, loss.negatives, loss.gbce_t, loss.sampler, loss.logq, loss.negatives_per,
                loss.exclude_seen) == ("gbce", 256, 0.75, "uniform", False, "position", False)
