"""Job keys pinned: long runs are resumed by key (``--resume``), so a change of the code that moves a key without
raising ``KEY_VERSION`` would silently start them again from the beginning. The values were computed before the
code was restructured (issue 31); a key may change only with ``KEY_VERSION``, and then these values with it."""
import pytest

from recbench.benchmarks.jobs import KEY_VERSION, Job
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.planner import plan_grid
from tests.helpers import SHARED_DATA, requires_shared_data

PINNED_VERSION = 3
SYNTHETIC = {
    ("bert4rec", "smoke"): "bc11b60370e2333745c89b0a84735d7a7aaeb21e313d46461cca36bc2ed50d86",
    ("bert4rec", "paper"): "5c6cc8c96c3b300ffd64705424754e3fd3bd409add6d8a85a92cc0e48df7eab7",
    ("bert4rec", "converge"): "0798b194419cc7a6f8b5baeb196c58587a97c66b8fdca3af0841dd3e500c28af",
    ("sasrec", "paper"): "f470e10f6667d51976f9b6426c53c910feff73588adba8583f8802de5264c93d",
    ("pop", "paper"): "2e8250cf8e4843611a3260312a754ad2e6d5d7cdce385b4f7abf0361b98af849",
}
# The BERT4Rec runs of the converge profile that are resumed by key on the real data. ML-1m's moved with its
# patience (10 → 20, a setting, not the code): the run under 10 was 7ee1d626e751…, finished and kept.
REAL = {
    "ml-1m": "1e5b4e3fe963aa721dacd6909e019297eeb35499e96fdabb88c5f6f307bf7a15",
    "beauty": "698a5ce90b63cff78be60fb74b038c45bf28be3694e4d6f1f386bd8c59ee8a77",
}


def key_of(job: Job, profile: str, tmp_path, **options) -> str:
    planned, _ = plan_grid([job], RunOptions(output=tmp_path / "out", profile=profile, device="cpu",
                                             cache_dir=tmp_path / "cache", **options), log=lambda *_: None)
    return planned[0].key


def test_the_key_version_is_the_pinned_one():
    assert KEY_VERSION == PINNED_VERSION, "KEY_VERSION changed: recompute the pinned keys of this file"


@pytest.mark.parametrize(("model", "profile"), list(SYNTHETIC))
def test_synthetic_keys_are_pinned(model, profile, tmp_path):
    assert key_of(Job("synthetic", model, 0), profile, tmp_path) == SYNTHETIC[(model, profile)]


@requires_shared_data
@pytest.mark.parametrize("dataset", list(REAL))
def test_the_converge_runs_keep_their_keys(dataset, tmp_path):
    assert key_of(Job(dataset, "bert4rec", 0), "converge", tmp_path, data_dir=SHARED_DATA) == REAL[dataset]
