"""The studies as the paper ran them (ablation, sensitivity sweeps with their tied settings, Cloze study at d = 256),
their plan and time estimates, and one tiny study run end to end through the grid."""
import json
import re

import numpy as np
import pytest
import torch
from torch import nn

from recbench.benchmarks.checkpoint import TrainState
from recbench.benchmarks.commands.studies import (
    ABLATIONS,
    ablation_jobs,
    build_jobs,
    cloze_jobs,
    main,
    parse_args,
    plan_lines,
    sensitivity_jobs,
    study_table,
    sweep_values,
)
from recbench.benchmarks.config import resolve
from recbench.benchmarks.estimate import (
    Estimate,
    at_once,
    duration,
    estimate_jobs,
    planned_steps,
    reference_job_stops,
    reference_stops,
    seconds_per_step as estimate_seconds_per_step,
)
from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.planner import plan_grid
from recbench.benchmarks.trainer import TrainSettings
from recbench.datasets import load_dataset
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.models import model_class
from recbench.reports import names
from tests.helpers import SHARED_DATA, chain_data, interrupt_training_at_validation, requires_shared_data

pytestmark = pytest.mark.usefixtures("one_thread")


def configs(jobs, profile="paper"):
    return [resolve(job.model, job.dataset, profile, job.overrides).model for job in jobs]


# ------------------------------------------------------------------------------------------------ ablation

@pytest.mark.parametrize("model", ["bert4rec", "sasrec"])
def test_every_ablation_row_is_the_same_model_with_its_switch_set(model):
    jobs = ablation_jobs(["ml-1m"], [model], seeds=[0, 1])
    assert len(jobs) == 2 * len(ABLATIONS) and {job.study for job in jobs} == {"ablation"}
    found = {job.variant: config for job, config in zip(jobs, configs(jobs))}
    default = found["default"]
    assert type(default) is model_class(model).Config
    assert found["w/o PE"].use_position is False and found["w/o PFFN"].use_ffn is False
    assert found["w/o LN"].use_layernorm is False and found["w/o RC"].use_residual is False
    assert found["w/o Dropout"].dropout == 0.0 and found["w/o Dropout"].attention_dropout == 0.0
    assert [found[f"L={n}"].layers for n in (1, 3, 4)] == [1, 3, 4]
    assert [found[f"h={n}"].heads for n in (1, 4, 8)] == [1, 4, 8]
    assert found["w/o RC, L=4"].use_residual is False and found["w/o RC, L=4"].layers == 4  # §4.8
    assert found["w/o PE"].max_len == default.max_len == 200  # everything else stays the dataset's setting


@pytest.mark.parametrize("model, norms", [("bert4rec", "2L + 2"), ("sasrec", "2L + 1")])
def test_w_o_ln_says_which_layernorms_and_removes_exactly_those(model, norms):
    text = names.ablation_removes(model, "w/o LN")
    assert text.startswith(f"all {norms} LayerNorms")
    layers = 3
    count = {"2L + 2": 2 * layers + 2, "2L + 1": 2 * layers + 1}[norms]
    for use_layernorm, expected in ((True, count), (False, 0)):
        config = model_class(model).Config(max_len=10, hidden=16, layers=layers, use_layernorm=use_layernorm)
        built = model_class(model)(5, 30, config)
        assert sum(isinstance(m, nn.LayerNorm) for m in built.modules()) == expected
    assert names.ablation_removes(model, "L=3") is None and "residual" in names.ablation_removes(model, "w/o RC")


def test_ablation_variants_can_be_chosen_and_unknown_ones_are_refused():
    assert [job.variant for job in ablation_jobs(["beauty"], ["bert4rec"], variants=["w/o PE"])] == ["w/o PE"]
    with pytest.raises(ValueError, match="unknown ablation variant"):
        ablation_jobs(["beauty"], ["bert4rec"], variants=["w/o attention"])


# ------------------------------------------------------------------------------------------- the d sweep

def test_the_d_sweep_runs_figure_3s_models_with_heads_by_the_papers_rule():
    jobs = sensitivity_jobs(["ml-1m"], param="d")
    assert list(dict.fromkeys(job.model for job in jobs)) == ["gru4rec", "gru4rec+", "caser", "sasrec", "bert4rec"]
    bert = [job for job in jobs if job.model == "bert4rec"]
    built = configs(bert)
    assert [c.hidden for c in built] == [16, 32, 64, 128, 256]
    assert [c.heads for c in built] == [1, 1, 2, 4, 8]  # 32 dimensions per head, at least one
    assert [job.sweep["tied"]["heads"] for job in bert] == [1, 1, 2, 4, 8]  # recorded in every row
    assert "heads=8" in bert[-1].overrides  # and part of the job, so the plan shows it
    assert [c.heads for c in configs([job for job in jobs if job.model == "sasrec"])] == [1] * 5
    # The FFN is 4d (eq. 3) but at ML-1m's d = 256, where the authors' bert_config_ml-1m_256.json has 512; SASRec's
    # stays d (its authors' code)
    inner = [model_class("bert4rec")(5, 30, config).encoder.blocks[0].ffn.inner.out_features for config in built]
    assert inner == [64, 128, 256, 512, 512]
    beauty = configs([job for job in sensitivity_jobs(["beauty"], ["bert4rec"], "d")])
    assert model_class("bert4rec")(5, 30, beauty[-1]).encoder.blocks[0].ffn.inner.out_features == 1024
    sasrec = configs([job for job in jobs if job.model == "sasrec"])[-1]
    assert model_class("sasrec")(5, 30, sasrec).encoder.blocks[0].ffn.inner.out_features == 256


def test_the_d_sweep_takes_the_authors_dropouts_of_each_d_under_the_paper_profile():
    ml1m = configs([j for j in sensitivity_jobs(["ml-1m"], ["bert4rec"], "d")])
    assert [c.dropout for c in ml1m] == [0.2, 0.2, 0.2, 0.5, 0.5]  # bert_config_ml-1m_{64,128,256}.json
    assert [c.attention_dropout for c in ml1m] == [0.2] * 5
    steam = configs([j for j in sensitivity_jobs(["steam"], ["bert4rec"], "d")])
    assert [(c.dropout, c.attention_dropout) for c in steam][-2:] == [(0.1, 0.1), (0.2, 0.2)]
    beauty = configs([j for j in sensitivity_jobs(["beauty"], ["bert4rec"], "d")])
    assert {(c.dropout, c.attention_dropout) for c in beauty} == {(0.5, 0.2)}


def test_heads_set_by_the_user_win_and_must_divide_every_d():
    jobs = sensitivity_jobs(["ml-1m"], ["bert4rec"], "d", overrides=("heads=1",))
    assert [c.heads for c in configs(jobs)] == [1] * 5 and all("heads" not in job.sweep.get("tied", {}) for job in jobs)
    with pytest.raises(ValueError, match=r"--set bert4rec:heads=3: 3 heads do not divide d=16 of the d sweep") as error:
        sensitivity_jobs(["ml-1m"], ["bert4rec"], "d", overrides=("bert4rec:heads=3",))
    assert "\n" not in str(error.value)


def test_an_unknown_sweep_parameter_is_one_line_before_anything_runs():
    with pytest.raises(ValueError, match="unknown sweep parameter 'depth' for bert4rec") as error:
        sensitivity_jobs(["ml-1m"], ["bert4rec"], "depth", values=[1, 2])
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="unknown sweep parameter 'mask_proportion' for sasrec"):
        sensitivity_jobs(["ml-1m"], ["bert4rec", "sasrec"], "rho")
    with pytest.raises(ValueError, match="no default values"):
        sensitivity_jobs(["ml-1m"], ["bert4rec"], "layers")


# ----------------------------------------------------------------------------------------- the ρ and N sweeps

def test_the_n_sweep_takes_table_4s_values_per_dataset_and_caps_at_rho_n():
    assert sweep_values("max_len", "beauty") == [10, 20, 30, 40, 50]
    assert sweep_values("max_len", "ml-1m") == [10, 50, 100, 200, 400]
    assert sweep_values("max_len", "steam") == [10, 20, 30, 40, 50]  # N = 50 in Table 1, as Beauty
    assert sweep_values("max_len", "ml-20m") == [10, 50, 100, 200, 400]  # N = 200, as ML-1m
    jobs = sensitivity_jobs(["beauty", "ml-1m"], param="N")
    assert [(job.dataset, job.sweep["value"]) for job in jobs][:2] == [("beauty", 10), ("beauty", 20)]
    built = configs(jobs)
    # ⌈ρ·N⌉ with Beauty's ρ = 0.6 and ML-1m's 0.2 (0.6·10 = 6, 0.2·400 = 80; the authors' caps are 30 and 40)
    assert [c.max_predictions for c in built] == [6, 12, 18, 24, 30, 2, 10, 20, 40, 80]
    assert [job.sweep["tied"] for job in jobs][-1] == {"max_predictions": 80}


def test_the_rho_sweep_lifts_the_cap_but_the_default_configuration_keeps_the_authors():
    jobs = sensitivity_jobs(["ml-1m"], ["bert4rec"], "rho")
    assert [c.max_predictions for c in configs(jobs)] == [20, 40, 60, 80, 100, 120, 140, 160, 180]
    assert resolve("bert4rec", "ml-1m", "paper").model.max_predictions == 40
    kept = sensitivity_jobs(["ml-1m"], ["bert4rec"], "rho", values=[0.5], overrides=("max_predictions=40",))
    assert configs(kept)[0].max_predictions == 40 and "tied" not in kept[0].sweep  # the user's cap wins
    # A 1-mask variant masks one item whatever ρ: no cap to follow.
    one = sensitivity_jobs(["ml-1m"], ["bert4rec-1mask-random"], "N", values=[100])
    assert configs(one)[0].max_predictions == 1 and "tied" not in one[0].sweep


@requires_shared_data
def test_the_cloze_copies_of_a_rho_sweep_mask_rho_of_their_items_on_ml1m(tmp_path):
    train = LeaveOneOutSplit(load_dataset("ml-1m", SHARED_DATA, tmp_path, download=False)).train()
    for job in sensitivity_jobs(["ml-1m"], ["bert4rec"], "rho", overrides=("dupe_factor=1",)):
        rho = job.sweep["value"]
        torch.manual_seed(0)
        model = model_class("bert4rec")(6040, 3416, resolve("bert4rec", "ml-1m", "paper", job.overrides).model)
        examples = model.training_examples(train)
        cloze = ~examples["last"]  # the Cloze copies, not the last-item copy
        masked = (examples["masked_columns"][cloze] < model.config.max_len).sum().item()
        items = (model.windows[examples["window"][cloze]] != 0).sum().item()
        assert masked / items == pytest.approx(rho, abs=0.02)
        report = model.training_report()
        assert report["masked_proportion"] == pytest.approx(masked / items) and report["capped_windows"] == 0


def test_the_default_cap_binds_and_the_row_says_so():
    model = model_class("bert4rec")(4, 30, resolve("bert4rec", "ml-1m", "paper", ("mask_proportion=0.6",)).model)
    windows = torch.zeros(2, 200, dtype=torch.long)
    windows[0, -100:], windows[1, -10:] = 1, 1
    facts = model.cloze_copy_facts(windows)  # 60 of 100 items capped at 40, 6 of 10 not
    assert facts == {"masked_proportion": pytest.approx(46 / 110), "capped_windows": 0.5}
    assert model_class("bert4rec-1mask")(4, 30, model_class("bert4rec-1mask").Config()).training_report() == {}


# ---------------------------------------------------------------------------------------------- Cloze study

def test_the_cloze_study_runs_at_d_256_with_both_readings_of_one_mask():
    jobs = cloze_jobs(["ml-1m"], seeds=[0])
    assert [(job.model, job.variant, job.study) for job in jobs] == [
        ("sasrec", "SASRec", "cloze"), ("bert4rec-1mask", "BERT4Rec (1 mask: last)", "cloze"),
        ("bert4rec-1mask-random", "BERT4Rec (1 mask: random)", "cloze"), ("bert4rec", "BERT4Rec", "cloze")]
    sasrec, last, random, bert = configs(jobs)
    assert {c.hidden for c in (sasrec, last, random, bert)} == {256}
    assert sasrec.heads == 1 and last.heads == random.heads == bert.heads == 8
    assert last.dupe_factor == 0 and last.mask_last  # only the last item of each sequence
    assert random.dupe_factor == 10 and random.max_predictions == 1  # one random item per copy
    assert bert.max_predictions == 40 and bert.dropout == 0.5  # the authors' cap; bert_config_ml-1m_256.json
    mine = cloze_jobs(["ml-1m"], models=["bert4rec"], overrides=("hidden=64",))  # the user's d wins, heads follow
    assert [(c.hidden, c.heads, c.dropout) for c in configs(mine)] == [(64, 2, 0.2)]
    with pytest.raises(ValueError, match="max_predictions=40 must be 1"):
        model_class("bert4rec-1mask-random").Config(max_predictions=40)


def test_the_one_random_mask_variant_masks_one_item_per_copy_and_the_last_item_copy():
    torch.manual_seed(0)
    config = model_class("bert4rec-1mask-random").Config(max_len=20, dupe_factor=3)
    model = model_class("bert4rec-1mask-random")(60, 150, config)
    examples = model.training_examples(LeaveOneOutSplit(chain_data(n_users=60)).train())
    used = (examples["masked_columns"] < 20).sum(1)
    assert used.tolist() == [1] * len(used)
    last_column = examples["masked_columns"][examples["last"], 0]
    assert (last_column == 19).all()  # the mask_last copy: the window's last column
    cloze = examples["masked_columns"][~examples["last"], 0]
    assert len(set(cloze.tolist())) > 5  # the other copies: random items, not always the last


def test_the_study_command_defaults_to_the_converge_profile_and_plans_with_tied_settings(capsys):
    args = parse_args(["cloze", "--datasets", "synthetic"])
    assert args.profile == "converge" and args.hidden == 256
    assert main(["cloze", "--datasets", "synthetic", "--models", "bert4rec", "--dry-run", "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert "profile converge" in out and "sets: hidden=256 heads=8" in out and "hidden=256 layers=2 heads=8" in out
    assert main(["sensitivity", "--param", "d", "--models", "sasrec", "--set", "heads=3", "--dry-run",
                 "--no-estimate"]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line, before anything trains


def test_command_line_builds_the_same_jobs():
    args = parse_args(["ablation", "--datasets", "beauty", "--models", "sasrec", "--variants", "L=1",
                       "--set", "max_epochs=2"])
    (job,) = build_jobs(args)
    assert job.overrides == ("max_epochs=2", "layers=1") and job.variant == "L=1"
    args = parse_args(["sensitivity", "--param", "hidden", "--values", "8", "16", "--models", "sasrec"])
    assert [job.sweep for job in build_jobs(args)] == [{"param": "hidden", "value": 8},
                                                        {"param": "hidden", "value": 16}]


# -------------------------------------------------------------------------------------------- time estimates

def test_planned_steps_are_exact_without_early_stopping_and_an_upper_bound_with_it():
    paper = TrainSettings(max_steps=400_000, max_epochs=100_000, patience=10 ** 6)
    assert planned_steps(paper, 112_783) == (400_000, True)  # 441 batches an epoch: max_steps decides
    early = TrainSettings(max_epochs=200, patience=10, batch_size=128)
    assert planned_steps(early, 6040) == (200 * 48, False)
    assert duration(30) == "30 s" and duration(7200) == "2.0 h" and duration(86400 * 11.6) == "11.6 days"
    assert Estimate(3600.0, 1000, 3.6, exact=True).describe() == "≈ 1.0 h: 1,000 steps × 3.6 s (runs every step)"
    assert Estimate(None).describe() == "no training"


def test_a_resumed_jobs_estimate_is_what_its_checkpoint_has_not_trained_yet():
    early = Estimate(200.0, 100, 2.0, exact=False, expected=60.0, expected_from="a run")  # expected: 30 steps
    left = early.after(TrainState(epoch=2, step=20, train_seconds=41.0))
    assert (left.steps, left.seconds, left.expected) == (80, 160.0, 20.0)
    assert early.after(TrainState(step=45)).expected == 0.0  # past where the reference stopped: only the bound
    assert early.after(TrainState(step=45, stopped_by="early stopping")).seconds == 0.0  # only its test pass left
    capped = Estimate(50.0, 100, 2.0, exact=False, budget=50.0)
    assert capped.after(TrainState(step=10, train_seconds=30.0)).seconds == 20.0  # the budget's rest
    assert Estimate(None).after(TrainState(step=5)).seconds is None


def test_estimates_time_real_steps_and_the_plan_states_them(tmp_path):
    jobs = ablation_jobs(["chain"], ["bert4rec"], variants=["default"],
                         overrides=("max_len=8", "hidden=8", "heads=1", "max_steps=1000", "max_epochs=100000",
                                    "patience=1000"))
    jobs += cloze_jobs(["chain"], models=["sasrec"], overrides=("max_len=8", "max_epochs=3", "patience=1"))
    jobs += ablation_jobs(["chain"], ["pop"], variants=["default"])
    options = RunOptions(output=tmp_path, protocols=("pop100",), profile="smoke", device="cpu")
    planned, datasets = plan_grid(jobs, options, preloaded={"chain": chain_data(n_users=60)}, log=lambda *_: None)
    estimates = estimate_jobs(planned, datasets, device="cpu", threads=1, log=lambda *_: None)
    bert, sasrec, pop = (estimates[job.key] for job in planned)
    assert bert.exact and bert.steps == 1000 and bert.per_step > 0
    assert bert.seconds == pytest.approx(1000 * bert.per_step)
    assert not sasrec.exact and sasrec.steps == 3 * 1  # 3 epochs of one batch of 60 windows: an upper bound
    assert pop.seconds is None
    text = "\n".join(plan_lines(planned, estimates))
    assert "estimated training: ≈" in text and "early stopping may end it sooner" in text
    assert "no training" in text and "tied to" not in text and "patience=1 hidden=256" in text


@pytest.mark.parametrize("flags, timed_in_bf16", [({"avx512_bf16"}, True), (set(), False)])
def test_a_bf16_job_is_timed_in_bf16_where_the_cpu_has_it(flags, timed_in_bf16, tmp_path, monkeypatch):
    """The plan times a job as the trainer will run it: under bf16 autocast where precision=bf16 and the CPU has
    native bf16, so its estimate is not an fp32 figure; without native bf16 it trains in fp32 and shares the fp32
    job's measurement."""
    from recbench.benchmarks import estimate, provenance

    monkeypatch.setattr(provenance, "cpu_flags", lambda cpuinfo=None: flags)
    timed = []

    def spy(model, examples, batch_size, bf16=False):  # the autocast itself: the next test
        timed.append(bf16)
        return 0.5 if bf16 else 1.0

    monkeypatch.setattr(estimate, "seconds_per_step", spy)
    jobs = []
    for precision in ("fp32", "bf16"):
        jobs += ablation_jobs(["chain"], ["bert4rec"], variants=["default"], overrides=(
            "max_len=8", "hidden=8", "heads=1", "max_epochs=3", "patience=1", f"precision={precision}"))
    options = RunOptions(output=tmp_path, protocols=("pop100",), profile="smoke", device="cpu")
    planned, datasets = plan_grid(jobs, options, preloaded={"chain": chain_data(n_users=60)}, log=lambda *_: None)
    estimates = estimate_jobs(planned, datasets, device="cpu", threads=1, log=lambda *_: None)
    fp32, bf16 = (estimates[job.key] for job in planned)
    assert timed == ([False, True] if timed_in_bf16 else [False])  # one measurement per precision actually used
    assert fp32.per_step == 1.0 and bf16.per_step == (0.5 if timed_in_bf16 else 1.0)


def test_seconds_per_step_runs_the_loss_under_bf16_autocast_when_asked():
    class Recording(model_class("bprmf")):
        def loss(self, batch, generator):
            autocast.append(torch.is_autocast_enabled("cpu"))
            return super().loss(batch, generator)

    split = LeaveOneOutSplit(chain_data(n_users=60))
    model = Recording(split.data.n_users, split.n_items, resolve("bprmf", "chain", "smoke", ()).model)
    examples = model.training_examples(split.train())
    for bf16 in (False, True):
        autocast = []
        assert estimate_seconds_per_step(model, examples, 16, bf16=bf16) > 0
        assert autocast and set(autocast) == {bf16}


def test_a_file_named_like_a_converge_reference_that_is_none_is_one_clear_error(tmp_path):
    (tmp_path / "converge-deviations.json").write_text(json.dumps({"variants": {}}))
    with pytest.raises(ValueError, match=r"converge-deviations\.json: not a converge reference .* rename it"):
        reference_stops(tmp_path)


def test_the_committed_reference_runs_read_as_a_studys_time_estimate_reads_them():
    # every converge-*.json of results/reference must be a converge reference, or every study refuses to start (a
    # bf16 rows file named converge-ml-1m-bf16-... once did that); and the converged runs give their stops
    stops = reference_stops()
    assert {("ml-1m", "sasrec", "converge", 10), ("beauty", "sasrec", "converge", 10)} <= stops.keys()
    assert all(dataset in names.DATASETS and epochs > 0 for (dataset, *_), (epochs, _) in stops.items())
    assert all(epochs > 0 for epochs, _ in reference_job_stops().values())  # every rows file reads, none refuses


def test_a_converged_reference_run_gives_early_stopped_jobs_an_expected_time(tmp_path):
    reference = {"dataset": "chain", "profile": "smoke", "summary": [
        {"model": "sasrec", "converged": True, "epochs_run": {"0": 2, "1": 3, "2": 9},
         "patience": {"0": 5, "1": 5, "2": 20}},  # seed 2 waited longer: its stop says nothing of patience 5
        {"model": "bert4rec", "converged": False, "epochs_run": {"0": 400}, "patience": {"0": 5}},  # a cap ended it
        {"model": "pop", "converged": None, "epochs_run": {"0": 0}, "patience": {"0": None}}]}
    (tmp_path / "converge-chain.json").write_text(json.dumps(reference))
    stops = reference_stops(tmp_path)
    assert set(stops) == {("chain", "sasrec", "smoke", 5), ("chain", "sasrec", "smoke", 20)}
    assert stops[("chain", "sasrec", "smoke", 5)][0] == 3 and stops[("chain", "sasrec", "smoke", 20)][0] == 9
    jobs = cloze_jobs(["chain"], models=["sasrec"], overrides=("max_len=8", "max_epochs=50", "patience=5"))
    options = RunOptions(output=tmp_path / "out", protocols=("pop100",), profile="smoke", device="cpu")
    planned, datasets = plan_grid(jobs, options, preloaded={"chain": chain_data(n_users=60)}, log=lambda *_: None)
    (sasrec,) = estimate_jobs(planned, datasets, device="cpu", threads=1, log=lambda *_: None,
                              stops=stops).values()
    assert not sasrec.exact and sasrec.steps == 50  # one batch of 60 windows an epoch, 50 epochs at most
    assert sasrec.expected == pytest.approx(3 * sasrec.per_step) and sasrec.likely == sasrec.expected
    assert "if it stops where the converged sasrec run on chain with patience 5 did (epoch 3" in sasrec.describe()
    jobs = cloze_jobs(["chain"], models=["sasrec"], overrides=("max_len=8", "max_epochs=50", "patience=7"))
    planned_7, _ = plan_grid(jobs, options, preloaded={"chain": chain_data(n_users=60)}, log=lambda *_: None)
    (other,) = estimate_jobs(planned_7, datasets, device="cpu", threads=1, log=lambda *_: None, stops=stops).values()
    assert other.expected is None  # no reference run waited 7 validations
    text = "\n".join(plan_lines(planned, {job.key: sasrec for job in planned}))
    assert "≈ " in text.splitlines()[-1] and f"≤ {duration(sasrec.seconds)} if every job runs to its cap" in text
    assert "at once" not in text
    two = plan_lines(planned, {job.key: sasrec for job in planned}, n_jobs=2)[-1]
    assert two.startswith("with 2 jobs at once: ≈ ") and f"(≤ {duration(sasrec.seconds)})" in two  # one job: its own


def test_a_job_a_reference_file_holds_is_expected_to_stop_where_that_row_did(tmp_path):
    # a rerun of the reproduction's commands: the stored row of the same key says where its job stops (Table 5's
    # variants stopped at epochs 45-191 where BERT4Rec's reference run stopped at 146), before the model's run
    jobs = cloze_jobs(["chain"], models=["sasrec"], overrides=("max_len=8", "max_epochs=50", "patience=5"))
    options = RunOptions(output=tmp_path / "out", protocols=("pop100",), profile="smoke", device="cpu")
    planned, datasets = plan_grid(jobs, options, preloaded={"chain": chain_data(n_users=60)}, log=lambda *_: None)
    (job,) = planned
    row = {"key": job.key, "stopped_by": "early stopping", "epochs_run": 7}
    rows = [{**row, "protocol": "full"}, {**row, "protocol": "pop100"}, {"key": "other", "stopped_by": "early stopping",
                                                                          "epochs_run": 40},
            {"key": "capped", "stopped_by": "max_epochs", "epochs_run": 50}]
    (tmp_path / "rows-probe-chain.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "notes.json").write_text(json.dumps(["not a rows file"]))
    stops = reference_job_stops(tmp_path)
    assert stops == {job.key: (7, "the same job did (epoch 7, results/reference/rows-probe-chain.json)"),
                     "other": (40, "the same job did (epoch 40, results/reference/rows-probe-chain.json)")}
    model_run = {("chain", "sasrec", "smoke", 5): (3, "the converged sasrec run did (epoch 3)")}
    (sasrec,) = estimate_jobs(planned, datasets, device="cpu", threads=1, log=lambda *_: None,
                              stops={**model_run, **stops}).values()
    assert sasrec.expected == pytest.approx(7 * sasrec.per_step)  # one batch an epoch; the same job's 7, not 3
    assert "if it stops where the same job did (epoch 7, results/reference/rows-probe-chain.json)" in sasrec.describe()


def test_a_plans_own_early_stopped_jobs_set_where_its_other_jobs_are_expected_to_stop(tmp_path):
    """Table 5's ablation at dropout 0.1 reuses a default row that stopped at epoch 185 while the profile's reference
    run (dropout 0.2) stopped at 146: the plan must expect its variants to stop where its own finished jobs did, the
    reused default row or the variants already done, the latest of them, not where the reference file says."""
    from argparse import Namespace

    from recbench.benchmarks.commands.cli import training_left
    from recbench.benchmarks.reuse import Twin
    from recbench.benchmarks.store import ResultStore

    tiny = ("max_len=8", "hidden=8", "heads=1", "max_epochs=50", "patience=1", "dupe_factor=1")
    jobs = ablation_jobs(["chain"], ["bert4rec"], variants=["default", "w/o PE", "w/o PFFN"], overrides=tiny)
    options = RunOptions(output=tmp_path / "study", protocols=("pop100",), profile="smoke", device="cpu")
    planned, datasets = plan_grid(jobs, options, preloaded={"chain": chain_data(n_users=60)}, log=lambda *_: None)
    default, without_pe, without_pffn = planned

    def row(job, epochs, stopped_by="early stopping"):
        return {"key": job.key, "protocol": "pop100", "dataset": "chain", "model": "bert4rec", "profile": "smoke",
                "train_settings": {"patience": 1}, "epochs_run": epochs, "stopped_by": stopped_by}

    store = ResultStore(tmp_path / "study")
    args = Namespace(resume=True, device="cpu", threads=1, jobs=1)
    twins = {default.key: Twin(tmp_path / "main", "0" * 64, (row(default, 4),))}
    estimates = training_left(planned, datasets, store, args, {}, twins)
    assert set(estimates) == {without_pe.key, without_pffn.key}
    pffn = estimates[without_pffn.key]
    per_epoch = pffn.steps // 50
    assert pffn.steps == 50 * per_epoch and pffn.expected == pytest.approx(4 * per_epoch * pffn.per_step)
    assert (f"if it stops where the finished {default.run_id} did (epoch 4, reused from "
            f"{tmp_path / 'main'}); ≤ ") in pffn.describe()

    store.commit(without_pe.key, [row(without_pe, 7)], {})  # a later early stop of the plan's own folder counts
    (pffn,) = training_left(planned, datasets, store, args, {}, twins).values()
    assert pffn.expected == pytest.approx(7 * per_epoch * pffn.per_step)
    assert f"the finished {without_pe.run_id} did (epoch 7)" in pffn.describe()

    store.commit(without_pe.key, [row(without_pe, 50, "max epochs")], {})  # a cap says nothing of where it stops
    (pffn,) = training_left(planned, datasets, store, args, {}, twins).values()
    assert pffn.expected == pytest.approx(4 * per_epoch * pffn.per_step)
    without_resume = training_left(planned, datasets, store, Namespace(**{**vars(args), "resume": False}), {}, {})
    assert all(estimate.expected is None for estimate in without_resume.values())  # no reference run on chain

    # A later run of the study with --variants "w/o PFFN" plans that job alone; the folder's w/o PE row still counts.
    store.commit(without_pe.key, [{**row(without_pe, 9), "run_id": without_pe.run_id}], {})
    (alone,) = training_left([without_pffn], datasets, store, args, {}, {}).values()
    assert alone.expected == pytest.approx(9 * per_epoch * alone.per_step)
    assert f"the finished {without_pe.run_id} did (epoch 9, a row of this folder outside this plan)" in alone.describe()


def test_jobs_at_once_share_the_sum_but_never_beat_the_longest_job():
    assert at_once([2.0, 2.0, 2.0, 2.0], 2) == 4.0
    assert at_once([5.0, 1.0, 1.0, 1.0], 2) == 5.0  # the longest job runs on its own core all along
    assert at_once([3.0, 3.0], 1) == 6.0 and at_once([], 3) == 0.0


# -------------------------------------------------------------------------------------------- end to end

def test_a_tiny_ablation_writes_rows_with_study_variant_and_sweep(tmp_path):
    tiny = ("max_len=8", "hidden=8", "heads=1", "max_epochs=1", "valid_every=1")
    jobs = ablation_jobs(["chain"], ["bert4rec"], variants=["default", "w/o PE"],
                         overrides=(*tiny, "dupe_factor=1"))
    jobs += sensitivity_jobs(["chain"], ["sasrec"], "hidden", values=[4], overrides=tiny)
    options = RunOptions(output=tmp_path, protocols=("pop100",), profile="smoke", device="cpu",
                         cache_dir=str(tmp_path / "cache"), progress=False)
    rows = run_jobs(jobs, options, preloaded={"chain": chain_data(n_users=60)}, log=lambda *_: None).rows
    written = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == len(written) == 3
    assert [(r["study"], r["variant"], r["sweep"]) for r in written] == [
        ("ablation", "default", None), ("ablation", "w/o PE", None),
        ("sensitivity", "hidden=4", {"param": "hidden", "value": 4})]
    assert written[1]["hyperparameters"]["use_position"] is False and written[2]["hyperparameters"]["hidden"] == 4
    for row in written:  # both models save heat maps: every layer and head, averaged and one user's
        with np.load(tmp_path / row["attention_file"]) as saved:
            mean, users, weights, items = saved["weights"], saved["users"], saved["user_weights"], saved["user_items"]
        assert mean.shape == (2, 1, 10, 10) and users.shape == (10, 10)  # layers, heads (heads=1), last 10 positions
        assert users[-1, -1] == 60  # every test user has its last position
        assert weights.shape == (2, 1, len(items), len(items))
        assert np.allclose(weights.sum(-1)[..., items != 0], 1.0, atol=1e-5)  # each real query's weights sum to 1
    assert len({row["attention_file"] for row in written}) == 3  # one file per job
    table = study_table(written[:2])
    assert "w/o PE" in table and "chain bert4rec (pop100)" in table
    assert np.isfinite([r["metrics"]["NDCG@10"] for r in written]).all()


def test_a_resumed_studys_plan_skips_its_finished_jobs_and_times_only_what_the_interrupted_one_has_left(
        tmp_path, capsys, monkeypatch):
    """A study of hours runs across sessions: rerun with --resume, its plan must not count again the jobs whose rows
    are written, and an interrupted job's estimate is the steps its checkpoint has not trained (the plan used to time
    every job from the start)."""
    tiny = [part for field in ("max_len=10", "hidden=8", "heads=1", "max_epochs=2", "valid_every=1", "dupe_factor=1",
                               "time_budget_s=none", "batch_size=256") for part in ("--set", field)]
    argv = ["ablation", "--datasets", "synthetic", "--variants", "default", "w/o PE", *tiny, "--output",
            str(tmp_path / "study"), "--cache-dir", str(tmp_path / "cache"), "--quiet", "--no-report"]
    interrupt_training_at_validation(monkeypatch, 2)
    assert main(argv) == 1  # the default row stopped after epoch 1, its checkpoint kept; w/o PE finished
    monkeypatch.undo()
    capsys.readouterr()
    (checkpoint,) = (tmp_path / "study" / "checkpoints").glob("*.pt")
    state = torch.load(checkpoint, weights_only=False)["state"]

    assert main([*argv, "--dry-run"]) == 0  # without --resume every job would train from the start
    fresh = capsys.readouterr().out
    planned = [int(steps.replace(",", "")) for steps in re.findall(r"estimated training: .*?([\d,]+) steps ×", fresh)]
    assert len(planned) == 2 and planned[0] == 2 * state["step"]
    assert main([*argv, "--dry-run", "--resume"]) == 0
    resumed = capsys.readouterr().out
    assert resumed.count("[1/2]") == 1  # one plan: the study's lines are inside run_grid's
    default, without_pe = resumed.split("[2/2]")[0], resumed.split("[2/2]")[1].split("estimated training in all")[0]
    assert f"  resume from epoch 1 of at most 2, best validation NDCG@10 {state['best_metric']:.4f}" in default
    assert " use_position=false\n    removes: the learnable positional embedding" in without_pe
    (left,) = re.findall(r"estimated training left: .*?([\d,]+) steps ×", resumed)
    assert int(left.replace(",", "")) == planned[0] - state["step"]
    assert "  skip (done)" in without_pe and "estimated training" not in without_pe
    assert resumed.count("estimated training in all: ") == 1

    assert main([*argv, "--resume"]) == 0  # the run itself prints the same plan before it trains
    ran = capsys.readouterr().out
    assert f"    resumes from epoch 1 of at most 2, best validation NDCG@10 {state['best_metric']:.4f}" in ran
    # the run's time left, from the plan's estimate (no job of its model has finished in this run)
    started = r"^\[1/2\] synthetic/bert4rec/default/seed0 \(key \w+\), about (\d+ s|\d+\.\d (min|h)) left$"
    assert re.search(started, ran, re.M), ran
    assert "    done: its rows are in results.jsonl, skipped (--resume)" in ran
    assert len(re.findall(r"estimated training left: ", ran)) == 1 and ran.count("estimated training in all: ") == 1


def test_a_study_reuses_the_main_grids_identical_job_instead_of_training_it_again(tmp_path, capsys):
    """The ablation's default row is the main grid's job under other labels: with --reuse it takes that job's rows
    and files, labelled reused_from, and trains only the variants; a job with other settings finds no twin."""
    from recbench.benchmarks.jobs import Job
    from recbench.benchmarks.reuse import reusable_twins

    tiny = ("max_len=8", "hidden=8", "heads=1", "max_epochs=1", "valid_every=1", "dupe_factor=1")
    data, main_folder = {"chain": chain_data(n_users=60)}, tmp_path / "main"

    def options(folder):
        return RunOptions(output=tmp_path / folder, protocols=("full", "pop100"), profile="smoke", device="cpu",
                          cache_dir=str(tmp_path / "cache"), progress=False)

    originals = run_jobs([Job("chain", "bert4rec", 0, overrides=tiny)], options("main"), preloaded=data,
                         log=lambda *_: None).rows
    jobs = ablation_jobs(["chain"], ["bert4rec"], variants=["default", "w/o PE"], overrides=tiny)
    planned, _ = plan_grid(jobs, options("study"), preloaded=data)
    twins = reusable_twins(planned, (main_folder,))
    assert list(twins) == [planned[0].key] and twins[planned[0].key].key == originals[0]["key"]
    assert "    reused: the same job's rows in" in "\n".join(plan_lines(planned, None, 1, twins))

    logged = []
    result = run_jobs(jobs, options("study"), preloaded=data, log=logged.append, twins=twins)
    assert [outcome.trained for outcome in result.finished] == [False, True]  # only w/o PE trained
    assert any(line.startswith("[1/2] chain/bert4rec/default/seed0: reused from ") for line in logged)
    written = [json.loads(line) for line in (tmp_path / "study" / "results.jsonl").read_text().splitlines()]
    reused = [row for row in written if row["variant"] == "default"]
    assert [row["protocol"] for row in reused] == [row["protocol"] for row in originals] == ["full", "pop100"]
    for row, original in zip(reused, originals):
        assert row["metrics"] == original["metrics"] and row["key"] == planned[0].key != original["key"]
        assert (row["study"], row["run_id"]) == ("ablation", "chain/bert4rec/default/seed0")
        assert row["reused_from"] == {"folder": str(main_folder.resolve()), "key": original["key"],
                                      "run_id": "chain/bert4rec/seed0"}
        for column in ("per_user_file", "attention_file"):
            assert (tmp_path / "study" / row[column]).read_bytes() == (main_folder / original[column]).read_bytes()
            assert planned[0].file_stem in row[column]
    manifest = [json.loads(line) for line in (tmp_path / "study" / "manifest.jsonl").read_text().splitlines()]
    assert [job["action"] for job in manifest[0]["jobs"]] == ["reuse", "run"]

    other = ablation_jobs(["chain"], ["bert4rec"], variants=["default"], overrides=(*tiny, "lr=0.01"))
    assert reusable_twins(plan_grid(other, options("other"), preloaded=data)[0], (main_folder,)) == {}
    assert main(["ablation", "--datasets", "synthetic", "--reuse", str(tmp_path / "nowhere"), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --reuse {tmp_path / 'nowhere'}: no results.jsonl there "
                                               f"(expected a results folder of run_all.py or of a study)")


def test_a_study_reuses_its_own_job_run_in_another_folder(tmp_path, capsys):
    """A variant trained elsewhere (another machine, a lent GPU) with the same study, settings and seed is the same
    job: --reuse takes its rows under its own key, and the study trains only what no folder holds."""
    from recbench.benchmarks.reuse import reusable_twins

    tiny = ("max_len=8", "hidden=8", "heads=1", "max_epochs=1", "valid_every=1", "dupe_factor=1")
    data = {"chain": chain_data(n_users=60)}

    def options(folder):
        return RunOptions(output=tmp_path / folder, protocols=("full", "pop100"), profile="smoke", device="cpu",
                          cache_dir=str(tmp_path / "cache"), progress=False)

    elsewhere = run_jobs(ablation_jobs(["chain"], ["bert4rec"], variants=["w/o PE"], overrides=tiny),
                         options("elsewhere"), preloaded=data, log=lambda *_: None).rows
    jobs = ablation_jobs(["chain"], ["bert4rec"], variants=["default", "w/o PE"], overrides=tiny)
    planned, _ = plan_grid(jobs, options("study"), preloaded=data)
    twins = reusable_twins(planned, (tmp_path / "elsewhere",))
    assert list(twins) == [planned[1].key] and twins[planned[1].key].key == planned[1].key == elsewhere[0]["key"]
    result = run_jobs(jobs, options("study"), preloaded=data, log=lambda *_: None, twins=twins)
    assert {outcome.run_id: outcome.trained for outcome in result.finished} == {
        "chain/bert4rec/default/seed0": True, "chain/bert4rec/w/o PE/seed0": False}  # only the default trained
    written = [json.loads(line) for line in (tmp_path / "study" / "results.jsonl").read_text().splitlines()]
    reused = [row for row in written if row["variant"] == "w/o PE"]
    assert [row["metrics"] for row in reused] == [row["metrics"] for row in elsewhere]
    assert all(row["reused_from"] == {"folder": str((tmp_path / "elsewhere").resolve()), "key": planned[1].key,
                                      "run_id": "chain/bert4rec/w/o PE/seed0"} for row in reused)
    study = str(tmp_path / "study")  # its own output would reuse every finished job as itself
    assert main(["ablation", "--datasets", "synthetic", "--output", study, "--reuse", study, "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --reuse {study}: this is the study's own --output, whose "
                                               f"finished jobs --resume skips; name another folder")
