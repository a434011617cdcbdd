"""The loss family on SASRec's network (models/losses.py, models/sasrec_losses.py): each loss against a value worked
by hand or against the authors' own formulation, and each model against SASRec and SASRec-CE where they coincide."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from recbench.benchmarks.config import resolve
from recbench.datasets.sequences import Histories
from recbench.models.base import SettingError
from recbench.models.losses import binary_cross_entropy, gbce_beta, log_expected_counts, sampled_softmax
from tests.helpers import small

TWO_USERS = Histories(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), np.array([0, 6, 11]), np.array([0, 1]))


def test_gbce_beta_by_hand():
    # 101 items, k = 10: α = 10/100 = 0.1; β = α(t(1 − 1/α) + 1/α) = 0.1 · (0.5 · (1 − 10) + 10) = 0.55.
    assert gbce_beta(10, 101, 0.5) == pytest.approx(0.55)
    assert gbce_beta(10, 101, 0.0) == pytest.approx(1.0)  # t = 0: plain BCE
    assert gbce_beta(10, 101, 1.0) == pytest.approx(0.1)  # t = 1: β = α


def test_binary_cross_entropy_by_hand():
    # Every score 0: each of the 1 + 2 logits costs log 2, the positive's times β; the mean over the 3 logits.
    zero = torch.zeros(4)
    assert binary_cross_entropy(zero, torch.zeros(4, 2), beta=0.4).item() == pytest.approx(2.4 * math.log(2) / 3)
    positive, negatives = torch.tensor([2.0]), torch.tensor([[-1.0, 3.0]])
    by_hand = (-math.log(1 / (1 + math.exp(-2))) - math.log(1 - 1 / (1 + math.exp(1)))
               - math.log(1 - 1 / (1 + math.exp(-3)))) / 3
    assert binary_cross_entropy(positive, negatives).item() == pytest.approx(by_hand, rel=1e-6)


def test_gbce_equals_the_authors_transformed_logit():
    """The gSASRec code computes BCE on the positive logit log(1 / (σ(s)^−β − 1)), in float64."""
    generator = torch.Generator().manual_seed(0)
    positive, negatives = torch.randn(50, generator=generator) * 3, torch.randn(50, 8, generator=generator) * 3
    beta = gbce_beta(8, 500, 0.75)
    s = positive.double()
    transformed = torch.log(1.0 / (torch.sigmoid(s).pow(-beta) - 1.0))
    logits = torch.cat([transformed[:, None], negatives.double()], 1)
    labels = torch.zeros_like(logits)
    labels[:, 0] = 1
    authors = F.binary_cross_entropy_with_logits(logits, labels, reduction="none").sum(1) / 9
    assert binary_cross_entropy(positive, negatives, beta).item() == pytest.approx(authors.mean().item(), rel=1e-5)


def test_sampled_softmax_by_hand_and_its_log_q_correction():
    positive, negatives = torch.tensor([1.0]), torch.tensor([[0.0, 2.0]])
    by_hand = -(1.0 - math.log(math.exp(1.0) + math.exp(0.0) + math.exp(2.0)))
    assert sampled_softmax(positive, negatives).item() == pytest.approx(by_hand, rel=1e-6)
    # logQ: each logit loses log(k·Q); the positive drawn with Q = 0.5, the negatives with 0.25 and 0.125 (k = 2).
    log_q = log_expected_counts(torch.tensor([0.0, 0.5, 0.25, 0.125]), 2)
    corrected = sampled_softmax(positive, negatives, log_q[torch.tensor([1])], log_q[torch.tensor([[2, 3]])])
    a, b, c = 1.0 - math.log(1.0), 0.0 - math.log(0.5), 2.0 - math.log(0.25)
    assert corrected.item() == pytest.approx(-(a - math.log(math.exp(a) + math.exp(b) + math.exp(c))), rel=1e-6)
    # Under uniform sampling the correction shifts every logit alike: nothing changes.
    uniform = log_expected_counts(torch.full((4,), 0.25), 2)
    same = sampled_softmax(positive, negatives, uniform[torch.tensor([1])], uniform[torch.tensor([[2, 3]])])
    assert same.item() == pytest.approx(sampled_softmax(positive, negatives).item(), rel=1e-6)


def test_bce_with_one_excluded_negative_is_sasrecs_loss_halved():
    """SASRec sums its two terms, the family averages its k + 1 = 2 logits; the draws are the same."""
    sasrec = small("sasrec", dropout=0.0, attention_dropout=0.0)
    family = small("gsasrec", dropout=0.0, attention_dropout=0.0, loss="bce", negatives=1, exclude_seen=True)
    family.load_state_dict(sasrec.state_dict())
    expected = sasrec.loss(sasrec.training_examples(TWO_USERS), torch.Generator().manual_seed(3))
    ours = family.loss(family.training_examples(TWO_USERS), torch.Generator().manual_seed(3))
    assert ours.item() == pytest.approx(expected.item() / 2, rel=1e-6)


def test_softmax_setting_is_sasrec_ce():
    ce = small("sasrec-ce", dropout=0.0, attention_dropout=0.0)
    family = small("sasrec-ss", dropout=0.0, attention_dropout=0.0, loss="softmax")
    family.load_state_dict(ce.state_dict())
    generator = torch.Generator().manual_seed(0)
    assert family.loss(family.training_examples(TWO_USERS), generator).item() == pytest.approx(
        ce.loss(ce.training_examples(TWO_USERS), generator).item(), rel=1e-6)


@pytest.mark.parametrize("negatives_per", ["position", "sequence"])
def test_negative_scores_are_each_positions_hidden_state_against_its_draws(monkeypatch, negatives_per):
    """Per sequence, every position of a row scores the row's one set of k draws; per position, its own set."""
    from recbench.models import loss_family as module

    seen = {}

    def recording(positive, negatives, beta=1.0):
        seen["positive"], seen["negatives"] = positive, negatives
        return binary_cross_entropy(positive, negatives, beta)

    monkeypatch.setattr(module, "binary_cross_entropy", recording)
    m = small("gsasrec", dropout=0.0, attention_dropout=0.0, negatives=5, negatives_per=negatives_per)
    batch = m.training_examples(TWO_USERS)
    generator = torch.Generator().manual_seed(1)
    m.loss(batch, generator)
    hidden, targets, rows = m._encode(batch)
    draws = torch.randint(1, 41, (len(rows) if negatives_per == "position" else 2, 5),
                          generator=torch.Generator().manual_seed(1))
    if negatives_per == "sequence":
        draws = draws[rows]
    expected = torch.einsum("nd,nkd->nk", hidden, m.item_embedding[draws])
    assert torch.allclose(seen["negatives"], expected, atol=1e-5)
    assert torch.allclose(seen["positive"], (hidden * m.item_embedding[targets]).sum(-1), atol=1e-5)


def test_an_output_table_of_its_own_scores_without_touching_the_input_embedding():
    m = small("gsasrec", shared_output=False)
    assert m.item_embedding.data_ptr() != m.encoder.item_embedding.weight.data_ptr()
    scores = m.score(torch.tensor([0]), torch.tensor([[0, 0, 3, 4]]), None)
    with torch.no_grad():
        m.output_embedding.weight.zero_()
    assert scores.abs().sum() > 0 and m.score(torch.tensor([0]), torch.tensor([[0, 0, 3, 4]]), None).abs().sum() == 0


@pytest.mark.parametrize("changes, message", [
    ({"loss": "gbce", "logq": True}, "logq=true must be false unless loss='sampled-softmax'"),
    ({"negatives": 0}, "negatives=0 must be an integer ≥ 1"),
    ({"gbce_t": 1.5}, "gbce_t=1.5 must be in [0, 1]"),
    ({"sampler": "zipf"}, "sampler='zipf' must be one of uniform, popularity"),
])
def test_settings_that_cannot_train_say_so_in_one_line(changes, message):
    with pytest.raises(SettingError, match=message.replace("[", r"\[").replace("]", r"\]")):
        small("gsasrec", **changes)


def test_registered_defaults_are_the_papers():
    gsasrec = resolve("gsasrec", "ml-1m", "converge").model
    assert (gsasrec.loss, gsasrec.negatives, gsasrec.gbce_t, gsasrec.negatives_per, gsasrec.shared_output) == (
        "gbce", 256, 0.75, "position", False)
    sampled = resolve("sasrec-ss", "ml-1m", "converge").model
    assert (sampled.loss, sampled.negatives, sampled.sampler, sampled.negatives_per, sampled.shared_output) == (
        "sampled-softmax", 3000, "uniform", "sequence", True)
    sasrec = resolve("sasrec", "ml-1m", "converge").model
    for field in ("max_len", "hidden", "layers", "heads", "dropout", "block"):  # SASRec's network, only the loss
        assert getattr(gsasrec, field) == getattr(sasrec, field) == getattr(sampled, field)


def test_popularity_negatives_follow_the_training_counts():
    # Item 1 six times, item 2 three times, item 3 once, other items never: draws ∝ 6 : 3 : 1.
    h = Histories(np.array([1, 2, 1, 3, 1, 2, 1, 1, 2, 1]), np.array([0, 4, 7, 10]), np.array([0, 1, 2]))
    m = small("sasrec-ss", loss="sampled-softmax", sampler="popularity", negatives=4, logq=True)
    m.training_examples(h)
    draws = m._negatives((20000, 4), torch.zeros(20000, dtype=torch.long), torch.Generator().manual_seed(0))
    counts = torch.bincount(draws.flatten(), minlength=41).double() / draws.numel()
    assert counts[4:].sum() == 0 and counts[1:4].tolist() == pytest.approx([0.6, 0.3, 0.1], abs=0.01)
    assert m.log_q[1:4].tolist() == pytest.approx([math.log(4 * 0.6), math.log(4 * 0.3), math.log(4 * 0.1)])


def test_the_loss_study_plans_each_variant_per_dataset_and_seed():
    from recbench.benchmarks.commands.studies import LOSS_REFERENCE, LOSS_VARIANTS, loss_jobs

    jobs = loss_jobs(["beauty"], seeds=(0, 1))
    n = len(LOSS_VARIANTS)
    assert len(jobs) == 2 * n and [j.seed for j in jobs[:n]] == [0] * n
    by_label = {j.variant: j for j in jobs if j.seed == 0}
    assert by_label[LOSS_REFERENCE].model == "sasrec-ce" and by_label[LOSS_REFERENCE].overrides == ()
    assert by_label["gBCE, 256 negatives, t = 0.75 (gSASRec)"].overrides == ("shared_output=true",)
    gbert4rec = by_label["Cloze, gBCE, 256 negatives, t = 0.75 (gBERT4Rec)"]
    assert (gbert4rec.model, gbert4rec.overrides) == ("gbert4rec", ())
    with pytest.raises(ValueError, match="unknown loss variant"):
        loss_jobs(["beauty"], variants=["hinge"])
