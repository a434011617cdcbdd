"""The promise of the default ``python run_all.py``: on the default synthetic data and the smoke profile, every
sequential model it shows reaches at least 1.5 × POP's full-ranking NDCG@10 and beats BPR-MF, and two runs
give identical numbers (budgets are epochs, never seconds).

The default suite runs the default grid once at full size (about 90 CPU-seconds: smaller data does not keep the
promise, because BERT4Rec needs a few hundred steps over enough users to leave the popularity plateau it starts
on; with 400 users it stayed at POP's level through its 15 epochs) and checks that two short runs of the same
grid on smaller data agree to the last digit; the slow suite runs the whole default twice and compares the
tables. What makes CPU runs repeat is the worker's deterministic kernels (four SASRec runs on 2 threads without
them ended at four different values) and ``MKL_CBWR=AUTO``, which importing ``benchmarks`` sets (MKL's sums
otherwise follow the memory alignment of their inputs); runs go to fresh processes, with that variable set."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recbench.benchmarks.store import read_results
from run_all import DEFAULT_MODELS

ROOT = Path(__file__).resolve().parents[1]
NON_SEQUENTIAL = {"pop", "bprmf"}  # popularity and user taste; every other default model reads the order
SEQUENTIAL = [model for model in DEFAULT_MODELS if model not in NON_SEQUENTIAL]
PROMISE = 1.5  # × POP's full-ranking NDCG@10
ENV = {**os.environ, "MKL_CBWR": "AUTO"}

# The default grid through the driver (run_jobs), on the default generator with fewer users; the dataset is named
# "synthetic" so that the default run's smoke settings apply. Prints each model's full-ranking metrics.
SMALL_RUN = """
import json, sys
from recbench.benchmarks.jobs import Job
from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.options import RunOptions
from recbench.datasets import generate
from run_all import DEFAULT_MODELS
output, users, overrides = sys.argv[1], int(sys.argv[2]), tuple(sys.argv[3:])
data = generate(n_users=users, n_items=500, mean_length=30.0, seed=0, name="synthetic")
options = RunOptions(output=output, protocols=("full",), profile="smoke", device="cpu", cache_dir=output + "-cache",
                     progress=False)
rows = run_jobs([Job("synthetic", model, 0, overrides=overrides) for model in DEFAULT_MODELS], options,
                preloaded={"synthetic": data}, log=lambda *a: None).rows
print(json.dumps({row["model"]: row["metrics"] for row in rows}))
"""


def small_run(folder: Path, users: int, *overrides: str) -> dict[str, dict]:
    done = subprocess.run([sys.executable, "-c", SMALL_RUN, str(folder), str(users), *overrides], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_promise(ndcg: dict[str, float]) -> None:
    assert set(ndcg) == set(DEFAULT_MODELS) and SEQUENTIAL
    for model in SEQUENTIAL:
        assert ndcg[model] >= PROMISE * ndcg["pop"], (model, ndcg)
        assert ndcg[model] > ndcg["bprmf"], (model, ndcg)


def default_run(output: Path, cache: Path) -> Path:
    done = subprocess.run([sys.executable, str(ROOT / "run_all.py"), "--output", str(output), "--cache-dir",
                           str(cache), "--quiet", "--no-report"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return output


def test_the_default_run_keeps_the_promise(tmp_path):
    rows = read_results(default_run(tmp_path / "run", tmp_path / "cache") / "results.jsonl")
    check_promise({row["model"]: row["metrics"]["NDCG@10"] for row in rows if row["protocol"] == "full"})


def test_two_runs_give_identical_numbers(tmp_path):
    first, second = (small_run(tmp_path / name, 150, "max_epochs=3") for name in ("first", "second"))
    assert first == second  # every metric of every model, exactly


@pytest.mark.slow
def test_two_default_runs_give_identical_tables(tmp_path):
    first, second = (default_run(tmp_path / name, tmp_path / "cache") for name in ("first", "second"))
    assert (first / "table.md").read_text() == (second / "table.md").read_text()
