"""The CUDA path (marked ``cuda``; skipped where torch sees no GPU): every registered model scores on the GPU as
on the CPU (to float32 and bf16 tolerances) and takes a finite bf16 training step there; a small model trains
to a useful result on the GPU; the trainer's loop waits for the device once per check, not once per step; the
evaluator on the device gives the CPU's counts; a CUDA checkpoint resumes on the CPU.

Run with ``python -m pytest -m cuda``, or ``python -m benchmarks.gpu_check``, which names the device first.
"""
import copy
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from recbench.benchmarks.config import resolve
from recbench.benchmarks.evaluator import ORDER_BLOCK, Evaluator
from recbench.benchmarks.evaluator_fast import chunk_users
from recbench.benchmarks.trainer import Trainer, TrainRun, TrainSettings
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.models import model_class, model_names
from recbench.models.base import NeuralRecommender
from tests.helpers import FixedScorer, chain_data, repeat_data

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")]

CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def chain():
    return LeaveOneOutSplit(chain_data())


def build(name: str, split: LeaveOneOutSplit, seed: int = 0):
    """The registered model with its smoke-profile configuration, on the CPU."""
    torch.manual_seed(seed)
    model = model_class(name)(split.data.n_users, split.n_items, resolve(name, "synthetic", "smoke", ()).model)
    if not isinstance(model, nn.Module):
        model.fit(split.train())  # POP
    return model


def inputs_for(model, split: LeaveOneOutSplit, device, rows=np.arange(0, 300, 5)):
    view = split.test()
    users = torch.from_numpy(view.users[rows]).to(device)
    histories = torch.from_numpy(view.padded(rows, max(model.history_length, 1))).to(device)
    candidates = torch.from_numpy(np.random.default_rng(0).integers(1, split.n_items + 1, (len(rows), 20))).to(device)
    return users, histories, candidates


def close(expected: torch.Tensor, actual: torch.Tensor, relative: float) -> None:
    """``actual`` within ``relative`` of the scores' scale from ``expected`` (elementwise relative errors are
    meaningless near zero)."""
    scale = expected.abs().max().item() + 1e-6
    error = (actual.float().cpu() - expected).abs().max().item()
    assert error <= relative * scale, f"max error {error:.3g} against scale {scale:.3g}"


@pytest.mark.parametrize("name", model_names())
def test_scores_on_cuda_equal_the_cpu_scores(name, chain):
    cpu_model = build(name, chain)
    cuda_model = copy.deepcopy(cpu_model)
    if isinstance(cpu_model, nn.Module):
        cpu_model.eval()
        cuda_model.to(CUDA).eval()
    with torch.inference_mode():
        for candidates in (False, True):
            users, histories, chosen = inputs_for(cpu_model, chain, "cpu")
            expected = cpu_model.score(users, histories, chosen if candidates else None).float()
            users, histories, chosen = inputs_for(cpu_model, chain, CUDA)
            on_gpu = cuda_model.score(users, histories, chosen if candidates else None)
            assert on_gpu.device.type == "cuda" and on_gpu.shape == expected.shape
            close(expected, on_gpu, 5e-3)  # float32 (TF32 in cuDNN convolutions and RNNs)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                in_bf16 = cuda_model.score(users, histories, chosen if candidates else None)
            close(expected, in_bf16, 5e-2)  # bf16: 8 bits of mantissa through a few layers


@pytest.mark.parametrize("name", [n for n in model_names() if n != "pop"])
def test_one_bf16_training_step_on_cuda_is_finite(name, chain):
    model = build(name, chain).to(CUDA).train()
    examples = model.training_examples(chain.train())
    batch = {key: value[:64].to(CUDA) for key, value in examples.items()}
    generator = torch.Generator(device=CUDA).manual_seed(0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.loss(batch, generator)
    loss.backward()
    assert torch.isfinite(loss)
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all(), parameter_name


def pop_ndcg(split: LeaveOneOutSplit, evaluator: Evaluator) -> float:
    pop = model_class("pop")(split.data.n_users, split.n_items)
    pop.fit(split.train())
    return evaluator.evaluate(pop, "test", "pop100").metrics["NDCG@10"]


@pytest.mark.parametrize("compile", [False, True])
def test_a_small_model_trains_on_cuda(compile, chain):
    if compile:
        pytest.importorskip("triton", reason="torch.compile on CUDA needs triton")
    from recbench.models.sasrec import SASRecCE, SASRecConfig

    evaluator = Evaluator(chain, seed=0)
    torch.manual_seed(0)
    model = SASRecCE(chain.data.n_users, chain.n_items,
                     SASRecConfig(max_len=20, hidden=32, dropout=0.1, attention_dropout=0.1)).to(CUDA)
    settings = TrainSettings(lr=5e-3, batch_size=64, max_epochs=8, betas=(0.9, 0.98))
    report = Trainer(settings, TrainRun(progress=False, compile=compile)).fit(model, chain.train(),
                                   lambda current: evaluator.evaluate(current, "valid", "pop100").metrics)
    assert report.epochs_run >= 1 and all(np.isfinite(row["loss"]) for row in report.curve)
    ndcg = evaluator.evaluate(model, "test", "pop100").metrics["NDCG@10"]
    assert ndcg > pop_ndcg(chain, evaluator) + 0.3


@dataclass
class _Shape:
    hidden: int = 8


class Regression(NeuralRecommender):
    """A loss that never waits for the device itself (no embedding lookups, whose backward may): a linear map
    regressed onto noise drawn from the trainer's generator. Any wait during its training is the trainer's own."""

    name = "regression"
    Config = _Shape

    def __init__(self, n_users: int, n_items: int, config: _Shape):
        super().__init__(n_users, n_items, config)
        self.linear = nn.Linear(config.hidden, config.hidden)

    def training_examples(self, train):
        return {"x": torch.randn(self.n_items, self.config.hidden, generator=torch.Generator().manual_seed(0))}

    def loss(self, batch, generator):
        values = self.linear(batch["x"])
        noise = torch.randn(values.shape, generator=generator, device=values.device)
        return (values - noise).pow(2).mean()

    def score(self, users, histories, candidates):  # never scored here
        return torch.zeros(len(users), self.n_items + 1, device=users.device)


def synchronisations(n_items: int, batch_size: int, epochs: int) -> int:
    model = Regression(1, n_items, _Shape()).to(CUDA)
    settings = TrainSettings(batch_size=batch_size, max_epochs=epochs, clip_norm=1.0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Trainer(settings, TrainRun(progress=False)).fit(model, None, None)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def test_the_training_loop_waits_per_check_not_per_step():
    few, many = synchronisations(640, 64, 2), synchronisations(640, 16, 2)  # 10 and 40 steps per epoch
    assert few == many, (few, many)


def test_evaluator_on_cuda_gives_the_cpu_counts(tmp_path):
    class OnDevice(FixedScorer):
        def __init__(self, table, device):
            super().__init__(table)
            self.table = self.table.to(device)

        @property
        def device(self):
            return self.table.device

    data = repeat_data(n_users=300, n_items=150)
    split = LeaveOneOutSplit(data)
    rng = np.random.default_rng(0)
    table = rng.integers(-3, 4, (data.n_users, data.n_items + 1)).astype(np.float32)  # many ties
    table[rng.random(table.shape) < 0.05] = -np.inf
    for protocol in ("full", "pop100", "uni100"):
        cpu = Evaluator(split, seed=1, cache_dir=tmp_path).evaluate(OnDevice(table, "cpu"), "test", protocol)
        for batch_size in (None, 7):
            gpu = Evaluator(split, seed=1, cache_dir=tmp_path, batch_size=batch_size).evaluate(
                OnDevice(table, CUDA), "test", protocol)
            assert np.array_equal(cpu.counts.greater, gpu.counts.greater), (protocol, batch_size)
            assert np.array_equal(cpu.counts.ties, gpu.counts.ties), (protocol, batch_size)
    assert chunk_users(CUDA, 26745, 200, ORDER_BLOCK) >= 256  # ML-20m's catalogue: more than the CPU's fixed chunks


def test_a_cuda_checkpoint_resumes_on_the_cpu(chain, tmp_path):
    checkpoint = tmp_path / "run.pt"
    settings = TrainSettings(lr=1e-2, batch_size=256, max_epochs=4)
    run = TrainRun(checkpoint=checkpoint, progress=False)

    calls = []

    def interrupted_at_epoch_3(current):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return {"NDCG@10": float(len(calls))}

    on_gpu = build("bprmf", chain).to(CUDA)
    with pytest.raises(KeyboardInterrupt):
        Trainer(settings, run).fit(on_gpu, chain.train(), interrupted_at_epoch_3)
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert saved["state"]["epoch"] == 2 and saved["generator_device"] == "cuda"

    on_cpu = build("bprmf", chain, seed=1)
    report = Trainer(settings, run).fit(on_cpu, chain.train(), lambda current: {"NDCG@10": 0.0})
    assert report.epochs_run == 4 and [row["epoch"] for row in report.curve] == [1, 2, 3, 4]
    assert report.best_epoch == 2  # epochs 3 and 4 on the CPU did not beat the CUDA run's best
    assert torch.equal(on_cpu.item_factors.weight, saved["state"]["best_weights"]["item_factors.weight"])
