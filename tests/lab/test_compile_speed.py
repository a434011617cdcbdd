"""The summary of ``benchmarks.experiments.compile_speed``: what the README quotes from its files."""
from benchmarks.experiments.compile_speed import summary


def _round(model, number, ratio, compile_seconds):
    return {"model": model, "round": number, "compiled_over_eager": ratio, "compile_seconds": compile_seconds}


def test_the_first_round_compiles_cold_and_is_reported_apart_from_the_warm_ones():
    # rounds listed out of order: the first round is the cold one whatever the list's order
    results = [_round("bert4rec", 3, 0.44, 4.6), _round("bert4rec", 1, 0.41, 55.5), _round("bert4rec", 2, 0.43, 6.6),
               _round("sasrec-ce", 1, 0.75, 27.0)]
    by_model = {row["model"]: row for row in summary(results, ["bert4rec", "sasrec-ce"])}
    assert by_model["bert4rec"] == {"model": "bert4rec", "median_compiled_over_eager": 0.43, "min": 0.41, "max": 0.44,
                                    "rounds": 3, "cold_compile_seconds": 55.5, "median_warm_compile_seconds": 5.6}
    # one round has no warm compile to report, and says so instead of repeating the cold one
    assert by_model["sasrec-ce"]["cold_compile_seconds"] == 27.0
    assert by_model["sasrec-ce"]["median_warm_compile_seconds"] is None
