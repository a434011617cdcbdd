"""The report generator on a programmatic results folder (``tests/fixtures/reports_fixture.py``).

The full fixture's report is generated once per module; smaller folders check gaps, a one-model run, errors
and the command line. Table checks parse the written Markdown and compare it with the rows themselves.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from recbench.benchmarks.metrics import DEFAULT_METRICS, RankCounts, per_user_metrics
from recbench.reports import generate_report, names
from recbench.reports.__main__ import main as cli
from recbench.reports.published import load_published
from recbench.reports.render import latex_escape
from recbench.reports.results import ResultsError, load_results
from recbench.reports.stats import PerUser, holm
from recbench.reports.tables import ablation_table, main_table
from tests.fixtures.reports_fixture import (
    SEEDS,
    build_fixture,
    counts_for,
    ranking_row,
    relevance_row,
    write_attention,
    write_results,
)
from tests.helpers import ROOT

MODELS = {"POP": "pop", "GRU4Rec": "gru4rec", "SASRec": "sasrec", "BERT4Rec": "bert4rec"}
DATASETS = {"ML-1m": "ml-1m", "Beauty": "beauty"}


@pytest.fixture(scope="module")
def fixture_report(tmp_path_factory) -> Path:
    folder = build_fixture(tmp_path_factory.mktemp("results") / "run")
    report = generate_report(folder)
    assert report == folder / "report.md"
    return folder


# ------------------------------------------------------------------------------------------------ helpers

def parse_markdown(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and body cells of the (first) GitHub table in ``path``."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    split = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
    return split[0], split[2:]


def plain(cell: str) -> str:
    """A cell's text without emphasis and significance marks."""
    return re.sub(r"\*\*|</?ins>|[†‡]", "", cell).strip()


def numbers(cell: str) -> tuple[float, float | None]:
    """(mean, std) from ``0.1234`` or ``0.1234 ± 0.0056``."""
    parts = plain(cell).replace(" ↓", "").split(" ± ")
    return float(parts[0]), float(parts[1]) if len(parts) > 1 else None


def rows_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def expected(folder: Path, dataset: str, model: str, metric: str, protocol: str = "pop100",
             study: str = "main", variant: str | None = None) -> tuple[float, float]:
    values = [r["metrics"][metric] for r in rows_of(folder) if r["dataset"] == dataset and r["model"] == model
              and r["protocol"] == protocol and r["study"] == study and (variant is None or r["variant"] == variant)]
    return float(np.mean(values)), float(np.std(values, ddof=1))


def table2_cells(folder: Path, protocol: str = "pop100") -> tuple[list[str], dict]:
    """Header and {(dataset, metric): {column: cell}} of a Table 2."""
    header, body = parse_markdown(folder / "tables" / f"table2_{protocol}.md")
    return header, {(row[0], row[1]): dict(zip(header[2:], row[2:])) for row in body}


# ------------------------------------------------------------------------------------------------ the files

def test_every_table_and_figure_is_written_and_linked(fixture_report):
    tables = ["table1_datasets", "table2_pop100", "table2_full", "published_comparison", "table3_cloze_pop100",
              "table5_ablation_pop100", "relevance_pairs"]
    figures = ["sensitivity_hidden_pop100", "curves_ml-1m", "curves_beauty", "ablation_curves_ml-1m_bert4rec",
               "quality_vs_time_pop100", "quality_vs_time_full", "attention_ml-1m_bert4rec", "bars_pop100",
               "bars_full"]
    report = (fixture_report / "report.md").read_text()
    for name in tables:
        for suffix in ("md", "tex"):
            assert (fixture_report / "tables" / f"{name}.{suffix}").stat().st_size > 0
            assert f"tables/{name}.{suffix}" in report
    for name in figures:
        for suffix in ("png", "pdf"):
            assert (fixture_report / "figures" / f"{name}.{suffix}").stat().st_size > 1000
            assert f"figures/{name}.{suffix}" in report
    all_tables = (fixture_report / "tables" / "all_tables.tex").read_text()
    assert all(rf"\input{{{name}}}" in all_tables for name in tables)
    assert not list(fixture_report.rglob("*.tmp*")), "temporary files left behind"


def test_report_states_how_results_were_produced(fixture_report):
    report = (fixture_report / "report.md").read_text()
    for fact in ("pop100 (100 popularity-sampled negatives)", "Tie policy: expected", "Seeds: 0, 1",
                 "cpu (2 threads)", "`abc1234`", "torch 2.13", "ml-1m-sha256-0123456789abcdef", "config.json"):
        assert fact in report


# ------------------------------------------------------------------------------------------------ Table 2

def test_table2_numbers_equal_the_results(fixture_report):
    header, cells = table2_cells(fixture_report)
    assert header == ["Dataset", "Metric", "POP", "GRU4Rec", "SASRec", "BERT4Rec", "Improv."]  # paper order
    assert [key[0] for key in cells][::6] == ["Beauty", "ML-1m"]
    assert [key[1] for key in cells][:6] == ["HR@1", "HR@5", "HR@10", "NDCG@5", "NDCG@10", "MRR"]
    for (dataset, metric), row in cells.items():
        for column, model in MODELS.items():
            mean, std = expected(fixture_report, DATASETS[dataset], model, metric)
            assert numbers(row[column]) == pytest.approx((round(mean, 4), round(std, 4)), abs=1e-12)


def test_bold_marks_the_best_and_underline_the_second(fixture_report):
    for protocol in ("pop100", "full"):
        _, cells = table2_cells(fixture_report, protocol)
        for (dataset, metric), row in cells.items():
            means = {c: expected(fixture_report, DATASETS[dataset], MODELS[c], metric, protocol)[0] for c in MODELS}
            ranked = sorted(set(means.values()), reverse=True)
            for column in MODELS:
                assert row[column].startswith("**") == (means[column] == ranked[0]), (dataset, metric, column)
                assert row[column].startswith("<ins>") == (means[column] == ranked[1]), (dataset, metric, column)


def test_improvement_column_is_bert4rec_over_the_best_baseline(fixture_report):
    _, cells = table2_cells(fixture_report)
    for (dataset, metric), row in cells.items():
        means = {m: expected(fixture_report, DATASETS[dataset], m, metric)[0] for m in MODELS.values()}
        best = max(v for m, v in means.items() if m != "bert4rec")
        assert row["Improv."] == f"{100 * (means['bert4rec'] - best) / best:+.2f}%"


def test_significance_marks_follow_paired_tests_over_seed_averaged_users(fixture_report):
    _, cells = table2_cells(fixture_report)
    rows = rows_of(fixture_report)
    tests = {}
    for (dataset, metric), row in cells.items():
        means = {m: expected(fixture_report, DATASETS[dataset], m, metric)[0] for m in MODELS.values()}
        runner_up = max((m for m in means if m != "bert4rec"), key=means.get)

        def averaged(model):
            files = [r["per_user_file"] for r in rows if r["dataset"] == DATASETS[dataset] and r["model"] == model
                     and r["protocol"] == "pop100" and r["study"] == "main"]
            values = []
            for name in files:
                with np.load(fixture_report / name) as f:
                    values.append(per_user_metrics(f["greater"], f["ties"], metrics=(metric,))[metric])
            return np.mean(values, axis=0)

        a, b = averaged("bert4rec"), averaged(runner_up)
        tests[(dataset, metric)] = (stats.ttest_rel(a, b).pvalue, stats.wilcoxon(a, b).pvalue)
    # Holm over the table's comparisons, one family per test: the i-th smallest of m p-values times (m - i + 1),
    # made monotone; a mark where the adjusted value is below 0.01.
    m = len(tests)
    adjusted = {}
    for kind in (0, 1):
        ranked = sorted(tests, key=lambda cell: tests[cell][kind])
        running = 0.0
        for i, cell in enumerate(ranked):
            running = max(running, min(1.0, (m - i) * tests[cell][kind]))
            adjusted[(cell, kind)] = running
    for cell, row in cells.items():
        marks = ("†" if adjusted[(cell, 0)] < 0.01 else "") + ("‡" if adjusted[(cell, 1)] < 0.01 else "")
        assert row["BERT4Rec"].endswith("**" + marks), cell
    raw_only = [cell for cell in tests if tests[cell][0] < 0.01 <= adjusted[(cell, 0)]]
    assert any(cell.endswith("†‡") for row in cells.values() for cell in row.values())
    notes = (fixture_report / "tables" / "table2_pop100.md").read_text()
    assert "paired t-test" in notes and "Wilcoxon signed-rank" in notes and "p < 0.01" in notes
    assert f"Holm's correction for the {m} comparisons of this table" in notes
    print(f"{len(raw_only)} of {m} t-test marks removed by the correction")


def test_holm_adjusts_p_values_step_down():
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> kept at 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_identical_models_get_no_significance_mark(tmp_path):
    counts = counts_for("ml-1m", "sasrec", 0, "pop100")
    rows = [ranking_row(tmp_path, "ml-1m", model, 0, counts=counts) for model in ("sasrec", "bert4rec")]
    generate_report(write_results(tmp_path, rows))
    _, cells = table2_cells(tmp_path)
    assert set(cells) == {("ML-1m", metric) for metric in DEFAULT_METRICS}
    assert not any("†" in c or "‡" in c for row in cells.values() for c in row.values())
    assert all(row["Improv."] == "+0.00%" for row in cells.values())


def test_without_bert4rec_the_best_model_is_tested_against_the_runner_up(tmp_path):
    rows = [ranking_row(tmp_path, "ml-1m", model, seed) for model in ("pop", "gru4rec", "sasrec") for seed in (0, 1)]
    generate_report(write_results(tmp_path, rows))
    header, cells = table2_cells(tmp_path)
    assert "Improv." not in header
    best = cells[("ML-1m", "NDCG@10")]["SASRec"]  # 60 users, SASRec far ahead of GRU4Rec in the fixture
    assert best.startswith("**") and best.endswith("**†‡")
    assert not any(mark in cells[("ML-1m", "NDCG@10")]["GRU4Rec"] for mark in "†‡")
    assert "between the best model and the runner-up" in (tmp_path / "tables" / "table2_pop100.md").read_text()


# ------------------------------------------------------------------------------------- the other tables

def published_rows(folder: Path) -> dict:
    """{(paper table, paper row, dataset, our row, metric): the row's cells} of the published comparison."""
    header, body = parse_markdown(folder / "tables" / "published_comparison.md")
    return {tuple(r[:5]): dict(zip(header, r)) for r in body}


def test_published_comparison_holds_each_row_against_the_published_row_at_its_setting(fixture_report):
    found = published_rows(fixture_report)
    # The main grid's BERT4Rec at d = 64 (the authors' public configs): Table 5's default row, not Table 2's.
    bert = found[("Table 5 (d = 64)", "BERT4Rec default", "ML-1m", "BERT4Rec, main grid, d = 64", "NDCG@10")]
    ours = expected(fixture_report, "ml-1m", "bert4rec", "NDCG@10")[0]
    assert bert["Paper"] == "0.4759"
    assert float(bert["Δ"]) == pytest.approx(ours - 0.4759, abs=1e-4)
    assert float(bert["Δ%"].rstrip("%")) == pytest.approx(100 * (ours - 0.4759) / 0.4759, abs=0.05)
    assert not any(key[0].startswith("Table 2") and key[1] == "BERT4Rec" for key in found)
    # Its HR@10, which Table 5 does not give, against Table 4's column of the same configuration (N = 200 on
    # ML-1m), and nothing else from that column: NDCG@10 is Table 5's, samples/s is the N sweep's question.
    hr = found[("Table 4 (d = 64)", "BERT4Rec N=200", "ML-1m", "BERT4Rec, main grid, d = 64", "HR@10")]
    assert hr["Paper"] == "0.6955"
    assert float(hr["Δ"]) == pytest.approx(expected(fixture_report, "ml-1m", "bert4rec", "HR@10")[0] - 0.6955,
                                           abs=1e-4)
    assert [key[4] for key in found if key[:4] == ("Table 4 (d = 64)", "BERT4Rec N=200", "ML-1m",
                                                    "BERT4Rec, main grid, d = 64")] == ["HR@10"]
    # the ablation's default row is the same configuration and gets the same; its other variants do not
    ablation_hr = found[("Table 4 (d = 64)", "BERT4Rec N=200", "ML-1m", "BERT4Rec, ablation, default, d = 64",
                         "HR@10")]
    assert float(ablation_hr["Δ"]) == pytest.approx(
        expected(fixture_report, "ml-1m", "bert4rec", "HR@10", study="ablation", variant="default")[0] - 0.6955,
        abs=1e-4)
    assert not any(key[0].startswith("Table 4") and "ablation" in key[3] and "default" not in key[3]
                   for key in found)
    # A baseline has no other published row than Table 2's; an ablation row its Table 5 row.
    sasrec = found[("Table 2 (best settings)", "SASRec", "Beauty", "SASRec, main grid, d = 64", "MRR")]
    assert sasrec["Paper"] == "0.1536"
    assert found[("Table 5 (d = 64)", "BERT4Rec w/o PE", "ML-1m", "BERT4Rec, ablation, w/o PE, d = 64",
                  "NDCG@10")]["Paper"] == "0.2155"
    # The Cloze study at d = 256: both readings of "1 mask" against Table 3's one row.
    for reading in ("last", "random"):
        row = found[("Table 3 (d = 256)", "BERT4Rec (1 mask, last)", "ML-1m",
                     f"BERT4Rec (1 mask, {reading}), cloze, d = 256", "NDCG@10")]
        assert row["Paper"] == "0.4696"
    # The N sweep against Table 4's column, samples/s included.
    n200 = found[("Table 4 (d = 64)", "BERT4Rec N=200", "ML-1m", "BERT4Rec, sensitivity, max_len=200, d = 64",
                  "samples/s")]
    assert n200["Paper"] == "2918" and n200["Ours"] == "200 ± 0"  # two seeds, each 40,000 / N
    assert found[("Table 4 (d = 64)", "BERT4Rec N=400", "ML-1m", "BERT4Rec, sensitivity, max_len=400, d = 64",
                  "NDCG@10")]["Paper"] == "0.4715"
    assert not any(key[0].startswith("Table 4") and "hidden" in key[3] for key in found)  # the d sweep: none
    assert not any(key[2] == "Steam" for key in found)  # no Steam results: no Steam rows
    text = (fixture_report / "tables" / "published_comparison.md").read_text()
    assert "Sun et al." in text and "CIKM 2019" in text and "authors' GPU" in text
    published, source = load_published()
    assert len(published) == 312 and "Table 5" in source and "Table 4" in source
    table2 = {(p.dataset, p.model, p.metric): p.value for p in published if p.table == "Table 2"}
    assert len(table2) == 4 * 9 * 6  # every model of Table 2 on every dataset, six metrics each
    assert table2[("beauty", "ncf", "NDCG@10")] == 0.1124 and table2[("steam", "gru4rec+", "HR@1")] == 0.0812


def test_a_tuned_row_is_held_against_table_2_and_a_cloze_row_at_another_d_against_nothing(tmp_path):
    rows = [ranking_row(tmp_path, "ml-1m", "bert4rec", seed, hidden=256, tuned_from="sensitivity hidden")
            for seed in SEEDS]
    rows += [ranking_row(tmp_path, "beauty", "bert4rec-1mask", 0, study="cloze", variant="1 mask", hidden=64)]
    generate_report(write_results(tmp_path, rows))
    found = published_rows(tmp_path)
    label = "BERT4Rec, main grid, d = 256, tuned by sensitivity hidden"
    assert found[("Table 2 (best settings)", "BERT4Rec", "ML-1m", label, "NDCG@10")]["Paper"] == "0.4818"
    assert not any(key[0].startswith("Table 3") for key in found)  # d = 64 is not Table 3's setting


def test_cloze_table(fixture_report):
    header, body = parse_markdown(fixture_report / "tables" / "table3_cloze_pop100.md")
    assert [row[0] for row in body] == ["SASRec", "BERT4Rec (1 mask, last)", "BERT4Rec (1 mask, random)", "BERT4Rec"]
    one_mask = dict(zip(header, body[1]))
    assert one_mask["Beauty HR@10"] == "–"  # no Cloze run on Beauty: a gap
    mean, _ = expected(fixture_report, "ml-1m", "bert4rec-1mask", "NDCG@10", study="cloze")
    assert numbers(one_mask["ML-1m NDCG@10"])[0] == round(mean, 4)


def test_a_table_whose_rows_came_from_a_gpu_and_cpus_says_which_came_from_the_gpu(tmp_path):
    rows = [ranking_row(tmp_path, "ml-1m", "bert4rec", 0, study="ablation", variant=variant, with_per_user=False,
                        device=device)
            for variant, device in (("default", "cpu (1 thread, AMD EPYC)"), ("L=1", "cpu (2 threads, AMD EPYC)"),
                                    ("h=4", "cuda (NVIDIA H200)"), ("h=8", "cuda (NVIDIA H200)"))]
    table = ablation_table(load_results(write_results(tmp_path, rows)), "pop100")
    # two rows each: on a tie the CPU is "the rest", and the GPU's rows are named
    assert [note for note in table.notes if "device" in note] == [
        "Trained on more than one kind of device: h=4, h=8 on cuda (NVIDIA H200); the rest on cpu."]
    # two CPUs (threads, models) are one kind: nothing to say
    same_kind = [row for row in rows if row["device"].startswith("cpu")]
    table = ablation_table(load_results(write_results(tmp_path, same_kind)), "pop100")
    assert not any("device" in note for note in table.notes)
    # but their thread counts are said (issue 70: a seed's figures differ between 1 and 2 threads)
    assert [note for note in table.notes if "thread" in note] == [
        "Trained on the CPU with different thread counts, with which a seed's figures differ: L=1 on 2 threads; "
        "the rest on 1 thread."]


def test_a_default_taken_from_the_main_grid_is_its_row_at_the_ablations_d_not_every_bert4rec_row(tmp_path):
    """An ablation run without its own default takes the main grid's: the main BERT4Rec at the ablation's d, not a
    d = 256 BERT4Rec of the same folder averaged in as if it were another seed."""
    rows = [ranking_row(tmp_path, "ml-1m", "bert4rec", 0, study="ablation", variant="L=1", with_per_user=False),
            ranking_row(tmp_path, "ml-1m", "bert4rec", 0, with_per_user=False),
            {**ranking_row(tmp_path, "ml-1m", "bert4rec", 1, with_per_user=False, hidden=256),
             "metrics": {"NDCG@10": 0.99}}]
    table = ablation_table(load_results(write_results(tmp_path, rows)), "pop100")
    assert table.rows[0][1].value == pytest.approx(rows[1]["metrics"]["NDCG@10"])
    assert any(note.startswith("Default taken from the main grid for: BERT4Rec ML-1m") for note in table.notes)


def test_ablation_table_marks_large_drops(fixture_report):
    header, body = parse_markdown(fixture_report / "tables" / "table5_ablation_pop100.md")
    assert header == ["Architecture", "ML-1m", "ML-1m (paper)"]
    cells = {row[0]: row[1] for row in body}
    assert list(cells) == ["default", "w/o PE", "L=1", "h=4"]  # the paper's row order
    assert plain(cells["w/o PE"]).endswith("↓")
    assert not plain(cells["L=1"]).endswith("↓") and not plain(cells["h=4"]).endswith("↓")
    ndcg = {variant: float(np.mean([r["metrics"]["NDCG@10"] for r in rows_of(fixture_report)
                                    if r["variant"] == variant and r["protocol"] == "pop100"]))
            for variant in cells}
    assert numbers(cells["default"])[0] == round(ndcg["default"], 4)
    change = 100 * (ndcg["L=1"] - ndcg["default"]) / ndcg["default"]
    assert f"({change:+.1f}%)".replace("-", "−") in cells["L=1"]


def test_ablation_table_tests_each_variant_against_its_default_over_users(fixture_report):
    """Is a variant's change more than these users' noise? w/o PE, six times the default's ranks, is marked by both
    paired tests; the default is never marked (nothing to test it against), nor is the paper's column."""
    header, body = parse_markdown(fixture_report / "tables" / "table5_ablation_pop100.md")
    ours = {row[0]: row[1] for row in body}
    paper = {row[0]: row[2] for row in body}
    assert ours["w/o PE"].endswith("↓†‡")
    assert not re.search("[†‡]", ours["default"]) and not any(re.search("[†‡]", cell) for cell in paper.values())
    text = (fixture_report / "tables" / "table5_ablation_pop100.md").read_text()
    assert "between each variant and its default" in text and "for the 3 comparisons of this table" in text


def test_ablation_table_says_which_rows_could_not_be_tested_and_why(tmp_path):
    """Rows restored from a reference file without their per-user counts cannot be paired: where the default's are
    missing, the note says so once (no variant can be tested); where a variant's are, that variant is named."""
    def table(folder, without):
        rows = [ranking_row(folder, "ml-1m", "bert4rec", 0, study="ablation", variant=variant,
                            with_per_user=variant not in without) for variant in ("default", "w/o PE", "L=1")]
        generate_report(write_results(folder, rows), protocols=["pop100"])
        return (folder / "tables" / "table5_ablation_pop100.md").read_text()

    no_default = table(tmp_path / "a", {"default"})
    assert "No † or ‡ marks: no paired test between each variant and its default could be run here." in no_default
    assert "Not tested: the default's per-user files are missing" in no_default
    assert "Not tested (per-user files missing)" not in no_default
    no_variant = table(tmp_path / "b", {"w/o PE"})
    assert "for the 1 comparison of this table" in no_variant
    assert "Not tested (per-user files missing): w/o PE." in no_variant and "the default's" not in no_variant


def test_ablation_table_sets_the_papers_relative_drops_beside_ours(fixture_report):
    """Table 5 is read as drops against the default row: the paper's column gives its own (ML-1m, d = 64, pop100:
    .4759 default, w/o PE .2155 is −54.7% and marked, L=1 .4412 is −7.3%, h=4 .4770 is +0.2%)."""
    _, body = parse_markdown(fixture_report / "tables" / "table5_ablation_pop100.md")
    paper = {row[0]: row[2] for row in body}
    assert paper == {"default": "0.4759", "w/o PE": "0.2155 (−54.7%) ↓", "L=1": "0.4412 (−7.3%)",
                     "h=4": "0.4770 (+0.2%)"}


@pytest.mark.parametrize("setting", ["d = 256", "smoke", "full ranking"])
def test_no_paper_column_where_table_5_was_measured_otherwise(tmp_path, setting):
    """Table 5 is BERT4Rec at d = 64 under pop100; an ablation at d = 256, a smoke run or full ranking is not
    held against it, and its table has only our columns."""
    hidden = 256 if setting == "d = 256" else 64
    protocol = "full" if setting == "full ranking" else "pop100"
    extra = {"profile": "smoke"} if setting == "smoke" else {}
    rows = [ranking_row(tmp_path, "ml-1m", "bert4rec", 0, protocol=protocol, study="ablation", variant=variant,
                        hidden=hidden, **extra) for variant in ("default", "w/o PE")]
    generate_report(write_results(tmp_path, rows), protocols=[protocol])
    header, body = parse_markdown(next((tmp_path / "tables").glob(f"table5_ablation_{protocol}.md")))
    assert header == ["Architecture", "ML-1m"]
    assert body[0] == ["default", plain(body[0][1])] and "(" in body[1][1]


def test_relevance_table(fixture_report):
    header, body = parse_markdown(fixture_report / "tables" / "relevance_pairs.md")
    assert header == ["Dataset", "Model", "Accuracy", "AUC", "Log-loss"]
    rows = {row[1]: row for row in body}
    assert rows["BERT4Rec"][2:] == ["**0.8600**", "**0.9200**", "**0.3800**"]  # lower log-loss is better
    assert rows["LSTM"][2:] == ["<ins>0.8100</ins>", "<ins>0.8800</ins>", "<ins>0.4500</ins>"]


def test_dataset_table(fixture_report):
    header, body = parse_markdown(fixture_report / "tables" / "table1_datasets.md")
    assert body[1] == ["ML-1m", "60", "300", "720", "12.0", "4.00%"]


# ------------------------------------------------------------------------------------------------ LaTeX

def test_latex_escaping():
    assert latex_escape("a_b 5% R&D #1 {x} ± ↓") == r"a\_b 5\% R\&D \#1 \{x\} $\pm$ $\downarrow$"
    # pdflatex stops at a Unicode character no package declares: these three are in the suite's notes and headers.
    assert latex_escape("Kendall's τ, the ℓ2 weight (§4.3)") == r"Kendall's $\tau$, the $\ell$2 weight (\S{}4.3)"


def test_the_stored_latex_tables_are_ascii():
    """Every .tex kept under results/reference/ goes through latex_escape, so none holds a character that
    pdflatex would refuse without a package declaring it."""
    for path in (ROOT / "results" / "reference").rglob("*.tex"):
        text = path.read_text(encoding="utf-8")
        assert text.isascii(), f"{path}: {sorted({char for char in text if not char.isascii()})}"


def _balanced(text: str) -> bool:
    depth = 0
    for char in re.sub(r"\\[{}]", "", text):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def test_latex_is_balanced_and_escaped(tmp_path):
    rows = [ranking_row(tmp_path, "ml-1m", model, 0) for model in ("sasrec", "my_model#1")]
    rows.append(ranking_row(tmp_path, "ml-1m", "bert4rec", 0, study="ablation", variant="w/o 50% & more"))
    generate_report(write_results(tmp_path, rows))
    texts = {p.name: p.read_text() for p in (tmp_path / "tables").glob("*.tex")}
    for name, text in texts.items():
        assert _balanced(text), name
        assert text.isascii(), name
        assert text.count(r"\begin{") == text.count(r"\end{"), name
        body = text.split(r"\midrule", 1)[1].split(r"\bottomrule")[0] if r"\midrule" in text else ""
        columns = len(re.search(r"\\begin\{tabular\}\{(\w+)\}", text).group(1)) if "tabular" in text else 0
        for line in body.splitlines():
            if line.endswith(r"\\"):
                assert len(re.findall(r"(?<!\\)&", line)) == columns - 1, (name, line)
        assert not re.search(r"(?<!\\)[_%#]", re.sub(r"\\(label|input)\{[^}]*\}", "", text)
                             .split("\n", 1)[1]), name
    assert r"my\_model\#1" in texts["table2_pop100.tex"]
    assert r"w/o 50\% \& more" in texts["table5_ablation_pop100.tex"]


# ---------------------------------------------------------------------------------- gaps and small folders

def test_a_missing_model_or_dataset_leaves_a_gap(tmp_path):
    rows = [ranking_row(tmp_path, dataset, model, seed) for dataset in ("ml-1m", "beauty")
            for model in ("pop", "bert4rec") for seed in (0, 1)]
    rows += [ranking_row(tmp_path, "ml-1m", "sasrec", seed) for seed in (0, 1)]  # SASRec: no Beauty
    rows[0]["metrics"]["MRR"] = float("nan")  # POP ML-1m seed 0: a mean over no users
    (tmp_path / rows[4]["per_user_file"]).unlink()  # POP Beauty seed 0: per-user counts lost
    (tmp_path / "attention").mkdir()
    (tmp_path / "attention" / "ml-1m__bert4rec__seed0.npz").write_bytes(b"not a zip file")
    generate_report(write_results(tmp_path, rows))
    header, cells = table2_cells(tmp_path)
    assert header == ["Dataset", "Metric", "POP", "SASRec", "BERT4Rec", "Improv."]
    assert cells[("Beauty", "NDCG@10")]["SASRec"] == "–"
    assert cells[("ML-1m", "NDCG@10")]["SASRec"] != "–"
    pop, _ = expected(tmp_path, "beauty", "pop", "NDCG@10")
    bert, _ = expected(tmp_path, "beauty", "bert4rec", "NDCG@10")
    assert cells[("Beauty", "NDCG@10")]["Improv."] == f"{100 * (bert - pop) / pop:+.2f}%"
    # The NaN seed is left out: one seed remains, shown without ±.
    assert numbers(cells[("ML-1m", "MRR")]["POP"]) == (round(rows[1]["metrics"]["MRR"], 4), None)
    report = (tmp_path / "report.md").read_text()
    assert "Sensitivity plots skipped" in report and "Table 5 (ablation) skipped" in report
    assert "Not tested (per-user files missing): Beauty." in report and "file missing" in report
    assert "ml-1m__bert4rec__seed0.npz: unreadable as an attention map" in report


def test_a_table_without_any_per_user_file_says_it_marks_nothing(tmp_path):
    """Rows restored from a reference file carry no per-user counts: the note says no test ran, not that Holm's
    correction was applied to 0 comparisons."""
    rows = [ranking_row(tmp_path, "ml-1m", model, seed, with_per_user=False) for model in ("pop", "bert4rec")
            for seed in (0, 1)]
    generate_report(write_results(tmp_path, rows))
    table = (tmp_path / "tables" / "table2_pop100.md").read_text()
    assert "No † or ‡ marks: no paired test between BERT4Rec and the best baseline could be run here." in table
    assert "Not tested (per-user files missing): ML-1m." in table and "Holm" not in table


def test_a_folder_with_one_model_works(tmp_path):
    rows = [ranking_row(tmp_path, "ml-1m", "bert4rec", 0, with_per_user=False)]
    report = generate_report(write_results(tmp_path, rows))
    header, cells = table2_cells(tmp_path)
    assert header == ["Dataset", "Metric", "BERT4Rec"]  # no baseline: no Improv. column
    assert plain(cells[("ML-1m", "HR@10")]["BERT4Rec"]) == f"{rows[0]['metrics']['HR@10']:.4f}"
    for name in ("curves_ml-1m", "quality_vs_time_pop100", "bars_pop100"):
        assert (tmp_path / "figures" / f"{name}.png").exists()
    text = report.read_text()
    assert "Attention heat maps skipped" in text and "No `config.json`" in text


def test_a_report_read_mid_run_names_the_planned_jobs_that_have_no_rows_yet(tmp_path):
    """Table 5's ablation takes a day: a report of its folder halfway must say which rows are missing and why, not
    only show the rows there are. Only the latest run's plan counts (an earlier run may have planned other jobs)."""
    rows = [{**ranking_row(tmp_path, "ml-1m", "bert4rec", 0, variant="default", study="ablation"), "key": "a"}]
    write_results(tmp_path, rows)

    def start(time, jobs):
        return {"event": "start", "time": time, "jobs": [{"key": key, "run_id": f"ml-1m/bert4rec/{name}/seed0",
                                                          "action": "run"} for key, name in jobs]}

    manifest = [start("2026-01-01T00:00:00+00:00", [("old", "w/o LN")]),
                start("2026-01-02T00:00:00+00:00", [("a", "default"), ("b", "w/o PE"), ("c", "L=4")])]
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(entry) + "\n" for entry in manifest))
    (tmp_path / "failed.jsonl").write_text(json.dumps({"key": "c", "error": "out of memory"}) + "\n")
    report = generate_report(tmp_path).read_text()
    (note,) = [line for line in report.splitlines() if "have no rows yet" in line]
    assert note.startswith("- 2 of the 3 jobs of the latest run into this folder (started 2026-01-02T00:00:00")
    assert "ml-1m/bert4rec/w/o PE/seed0, ml-1m/bert4rec/L=4/seed0 (failed: failed.jsonl)." in note
    assert "w/o LN" not in note and "--resume" in note


    with (tmp_path / "manifest.jsonl").open("a") as torn:  # a driver killed while it appended a line
        torn.write('{"event": "start", "ti')
    report = generate_report(tmp_path).read_text()
    assert "- Jobs without rows not listed: " in report and "manifest.jsonl, line 3: not valid JSON" in report

    manifest[-1]["jobs"] = manifest[-1]["jobs"][:1]  # every planned job has its rows: nothing to say
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(entry) + "\n" for entry in manifest))
    assert "have no rows yet" not in generate_report(tmp_path).read_text()


def test_jobs_whose_rows_the_papers_tables_leave_out_are_not_reported_missing(tmp_path):
    """The paper's tables show one split and the requested protocols; a finished job of the other split (or with
    rows of another protocol only) has its rows in the folder and is not one that 'has no rows yet'."""
    rows = [{**ranking_row(tmp_path, "ml-1m", "sasrec", 0, split_scheme=split, protocol=protocol), "key": key}
            for key, split, protocol in (("loo", "leave-one-out", "pop100"), ("temporal", "temporal", "pop100"),
                                         ("full-only", "leave-one-out", "full"))]
    write_results(tmp_path, rows)
    jobs = [{"key": key, "run_id": f"ml-1m/sasrec/{key}/seed0", "action": "run"}
            for key in ("loo", "temporal", "full-only", "pending")]
    (tmp_path / "manifest.jsonl").write_text(json.dumps({"event": "start", "time": "2026-01-02T00:00:00+00:00",
                                                         "jobs": jobs}) + "\n")
    report = generate_report(tmp_path, protocols=["pop100"]).read_text()
    (note,) = [line for line in report.splitlines() if "have no rows yet" in line]
    assert note.startswith("- 1 of the 4 jobs") and "ml-1m/sasrec/pending/seed0." in note


def test_the_report_names_the_settings_every_job_was_given_beside_its_profiles(tmp_path):
    """Table 5's ablation ran at dropout 0.1, and its rows' labels name only what each variant removes: the report
    must say what every job was set to, or its table reads as the profile's settings."""
    rows = [{**ranking_row(tmp_path, "ml-1m", "bert4rec", 0, variant=variant, study="ablation"), "key": key}
            for key, variant in (("a", "default"), ("b", "w/o PE"))]
    write_results(tmp_path, rows)
    assert "Settings every job here" not in generate_report(tmp_path).read_text()  # no config.json: nothing known
    config = {"jobs": [{"key": "a", "overrides": ["bert4rec:dropout=0.1", "bert4rec:attention_dropout=0.1"]},
                       {"key": "b", "overrides": ["bert4rec:dropout=0.1", "bert4rec:attention_dropout=0.1",
                                                  "use_position=false"]},
                       {"key": "never run", "overrides": ["hidden=256"]}]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    lines = generate_report(tmp_path).read_text().splitlines()
    assert ("- Settings every job here was given beside its profile's (`--set`): `bert4rec:attention_dropout=0.1`, "
            "`bert4rec:dropout=0.1`.") in lines  # not w/o PE's own setting, nor a job without rows


def test_unknown_studies_and_tasks_are_ignored(tmp_path):
    rows = [ranking_row(tmp_path, "ml-1m", "sasrec", 0), {**ranking_row(tmp_path, "ml-1m", "pop", 0),
                                                          "study": "future-study"},
            {**relevance_row("ml-1m", "lstm", 0, 0.8, 0.9, 0.4), "task": "captioning"}]
    report = generate_report(write_results(tmp_path, rows)).read_text()
    assert "Ignored 1 row(s) with unknown study 'future-study'" in report
    assert "Ignored 1 row(s) with unknown task 'captioning'" in report
    header, _ = table2_cells(tmp_path)
    assert header == ["Dataset", "Metric", "SASRec"]


def test_a_later_line_supersedes_an_earlier_one(tmp_path):
    first = ranking_row(tmp_path, "ml-1m", "sasrec", 0)
    second = {**first, "metrics": {**first["metrics"], "HR@10": 0.5}}
    results = load_results(write_results(tmp_path, [first, second]))
    assert len(results.rows) == 1 and results.rows[0].metrics["HR@10"] == 0.5 and results.superseded == 1


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('{"schema": 1}', "missing key(s)"),
    ('[1, 2]', "expected a JSON object"),
])
def test_a_malformed_line_names_the_file_and_line(tmp_path, line, message):
    good = json.dumps(ranking_row(tmp_path, "ml-1m", "sasrec", 0))
    (tmp_path / "results.jsonl").write_text(f"{good}\n{line}\n")
    with pytest.raises(ResultsError, match=re.escape(f"results.jsonl, line 2: {message}")):
        generate_report(tmp_path)


def test_per_user_values_are_averaged_over_seeds(tmp_path):
    rows = [ranking_row(tmp_path, "ml-1m", "sasrec", seed) for seed in (0, 1)]
    results = load_results(write_results(tmp_path, rows))
    users, values = PerUser(tmp_path).averaged(results.rows, "NDCG@10")
    per_seed = [per_user_metrics(c.greater, c.ties, metrics=("NDCG@10",))["NDCG@10"]
                for c in (counts_for("ml-1m", "sasrec", seed, "pop100") for seed in (0, 1))]
    assert np.array_equal(users, np.arange(60))
    assert np.allclose(values, np.mean(per_seed, axis=0))
    assert values.mean() == pytest.approx(np.mean([r["metrics"]["NDCG@10"] for r in rows]))


# ------------------------------------------------------------------------------------------- command line

def test_command_line_restricts_protocols_and_picks_the_user(tmp_path, capsys):
    rows = [ranking_row(tmp_path, "ml-1m", model, 0, protocol) for model in ("sasrec", "bert4rec")
            for protocol in ("pop100", "full")]
    write_results(tmp_path, rows)
    write_attention(tmp_path, user=7)
    assert cli([str(tmp_path), "--protocols", "full", "--user", "3"]) == 0
    assert "report.md" in capsys.readouterr().out
    assert (tmp_path / "tables" / "table2_full.md").exists()
    assert not (tmp_path / "tables" / "table2_pop100.md").exists()
    report = (tmp_path / "report.md").read_text()
    assert "no attention file holds user 3" in report and "Comparison with the published values skipped" in report
    assert cli([str(tmp_path), "--user", "7"]) == 0
    assert (tmp_path / "figures" / "attention_ml-1m_bert4rec.png").exists()


def test_attention_maps_of_main_runs_under_either_file_naming(tmp_path):
    rows = [ranking_row(tmp_path, dataset, "bert4rec", 0) for dataset in ("ml-1m", "beauty")]
    rows.append(ranking_row(tmp_path, "ml-1m", "bert4rec", 0, study="ablation", variant="w/o PE"))
    write_results(tmp_path, rows)
    write_attention(tmp_path, "ml-1m", separator="__")
    write_attention(tmp_path, "beauty", separator="_", heads=4, length=30)
    (tmp_path / "attention" / "ml-1m_bert4rec_w_o_PE_seed0.npz").write_bytes(b"ablation map: never read")
    generate_report(tmp_path)
    drawn = sorted(p.name for p in (tmp_path / "figures").glob("attention_*.png"))
    assert drawn == ["attention_beauty_bert4rec.png", "attention_ml-1m_bert4rec.png"]


def test_command_line_reports_a_missing_folder(tmp_path, capsys):
    assert cli([str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_latex_tables_compile(fixture_report, tmp_path):
    """The LaTeX a user pastes into a paper compiles (booktabs, escaping, column counts) without errors."""
    tables = tmp_path / "tables"
    shutil.copytree(fixture_report / "tables", tables)
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "all_tables.tex"], cwd=tables,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]
    assert (tables / "all_tables.pdf").stat().st_size > 0


# ------------------------------------------------------------------------------------------ smoke profile

def smoke_rows(folder: Path, profile_of: dict | None = None) -> list[dict]:
    """POP, SASRec and BERT4Rec on ML-1m and Beauty (pop100); ``profile_of[dataset]`` becomes the rows'
    own ``profile`` key where given."""
    rows = [ranking_row(folder, dataset, model, 0) for dataset in ("ml-1m", "beauty")
            for model in ("pop", "sasrec", "bert4rec")]
    for row in rows:
        if (profile_of or {}).get(row["dataset"]):
            row["profile"] = profile_of[row["dataset"]]
    return rows


def test_smoke_results_are_labelled_and_get_no_improvement(tmp_path):
    generate_report(write_results(tmp_path, smoke_rows(tmp_path), config={"profile": "smoke"}))
    header, _ = table2_cells(tmp_path)
    assert "Improv." not in header
    markdown = (tmp_path / "tables" / "table2_pop100.md").read_text()
    assert markdown.startswith("**Table 2: Performance of all models, protocol pop100 (smoke profile: "
                               "installation check, not the paper's settings)**")
    assert "Every result here comes from the smoke profile" in markdown and "Improv." not in markdown
    latex = (tmp_path / "tables" / "table2_pop100.tex").read_text()
    assert r"\caption{Performance of all models, protocol pop100 (smoke profile: installation check, not the " \
           r"paper's settings)" in latex
    report = (tmp_path / "report.md").read_text()
    assert report.split("\n")[2].startswith("> **Smoke profile: installation check, not the paper's settings.** "
                                            "All results come from `--profile smoke`")
    assert "- Profiles: smoke (6 rows)." in report
    # Smoke numbers are never set beside the paper's, though ML-1m and Beauty are the paper's datasets.
    assert not (tmp_path / "tables" / "published_comparison.md").exists()
    assert "other than smoke-profile results" in report


def test_the_rows_own_profile_comes_before_the_runs(tmp_path):
    """A row's ``profile`` wins over config.json's; a row with neither is not smoke."""
    rows = smoke_rows(tmp_path, {"ml-1m": "paper", "beauty": "paper"})
    generate_report(write_results(tmp_path, rows, config={"profile": "smoke"}))
    header, _ = table2_cells(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert header[-1] == "Improv." and "Smoke profile" not in report and "- Profiles: paper (6 rows)." in report

    def header_of(folder: Path) -> list[str]:
        results = load_results(folder)
        return main_table(results, "pop100", PerUser(folder)).header

    unknown = tmp_path / "unknown"
    assert header_of(write_results(unknown, smoke_rows(unknown)))[-1] == "Improv."  # no profile anywhere
    own = tmp_path / "own"
    rows = smoke_rows(own, {"ml-1m": "smoke", "beauty": "smoke"})
    assert "Improv." not in header_of(write_results(own, rows, config={"profile": "paper"}))


def test_a_mix_of_profiles_labels_the_smoke_results_and_keeps_improvement_for_the_rest(tmp_path):
    rows = smoke_rows(tmp_path, {"ml-1m": "smoke", "beauty": "paper"})
    generate_report(write_results(tmp_path, rows))
    header, cells = table2_cells(tmp_path)
    assert header[-1] == "Improv."
    improvement = {dataset: [row["Improv."] for (name, _), row in cells.items() if name == dataset]
                   for dataset in ("ML-1m", "Beauty")}
    assert len(improvement["ML-1m"]) == len(improvement["Beauty"]) == len(DEFAULT_METRICS)
    assert all(cell == "–" for cell in improvement["ML-1m"])
    assert all(cell.endswith("%") for cell in improvement["Beauty"])
    markdown = (tmp_path / "tables" / "table2_pop100.md").read_text()
    assert "(partly smoke profile: installation check, not the paper's settings)" in markdown
    assert "From the smoke profile: POP on ML-1m, SASRec on ML-1m, BERT4Rec on ML-1m;" in markdown
    assert "not given for smoke-profile results" in markdown
    assert "> **Smoke profile: installation check, not the paper's settings.** 3 of 6 results" in \
        (tmp_path / "report.md").read_text()


# ------------------------------------------------------------------------------------------------ figures

@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib figures the builders save, by file stem, kept open for inspection."""
    from recbench.reports import figures

    kept = {}

    def keep(fig, folder, name, caption):
        kept[name] = fig
        return figures.Figure(name, caption, ())

    monkeypatch.setattr(figures, "_save", keep)
    yield kept
    plt = figures.plt
    for fig in kept.values():
        plt.close(fig)


def test_the_ablation_curves_draw_each_variant_and_seed_to_where_it_stopped(tmp_path, drawn):
    """Table 5's rows differ from the paper's for reasons a number cannot show (a variant that climbed later, or
    never left its first level before early stopping ended it): each variant's validation curve, one line per seed
    and protocol-independent, in the paper's row order, with its last point at the last validated epoch."""
    from recbench.reports import figures

    rows = []
    for variant, seeds, epochs in (("w/o PE", (0,), 3), ("default", (0, 1), 5)):
        for seed in seeds:
            for protocol in ("pop100", "full"):  # one training run, two rows: one line
                row = ranking_row(tmp_path, "ml-1m", "bert4rec", seed, protocol=protocol, study="ablation",
                                  variant=variant, with_per_user=False)
                rows.append({**row, "curve": row["curve"][:epochs]})
    rows.append(ranking_row(tmp_path, "ml-1m", "sasrec", 0, with_per_user=False))  # the main grid: not here
    outcome = figures.ablation_curve_figures(load_results(write_results(tmp_path, rows)), tmp_path)
    assert [f.name for f in outcome.figures] == ["ablation_curves_ml-1m_bert4rec"] and not outcome.notes
    by_epoch, by_time = drawn["ablation_curves_ml-1m_bert4rec"].axes
    assert [list(line.get_xdata()) for line in by_epoch.get_lines()] == [[1, 2, 3, 4, 5]] * 2 + [[1, 2, 3]]
    assert [line.get_color() for line in by_time.get_lines()] == [line.get_color() for line in by_epoch.get_lines()]
    legend = drawn["ablation_curves_ml-1m_bert4rec"].legends[0]
    assert [text.get_text() for text in legend.get_texts()] == ["default", "w/o PE"]

    main_only = [row for row in rows if row["study"] == "main"]
    assert figures.ablation_curve_figures(load_results(write_results(tmp_path, main_only)), tmp_path).notes == []


def test_curves_from_two_devices_say_which_is_which_and_take_a_log_time_axis(tmp_path, drawn):
    """A variant trained on a GPU (minutes) beside CPU rows (hours): seconds on one device are not seconds on the
    other, so each device gets its own line style, named in a legend, and the time axis turns logarithmic; rows
    from one device keep the plain axis and one legend."""
    from recbench.reports import figures

    rows = []
    for variant, device in (("default", "cpu (2 threads)"), ("h=4", "cuda (NVIDIA H200)")):
        for protocol in ("pop100", "full"):
            rows.append(ranking_row(tmp_path, "ml-1m", "bert4rec", 0, protocol=protocol, study="ablation",
                                    variant=variant, with_per_user=False, device=device))
    figures.ablation_curve_figures(load_results(write_results(tmp_path, rows)), tmp_path)
    fig = drawn["ablation_curves_ml-1m_bert4rec"]
    by_epoch, by_time = fig.axes
    assert by_time.get_xscale() == "log"
    assert [line.get_linestyle() for line in by_time.get_lines()] == ["-", "--"]  # default, then h=4
    assert [[text.get_text() for text in legend.get_texts()] for legend in fig.legends] == [
        ["default", "h=4"], ["cpu (2 threads)", "cuda (NVIDIA H200)"]]

    # a row recorded before the provenance said "1 thread" is named in the reports' grammar, its file untouched
    drawn.clear()
    old = [{**row, "device": "cpu (1 threads, x86_64)"} if row["variant"] == "default" else row for row in rows]
    figures.ablation_curve_figures(load_results(write_results(tmp_path, old)), tmp_path)
    assert [text.get_text() for text in drawn["ablation_curves_ml-1m_bert4rec"].legends[1].get_texts()] == [
        "cpu (1 thread, x86_64)", "cuda (NVIDIA H200)"]
    assert '"cpu (1 threads, x86_64)"' in (tmp_path / "results.jsonl").read_text()

    drawn.clear()
    same = [{**row, "device": "cpu (2 threads)"} for row in rows]
    figures.ablation_curve_figures(load_results(write_results(tmp_path, same)), tmp_path)
    fig = drawn["ablation_curves_ml-1m_bert4rec"]
    assert fig.axes[1].get_xscale() == "linear" and len(fig.legends) == 1


def test_error_bars_and_bands_only_with_two_or_more_seeds(tmp_path, drawn):
    from matplotlib.collections import PolyCollection
    from matplotlib.container import ErrorbarContainer

    from recbench.reports import figures

    def sweep(folder, seeds):
        return [ranking_row(folder, "ml-1m", "sasrec", seed, study="sensitivity", variant=f"hidden={h}",
                            sweep={"param": "hidden", "value": h}, with_per_user=False)
                for h in (16, 32) for seed in seeds]

    for seeds, with_spread in (((0,), False), ((0, 1), True)):
        folder = tmp_path / f"seeds{len(seeds)}"
        rows = [ranking_row(folder, "ml-1m", m, s, with_per_user=False) for m in ("pop", "sasrec") for s in seeds]
        results = load_results(write_results(folder, rows + sweep(folder, seeds)))
        bars = figures.bar_figures(results, folder, ["pop100"]).figures[0]
        axes = drawn["bars_pop100"].axes[0]
        assert any(isinstance(c, ErrorbarContainer) for c in axes.containers) == with_spread
        assert ("error bars: std over 2 seeds" in bars.caption) == with_spread
        assert ("one seed, no error bars" in bars.caption) != with_spread
        sensitivity = figures.sensitivity_figures(results, folder).figures[0]
        bands = [c for ax in drawn["sensitivity_hidden_pop100"].axes for c in ax.collections
                 if isinstance(c, PolyCollection)]
        assert bool(bands) == with_spread and ("± std over 2 seeds" in sensitivity.caption) == with_spread


def test_a_model_without_training_is_a_reference_line_not_a_point(tmp_path, drawn):
    from recbench.reports import figures

    rows = [ranking_row(tmp_path, "ml-1m", m, 0, with_per_user=False) for m in ("pop", "sasrec", "bert4rec")]
    rows[0]["train_seconds"] = 0.0001  # POP's fit takes a blink, but it trains nothing (epochs_run 0)
    results = load_results(write_results(tmp_path, rows))
    outcome = figures.quality_time_figures(results, tmp_path)
    ax = drawn["quality_vs_time_pop100"].axes[0]
    points = np.concatenate([c.get_offsets() for c in ax.collections])
    trained = {r["model"]: r for r in rows[1:]}
    assert sorted(points[:, 0]) == sorted(r["train_seconds"] for r in trained.values())  # no POP point
    pop = rows[0]["metrics"]["NDCG@10"]
    assert any(np.allclose(line.get_ydata(), pop) and tuple(line.get_xdata()) == (0, 1) for line in ax.lines)
    # No marker anywhere on the axes for it either: on a log time axis a marker reads as a time (issue 29: "POP
    # near 13 s"); words say whose line it is.
    assert all(line.get_marker() in ("None", "", None) for line in ax.lines)
    assert [text.get_text() for text in ax.texts] == ["POP on ML-1m, no training"]
    assert ax.get_xlim()[0] > 0.001  # no axis stretched down to a made-up time
    assert "POP, without training, as a dashed line" in outcome.figures[0].caption


def test_attention_ticks_are_every_kth_position_and_the_mask():
    from recbench.reports.figures import MASK_LABEL, _position_ticks

    def shown(length):
        labels = [str(i + 1) for i in range(length - 1)] + [MASK_LABEL]
        return [labels[t] for t in _position_ticks(labels)]

    assert shown(9) == ["1", "2", "3", "4", "5", "6", "7", "8", MASK_LABEL]
    assert shown(13) == ["2", "4", "6", "8", "10", "12", MASK_LABEL]
    assert shown(51) == ["10", "20", "30", "40", MASK_LABEL]  # 50 is too close to the [MASK] at 51
    assert shown(200) == [str(p) for p in range(20, 200, 20)] + [MASK_LABEL]
    # A [MASK] inside the sequence (a Cloze training view) is labelled too.
    labels = [str(i + 1) for i in range(30)]
    labels[14] = MASK_LABEL
    assert [labels[t] for t in _position_ticks(labels)] == ["5", "10", MASK_LABEL, "20", "25", "30"]


def test_the_attention_figure_shows_those_ticks(tmp_path, drawn):
    from recbench.reports import figures

    write_results(tmp_path, [ranking_row(tmp_path, "ml-1m", "bert4rec", 0, with_per_user=False)])
    write_attention(tmp_path, length=40, padding=5)  # 34 items and the [MASK]
    figures.attention_figures(load_results(tmp_path), tmp_path)
    ax = drawn["attention_ml-1m_bert4rec"].axes[0]
    expected_labels = ["5", "10", "15", "20", "25", "30", "[MASK]"]
    assert [t.get_text() for t in ax.get_xticklabels()] == expected_labels
    assert [t.get_text() for t in ax.get_yticklabels()] == expected_labels
    assert [t.get_rotation() for t in ax.get_xticklabels()] == [0] * 6 + [90]


def test_a_study_without_a_main_grid_draws_the_attention_of_its_run_with_the_models_own_settings(tmp_path, drawn):
    """Issue 29: the smoke ablation wrote 13 attention files and the report drew none (main-grid runs only)."""
    from recbench.reports import figures

    rows = []
    for variant, heads in (("w/o PE", 2), ("default", 4), ("L=1", 2)):
        path = write_attention(tmp_path, heads=heads, seed=0)
        named = path.rename(path.with_name(f"ml-1m__bert4rec__{variant.replace('/', '-')}.npz"))
        rows.append(ranking_row(tmp_path, "ml-1m", "bert4rec", 0, study="ablation", variant=variant,
                                attention_file=f"attention/{named.name}", profile="smoke"))
    outcome = figures.attention_figures(load_results(write_results(tmp_path, rows)), tmp_path)
    assert [figure.name for figure in outcome.figures] == ["attention_ml-1m_bert4rec"] and not outcome.notes
    fig = drawn["attention_ml-1m_bert4rec"]
    assert len([ax for ax in fig.axes if ax.get_title().startswith("head ")]) == 4  # the default variant's map
    assert "(seed 0, ablation run 'default')" in fig._suptitle.get_text()
    assert "smoke profile" in fig._suptitle.get_text()


def test_the_tuning_figure_numbers_trials_as_the_tables_do_and_labels_smoke_studies(tmp_path, drawn):
    """Issue 29: the best-so-far figure counted trials from 1 while its table (and tuned.toml) use the study's
    numbers, which start at 0, and it lacked the smoke label the other figures carry."""
    from recbench.reports import figures
    from recbench.reports.tuning import studies_table

    trials = [{"number": 0, "state": "complete", "value": 0.10}, {"number": 1, "state": "pruned", "value": None},
              {"number": 2, "state": "complete", "value": 0.30}, {"number": 3, "state": "complete", "value": 0.20}]
    study = {"study": "tune-ml-1m-bprmf", "dataset": "ml-1m", "model": "bprmf", "objective": "NDCG@10 under full",
             "sampler": "tpe", "pruner": "median", "budget": [], "profile": "smoke", "cpu_seconds": 9.0,
             "trials": trials, "best": {"number": 2, "value": 0.30, "params": {}}}
    figures.tuning_figures([study], tmp_path)
    fig = drawn["tuning_best_so_far"]
    (ax,) = [ax for ax in fig.axes if ax.lines]
    points, best = ax.lines
    assert list(points.get_xdata()) == [0, 2, 3] and list(points.get_ydata()) == [0.10, 0.30, 0.20]
    assert list(best.get_xdata()) == [0, 1, 2, 3] and list(best.get_ydata()) == [0.10, 0.10, 0.30, 0.30]
    table = studies_table([study])
    assert table.rows[0][table.header.index("Trial")].text == "2"  # the figure's best point is at x = 2
    assert "smoke profile: installation check" in fig._suptitle.get_text()


def test_the_report_counts_planned_jobs_in_words_not_as_an_option(tmp_path):
    """Issue 29: report.md's `"jobs": 3` read like `--jobs 3` (three parallel workers)."""
    rows = [ranking_row(tmp_path, "ml-1m", model, 0, with_per_user=False) for model in ("pop", "sasrec")]
    config = {"profile": "paper", "seeds": [0], "jobs": [{"key": "a"}, {"key": "b"}, {"key": "c"}]}
    report = generate_report(write_results(tmp_path, rows, config=config)).read_text()
    (line,) = [line for line in report.splitlines() if line.startswith("- Run configuration")]
    assert '"jobs"' not in line and "3 job(s) were planned into this folder" in line


def test_the_tuning_tables_marks_follow_holm_corrected_p_values_not_raw_ones(tmp_path):
    """Issue 29: the tuning report's test checked only the note's words, so raw p-values passed it. Here the level
    lies between the smallest raw p-value and its Holm-adjusted value: a raw test marks that cell, Holm does not."""
    from recbench.reports.tuning import default_vs_tuned_table

    rows = [ranking_row(tmp_path, "ml-1m", model, 0, study="tuning", variant=variant,
                        counts=counts_for("ml-1m", model, 5, "pop100", scale))
            for model in ("sasrec", "bert4rec") for variant, scale in (("default", 1.0), ("tuned", 0.75))]
    results, per_user = load_results(write_results(tmp_path, rows)), PerUser(tmp_path)
    raw = {}  # (model, metric) -> (t-test p, Wilcoxon p), from each user's values
    for model in ("sasrec", "bert4rec"):
        pair = [results.select(model=model, variant=variant) for variant in ("default", "tuned")]
        for metric in DEFAULT_METRICS:
            test = per_user.compare(*pair, metric)
            raw[(model, metric)] = (test.t_pvalue, test.wilcoxon_pvalue)
    adjusted = {}
    for kind in (0, 1):  # Holm over the table's comparisons, one family per kind of test
        running = 0.0
        for i, cell in enumerate(sorted(raw, key=lambda cell: raw[cell][kind])):
            running = max(running, min(1.0, (len(raw) - i) * raw[cell][kind]))
            adjusted[(cell, kind)] = running
    smallest = min(raw, key=lambda cell: raw[cell][0])
    alpha = (raw[smallest][0] * adjusted[(smallest, 0)]) ** 0.5
    assert raw[smallest][0] < alpha < adjusted[(smallest, 0)]
    table = default_vs_tuned_table(results, "pop100", per_user, alpha)
    for row in table.rows:
        model = next(m for m in ("sasrec", "bert4rec") if row[1].text == names.model_name(m))
        cell = (model, row[2].text)
        expected = ("†" if adjusted[(cell, 0)] < alpha else "") + ("‡" if adjusted[(cell, 1)] < alpha else "")
        assert row[3].marks + row[4].marks == expected, cell
    assert f"Holm's correction for the {len(raw)} comparisons of this table" in " ".join(table.notes)


# ------------------------------------------------------------------------------- under both splits (issue 30)

BEYOND = ("Coverage@10", "Gini@10", "ARP@10", "APLT@10", "Novelty@10", "Personalization@10")
# NDCG@10 by hand: leave-one-out orders BERT4Rec > SASRec > GRU4Rec > POP; the temporal split swaps the first two
# and the last two (two discordant pairs of six: τ = (4 − 2)/6 = 1/3). HR@10 keeps one order under both (τ = 1).
HAND_NDCG = {"leave-one-out": {"bert4rec": 0.30, "sasrec": 0.25, "gru4rec": 0.20, "pop": 0.05},
             "temporal": {"bert4rec": 0.10, "sasrec": 0.12, "gru4rec": 0.08, "pop": 0.09}}
HAND_HR = {"bert4rec": 0.5, "sasrec": 0.4, "gru4rec": 0.3, "pop": 0.1}


def hand_split_row(folder: Path, split: str, model: str, seed: int = 0, **changes) -> dict:
    """A full-ranking row with hand-set metrics (no per-user file): NDCG@10 and HR@10 above, and beyond-accuracy
    values that tell the models apart (POP's lists the most popular)."""
    row = ranking_row(folder, "ml-1m", model, seed, protocol="full", with_per_user=False, split_scheme=split)
    popular = {"pop": 900.0, "gru4rec": 700.0, "sasrec": 400.0, "bert4rec": 300.0}[model]
    row["metrics"] = {"HR@10": HAND_HR[model] / (1 if split == "leave-one-out" else 2),
                      "NDCG@10": HAND_NDCG[split][model], "Coverage@10": 0.05 if model == "pop" else 0.4,
                      "Gini@10": 0.99 if model == "pop" else 0.8, "ARP@10": popular + seed,
                      "APLT@10": 0.0 if model == "pop" else 0.2, "Novelty@10": 1.5 if model == "pop" else 4.0,
                      "Personalization@10": 0.3 if model == "pop" else 0.9, **changes}
    row["users_evaluated"] = 6040 if split == "leave-one-out" else 120  # a temporal split tests fewer users
    return row


def split_folder(folder: Path, splits=("leave-one-out", "temporal"), seeds=(0,)) -> Path:
    return write_results(folder, [hand_split_row(folder, split, model, seed) for split in splits
                                  for model in ("pop", "gru4rec", "sasrec", "bert4rec") for seed in seeds])


def test_a_rows_split_is_leave_one_out_unless_it_names_another_and_splits_never_supersede_each_other(tmp_path):
    rows = [ranking_row(tmp_path, "ml-1m", "sasrec", 0, protocol="full", split_scheme=scheme)
            for scheme in ("leave-one-out", "temporal", "temporal")]
    del rows[0]["split_scheme"]  # a row written before the field: leave-one-out
    rows.append(ranking_row(tmp_path, "ml-1m", "sasrec", 0, protocol="full", split_scheme="leave-one-out"))
    results = load_results(write_results(tmp_path, rows))
    assert sorted(row.split for row in results.rows) == ["leave-one-out", "temporal"]
    # The fourth line replaced the first and the third the second; no row of one split replaced the other's.
    assert results.superseded == 2 and [row.line for row in results.rows] == [3, 4]


def test_the_models_side_by_side_and_kendalls_tau_by_hand(tmp_path):
    report = generate_report(split_folder(tmp_path)).read_text()
    header, body = parse_markdown(tmp_path / "tables" / "splits_side_by_side.md")
    assert header == ["Dataset", "Model", "HR@10 (leave-one-out)", "NDCG@10 (leave-one-out)", "place (leave-one-out)",
                      "HR@10 (global temporal)", "NDCG@10 (global temporal)", "place (global temporal)"]
    cells = {row[1]: row for row in body}
    assert [plain(cells[m][3]) for m in ("BERT4Rec", "SASRec", "GRU4Rec", "POP")] == ["0.3000", "0.2500", "0.2000",
                                                                                      "0.0500"]
    assert {m: (cells[m][4], cells[m][7]) for m in cells} == {"BERT4Rec": ("1", "2"), "SASRec": ("2", "1"),
                                                              "GRU4Rec": ("3", "4"), "POP": ("4", "3")}
    assert cells["SASRec"][6] == "**0.1200**" and cells["BERT4Rec"][6] == "<ins>0.1000</ins>"  # per column
    header, body = parse_markdown(tmp_path / "tables" / "splits_kendall.md")
    assert header == ["Dataset", "Metric", "Models", "Kendall's τ", "p"]
    # Exact p of four models without ties: permutations with at most 2 inversions (1 + 3 + 5 of 24), both sides.
    assert body == [["ML-1m", "HR@10", "4", "+1.000", f"{2 / 24:.3f}"], ["ML-1m", "NDCG@10", "4", "+0.333", "0.750"]]
    kendall = (tmp_path / "tables" / "splits_kendall.md").read_text()  # the verdicts in words (issue 70)
    assert "ML-1m, HR@10: both splits rank the models in the same order." in kendall
    assert ("ML-1m, NDCG@10: no evidence either way: the orderings are as alike as chance would make them (τ = +0.33, "
            "p = 0.750, 4 models); more models or more users would tell.") in kendall
    assert "only 120 users" not in kendall  # 120 users: steps of 0.008, fine enough
    assert "## Under both splits: order and popularity" in report and "has no rows here" not in report
    # Table 2 under full ranking shows leave-one-out alone, never a mean of both splits' rows.
    _, table2 = table2_cells(tmp_path, "full")
    assert plain(table2[("ML-1m", "NDCG@10")]["SASRec"]) == "0.2500"
    assert "The paper's tables and figures show the leave-one-out split" in report
    assert "split: leave-one-out (4 rows), global temporal (4 rows)" in report
    for table in ("splits_side_by_side", "splits_kendall", "beyond_accuracy"):  # how many users each value rests on
        assert "(users evaluated, ML-1m: leave-one-out 6,040, global temporal 120)" in (
            tmp_path / "tables" / f"{table}.md").read_text()
    all_tables = (tmp_path / "tables" / "all_tables.tex").read_text()
    assert all(rf"\input{{{name}}}" in all_tables for name in ("splits_side_by_side", "splits_kendall",
                                                                "beyond_accuracy"))


def test_paired_tests_between_neighbours_of_each_ordering_are_holm_corrected(tmp_path):
    users = np.arange(60)
    rng = np.random.default_rng(0)
    spread = RankCounts(users, rng.integers(0, 16, 60), np.zeros(60, dtype=np.int64))  # some beyond the top 10
    counts = {"bert4rec": RankCounts(users, np.zeros(60, dtype=np.int64), np.zeros(60, dtype=np.int64)),
              "sasrec": spread, "gru4rec": spread, "pop": RankCounts(users, np.full(60, 200), np.zeros(60, dtype=int))}
    rows = [ranking_row(tmp_path, "ml-1m", model, 0, protocol="full", counts=counts[model], split_scheme=split)
            for split in ("leave-one-out", "temporal") for model in counts]
    generate_report(write_results(tmp_path, rows))
    _, body = parse_markdown(tmp_path / "tables" / "splits_side_by_side.md")
    cells = {row[1]: row for row in body}
    ndcg = {model: cells[model][3] for model in cells}
    # BERT4Rec (every target first) beats the next model down; SASRec and GRU4Rec are the same, so whichever of
    # them is placed above the other carries no mark, and the one below beats POP (never a target in the top 10).
    assert ndcg["BERT4Rec"].endswith("†‡") and not ndcg["POP"].endswith(("†", "‡"))
    assert [ndcg[m].endswith("†‡") for m in ("SASRec", "GRU4Rec")].count(True) == 1
    notes = (tmp_path / "tables" / "splits_side_by_side.md").read_text()
    # Three neighbours per column, two metrics, two splits.
    assert "between each model and the next one below it in the same column" in notes
    assert "Holm's correction for the 12 comparisons of this table" in notes


def test_the_beyond_accuracy_table_shows_every_split_and_names_rows_without_the_metrics(tmp_path):
    rows = [hand_split_row(tmp_path, split, model, seed) for split in ("leave-one-out", "temporal")
            for model in ("pop", "sasrec") for seed in (0, 1)]
    old = ranking_row(tmp_path, "ml-1m", "gru4rec", 0, protocol="full", with_per_user=False)  # no list metrics
    older = hand_split_row(tmp_path, "temporal", "gru4rec")  # written before personalisation
    del older["metrics"]["Personalization@10"]
    generate_report(write_results(tmp_path, [*rows, old, older]))
    header, body = parse_markdown(tmp_path / "tables" / "beyond_accuracy.md")
    assert header == ["Dataset", "Split", "Model", "NDCG@10", *BEYOND]
    cells = {(row[1], row[2]): dict(zip(header[3:], row[3:])) for row in body}
    assert set(cells) == {("leave-one-out", "POP"), ("leave-one-out", "GRU4Rec"), ("leave-one-out", "SASRec"),
                          ("global temporal", "POP"), ("global temporal", "GRU4Rec"), ("global temporal", "SASRec")}
    assert cells[("leave-one-out", "POP")]["ARP@10"] == f"900.5 ± {np.std([900, 901], ddof=1):.1f}"
    assert cells[("global temporal", "SASRec")]["APLT@10"] == "0.2000 ± 0.0000"
    assert cells[("leave-one-out", "GRU4Rec")]["Gini@10"] == "–"
    assert cells[("global temporal", "GRU4Rec")]["Personalization@10"] == "–"
    assert cells[("global temporal", "GRU4Rec")]["Gini@10"] == "0.8000"
    notes = (tmp_path / "tables" / "beyond_accuracy.md").read_text()
    assert "No beyond-accuracy metrics in the rows of GRU4Rec on ML-1m (leave-one-out): they were written" in notes
    assert ("No Personalization@10 in the rows of GRU4Rec on ML-1m (global temporal): they were written before it "
            "existed") in notes
    assert "ARP@10: mean training interactions of a listed item" in notes


def test_a_list_metric_that_no_row_holds_is_a_note_not_a_column_of_dashes(tmp_path):
    rows = [hand_split_row(tmp_path, "leave-one-out", model) for model in ("pop", "sasrec")]
    for row in rows:
        del row["metrics"]["Personalization@10"]  # rows written before it
    generate_report(write_results(tmp_path, rows))
    header, _ = parse_markdown(tmp_path / "tables" / "beyond_accuracy.md")
    assert header == ["Dataset", "Split", "Model", "NDCG@10", *BEYOND[:-1]]
    notes = (tmp_path / "tables" / "beyond_accuracy.md").read_text()
    assert "Not in any row here, which were written before Personalization@10 existed" in notes
    assert "No Personalization@10 in the rows of" not in notes
    for row in rows:
        row["metrics"] = {name: value for name, value in row["metrics"].items() if name not in BEYOND}
    generate_report(write_results(tmp_path, rows))
    header, _ = parse_markdown(tmp_path / "tables" / "beyond_accuracy.md")
    assert header == ["Dataset", "Split", "Model", "NDCG@10"]
    assert "No row here holds beyond-accuracy metrics" in (tmp_path / "tables" / "beyond_accuracy.md").read_text()


def test_with_one_split_the_section_shows_the_lists_and_says_the_other_has_no_rows(tmp_path, drawn):
    report = generate_report(split_folder(tmp_path, splits=("leave-one-out",))).read_text()
    assert "The global temporal split has no rows here" in report and "--split temporal" in report
    assert (tmp_path / "tables" / "beyond_accuracy.md").is_file()
    assert not (tmp_path / "tables" / "splits_side_by_side.md").exists()
    assert not (tmp_path / "tables" / "splits_kendall.md").exists()
    assert "figures/accuracy_vs_popularity.png" in report
    assert "The paper's tables and figures show" not in report
    (axes,) = [ax for ax in drawn["accuracy_vs_popularity"].axes]
    assert axes.get_title() == "ML-1m, leave-one-out split"


def test_the_popularity_figure_has_a_point_per_model_a_panel_per_dataset_and_split(tmp_path, drawn):
    from recbench.reports import figures

    folder = split_folder(tmp_path, seeds=(0, 1))
    outcome = figures.popularity_figures(load_results(folder), folder)
    fig = drawn["accuracy_vs_popularity"]
    assert [ax.get_title() for ax in fig.axes] == ["ML-1m, leave-one-out split", "ML-1m, global temporal split"]
    for ax, split in zip(fig.axes, ("leave-one-out", "temporal")):
        assert ax.get_xlabel() == "ARP@10: mean training interactions of a listed item"
        assert ax.get_ylabel() == "test NDCG@10 (full)"
        points = sorted((float(bars.lines[0].get_xdata()[0]), float(bars.lines[0].get_ydata()[0]))
                        for bars in ax.containers)  # a model's point and its error bars
        expected_points = sorted((arp + 0.5, HAND_NDCG[split][model]) for model, arp in
                                 {"pop": 900, "gru4rec": 700, "sasrec": 400, "bert4rec": 300}.items())
        assert np.allclose(points, expected_points)
    assert "Accuracy against the popularity of the top 10" in fig.get_suptitle()
    legend = fig.legends[0]
    assert [text.get_text() for text in legend.get_texts()] == ["POP", "GRU4Rec", "SASRec", "BERT4Rec"]
    assert "bars: ± std over 2 seeds" in outcome.figures[0].caption
    old = ranking_row(tmp_path / "old", "ml-1m", "sasrec", 0, protocol="full", with_per_user=False)
    skipped = figures.popularity_figures(load_results(write_results(tmp_path / "old", [old])), tmp_path / "old")
    assert not skipped.figures and "has NDCG@10 and ARP@10" in skipped.notes[0]


def test_the_console_table_leaves_a_gap_for_a_metric_an_older_row_lacks(tmp_path):
    from recbench.reports.console import main_tables

    new = hand_split_row(tmp_path, "leave-one-out", "sasrec")
    old = {**hand_split_row(tmp_path, "leave-one-out", "pop"), "metrics": {"HR@10": 0.1, "NDCG@10": 0.05}}
    text = main_tables([old, new])
    lines = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
             for line in text.splitlines() if line.startswith("| ")}
    assert lines["NDCG@10"] == ["0.0500", "0.2500"] and lines["ARP@10"] == ["–", "400.0000"]


def test_the_console_table_shows_the_same_sample_standard_deviation_over_seeds_as_the_report(tmp_path):
    from recbench.reports.console import main_tables

    rows = [hand_split_row(tmp_path, "leave-one-out", "sasrec", seed, **{"NDCG@10": value})
            for seed, value in ((0, 0.1), (1, 0.3))]
    text = main_tables(rows)
    ndcg = next(line for line in text.splitlines() if line.startswith("| NDCG@10"))
    # mean .2; sample std sqrt(((.1 - .2)² + (.3 - .2)²) / (2 - 1)) = .1414 (the population std would be .1000)
    assert ndcg.split("|")[2].strip() == "0.2000 ± 0.1414"
    assert "(2 seeds, mean ± sample std, test split)" in text


def test_the_console_shows_accuracy_first_and_the_lists_metrics_in_a_table_of_their_own_beneath(tmp_path):
    """The answer a run is for comes first: every protocol's accuracy table of a dataset, then one table of the
    beyond-accuracy metrics (full ranking only) beneath them, which hold no accuracy metric."""
    from recbench.reports.console import main_tables

    full = [hand_split_row(tmp_path, "leave-one-out", model) for model in ("pop", "sasrec")]
    sampled = [{**row, "protocol": "pop100", "metrics": {"HR@10": 0.5, "NDCG@10": 0.3}} for row in full]
    text = main_tables(full + sampled)
    titles = [line for line in text.splitlines() if line.startswith("### ")]
    assert [title.split("`")[1] for title in titles] == ["full", "pop100", "full"]
    assert "beyond accuracy" not in titles[0] + titles[1] and "beyond accuracy" in titles[2]
    accuracy, beyond = text.split(titles[2])
    assert "| NDCG@10" in accuracy and not any(f"| {metric}" in accuracy for metric in BEYOND)
    assert all(f"| {metric}" in beyond for metric in BEYOND) and "| NDCG@10" not in beyond


def test_the_report_sets_the_lists_table_beneath_table_2(tmp_path):
    report = generate_report(split_folder(tmp_path, splits=("leave-one-out",))).read_text()
    headings = [line for line in report.splitlines() if line.startswith("### ")]
    table2 = next(i for i, line in enumerate(headings) if "Table 2:" in line)
    assert "What the top 10 lists show" in headings[table2 + 1]
    assert "Coverage@10" not in report.split(headings[table2])[1].split(headings[table2 + 1])[0]


def test_a_split_with_few_users_says_its_metrics_move_in_coarse_steps_and_tau_has_a_verdict_in_words():
    """Issue 70: the temporal split of ML-100k evaluated 82 users, of ML-latest-small 21, and said nothing of it."""
    from recbench.reports.splits import coarse_steps, tau_verdict

    assert coarse_steps("ml-1m", "temporal", 82) == (
        "ML-1m, global temporal split: only 82 users evaluated, so a hit rate moves in steps of 1/82 = 0.012; a "
        "difference of a step or two is one or two users' hits, not a finding.")
    assert coarse_steps("ml-100k", "temporal", 100) is None
    assert tau_verdict(0.9, 0.001, 6) == "the orderings agree beyond chance (τ = +0.90, p = 0.001, 6 models)"
    assert tau_verdict(-0.9, 0.001, 6).startswith("the orderings disagree beyond chance")
    assert tau_verdict(-1.0, 0.08, 4) == "the second split reverses the first split's order"
    assert tau_verdict(1.0, 1.0, 2).startswith("2 model(s) with a result under both splits: too few")


@pytest.mark.parametrize("hours, devices", [(25.0, ("cpu (1 thread)",)), (0.5, ("cpu (1 thread)",)),
                                            (30.0, ("cpu (1 thread)", "cuda (NVIDIA H200)"))])
def test_the_curve_figures_time_axis_labels_do_not_collide(hours, devices, tmp_path, drawn):
    """Issue 70: the curve figure's time-axis labels overlapped (five-digit seconds of hours-long runs)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from recbench.reports import figures

    rows = []
    for number, device in enumerate(devices):
        row = ranking_row(tmp_path, "ml-1m", ("sasrec", "bert4rec")[number], 0, protocol="full", with_per_user=False,
                          device=device)
        top = hours * 3600 / (1 + 40 * number)  # a GPU row: minutes where the CPU took hours
        rows.append({**row, "curve": [{**entry, "seconds": top * entry["epoch"] / len(row["curve"])}
                                      for entry in row["curve"]]})
    figures.curve_figures(load_results(write_results(tmp_path, rows)), tmp_path)
    fig = drawn["curves_ml-1m"]
    FigureCanvasAgg(fig).draw()
    axis, renderer = fig.axes[1], fig.canvas.get_renderer()
    low, high = axis.get_xlim()
    shown = sorted((text.get_window_extent(renderer) for text in axis.get_xticklabels()
                    + axis.get_xticklabels(minor=True) if text.get_text() and low <= text.get_position()[0] <= high),
                   key=lambda box: box.x0)
    assert len(shown) >= 2 and all(left.x1 < right.x0 for left, right in zip(shown, shown[1:]))
