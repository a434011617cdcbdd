"""``interleaved_rounds``, the pattern of every speed comparison of the lab (bf16 against fp32, compiled against
eager, fused Adam against the loop): which mode goes first, and that each round's load is recorded around it."""
from benchmarks.experiments import speed_transformers
from benchmarks.experiments.speed_transformers import interleaved_rounds


def test_the_order_alternates_so_that_each_mode_goes_first_as_often(monkeypatch):
    calls, loads = [], iter([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0], [7.0], [8.0]])
    monkeypatch.setattr(speed_transformers, "load_average", lambda: next(loads))
    rounds = list(interleaved_rounds(4, ("fp32", "bf16"), lambda mode: calls.append(mode) or len(calls)))
    assert calls == ["fp32", "bf16", "bf16", "fp32", "fp32", "bf16", "bf16", "fp32"]
    assert [number for number, *_ in rounds] == [1, 2, 3, 4]
    assert [order for _, order, *_ in rounds] == [("fp32", "bf16"), ("bf16", "fp32")] * 2
    # the measurements go to their mode whichever ran first, and the load is read before and after each round
    assert rounds[1][2] == {"bf16": 3, "fp32": 4}
    assert [(before, after) for *_, before, after in rounds] == [([1.0], [2.0]), ([3.0], [4.0]), ([5.0], [6.0]),
                                                                 ([7.0], [8.0])]


def test_an_odd_number_of_rounds_lets_the_first_mode_lead_once_more():
    orders = [order for _, order, *_ in interleaved_rounds(3, (False, True), lambda fused: 0.0)]
    assert orders == [(False, True), (True, False), (False, True)]
