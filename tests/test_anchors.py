"""Ours against the best published figures (reports/anchors.py): chosen on validation, never on test, and a figure
counts as reached only over two converged seeds."""
from recbench.reports.anchors import anchor_table, candidate_table, ranked
from recbench.reports.results import Row
from recbench.reports.time_to_quality import Anchor

ANCHORS = [Anchor("Them", None, "ml-1m", "full", "NDCG@10", 0.20, "their setting"),
           Anchor("Lower", None, "ml-1m", "full", "NDCG@10", 0.10, "a lower figure"),
           Anchor("Them", None, "ml-1m", "pop100", "NDCG@10", 0.50, "their setting")]


def _rows(model, valids, tests, stopped_by="early stopping", valid_metric="NDCG@10 under full", hours=1.0):
    """{protocol: rows}, one row per seed: its best validation, test NDCG@10 (pop100 = full + .3)."""
    by_protocol = {}
    for protocol, shift in (("full", 0.0), ("pop100", 0.3)):
        by_protocol[protocol] = [
            Row(line=seed, study="main", variant=None, sweep_param=None, sweep_value=None, dataset="ml-1m",
                model=model, task="next-item", protocol=protocol, seed=seed, metrics={"NDCG@10": test + shift},
                raw={"best_valid": valid, "valid_metric": valid_metric, "stopped_by": stopped_by,
                     "train_seconds": 3600 * hours, "device": "cpu (1 threads, x86_64)"})
            for seed, (valid, test) in enumerate(zip(valids, tests))]
    return by_protocol


def test_the_choice_is_made_on_validation_not_on_test():
    candidates = {"ml-1m": {"best on test": _rows("a", [0.10, 0.10], [0.30, 0.30]),
                            "best on validation": _rows("b", [0.15, 0.15], [0.19, 0.19])}}
    assert [entry[0] for entry in ranked(candidates["ml-1m"])] == ["best on validation", "best on test"]
    table = anchor_table(candidates, ANCHORS)
    full = next(row for row in table.rows if row[1].text == "full")
    assert full[2].text == "Them" and full[3].value == 0.20  # the highest published figure, not "Lower"
    assert full[4].text == "best on validation" and full[6].value == 0.19
    assert full[7].text == "-5.0%" and full[9].text == "below"
    pop100 = next(row for row in table.rows if row[1].text == "pop100")
    assert pop100[6].value == 0.49 and pop100[9].text == "below"


def test_reached_needs_two_seeds_each_ended_by_early_stopping():
    def verdict(by_protocol):
        table = anchor_table({"ml-1m": {"x": by_protocol}}, ANCHORS)
        return next(row for row in table.rows if row[1].text == "full")[9].text

    assert verdict(_rows("x", [0.2, 0.2], [0.21, 0.23])) == "reached"
    assert verdict(_rows("x", [0.2], [0.25])) == "above on one seed; 2 needed"
    assert verdict(_rows("x", [0.2, 0.2], [0.25, 0.25], stopped_by="time budget")) == "not converged (time budget)"


def test_a_candidate_selected_on_another_measure_is_never_chosen_and_is_named():
    candidates = {"ml-1m": {"on pop100": _rows("n", [0.9, 0.9], [0.3, 0.3], valid_metric="NDCG@10 under pop100"),
                            "on full one": _rows("a", [0.1, 0.1], [0.1, 0.1]),
                            "on full two": _rows("b", [0.2, 0.2], [0.2, 0.2])}}
    assert anchor_table(candidates, ANCHORS).rows[0][4].text == "on full two"
    table = candidate_table(candidates)
    assert [row[1].text for row in table.rows] == ["on full two", "on full one", "on pop100"]
    assert table.rows[-1][3].text.endswith("*")
    assert any("on pop100 on ML-1m: NDCG@10 under pop100" in note for note in table.notes)


def test_no_published_figure_no_table():
    assert anchor_table({"beauty": {"x": _rows("x", [0.1], [0.1])}}, ANCHORS) is None
