"""The report's sections "Sampled against full" and "Claims" (``reports/sampled.py``, ``reports/claims.py``) on a
small programmatic folder whose full-ranking per-user files keep each user's number of candidates."""
from __future__ import annotations

import numpy as np
import pytest

from recbench.benchmarks.metrics import RankCounts
from recbench.benchmarks.sampled_metrics import expected_uniform
from recbench.reports import generate_report
from recbench.reports.claims import agreement_counts, agrees, collapsed, comparisons, judge, ledger_table
from recbench.reports.published import Published
from recbench.reports.results import load_results
from recbench.reports.sampled import Expectations
from recbench.reports.stats import PerUser
from tests.fixtures.reports_fixture import N_ITEMS, counts_for, ranking_row, write_results

POOL = N_ITEMS["ml-1m"] - 13  # every user's candidates besides the target (12 history items and the target out)
SEEDS = (0, 1)


def with_pool(counts: RankCounts, protocol: str) -> RankCounts:
    """The fixture's counts, kept within the pool, with the candidates the evaluator stores."""
    limit = POOL if protocol == "full" else 100
    greater = np.minimum(counts.greater, limit)
    return RankCounts(counts.users, greater, np.minimum(counts.ties, limit - greater),
                      np.full(len(greater), limit))


def flat_curve(row: dict) -> dict:
    """A training curve whose loss stays flat from the third epoch on (a collapsed run's)."""
    return {**row, "curve": [{"epoch": e, "loss": 7.53 if e >= 3 else 9.0 - e, "seconds": float(e)}
                             for e in range(1, 8)]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sampled")
    rows = []
    for model in ("pop", "sasrec", "bert4rec"):
        for protocol in ("full", "uni100"):
            for seed in SEEDS:
                counts = with_pool(counts_for("ml-1m", model, seed, protocol), protocol)
                rows.append(ranking_row(folder, "ml-1m", model, seed, protocol, counts=counts))
    for variant, source in (("default", "bert4rec"), ("w/o RC", "pop"), ("L=3", "bert4rec")):
        for protocol in ("full", "uni100"):
            for seed in SEEDS:
                # w/o RC ranks exactly as POP does (a collapse); L=3 exactly as the default (no change)
                counts = with_pool(counts_for("ml-1m", source, seed, protocol), protocol)
                row = ranking_row(folder, "ml-1m", "bert4rec", seed, protocol, study="ablation", variant=variant,
                                  counts=counts)
                rows.append(flat_curve(row) if variant == "w/o RC" else row)
    write_results(folder, rows, config={"profile": "paper", "seeds": list(SEEDS), "protocols": ["full", "uni100"]})
    generate_report(folder)
    return folder


def table_lines(folder, name: str) -> list[list[str]]:
    text = (folder / "tables" / f"{name}.md").read_text()
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not line.startswith("|--") and not line.startswith("| --")]


def test_the_report_has_both_sections(folder):
    report = (folder / "report.md").read_text()
    assert "## Sampled against full" in report and "## Claims" in report
    assert (folder / "figures" / "claims.png").exists()
    for name in ("sampled_expected", "sampled_corrected", "sampled_orderings", "claims"):
        assert (folder / "tables" / f"{name}.md").exists() and (folder / "tables" / f"{name}.tex").exists()
        assert name in (folder / "tables" / "all_tables.tex").read_text()


def test_expected_values_are_the_stored_full_ranks_expectations(folder):
    header, *rows = table_lines(folder, "sampled_expected")
    line = next(r for r in rows if r[1] == "main" and r[2] == "SASRec" and r[3] == "NDCG@10")
    for n in (10, 100):
        means = []
        for seed in SEEDS:
            counts = RankCounts.load(folder / "per_user" / f"ml-1m__sasrec__main__full__seed{seed}.npz")
            means.append(expected_uniform(counts, n, ("NDCG@10",)).mean["NDCG@10"])
        shown = line[header.index(f"E[N={n}]")].split(" ± ")[0]
        assert float(shown) == pytest.approx(np.mean(means), abs=5e-5)


def test_orderings_by_number_of_negatives_are_set_against_full(folder):
    header, *rows = table_lines(folder, "sampled_orderings")
    main = [r for r in rows if r[1] == "main" and r[2] == "NDCG@10"]
    assert {r[3] for r in main} >= {"E[N=10]", "E[N=1000]", "uni100 (one draw)"}
    # the fixture's models are far apart: every ordering agrees with full ranking
    assert all(r[header.index("Kendall's τ")] == "1.0000" and r[-1] == "none" for r in main)


def test_claims_label_each_comparison(folder):
    header, *rows = table_lines(folder, "claims")
    labels = {r[2]: r[-1] for r in rows}
    assert labels["BERT4Rec vs POP"] == "robust"
    assert labels["BERT4Rec L=3 vs BERT4Rec default"] == "not resolved"
    assert labels["BERT4Rec w/o RC vs BERT4Rec default"] == "collapsed run: BERT4Rec w/o RC"
    kinds = {r[2]: r[3] for r in rows}
    assert kinds["BERT4Rec L=3 vs BERT4Rec default"] == "ablation row against its reference row"
    assert "neighbours in Table 2" in kinds["BERT4Rec vs SASRec"] and "BERT4Rec against each model" in \
        kinds["BERT4Rec vs SASRec"]
    assert header[4:-1] == ["full", "uni100", "E[uni100]"]


def test_a_sign_that_flips_between_protocols_is_protocol_dependent(tmp_path):
    """A beats B under full ranking by many users' small margins; under uni100 B beats A: the label says so."""
    users = np.arange(400)
    a_full = RankCounts(users, np.full(400, 3), np.zeros(400, int), np.full(400, POOL))
    b_full = RankCounts(users, np.full(400, 9), np.zeros(400, int), np.full(400, POOL))
    a_uni = RankCounts(users, np.full(400, 12), np.zeros(400, int), np.full(400, 100))
    b_uni = RankCounts(users, np.full(400, 2), np.zeros(400, int), np.full(400, 100))
    rng = np.random.default_rng(0)
    jitter = [RankCounts(c.users, np.clip(c.greater + rng.integers(-2, 3, 400), 0, c.candidates - 1), c.ties,
                         c.candidates) for c in (a_full, b_full, a_uni, b_uni)]
    rows = [ranking_row(tmp_path, "ml-1m", model, 0, protocol, counts=counts)
            for (model, protocol), counts in zip((("sasrec", "full"), ("gru4rec", "full"), ("sasrec", "uni100"),
                                                  ("gru4rec", "uni100")), jitter)]
    write_results(tmp_path, rows)
    results = load_results(tmp_path)
    per_user = PerUser(tmp_path)
    found = judge(results, per_user, Expectations(per_user), alpha=0.01)
    assert [c.label() for c in found] == ["protocol-dependent"]
    assert found[0].verdicts() == {"full": "+", "uni100": "−", "E[uni100]": "+"}


def test_collapse_needs_a_flat_loss_and_pops_value(tmp_path):
    pop = load_rows(tmp_path, [ranking_row(tmp_path, "ml-1m", "pop", 0, "full")])[0]
    counts = RankCounts.load(tmp_path / pop.get("per_user_file"))
    flat, learning = load_rows(tmp_path / "b", [
        flat_curve(ranking_row(tmp_path, "ml-1m", "sasrec", 0, "full", "ablation", "w/o RC", counts=counts)),
        ranking_row(tmp_path, "ml-1m", "sasrec", 0, "full", "ablation", "L=2", counts=counts)])
    assert collapsed(flat, pop) and not collapsed(learning, pop)


def load_rows(folder, rows):
    write_results(folder, rows)
    return load_results(folder).rows


def test_no_candidates_means_no_expected_values_and_a_note(tmp_path):
    rows = [ranking_row(tmp_path, "ml-1m", model, 0, "full") for model in ("pop", "sasrec")]  # no candidates
    write_results(tmp_path, rows)
    report = generate_report(tmp_path).read_text()
    assert "## Sampled against full" not in report
    assert "predate the stored candidate counts" in report
    assert not comparisons(load_results(tmp_path))[0].tests  # not judged until tested


def test_an_expected_value_by_hand(tmp_path):
    """Every user: one of 20 candidates above the target. Ten uniform negatives miss it with probability
    C(19, 10)/C(20, 10) = 1/2, so the target ranks first or second, each half the time: NDCG@10 = 1/2 + 1/2 ·
    1/log2(3). Fifty negatives draw all 20: the full value, 1/log2(3)."""
    users = np.arange(30)
    counts = RankCounts(users, np.ones(30, dtype=np.int64), np.zeros(30, dtype=np.int64), np.full(30, 20))
    write_results(tmp_path, [ranking_row(tmp_path, "ml-1m", "sasrec", 0, "full", counts=counts)])
    generate_report(tmp_path)
    header, line = table_lines(tmp_path, "sampled_expected")[:2]
    assert float(line[header.index("E[N=10]")]) == pytest.approx(0.5 + 0.5 / np.log2(3), abs=5e-5)
    assert float(line[header.index("E[N=50]")]) == pytest.approx(1 / np.log2(3), abs=5e-5)


def test_the_losses_study_is_held_against_the_full_softmax(tmp_path):
    rows = [ranking_row(tmp_path, "ml-1m", model, 0, "full", study="losses", variant=variant,
                        counts=with_pool(counts_for("ml-1m", source, 0, "full"), "full"))
            for model, variant, source in (("sasrec-ce", "full softmax (SASRec-CE)", "bert4rec"),
                                           ("sasrec", "BCE, 1 negative (SASRec)", "sasrec"),
                                           ("gsasrec", "gBCE, 256 negatives, t = 0.75 (gSASRec)", "bert4rec"))]
    write_results(tmp_path, rows)
    found = comparisons(load_results(tmp_path))
    assert sorted((c.first_label, c.second_label) for c in found) == [
        ("SASRec BCE, 1 negative (SASRec)", "SASRec-CE full softmax (SASRec-CE)"),
        ("gSASRec gBCE, 256 negatives, t = 0.75 (gSASRec)", "SASRec-CE full softmax (SASRec-CE)")]


def test_the_ledger_counts_only_resolved_comparisons_as_agreeing(tmp_path):
    """Against published rows written by hand: a comparison tested over users and robust counts; one whose side kept
    no per-user files is not tested and does not, whichever way it goes; one the paper does not make is left out."""
    rows = [ranking_row(tmp_path, "ml-1m", model, seed, "pop100", with_per_user=model != "gru4rec")
            for model in ("pop", "sasrec", "bert4rec", "gru4rec") for seed in SEEDS]
    write_results(tmp_path, rows)
    results = load_results(tmp_path)
    per_user = PerUser(tmp_path)
    found = judge(results, per_user, Expectations(per_user), alpha=0.01)
    mean = {m: np.mean([r.metrics["NDCG@10"] for r in results.rows if r.model == m]) for m in ("pop", "sasrec",
                                                                                           "bert4rec", "gru4rec")}
    assert mean["bert4rec"] > mean["sasrec"] > mean["pop"]
    published = [Published("Table 5", "ml-1m", "bert4rec", "default", "NDCG@10", 0.40),
                 Published("Table 2", "ml-1m", "pop", None, "NDCG@10", 0.10),
                 Published("Table 2", "ml-1m", "gru4rec", None, "NDCG@10", 0.20 if mean["gru4rec"] < mean[
                     "bert4rec"] else 0.50)]  # the paper's way as ours: only the missing files keep it from counting
    by_pair = {(c.first_label, c.second_label): c for c in found}
    assert by_pair[("BERT4Rec", "POP")].label() == "robust" and agrees(by_pair[("BERT4Rec", "POP")], published)
    untested = next(c for c in found if "GRU4Rec" in (c.first_label, c.second_label) and "BERT4Rec" in
                    (c.first_label, c.second_label))
    assert untested.label() == "not tested" and agrees(untested, published)
    assert agrees(by_pair[("BERT4Rec", "SASRec")], published) is None  # SASRec has no published row here
    counts = agreement_counts(found, published)
    made = [c for c in found if agrees(c, published) is not None]
    assert counts["made"] == len(made) and counts["its way"] >= 2
    assert counts["resolved its way"] == sum(c.label() == "robust" and agrees(c, published) for c in made) >= 1
    assert counts["not tested"] == sum(c.label() == "not tested" for c in made) >= 1
    table = ledger_table(found, published, 0.01)
    line = next(r for r in table.rows if r[2].text == "BERT4Rec vs POP")
    assert line[5].text == "+0.3000" and line[6].text == "yes" and line[7].text == "robust"
    assert line[4].value == mean["bert4rec"] - mean["pop"]


def test_a_comparison_tested_on_some_of_its_seeds_only_is_not_resolved(tmp_path):
    # SASRec's seed 1 kept no per-user file: the table's means are over both seeds, the tests of seed 0 alone do not
    # judge them, however clear they are
    rows = [ranking_row(tmp_path, "ml-1m", model, seed, "pop100", with_per_user=(model, seed) != ("sasrec", 1))
            for model in ("pop", "sasrec") for seed in (0, 1)]
    write_results(tmp_path, rows)
    per_user = PerUser(tmp_path)
    (found,) = judge(load_results(tmp_path), per_user, Expectations(per_user), alpha=0.01)
    assert [test.seed for test in found.tests] == [0] and found.tests[0].significant
    assert found.label() == "tested on some seeds only: seed 1 lacks per-user files"
    published = [Published("Table 2", "ml-1m", "pop", None, "NDCG@10", 0.10),
                 Published("Table 2", "ml-1m", "sasrec", None, "NDCG@10", 0.30)]
    counts = agreement_counts([found], published)
    assert counts["resolved its way"] == 0 and counts["tested on some seeds only"] == 1
