"""The three profiles: the converge profile trains the paper's models on the replications' schedule, and changes
nothing else; the paper profile keeps the authors' schedule."""
import dataclasses

import pytest

from recbench.benchmarks.config import PROFILES, resolve
from recbench.models import model_class, model_names
from recbench.models.base import NeuralRecommender

DATASETS = ("beauty", "ml-1m", "ml-20m", "steam", "synthetic")
# Model settings that are the schedule, not the network or its data: how many Cloze copies an epoch holds and
# whether their masks are drawn afresh (models/fidelity.md, "The converge profile").
SCHEDULE_FIELDS = {"dupe_factor", "fresh_masks"}
NEURAL = [name for name in model_names() if issubclass(model_class(name), NeuralRecommender)]


def test_profiles_are_named_in_order_of_cost():
    assert PROFILES == ("smoke", "converge", "paper")


@pytest.mark.parametrize("model", model_names())
def test_the_converge_profile_keeps_every_architecture_and_data_setting_of_the_paper_profile(model):
    for dataset in DATASETS:
        paper = dataclasses.asdict(resolve(model, dataset, "paper").model)
        converge = dataclasses.asdict(resolve(model, dataset, "converge").model)
        changed = {field for field in paper if paper[field] != converge[field]}
        assert changed <= SCHEDULE_FIELDS, (model, dataset, changed)


@pytest.mark.parametrize("model", NEURAL)
def test_every_converge_run_is_ended_by_early_stopping_not_by_a_step_count(model):
    for dataset in DATASETS:
        train = resolve(model, dataset, "converge").train
        assert train.patience is not None and train.max_steps is None, (model, dataset)
        assert train.time_budget_s is None and train.cpu_budget_s is None
        assert train.max_epochs >= 10 * train.patience * train.valid_every  # a cap far above where patience ends it


@pytest.mark.parametrize("model", ["bert4rec", "bert4rec-1mask", "bert4rec-1mask-random"])
def test_bert4rec_converges_on_the_replications_schedule(model):
    for dataset in ("beauty", "ml-1m"):
        paper, converge = resolve(model, dataset, "paper"), resolve(model, dataset, "converge")
        train = converge.train
        assert (train.optimizer, train.lr, train.batch_size, train.decay) == ("adamw", 1e-3, 128, "none")
        assert train.warmup_steps == paper.train.warmup_steps == 100  # the authors' short warm-up
        assert (train.weight_decay, train.clip_norm) == (paper.train.weight_decay, paper.train.clip_norm)
        # one Cloze copy of each window an epoch (none for the last-item-only variant), masks drawn afresh
        assert converge.model.dupe_factor == min(paper.model.dupe_factor, 1)
        assert converge.model.fresh_masks or converge.model.dupe_factor == 0


def test_the_ml1m_d256_bert4rec_takes_the_authors_ffn_size():
    from recbench.benchmarks.studies import tied_settings

    for profile in ("converge", "paper"):
        assert tied_settings("bert4rec", "ml-1m", profile, {"hidden": 256})["ffn_inner"] == 512
        assert "ffn_inner" not in tied_settings("bert4rec", "beauty", profile, {"hidden": 256})
    assert "ffn_inner" not in tied_settings("bert4rec", "ml-1m", "smoke", {"hidden": 256})
