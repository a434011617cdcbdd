"""Seconds per training step of our SASRec (BCE, one negative per position) against RecTools' ``SASRecModel(
loss="BCE", n_negatives=1)`` on ML-1m, the same shape on both sides (N = 200, d = 64, 2 blocks, ``--heads``,
batch 256, dropout 0.2, Adam lr 1e-3), interleaved in one process so that both see the same machine load:

    python -m benchmarks.experiments.rectools_sasrec --data-dir DIR --threads 1 --rounds 5 --steps 10

RecTools is not a dependency of the suite, and RecTools 0.19 pins numpy < 2 and pandas < 3, so it lives in its
own virtual environment that reuses this one's torch:

    python -m venv --system-site-packages .venv && .venv/bin/pip install "rectools[torch]==0.19.*"
    .venv/bin/python -m benchmarks.experiments.rectools_sasrec --data-dir DIR

A round times ``--steps`` training steps of each, ours first: ours through the shared trainer on the training
sequences (s[:-2]) of ``steps × 256`` randomly chosen users, after one warm-up batch (as
``speed_transformers``); RecTools' through its Lightning trainer on every user's training sequence, from the
start of its second step to the end of its last (Lightning's set-up and the first batch excluded). The figure
is the median over rounds of seconds per step, and the ratio RecTools / ours (above 1: ours is faster).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.experiments.speed_transformers import load_average
from recbench.benchmarks.config import resolve
from recbench.benchmarks.provenance import git_commit, machine
from recbench.benchmarks.trainer import Trainer, TrainRun
from recbench.datasets import load_dataset
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.models import model_class

ROOT = Path(__file__).resolve().parents[2]
MAX_LEN, HIDDEN, BLOCKS, BATCH, DROPOUT, LR = 200, 64, 2, 256, 0.2, 1e-3


def ours_per_step(train, data, heads: int, steps: int, seed: int) -> float:
    overrides = (f"max_len={MAX_LEN}", f"hidden={HIDDEN}", f"layers={BLOCKS}", f"heads={heads}",
                 f"dropout={DROPOUT}", f"attention_dropout={DROPOUT}", f"batch_size={BATCH}", f"lr={LR}",
                 "max_epochs=1", "warmup_steps=0")
    config = resolve("sasrec", "ml-1m", "paper", overrides)
    settings, run = config.train, TrainRun(seed=seed, progress=False)
    torch.manual_seed(seed)
    model = model_class("sasrec")(data.n_users, data.n_items, config.model)
    rng = np.random.default_rng(seed)
    Trainer(settings, run).fit(model, train.subset(rng.choice(len(train), BATCH, replace=False)), None)  # warm-up
    report = Trainer(settings, run).fit(model, train.subset(rng.choice(len(train), steps * BATCH, replace=False)),
                                        None)
    return report.train_seconds / steps


def rectools_per_step(interactions, heads: int, steps: int, seed: int) -> float:
    # optional: RecTools and Lightning are no dependencies of the suite (the module docstring installs them)
    from pytorch_lightning import Callback, Trainer as LightningTrainer, seed_everything
    from rectools.models import SASRecModel
    from rectools.models.nn.item_net import IdEmbeddingsItemNet

    class StepClock(Callback):
        def __init__(self):
            self.starts, self.ends = [], []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.ends.append(time.perf_counter())

    clock = StepClock()

    def trainer():
        return LightningTrainer(max_steps=steps + 1, callbacks=[clock], accelerator="cpu", devices=1,
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False)

    seed_everything(seed, verbose=False)
    model = SASRecModel(n_blocks=BLOCKS, n_heads=heads, n_factors=HIDDEN, dropout_rate=DROPOUT,
                        session_max_len=MAX_LEN, loss="BCE", n_negatives=1, lr=LR, batch_size=BATCH,
                        item_net_block_types=(IdEmbeddingsItemNet,), get_trainer_func=trainer)
    model.fit(interactions)
    clock = next(c for c in model.fit_trainer.callbacks if type(c).__name__ == "StepClock")
    return (clock.ends[-1] - clock.starts[1]) / steps  # steps 2 … steps + 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None, help="folder with the ML-1m files (else $RECBENCH_DATA_DIR)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per side and round")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(ROOT / "results" / "reference" / "rectools-sasrec-ml1m.json"))
    args = parser.parse_args(argv)
    # optional: RecTools is no dependency of the suite (the module docstring installs it)
    import rectools
    from rectools.dataset import Dataset

    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_dataset("ml-1m", data_dir=args.data_dir, download=False, progress=False)
    train = LeaveOneOutSplit(data).train()
    users, items = train.flat(np.arange(len(train)))
    position = np.arange(len(items)) - np.repeat(train.offsets[:-1], np.diff(train.offsets))
    interactions = Dataset.construct(pd.DataFrame({
        "user_id": train.users[users], "item_id": items, "weight": 1.0,
        "datetime": pd.Timestamp("2000-01-01") + pd.to_timedelta(position, unit="s")}))
    rounds = []
    for number in range(1, args.rounds + 1):
        ours = ours_per_step(train, data, args.heads, args.steps, args.seed + number)
        theirs = rectools_per_step(interactions, args.heads, args.steps, args.seed + number)
        rounds.append({"ours_s_per_step": round(ours, 4), "rectools_s_per_step": round(theirs, 4),
                       "load_average": load_average()})
        print(f"round {number}: ours {ours:.3f} s/step, RecTools {theirs:.3f} s/step, "
              f"RecTools / ours {theirs / ours:.2f} (load {rounds[-1]['load_average']})", flush=True)
    ours = statistics.median(r["ours_s_per_step"] for r in rounds)
    theirs = statistics.median(r["rectools_s_per_step"] for r in rounds)
    print(f"median: ours {ours:.3f} s/step, RecTools {theirs:.3f} s/step, RecTools / ours {theirs / ours:.2f}")
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        "command": " ".join(["python -m benchmarks.experiments.rectools_sasrec",
                             *(sys.argv[1:] if argv is None else argv)]),
        "commit": git_commit(), "rectools": rectools.__version__, "torch": torch.__version__,
        "machine": machine(),
        "shape": {"max_len": MAX_LEN, "hidden": HIDDEN, "blocks": BLOCKS, "heads": args.heads, "batch_size": BATCH,
                  "dropout": DROPOUT, "lr": LR, "loss": "BCE, one negative per position"},
        "median_ours_s_per_step": round(ours, 4), "median_rectools_s_per_step": round(theirs, 4),
        "rectools_over_ours": round(theirs / ours, 3), "rounds": rounds}, indent=2) + "\n")
    print(f"written: {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
