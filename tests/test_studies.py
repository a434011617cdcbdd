"""The study job builders (ablation, sensitivity, Cloze) and one tiny study run end to end through the runner."""
import json

import numpy as np
import pytest

from recbench.benchmarks.config import resolve
from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.studies import (
    ABLATIONS,
    ablation_jobs,
    build_jobs,
    cloze_jobs,
    parse_args,
    sensitivity_jobs,
    study_table,
)
from recbench.models import model_class
from tests.helpers import chain_data

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("model", ["bert4rec", "sasrec"])
def test_every_ablation_row_is_the_same_model_with_its_switch_set(model):
    jobs = ablation_jobs(["ml-1m"], [model], seeds=[0, 1])
    assert len(jobs) == 2 * len(ABLATIONS) and {job.study for job in jobs} == {"ablation"}
    configs = {job.variant: resolve(job.model, job.dataset, "paper", job.overrides).model for job in jobs}
    default = configs["default"]
    assert type(default) is model_class(model).Config
    assert configs["w/o PE"].use_position is False and configs["w/o PFFN"].use_ffn is False
    assert configs["w/o LN"].use_layernorm is False and configs["w/o RC"].use_residual is False
    assert configs["w/o Dropout"].dropout == 0.0 and configs["w/o Dropout"].attention_dropout == 0.0
    assert [configs[f"L={n}"].layers for n in (1, 3, 4)] == [1, 3, 4]
    assert [configs[f"h={n}"].heads for n in (1, 4, 8)] == [1, 4, 8]
    assert configs["w/o PE"].max_len == default.max_len == 200  # everything else stays the dataset's setting


def test_ablation_variants_can_be_chosen_and_unknown_ones_are_refused():
    assert [job.variant for job in ablation_jobs(["beauty"], ["bert4rec"], variants=["w/o PE"])] == ["w/o PE"]
    with pytest.raises(ValueError, match="unknown ablation variant"):
        ablation_jobs(["beauty"], ["bert4rec"], variants=["w/o attention"])


def test_sensitivity_sweeps_record_param_and_value():
    jobs = sensitivity_jobs(["ml-1m"], ["bert4rec", "sasrec"], "d")
    assert [job.sweep["value"] for job in jobs[::2]] == [16, 32, 64, 128, 256]
    assert jobs[0].variant == "hidden=16" and jobs[0].sweep == {"param": "hidden", "value": 16}
    assert resolve("sasrec", "ml-1m", "paper", jobs[-1].overrides).model.hidden == 256
    rho = sensitivity_jobs(["beauty"], ["bert4rec"], "rho")
    assert [job.sweep["value"] for job in rho] == pytest.approx([0.1 * k for k in range(1, 10)])
    lengths = sensitivity_jobs(["ml-1m"], ["bert4rec"], "N", values=[10, 400])
    assert [resolve(j.model, j.dataset, "paper", j.overrides).model.max_len for j in lengths] == [10, 400]


def test_sensitivity_refuses_a_field_some_model_lacks():
    with pytest.raises(ValueError, match="sasrec has no field 'mask_proportion'"):
        sensitivity_jobs(["ml-1m"], ["bert4rec", "sasrec"], "rho")
    with pytest.raises(ValueError, match="no default values"):
        sensitivity_jobs(["ml-1m"], ["bert4rec"], "layers")


def test_cloze_study_compares_the_three_models():
    jobs = cloze_jobs(["ml-1m"], seeds=[0])
    assert [(job.model, job.variant, job.study) for job in jobs] == [
        ("sasrec", "SASRec", "cloze"), ("bert4rec-1mask", "BERT4Rec (1 mask)", "cloze"),
        ("bert4rec", "BERT4Rec", "cloze")]
    assert resolve("bert4rec-1mask", "ml-1m", "paper").model.dupe_factor == 0


def test_command_line_builds_the_same_jobs():
    args = parse_args(["ablation", "--datasets", "beauty", "--models", "sasrec", "--variants", "L=1",
                       "--set", "max_epochs=2"])
    (job,) = build_jobs(args)
    assert job.overrides == ("max_epochs=2", "layers=1") and job.variant == "L=1"
    args = parse_args(["sensitivity", "--param", "hidden", "--values", "8", "16"])
    assert [job.sweep for job in build_jobs(args)] == [{"param": "hidden", "value": 8},
                                                        {"param": "hidden", "value": 16}]


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
    for row in written:  # both models save heat-map weights: every layer and head over one user's test input
        with np.load(tmp_path / row["attention_file"]) as saved:
            weights, items = saved["weights"], saved["items"]
        assert weights.shape == (2, 1, len(items), len(items))  # layers, heads (heads=1), positions, positions
        assert np.allclose(weights.sum(-1)[..., items != 0], 1.0, atol=1e-5)  # each real query's weights sum to 1
    assert len({row["attention_file"] for row in written}) == 3  # one file per job
    table = study_table(written[:2])
    assert "w/o PE" in table and "chain bert4rec (pop100)" in table
