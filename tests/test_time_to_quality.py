"""The report's time-to-quality table (reports/time_to_quality.py) and the loss study's table and figures
(reports/losses.py), on folders written by hand."""
from recbench.reports.losses import loss_figures, loss_table
from recbench.reports.report import generate_report
from recbench.reports.results import load_results
from recbench.reports.stats import PerUser
from recbench.reports.time_to_quality import Anchor, load_anchors, seconds_to_reach, time_to_quality_table
from tests.fixtures.reports_fixture import counts_for, ranking_row, write_results

CURVE = [{"epoch": 1, "loss": 3.0, "seconds": 10.0, "valid_NDCG@10": 0.10},
         {"epoch": 2, "loss": 2.0, "seconds": 20.0, "valid_NDCG@10": 0.30},
         {"epoch": 3, "loss": 1.5, "seconds": 30.0, "valid_NDCG@10": 0.28},
         {"epoch": 4, "loss": 1.4, "seconds": 40.0, "valid_NDCG@10": 0.31}]


def test_seconds_to_reach_is_the_first_validation_at_the_level():
    points = [(r["seconds"], r["valid_NDCG@10"]) for r in CURVE]
    assert seconds_to_reach(points, 0.9 * 0.31) == 20.0  # .279: epoch 2's .30, not epoch 3's dip
    assert seconds_to_reach(points, 0.31) == 40.0
    assert seconds_to_reach(points, 0.5) is None


def test_time_to_quality_table_by_hand(tmp_path):
    row = ranking_row(tmp_path, "ml-1m", "sasrec", 0, protocol="full", curve=CURVE, train_seconds=40.0)
    twin = ranking_row(tmp_path, "ml-1m", "sasrec", 0, protocol="pop100", curve=CURVE, train_seconds=40.0)
    row["key"] = twin["key"] = "k1"  # one training run, two protocols: one line
    write_results(tmp_path, [row, twin])
    anchors = [Anchor("Them", None, "ml-1m", "full", "NDCG@10", 0.29, "their setting"),
               Anchor("Far", None, "ml-1m", "full", "NDCG@10", 0.40, "out of reach"),
               Anchor("Other protocol", None, "ml-1m", "pop100", "NDCG@10", 0.05, "not the curve's protocol")]
    table = time_to_quality_table(load_results(tmp_path), anchors)
    assert len(table.rows) == 1
    cells = [cell.text for cell in table.rows[0]]
    assert cells[4:9] == ["NDCG@10 full", "0.3100", "20", "20", "40"]  # 90% = .279, 95% = .2945, 100% = .31
    assert cells[9] == "Them 0.2900: 20; Far 0.4000: not reached"
    assert any("Them on ML-1m (full NDCG@10 0.2900): their setting" in note for note in table.notes)


def test_the_published_anchors_load():
    anchors = load_anchors()
    assert {(a.source, a.dataset, a.protocol) for a in anchors} >= {("RecTools SASRec", "beauty", "full"),
                                                                    ("Klenitskiy & Vasilev SASRec+", "ml-1m", "full")}


def _loss_folder(tmp_path):
    rows = []
    for seed in (0, 1):
        for model, variant, scale in (("gbert4rec", "Cloze, gBCE, 256 negatives, t = 0.75 (gBERT4Rec)", 1.5),
                                      ("bert4rec", "Cloze, full softmax (BERT4Rec)", 1.2),
                                      ("sasrec", "BCE, 1 negative (SASRec)", 20.0),
                                      ("sasrec-ce", "full softmax (SASRec-CE)", 1.0)):
            rows.append(ranking_row(tmp_path, "ml-1m", model, seed, protocol="full", study="losses", variant=variant,
                                    counts=counts_for("ml-1m", model, seed, "full", scale)))
    return write_results(tmp_path, rows)


def test_loss_table_tests_each_loss_against_the_full_softmax(tmp_path):
    results = load_results(_loss_folder(tmp_path))
    table = loss_table(results, "full", PerUser(tmp_path))
    labels = [row[0].text for row in table.rows]
    assert labels == ["BCE, 1 negative (SASRec)", "full softmax (SASRec-CE)", "Cloze, full softmax (BERT4Rec)",
                      "Cloze, gBCE, 256 negatives, t = 0.75 (gBERT4Rec)"]  # the reference, then the Cloze rows last
    bce, reference = table.rows[:2]
    assert reference[2].text == "reference" and reference[1].marks == ""
    ours = [r.metrics["NDCG@10"] for r in results.rows if r.model == "sasrec"]
    base = [r.metrics["NDCG@10"] for r in results.rows if r.model == "sasrec-ce"]
    assert bce[2].text == f"{100 * (sum(ours) / sum(base) - 1):+.1f}%"
    assert bce[1].marks  # twenty times the rank: far below the reference on 60 users, marked
    assert all(row[2].text.startswith(("+", "-")) for row in table.rows[2:])  # each against the full softmax too
    assert any("Holm's correction for the 3 comparisons" in note for note in table.notes)


def test_loss_figures_and_report_sections(tmp_path):
    folder = _loss_folder(tmp_path)
    drawn = loss_figures(load_results(folder), tmp_path / "figures")
    assert {f.name for f in drawn.figures} == {"losses_quality_vs_time_full", "losses_curves_ml-1m"}
    generate_report(folder)
    report = (folder / "report.md").read_text()
    assert "The loss and the direction (NDCG@10), protocol full" in report and "Time to quality" in report
