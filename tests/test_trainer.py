"""The shared trainer: early stopping, best-weight restore, seeds and resume after an interruption."""
import time

import numpy as np
import pytest
import torch

from recbench.benchmarks import (
    checkpoint as checkpoint_module,
    optim,
    provenance,
    training_progress,
)
from recbench.benchmarks.device import resolve_device
from recbench.benchmarks.optim import build_optimizer
from recbench.benchmarks.trainer import Trainer, TrainRun, TrainSettings
from recbench.datasets.sequences import LeaveOneOutSplit, SequenceData
from recbench.models.bprmf import BPRMF, BPRMFConfig


def toy_split(seed=0) -> LeaveOneOutSplit:
    rng = np.random.default_rng(seed)
    sequences = [rng.choice(np.arange(1, 61), size=10, replace=False) for _ in range(40)]
    return LeaveOneOutSplit(SequenceData.from_sequences("toy", sequences, n_items=60))


def new_model(seed=0) -> BPRMF:
    torch.manual_seed(seed)
    return BPRMF(40, 60, BPRMFConfig(hidden=8))


RUN_FIELDS = ("seed", "checkpoint", "progress", "bars", "label", "compile", "on_validation")


def trainer(**changes) -> Trainer:
    """A trainer with the test's small settings; ``changes`` may name trainer settings and TrainRun fields."""
    base = dict(lr=0.05, batch_size=64, max_epochs=6, patience=2, progress=False, seed=1)
    base.update(changes)
    run = {name: base.pop(name) for name in RUN_FIELDS if name in base}
    return Trainer(TrainSettings(**base), TrainRun(**run))


def scripted_validator(values):
    calls = iter(values)
    snapshots = []

    def validate(model):
        snapshots.append(model.item_factors.weight.detach().clone())
        return {"NDCG@10": next(calls)}

    return validate, snapshots


def test_early_stopping_keeps_the_best_weights():
    model = new_model()
    validate, snapshots = scripted_validator([0.1, 0.3, 0.2, 0.25, 0.9])
    report = trainer().fit(model, toy_split().train(), validate)
    assert report.epochs_run == 4  # two validations without improvement after epoch 2
    assert report.best_epoch == 2 and report.best_valid == pytest.approx(0.3)
    assert torch.equal(model.item_factors.weight, snapshots[1])
    assert [row["epoch"] for row in report.curve] == [1, 2, 3, 4]
    assert report.curve[1]["valid_NDCG@10"] == pytest.approx(0.3)
    assert report.stopped_by == "early stopping"


def test_a_tie_is_no_improvement_so_the_earlier_epoch_is_kept():
    """A validation equal to the best so far counts against the patience, and the run keeps the earlier epoch's
    weights (the shorter run)."""
    model = new_model()
    validate, snapshots = scripted_validator([0.2, 0.3, 0.3, 0.3, 0.9])
    report = trainer().fit(model, toy_split().train(), validate)
    assert report.epochs_run == 4 and report.best_epoch == 2
    assert torch.equal(model.item_factors.weight, snapshots[1])

def test_same_seed_same_weights_on_cpu():
    split = toy_split()
    first, second = new_model(), new_model()
    trainer(max_epochs=3).fit(first, split.train(), None)
    trainer(max_epochs=3).fit(second, split.train(), None)
    assert torch.equal(first.item_factors.weight, second.item_factors.weight)
    third = new_model()
    trainer(max_epochs=3, seed=2).fit(third, split.train(), None)
    assert not torch.equal(first.item_factors.weight, third.item_factors.weight)


def test_interrupted_run_resumes_to_the_same_result(tmp_path):
    split = toy_split()
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    reference = new_model()
    trainer().fit(reference, split.train(), scripted_validator(values)[0])

    checkpoint = tmp_path / "run.pt"
    calls = {"n": 0}

    def crash_at_epoch_4(model):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return {"NDCG@10": values[calls["n"] - 1]}

    interrupted = new_model()
    with pytest.raises(KeyboardInterrupt):
        trainer(checkpoint=str(checkpoint)).fit(interrupted, split.train(), crash_at_epoch_4)
    assert checkpoint.exists()
    state = checkpoint_module.saved_progress(checkpoint)  # what a plan shows of the interrupted run
    assert (state.epoch, state.best_epoch, state.bad_validations) == (3, 3, 0) and state.best_metric == 0.3
    assert state.best_weights is None and state.stopped_by is None and state.train_seconds > 0

    resumed = new_model(seed=123)  # different init: everything must come from the checkpoint
    validate = scripted_validator(values[3:])[0]
    report = trainer(checkpoint=str(checkpoint)).fit(resumed, split.train(), validate)
    assert report.epochs_run == 6
    assert torch.equal(resumed.item_factors.weight, reference.item_factors.weight)

    # A finished checkpoint just restores the best weights: no more training.
    again = new_model(seed=5)
    report = trainer(checkpoint=str(checkpoint)).fit(again, split.train(), None)
    assert report.epochs_run == 6
    assert torch.equal(again.item_factors.weight, reference.item_factors.weight)


def test_time_the_process_stood_stopped_is_left_out_of_the_training_time_and_summed_over_sessions(
        tmp_path, monkeypatch):
    """A run paused for an hour (kill -STOP) while it validated, then interrupted and resumed: its training time,
    its curve's seconds and its time budget do not count the hour; the report says how long it stood stopped, over
    both sessions."""
    from recbench.benchmarks import clock as clock_module

    jump = {"by": 0.0}
    real = time.perf_counter
    monkeypatch.setattr(clock_module.time, "perf_counter", lambda: real() + jump["by"])
    seen = []

    def validate(model):
        seen.append(1)
        if len(seen) == 2:  # during the second validation the clock jumps an hour, as a stopped process sees it
            jump["by"] += 3600.0
            time.sleep(0.4)  # the heartbeat notices
        if len(seen) == 3 and not resumed:
            raise KeyboardInterrupt
        return {"NDCG@10": 0.1 * len(seen)}

    resumed, checkpoint = False, tmp_path / "run.pt"
    settings = dict(max_epochs=4, patience=None, time_budget_s=1800, checkpoint=str(checkpoint))
    with pytest.raises(KeyboardInterrupt):
        trainer(**settings).fit(new_model(), toy_split().train(), validate)
    assert checkpoint_module.saved_progress(checkpoint).paused_seconds == pytest.approx(3600, abs=1)
    resumed = True
    report = trainer(**settings).fit(new_model(), toy_split().train(), validate)
    assert report.stopped_by == "max epochs" and report.epochs_run == 4  # not the half-hour budget
    assert report.train_seconds < 60 and report.paused_seconds == pytest.approx(3600, abs=1)
    assert all(record["seconds"] < 60 for record in report.curve)


@pytest.mark.parametrize("terminal", [True, False])
def test_time_budget_stops_training_and_the_epoch_bar_says_so(capsys, monkeypatch, terminal):
    monkeypatch.setattr(training_progress, "bars_redraw_in_place", lambda: terminal)
    model = new_model()
    report = trainer(max_epochs=10_000, time_budget_s=0.5, progress=True).fit(model, toy_split().train(), None)
    assert 0.5 <= report.train_seconds < 5  # stopped once the budget had passed, not before, not long after
    assert 1 < report.epochs_run == len(report.curve)  # the epochs before the budget ran out all count
    assert report.stopped_by == "time budget"
    last = capsys.readouterr().err.splitlines()[-1]
    if terminal:
        assert "bprmf: stopped by the 0.5 s time budget" in last
    else:  # a log's last line: the run's last epoch, and what ended it
        assert last.startswith(f"bprmf: step {report.steps_run:,}, epoch {report.epochs_run} of at most 10000, loss ")
        assert last.endswith("stopped by the 0.5 s time budget")
    report = trainer(max_epochs=2, progress=True).fit(new_model(), toy_split().train(), None)
    assert report.stopped_by == "max epochs" and "time budget" not in capsys.readouterr().err


def test_a_log_gets_a_line_an_epoch_with_validation_and_the_time_left(capsys, monkeypatch):
    """Where stderr is a file (a background run's log), every redraw of a bar would stay in it: the trainer
    writes one line an epoch instead, with what the bar shows and this epoch's validation value."""
    monkeypatch.setattr(training_progress, "bars_redraw_in_place", lambda: False)
    validate, _ = scripted_validator([0.1, 0.3, 0.2, 0.25, 0.9])
    report = trainer(max_epochs=200, patience=2, progress=True).fit(new_model(), toy_split().train(), validate)
    lines = capsys.readouterr().err.splitlines()
    assert report.stopped_by == "early stopping" and len(lines) == report.epochs_run == 4
    steps = report.steps_run // 4  # an epoch's steps
    assert lines[1].startswith(f"bprmf: step {2 * steps}, epoch 2 of at most 200, loss ")
    assert ", NDCG@10 0.3000, best NDCG@10 0.3000, no better for 0/2 validations, " in lines[1]
    assert ", NDCG@10 0.2500, best NDCG@10 0.3000, no better for 2/2 validations, " in lines[3]
    assert lines[3].endswith("stopped: early stopping") and "left" not in "".join(lines)  # nobody knows the end
    report = trainer(max_epochs=3, patience=None, progress=True).fit(new_model(), toy_split().train(), None)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0:2] for line in lines] == [[f"bprmf: step {e * steps}/{3 * steps}", f" epoch {e}/3"]
                                                        for e in (1, 2, 3)]
    assert lines[0].endswith(" left") and lines[2].endswith("stopped: max epochs")  # the caps end it: time left
    assert trainer(max_epochs=2, progress=False).fit(new_model(), toy_split().train(), None).epochs_run == 2
    assert capsys.readouterr().err == ""


def test_a_job_beside_others_writes_lines_named_by_its_run_even_on_a_terminal(capsys, monkeypatch):
    """Jobs run side by side (--jobs 2) share the terminal: their bars would overwrite each other, so each writes a
    line an epoch, starting with its run id, since two BERT4Rec jobs of an ablation are not told apart by name."""
    monkeypatch.setattr(training_progress, "bars_redraw_in_place", lambda: True)
    trainer(max_epochs=2, patience=None, progress=True, bars=False, label="chain/bprmf/w/o PE/seed0").fit(
        new_model(), toy_split().train(), None)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(", ")[1] for line in lines] == ["epoch 1/2", "epoch 2/2"]
    assert all(line.startswith("chain/bprmf/w/o PE/seed0: step ") for line in lines) and "\r" not in "".join(lines)


def test_the_bar_counts_to_what_ends_the_run_and_promises_no_time_when_early_stopping_decides(monkeypatch):
    """Issue 29: BERT4Rec's smoke run keeps the authors' 400,000-step cap and ends after its epoch cap, a minute
    later, while its bar counted to 400,000 steps with hours left. When early stopping decides, nobody knows the
    end: the bar then shows the epoch against its cap and how close early stopping is, and no time left."""
    from recbench.benchmarks import training_progress as module

    bars = []

    class Recorded(module.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(module, "tqdm", Recorded)
    monkeypatch.setattr(module, "bars_redraw_in_place", lambda: True)  # where a bar is drawn (a log gets lines)
    split = toy_split()
    report = trainer(max_steps=400_000, max_epochs=3, patience=None, progress=True).fit(new_model(), split.train(),
                                                                                        None)
    assert report.stopped_by == "max epochs" and bars[-1].total == bars[-1].n == report.steps_run
    assert "<00:00" in str(bars[-1]) and "epoch 3/3" in str(bars[-1])  # the run's time left: none, at its end
    report = trainer(max_steps=7, max_epochs=3, patience=None, progress=True).fit(new_model(), split.train(), None)
    assert report.stopped_by == "max steps" and bars[-1].total == bars[-1].n == 7
    validate, _ = scripted_validator([0.1, 0.3, 0.2, 0.25, 0.9])
    report = trainer(max_epochs=200, patience=2, progress=True).fit(new_model(), split.train(), validate)
    assert report.stopped_by == "early stopping" and bars[-1].total is None and bars[-1].n == report.steps_run
    shown = str(bars[-1])
    assert "epoch 4 of at most 200" in shown and "no better for 2/2 validations" in shown and "<" not in shown
    # Patience longer than the run (BERT4Rec's smoke profile: 20 validations, 15 epochs): the epoch cap ends it.
    validate, _ = scripted_validator([0.1] * 3)
    report = trainer(max_epochs=3, patience=2, progress=True).fit(new_model(), split.train(), validate)
    assert report.stopped_by == "max epochs" and bars[-1].total == bars[-1].n == report.steps_run


def test_bad_settings_and_devices_are_explained():
    with pytest.raises(ValueError, match="^optimizer='rmsprop' must be one of adam, adamw, "):
        TrainSettings(optimizer="rmsprop")
    with pytest.raises(ValueError, match=r"^betas=\[0.9, 1.5\] must be two numbers in \[0, 1\)$"):
        TrainSettings(betas=(0.9, 1.5))
    with pytest.raises(ValueError, match="^valid_protocol='pop50' must be one of full, pop100, uni100$"):
        TrainSettings(valid_protocol="pop50")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            resolve_device("cuda")


def test_a_loss_that_is_nan_from_the_first_batch_is_said_as_such_not_blamed_on_the_learning_rate():
    """Issue 70: NaN weights from the start were told to lower the learning rate; a later NaN still is."""
    model = new_model()
    with torch.no_grad():
        model.user_factors.weight[0] = float("nan")
    with pytest.raises(FloatingPointError, match="nan from the first batch, before any optimiser step") as raised:
        trainer().fit(model, toy_split().train(), None)
    assert "learning rate" not in str(raised.value)


class DivergesAt(BPRMF):
    """BPR-MF whose loss becomes NaN from its ``at``-th training batch on (counted from 0 over the run)."""

    def __init__(self, at: int):
        torch.manual_seed(0)
        super().__init__(40, 60, BPRMFConfig(hidden=8))
        self.at, self.calls = at, 0

    def loss(self, batch, generator):
        self.calls += 1
        loss = super().loss(batch, generator)
        return loss * float("nan") if self.calls > self.at else loss


def test_divergence_between_two_checks_names_its_batch_and_is_never_saved(monkeypatch, tmp_path):
    import recbench.benchmarks.trainer as trainer_module
    monkeypatch.setattr(trainer_module, "FINITE_CHECK_STEPS", 4)
    split = toy_split()  # 40 users × 8 training items = 320 examples: 5 batches of 64 per epoch
    checkpoint = tmp_path / "run.pt"
    with pytest.raises(FloatingPointError, match=r"nan at epoch 2, batch 1; lower the learning rate \(now 0.05\)"):
        trainer(checkpoint=str(checkpoint)).fit(DivergesAt(6), split.train(), None)
    saved = torch.load(checkpoint, weights_only=False)  # written after epoch 1, before the NaN
    assert saved["state"]["epoch"] == 1 and all(torch.isfinite(v).all() for v in saved["model"].values())
    with pytest.raises(FloatingPointError, match="at epoch 1, batch 2;"):  # found by the check after batch 3
        trainer().fit(DivergesAt(2), split.train(), None)
    monkeypatch.setattr(trainer_module, "FINITE_CHECK_STEPS", 50)
    with pytest.raises(FloatingPointError, match="at epoch 1, batch 4;"):  # found at the epoch's end
        trainer().fit(DivergesAt(4), split.train(), None)


def test_compile_runs_the_loss_through_torch_compile(monkeypatch):
    compiled = []

    def recording_compile(function, **options):
        compiled.append(function)
        return function

    monkeypatch.setattr(torch, "compile", recording_compile)
    split = toy_split()
    eager, through_compile = new_model(), new_model()
    trainer(max_epochs=2).fit(eager, split.train(), None)
    assert compiled == []
    trainer(max_epochs=2, compile=True).fit(through_compile, split.train(), None)
    assert compiled == [through_compile.loss]
    assert torch.equal(eager.item_factors.weight, through_compile.item_factors.weight)


@pytest.mark.slow
def test_compiled_training_matches_eager_on_cpu():
    """torch.compile for real (inductor, CPU): the same training, to float tolerance."""
    from recbench.models.sasrec import SASRecCE, SASRecConfig

    split = toy_split()
    weights = []
    for compile in (False, True):
        torch.manual_seed(0)
        model = SASRecCE(40, 60, SASRecConfig(max_len=10, hidden=16, dropout=0.0, attention_dropout=0.0))
        report = trainer(max_epochs=2, compile=compile).fit(model, split.train(), None)
        weights.append((model.item_embedding.detach().clone(), report.curve[-1]["loss"]))
    assert torch.allclose(weights[0][0], weights[1][0], atol=1e-4)
    assert weights[0][1] == pytest.approx(weights[1][1], rel=1e-4)


@pytest.mark.slow
def test_compiled_training_with_attention_dropout_runs_on_cpu():
    """--compile on the CPU with attention dropout, on sequences of uneven length (every batch another shape): the
    compiled step takes the plain attention kernel, since inductor failed on the recomputed slices' data-dependent
    shapes (torch 2.13: InductorError), trains, and ends near eager's loss (other dropout masks, same computation)."""
    from recbench.models.sasrec import SASRecCE, SASRecConfig

    rng = np.random.default_rng(0)
    # N = 200 and lengths up to 300: several slices a batch (at N = 16 one slice held a whole batch and compiled)
    sequences = [rng.choice(np.arange(1, 301), size=rng.integers(3, 300), replace=False) for _ in range(96)]
    split = LeaveOneOutSplit(SequenceData.from_sequences("uneven", sequences, n_items=300))
    losses = {}
    for compile in (False, True):
        torch.manual_seed(0)
        model = SASRecCE(96, 300, SASRecConfig(max_len=200, hidden=16, dropout=0.2, attention_dropout=0.2))
        report = trainer(lr=0.01, batch_size=16, max_epochs=2, compile=compile).fit(model, split.train(), None)
        losses[compile] = [row["loss"] for row in report.curve]
    assert all(np.isfinite(losses[True])) and losses[True][-1] < losses[True][0]
    assert losses[True][-1] == pytest.approx(losses[False][-1], rel=0.05)


@pytest.mark.parametrize("model", ["bert4rec", "bert4rec-1mask", "bert4rec-1mask-random"])
def test_bert4rec_paper_profile_trains_the_authors_steps_without_early_stopping(model):
    from recbench.benchmarks.config import resolve

    for dataset, steps in (("beauty", 400_000), ("ml-1m", 400_000), ("ml-20m", 400_000), ("steam", 800_000)):
        train = resolve(model, dataset, "paper").train
        assert (train.patience, train.max_steps, train.time_budget_s) == (None, steps, None), (model, dataset)
        assert train.precision == "fp32"  # the authors' code trains in float32


def test_without_patience_training_runs_to_max_steps_and_tests_the_selected_step():
    # Validation falls after its first value: patience 2 would stop after 3 epochs, none runs every step.
    model = new_model()
    validate, snapshots = scripted_validator([0.5] + [0.1] * 20)
    report = trainer(patience=None, max_epochs=100, max_steps=23).fit(model, toy_split().train(), validate)
    assert report.steps_run == 23 and report.stopped_by == "max steps"  # 5 batches of 64 per epoch: 5 epochs
    assert report.epochs_run == 5 and len(snapshots) == 5  # the last, short epoch is validated too
    assert report.best_epoch == 1 and report.best_step == 5 and torch.equal(model.item_factors.weight, snapshots[0])
    budgeted = trainer(patience=None, max_epochs=100_000, max_steps=10**9, time_budget_s=0.3)
    assert budgeted.fit(new_model(), toy_split().train(), None).stopped_by == "time budget"


# ------------------------------------------------------------------------------------------- precision

def test_the_cpu_its_bf16_units_and_a_rows_device_words_are_read_from_cpuinfo(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\nflags\t\t: fpu avx2 avx512f "
                       "avx512_bf16\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
                       "flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert provenance.cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512f", "avx512_bf16"}
    assert provenance.cpu_name(cpuinfo) == "AMD EPYC 9654 96-Core Processor"
    assert provenance.cpu_flags(tmp_path / "absent") == set()  # not Linux: no native bf16 known
    assert provenance.cpu_name(tmp_path / "absent")  # the architecture at least, never empty
    monkeypatch.setattr(provenance, "CPUINFO", cpuinfo)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    expected = "cpu (1 thread, AMD EPYC 9654 96-Core Processor, avx512_bf16)"
    assert provenance.describe_device(torch.device("cpu")) == expected
    assert provenance.machine(2)["bf16_units"] == ["avx512_bf16"] and provenance.machine(2)["torch_threads"] == 2
    cpuinfo.write_text("model name\t: Intel(R) Xeon(R) CPU\nflags\t\t: fpu avx2\n")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert provenance.describe_device(torch.device("cpu")) == "cpu (2 threads, Intel(R) Xeon(R) CPU, no native bf16)"


def bf16_fit(monkeypatch, flags: set) -> tuple:
    """A SASRec-CE fit with precision=bf16 on a CPU whose flags are ``flags``; its report and its weights."""
    from recbench.models.sasrec import SASRecCE, SASRecConfig

    monkeypatch.setattr(provenance, "cpu_flags", lambda cpuinfo=None: flags)
    torch.manual_seed(0)
    model = SASRecCE(40, 60, SASRecConfig(max_len=10, hidden=16, dropout=0.0, attention_dropout=0.0))
    report = trainer(max_epochs=2, precision="bf16").fit(model, toy_split().train(), None)
    return report, model.item_embedding.detach().clone()


def test_bf16_trains_in_fp32_on_a_cpu_without_native_bf16_and_says_so_in_one_line(monkeypatch, capsys):
    report, weights = bf16_fit(monkeypatch, {"fpu", "avx2"})
    message = capsys.readouterr().err.strip().splitlines()
    assert len(message) == 1 and "no native bf16" in message[0] and "fp32" in message[0]
    assert report.precision == "fp32"  # what the run really used, which its rows record


def test_bf16_autocasts_on_a_cpu_with_native_bf16(monkeypatch, capsys):
    report, weights = bf16_fit(monkeypatch, {"avx512_bf16"})
    assert report.precision == "bf16" and capsys.readouterr().err == ""
    fp32, fp32_weights = bf16_fit(monkeypatch, set())
    assert not torch.equal(weights, fp32_weights)  # the products really ran in bf16
    assert report.curve[-1]["loss"] == pytest.approx(fp32.curve[-1]["loss"], rel=0.05)  # and learned the same


def test_a_checkpoint_of_another_layout_is_refused_in_one_line_and_a_plan_reads_nothing_from_it(tmp_path):
    checkpoint = tmp_path / "run.pt"
    trainer(checkpoint=str(checkpoint), max_epochs=1).fit(new_model(), toy_split().train(), None)
    saved = torch.load(checkpoint, weights_only=False)
    torch.save({**saved, "version": checkpoint_module.CHECKPOINT_VERSION - 1}, checkpoint)
    assert checkpoint_module.saved_progress(checkpoint) is None
    assert checkpoint_module.saved_progress(tmp_path / "absent.pt") is None
    with pytest.raises(ValueError, match="a training checkpoint of an older version of the suite; delete it"):
        trainer(checkpoint=str(checkpoint), max_epochs=2).fit(new_model(), toy_split().train(), None)


class DroppingBPRMF(BPRMF):
    """BPR-MF with dropout on its factors: its training draws from PyTorch's global generator, as every dropout
    layer does, besides the trainer's own generator."""

    def loss(self, batch, generator):
        users, positives = batch["users"], batch["items"]
        negatives = self.negatives(users, generator)
        p_u = torch.nn.functional.dropout(self.user_factors(users), 0.5, self.training)
        x_uij = (p_u * self.item_factors(positives)).sum(-1) - (p_u * self.item_factors(negatives)).sum(-1)
        return -torch.nn.functional.logsigmoid(x_uij).mean()


CUDA_PARAM = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch sees no CUDA device")])


@pytest.mark.parametrize("device", ["cpu", CUDA_PARAM])
def test_a_resumed_run_draws_the_dropout_masks_an_uninterrupted_run_draws(tmp_path, device):
    """A long run is resumed many times (a session, a killed worker); each resume starts a new process whose global
    generators the worker seeds afresh. The checkpoint keeps their states (on CUDA the device's too, which its
    dropout draws from), so the resumed run ends with the uninterrupted run's weights, not only with the same
    seed."""
    def model(seed=0):
        torch.manual_seed(seed)
        return DroppingBPRMF(40, 60, BPRMFConfig(hidden=8)).to(device)

    split = toy_split()
    torch.manual_seed(7)  # the worker seeds the global generator with the job's seed before training
    reference = model()
    trainer(max_epochs=4, patience=None).fit(reference, split.train(), None)

    checkpoint, calls = tmp_path / "run.pt", {"n": 0}

    def crash_at_epoch_3(current):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return {"NDCG@10": 0.1 * calls["n"]}

    torch.manual_seed(7)
    with pytest.raises(KeyboardInterrupt):
        trainer(checkpoint=str(checkpoint), max_epochs=4, patience=None).fit(model(), split.train(), crash_at_epoch_3)
    torch.manual_seed(7)  # a new process: the worker seeds again before resuming
    resumed = model(seed=123)
    report = trainer(checkpoint=str(checkpoint), max_epochs=4, patience=None).fit(resumed, split.train(), None)
    assert report.resumed_from_epoch == 2 and report.epochs_run == 4
    # Other dropout masks move the factors by about their own size; on CUDA the sums' order may differ (atomics).
    tolerance = 0.0 if device == "cpu" else 1e-5
    torch.testing.assert_close(resumed.item_factors.weight, reference.item_factors.weight, rtol=0, atol=tolerance)


def test_adam_runs_fused_on_the_cpu_the_loops_update_and_a_loop_checkpoint_resumes_fused(tmp_path, monkeypatch):
    """The trainer's Adam is fused on the CPU (one pass over each tensor instead of about ten, several times faster
    for large embedding tables): the loop's weights up to rounding, and a checkpoint that the loop wrote (a run of an
    older version) resumes with the fused implementation."""
    split = toy_split()
    optimizer = build_optimizer(TrainSettings(), new_model())
    assert [group["fused"] for group in optimizer.param_groups] == [True] * len(optimizer.param_groups)

    fused, loop = new_model(), new_model()
    trainer(max_epochs=3, patience=None).fit(fused, split.train(), None)
    checkpoint = tmp_path / "run.pt"
    with monkeypatch.context() as patched:
        patched.setattr(optim, "fused_adam", lambda device: False)
        trainer(max_epochs=3, patience=None, checkpoint=str(checkpoint)).fit(loop, split.train(), None)
    saved = torch.load(checkpoint, weights_only=False)["optimizer"]
    assert saved["param_groups"][0]["fused"] is False
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(fused.parameters(), loop.parameters()))

    resumed = build_optimizer(TrainSettings(), new_model())
    checkpoint_module.load_optimizer(resumed, saved)
    assert resumed.param_groups[0]["fused"] is True and resumed.state  # the loop's moments, the fused update
