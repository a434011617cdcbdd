"""BERT's optimiser and schedule (the BERT4Rec authors' optimization.py) against a direct transcription of their
equations, and the trainer's step budget."""
import re

import numpy as np
import pytest
import torch

from recbench.benchmarks import trainer as trainer_module
from recbench.benchmarks.optim import AdamWeightDecay, build_optimizer, lr_schedule
from recbench.benchmarks.trainer import Trainer, TrainRun, TrainSettings
from recbench.datasets.sequences import LeaveOneOutSplit, SequenceData
from recbench.models.bprmf import BPRMF, BPRMFConfig


def official_step(param, m, v, grad, lr, decay, beta1=0.9, beta2=0.999, eps=1e-6):
    """AdamWeightDecayOptimizer.apply_gradients for one variable, line by line, in float64."""
    next_m = beta1 * m + (1.0 - beta1) * grad
    next_v = beta2 * v + (1.0 - beta2) * np.square(grad)
    update = next_m / (np.sqrt(next_v) + eps)
    if decay:  # _do_use_weight_decay: not for LayerNorm or bias variables
        update += 0.01 * param
    return param - lr * update, next_m, next_v


def test_adam_weight_decay_steps_equal_the_official_equations():
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(5, 3)), rng.normal(size=3)
    params = [torch.tensor(weight, dtype=torch.float32, requires_grad=True),
              torch.tensor(bias, dtype=torch.float32, requires_grad=True)]
    optimizer = AdamWeightDecay([{"params": [params[0]]}, {"params": [params[1]], "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    expected = [(weight, np.zeros_like(weight), np.zeros_like(weight)),
                (bias, np.zeros_like(bias), np.zeros_like(bias))]
    for step, lr in enumerate([1e-3, 5e-4, 2e-3]):  # three steps: m and v accumulate, lr set by a schedule
        for group in optimizer.param_groups:
            group["lr"] = lr
        grads = [rng.normal(scale=10.0 ** -step, size=p.shape) for p in params]
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g, dtype=torch.float32)
        optimizer.step()
        expected = [official_step(*state, g, lr, decay) for state, g, decay in zip(expected, grads, [True, False])]
        for p, (value, _, _) in zip(params, expected):
            np.testing.assert_allclose(p.detach().numpy(), value, rtol=1e-5, atol=1e-7)
    # Without bias correction the first step is (1 − β₁)/√(1 − β₂) = 3.16 times Adam's: not torch's Adam.
    torch_params = [torch.tensor(weight, dtype=torch.float32, requires_grad=True)]
    torch_params[0].grad = torch.ones(5, 3)
    torch.optim.AdamW(torch_params, lr=1e-3, eps=1e-6, weight_decay=0.0).step()
    first = torch.tensor(weight, dtype=torch.float32, requires_grad=True)
    first.grad = torch.ones(5, 3)
    AdamWeightDecay([first], lr=1e-3).step()
    assert torch.allclose(first.detach() - torch.tensor(weight, dtype=torch.float32),
                          3.1623 * (torch_params[0].detach() - torch.tensor(weight, dtype=torch.float32)), rtol=1e-3)


def official_learning_rate(step, init_lr=1e-3, num_train_steps=1000, num_warmup_steps=100):
    """create_optimizer: polynomial_decay(power 1, end 0, cycle False), then the warm-up replaces it below W."""
    decayed = (init_lr - 0.0) * (1 - min(step, num_train_steps) / num_train_steps) ** 1.0 + 0.0
    if step < num_warmup_steps:
        return init_lr * step / num_warmup_steps
    return decayed


def test_polynomial_schedule_is_berts_learning_rate_at_every_step():
    optimizer = AdamWeightDecay([torch.zeros(1, requires_grad=True)], lr=1e-3)
    schedule = lr_schedule(TrainSettings(decay="polynomial", warmup_steps=100), optimizer, 1000)
    seen = []
    for _ in range(1002):
        seen.append(optimizer.param_groups[0]["lr"])  # the rate the next step uses
        optimizer.step()
        schedule.step()
    for step in [0, 1, 50, 99, 100, 101, 500, 999, 1000, 1001]:
        assert seen[step] == pytest.approx(official_learning_rate(step), abs=1e-12), step
    assert seen[0] == 0.0 and seen[50] == pytest.approx(5e-4) and seen[100] == pytest.approx(9e-4)  # by hand
    assert seen[500] == pytest.approx(5e-4) and seen[1000] == 0.0


def test_trainer_builds_berts_optimizer_with_the_models_groups():
    from recbench.models.bert4rec import BERT4Rec, BERT4RecConfig

    torch.manual_seed(0)
    model = BERT4Rec(5, 40, BERT4RecConfig(max_len=10, hidden=16, max_predictions=4))
    optimizer = build_optimizer(TrainSettings(optimizer="adam-weight-decay", eps=1e-6, weight_decay=0.01), model)
    assert isinstance(optimizer, AdamWeightDecay)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0] and optimizer.defaults["eps"] == 1e-6


def toy_split() -> LeaveOneOutSplit:
    rng = np.random.default_rng(0)
    sequences = [rng.choice(np.arange(1, 61), size=10, replace=False) for _ in range(40)]
    return LeaveOneOutSplit(SequenceData.from_sequences("toy", sequences, n_items=60))


def test_max_steps_stops_training_and_sets_the_decay_horizon(monkeypatch):
    torch.manual_seed(0)
    model = BPRMF(40, 60, BPRMFConfig(hidden=8))  # 40 users × 8 training items: 320 examples, 5 batches of 64
    calls = []
    model.loss = lambda batch, generator, loss=model.loss: calls.append(1) or loss(batch, generator)
    trainer = Trainer(TrainSettings(lr=0.05, batch_size=64, max_epochs=50, max_steps=12, decay="polynomial"),
                      TrainRun(progress=False))
    schedules = []
    monkeypatch.setattr(trainer_module, "lr_schedule", lambda settings, optimizer, total: schedules.append(total)
                        or lr_schedule(settings, optimizer, total))
    report = trainer.fit(model, toy_split().train(), None)
    assert len(calls) == 12 and report.epochs_run == 3 and schedules == [12]
    assert report.stopped_by == "max steps"


@pytest.mark.parametrize("changes, message", [
    ({"optimizer": "rmsprop"}, "optimizer='rmsprop' must be one of adam, adamw, adam-weight-decay"),
    ({"decay": "cosine"}, "decay='cosine' must be one of none, linear, polynomial"),
    ({"eps": 0.0}, "eps=0.0 must be > 0"),
    ({"max_steps": 0}, "max_steps=0 must be >= 1"),
])
def test_bad_optimizer_settings_are_explained(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainSettings(**changes)
