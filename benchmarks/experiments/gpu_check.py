"""The lab's rehearsal of a GPU machine: the suite on a CUDA GPU in minutes, in one command: the CUDA tests,
training speed of the attention models in fp32 and bf16, all-user full ranking, peak GPU memory, then BERT4Rec on
ML-1m under the converge profile, in the precision that measured faster, until early stopping or the time left,
with its result rows:

    python -m benchmarks.experiments.gpu_check --data-dir DIR --out DIR               # 8 minutes on one GPU
    python -m benchmarks.experiments.gpu_check --data-dir DIR --out DIR --minutes 30  # more time for BERT4Rec

``--data-dir`` is the folder with the ML-1m file (the one folder that travels with the command; the synthetic
datasets are generated). Everything the command writes goes into one archive, ``OUT/gpu_check.tar.gz``, rewritten
after every piece, so that whatever stops the command (an error, the time limit, a killed machine), the archive
holds what was done; ``OUT/gpu_check.json`` is its summary: the device, torch and CUDA, the commit, every figure,
and each target of issue 28 beside the figure it concerns (met, or how far it got).

The pieces, in order, each given what is left of ``--minutes`` (less a reserve for the ones after it):

1. ``tests``: ``pytest -m cuda`` on ``tests/`` (a checkout only; an installed suite has no tests; the product's short
   check of the CUDA path is ``python -m benchmarks.gpu_check``).
2. ``speed``: SASRec, SASRec-CE and BERT4Rec on ML-1m under the converge profile, trained ``--speed-batches``
   batches in fp32 and in bf16 each: steps/s, sequences/s, the seconds of one epoch, peak GPU memory.
3. ``ranking``: an all-user full ranking of the test split on ML-1m and on ``synthetic-ml-20m`` (138,493 users ×
   26,744 items), timed after one untimed pass, with its peak memory.
4. ``bert4rec``: BERT4Rec on ML-1m under the converge profile (``run_jobs``, resumable, the time budget set to what
   is left), its rows with ``stopped_by`` saying whether early stopping or the budget ended it. It trains in the
   precision the speed piece measured faster for BERT4Rec (bf16 where that piece was skipped); ``--set
   precision=bf16`` fixes it.

``--device cpu`` with a small ``--speed-dataset``, ``--ranking-datasets`` and ``--train-dataset`` rehearses the
whole command on a CPU; the tests do so (``tests/lab/test_gpu_check.py``).

On a lent machine that starts bare, has PyTorch but no network, and sends back only files under ``$OUT``: copy
``ml-1m_seq_full.txt.gz`` into the checkout's ignored ``.cache/gpu/``, carry that folder, and run (one line)::

    export PYTHONUNBUFFERED=1 RECBENCH_COMMIT=<commit>; python3 -m pip install -q --no-index --no-deps
    --no-build-isolation -e .; python3 -c "import recbench.benchmarks" 2>/dev/null || { mkdir -p /tmp/rb/recbench;
    for d in datasets models benchmarks reports; do ln -sfn "$PWD/$d" /tmp/rb/recbench/$d; done;
    export PYTHONPATH=/tmp/rb; }; python3 -m benchmarks.experiments.gpu_check --data-dir .cache/gpu --out "$OUT"
    --minutes 8 2>&1 | tee "$OUT/gpu_check.log"

(the links name the folders as pyproject.toml maps them, where an offline install fails, or ends without an error
and still leaves ``recbench`` unimportable, as on an H200 on 2026-11-28).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import re
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from recbench.benchmarks.config import resolve
from recbench.benchmarks.device import resolve_device
from recbench.benchmarks.evaluator import Evaluator
from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.jobs import Job
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.provenance import PeakMemory, describe_device, git_commit
from recbench.benchmarks.store import write_atomic
from recbench.benchmarks.trainer import Trainer, TrainRun
from recbench.datasets import load_dataset
from recbench.datasets.sequences import Histories, LeaveOneOutSplit
from recbench.models import model_class

ROOT = Path(__file__).resolve().parents[2]
SPEED_MODELS = ("sasrec", "sasrec-ce", "bert4rec")
PRECISIONS = ("fp32", "bf16")
# Issue 28's targets on one H100: BERT4Rec on ML-1m at Table 5's default row (d = 64) and later replications' full
# NDCG@10 within 5 minutes of training; SASRec-CE's epoch; the all-user full ranking on each dataset.
TARGETS = {"bert4rec ml-1m pop100 NDCG@10": (0.4759, ">="), "bert4rec ml-1m full NDCG@10": (0.15, ">="),
           "bert4rec ml-1m training seconds": (300.0, "<="), "sasrec-ce ml-1m epoch seconds (bf16)": (1.0, "<="),
           "full ranking seconds ml-1m": (0.5, "<="), "full ranking seconds synthetic-ml-20m": (10.0, "<=")}
# Shares of the command's time kept for the pieces after each one (of 8 minutes: 4.8, 3.2 and 2.4 minutes, the
# least left with which the tests may go on, a speed measurement and the rankings may start), and what is kept at the
# end for the last archive and for BERT4Rec's final evaluation, at most 20 s and 30 s.
RESERVE_SHARE = {"tests": 0.6, "speed": 0.4, "ranking": 0.3}
MARGIN_SHARE, MARGIN_MAX_S = 0.05, 20.0
FINISH_SHARE, FINISH_MAX_S = 0.1, 30.0


class TimeUp(Exception):
    """The command's time is over: write the archive and stop."""


@dataclass
class Clock:
    minutes: float  # the command's whole time
    started: float = 0.0

    def __post_init__(self):
        self.started = time.monotonic()

    def share(self, part: float, most: float = float("inf")) -> float:
        """Seconds of the command's time: ``part`` of it, at most ``most``."""
        return min(most, part * self.minutes * 60.0)

    def left(self) -> float:
        """Seconds until the last archive must be written."""
        return self.started + self.minutes * 60.0 - self.share(MARGIN_SHARE, MARGIN_MAX_S) - time.monotonic()

    def may_start(self, piece: str) -> bool:
        return self.left() > self.share(RESERVE_SHARE[piece])


def log(message: str) -> None:
    print(f"[gpu_check {datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)


class Check:
    """One run of the command: its folders, its summary and its archive."""

    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.work = self.out / "gpu_check"  # what the archive holds
        self.work.mkdir(parents=True, exist_ok=True)
        self.device = resolve_device(args.device)
        self.preparing = multiprocessing.get_context("spawn").Process(  # started by main, joined by the rankings
            target=prepare, args=([] if "ranking" in args.skip else args.ranking_datasets, args.data_dir,
                                  args.cache_dir), daemon=True)
        self.summary = {"command": " ".join(["python -m benchmarks.experiments.gpu_check", *sys.argv[1:]]),
                        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        "device": describe_device(self.device), "commit": git_commit(), "torch": torch.__version__,
                        "cuda": torch.version.cuda, "python": platform.python_version(), "pieces": {}}

    def record(self, piece: str, value) -> None:
        """Store a piece's figures in the summary and write the summary and the archive."""
        self.summary["pieces"][piece] = value
        self.summary["targets"] = targets(self.summary["pieces"])
        text = json.dumps(self.summary, indent=2, default=str) + "\n"
        write_atomic(self.work / "gpu_check.json", text)
        write_atomic(self.out / "gpu_check.json", text)
        self.pack()

    def pack(self) -> None:
        """``OUT/gpu_check.tar.gz``: the whole work folder (checkpoints left out), replaced atomically."""
        partial = self.out / "gpu_check.tar.gz.tmp"
        with tarfile.open(partial, "w:gz") as archive:
            archive.add(self.work, arcname="gpu_check", filter=lambda m: None if m.name.endswith(".pt") else m)
        partial.replace(self.out / "gpu_check.tar.gz")


# ------------------------------------------------------------------------------------------------- pieces

def cuda_tests(check: Check, clock: Clock) -> dict:
    """``pytest -m cuda`` in the checkout, cut off where it would eat the later pieces' time."""
    tests = ROOT / "tests"  # the whole folder: CUDA cases live beside their CPU ones too (test_trainer's resume)
    if not (tests / "test_cuda.py").is_file():
        return {"skipped": f"{tests} is absent: the CUDA tests run from a checkout"}
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "-q", "-rs", str(tests)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=max(10.0, clock.left() - clock.share(RESERVE_SHARE["tests"])))
    except subprocess.TimeoutExpired as stopped:  # its captured output is bytes whatever ``text`` says
        (check.work / "pytest.txt").write_text(stopped.stdout.decode(errors="replace") if stopped.stdout else "")
        return {"cut off": f"after {time.perf_counter() - started:.0f} s", "output": "pytest.txt"}
    output = done.stdout + done.stderr
    (check.work / "pytest.txt").write_text(output)
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", output)}
    return {"exit_status": done.returncode, "counts": counts, "seconds": round(time.perf_counter() - started, 1),
            "failures": [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))],
            "output": "pytest.txt"}


def training_speed(check: Check, model_name: str, precision: str, data, train: Histories) -> dict:
    """Steps/s of ``--speed-batches`` training batches of ``model_name`` under the converge profile (after one
    untimed batch), and the seconds of one epoch at that rate."""
    args = check.args
    config = resolve(model_name, args.speed_dataset, "converge",
                     (*args.overrides, f"precision={precision}", "max_epochs=1"))
    batch = config.train.batch_size
    rows = np.random.default_rng(0).permutation(len(train))
    torch.manual_seed(0)
    model = model_class(model_name)(data.n_users, data.n_items, config.model).to(check.device)
    run, memory = TrainRun(seed=0, progress=False), PeakMemory(check.device)
    Trainer(config.train, run).fit(model, train.subset(rows[:batch]), None)  # kernels and allocator warm-up
    memory.reset()
    timed = train.subset(rows[:args.speed_batches * batch])
    fit = Trainer(config.train, run).fit(model, timed, None)
    steps_per_s = fit.steps_run / fit.train_seconds
    epoch_steps = -(-len(next(iter(model.training_examples(train).values()))) // batch)
    return {"precision_used": fit.precision, "batch_size": batch, "steps_per_s": round(steps_per_s, 2),
            "sequences_per_s": round(fit.samples_per_s, 1), "epoch_steps": epoch_steps,
            "epoch_seconds": round(epoch_steps / steps_per_s, 2), "peak_memory_mb": round(memory.peak_mb(), 1)}


def ranking_speed(check: Check, dataset: str) -> dict:
    """Seconds of an all-user full ranking of the test split by a SASRec (untrained: the ranking's cost does not
    depend on the weights), after one untimed pass."""
    data = load_dataset(dataset, data_dir=check.args.data_dir, cache_dir=check.args.cache_dir, progress=False)
    split = LeaveOneOutSplit(data)
    config = resolve("sasrec", dataset, "converge")
    torch.manual_seed(0)
    model = model_class("sasrec")(data.n_users, data.n_items, config.model).to(check.device)
    evaluator = Evaluator(split, seed=0, cache_dir=check.args.cache_dir)
    evaluator.evaluate(model, "test", "full")  # untimed: kernels, the test view, the allocator
    memory = PeakMemory(check.device)
    memory.reset()
    seconds = evaluator.evaluate(model, "test", "full").seconds
    return {"users": data.n_users, "items": data.n_items, "seconds": round(seconds, 3),
            "peak_memory_mb": round(memory.peak_mb(), 1)}


def prepare(datasets: list[str], data_dir: str, cache_dir: str) -> None:
    """Each dataset's prepared cache (a synthetic one is generated: minutes for ``synthetic-ml-20m``); run in a
    process of its own from the start, so that the GPU pieces do not wait for it."""
    for name in datasets:
        load_dataset(name, data_dir=data_dir, cache_dir=cache_dir, progress=False)


def faster_precision(speed: dict) -> tuple[str, str]:
    """The precision in which BERT4Rec trained more steps a second in the speed piece, and why: bf16 unless fp32
    measured faster or bf16 fell back to fp32. On the first H100 (d = 64, batches of 128) fp32 ran 1.7 to 1.9 times
    as many steps (results/reference/gpu-h100/): steps that small wait on kernel launches, and autocast adds casts."""
    fp32, bf16 = (speed.get(f"bert4rec {precision}") or {} for precision in PRECISIONS)
    if "steps_per_s" not in fp32 or "steps_per_s" not in bf16:
        return "bf16", "the speed piece did not measure both precisions"
    if bf16["precision_used"] != "bf16":
        return "fp32", "bf16 is not native on this device"
    winner = "bf16" if bf16["steps_per_s"] >= fp32["steps_per_s"] else "fp32"
    return winner, f"steps/s measured: fp32 {fp32['steps_per_s']}, bf16 {bf16['steps_per_s']}"


def bert4rec_run(check: Check, clock: Clock, precision: str) -> dict:
    """BERT4Rec on ``--train-dataset`` (ML-1m), converge profile, in ``precision`` (a ``--set precision=...`` of
    the command wins), until early stopping or the time left (resumable: a rerun with the same output continues
    it)."""
    budget = clock.left() - clock.share(FINISH_SHARE, FINISH_MAX_S)  # the rest: the final evaluation and rows
    if budget < 5.0:
        return {"skipped": f"{clock.left():.0f} s left"}
    overrides = (f"precision={precision}", f"time_budget_s={budget:.0f}", *check.args.overrides)
    job = Job(check.args.train_dataset, "bert4rec", 0, overrides=overrides)
    options = RunOptions(output=check.work / "bert4rec", protocols=("full", "pop100"), profile="converge",
                         device=str(check.device), data_dir=check.args.data_dir, cache_dir=check.args.cache_dir,
                         resume=True, progress=False, command=check.summary["command"].split())
    run_jobs([job], options, log=log)
    rows = [json.loads(line) for line in (check.work / "bert4rec" / "results.jsonl").read_text().splitlines()]
    return {row["protocol"]: {**{key: row.get(key) for key in ("metrics", "stopped_by", "epochs_run", "best_epoch",
                                                                "train_seconds", "precision", "device", "key")},
                              "time_budget_s": row["train_settings"]["time_budget_s"]} for row in rows}


def targets(pieces: dict) -> dict:
    """Each target beside the figure it concerns: met, missed (with the gap) or not measured."""
    bert = pieces.get("bert4rec") or {}
    figures = {
        "bert4rec ml-1m pop100 NDCG@10": (bert.get("pop100") or {}).get("metrics", {}).get("NDCG@10"),
        "bert4rec ml-1m full NDCG@10": (bert.get("full") or {}).get("metrics", {}).get("NDCG@10"),
        "bert4rec ml-1m training seconds": (bert.get("full") or {}).get("train_seconds"),
        "sasrec-ce ml-1m epoch seconds (bf16)": ((pieces.get("speed") or {}).get("sasrec-ce bf16") or {}).get(
            "epoch_seconds"),
    }
    for dataset in ("ml-1m", "synthetic-ml-20m"):
        figures[f"full ranking seconds {dataset}"] = ((pieces.get("ranking") or {}).get(dataset) or {}).get("seconds")
    verdicts = {}
    for name, (goal, sense) in TARGETS.items():
        value = figures.get(name)
        if value is None:
            verdicts[name] = {"target": f"{sense} {goal}", "value": None, "verdict": "not measured"}
            continue
        met = value >= goal if sense == ">=" else value <= goal
        verdicts[name] = {"target": f"{sense} {goal}", "value": value,
                          "verdict": "met" if met else f"missed by {abs(value - goal):.4g}"}
    return verdicts


# --------------------------------------------------------------------------------------------------- main

def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, help="folder with the ML-1m file (ml-1m_seq_full.txt.gz)")
    parser.add_argument("--out", required=True, help="where gpu_check.tar.gz and gpu_check.json are written")
    parser.add_argument("--minutes", type=float, default=8.0, help="the command's whole time, archive included")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a rehearsal")
    parser.add_argument("--cache-dir", default=None, help="prepared datasets and negatives (default: OUT/cache)")
    parser.add_argument("--speed-dataset", default="ml-1m")
    parser.add_argument("--speed-batches", type=int, default=20, help="timed training batches per measurement")
    parser.add_argument("--ranking-datasets", nargs="+", default=["ml-1m", "synthetic-ml-20m"])
    parser.add_argument("--train-dataset", default="ml-1m", help="BERT4Rec's dataset")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="a setting of every model trained, over the converge profile's (a rehearsal's small "
                             "models); a field a model lacks is left to the others")
    parser.add_argument("--skip", nargs="*", default=[], choices=["tests", "speed", "ranking", "bert4rec"])
    args = parser.parse_args(argv)
    args.cache_dir = args.cache_dir or str(Path(args.out) / "cache")
    return args


def run_pieces(check: Check, clock: Clock) -> None:
    skip = set(check.args.skip)
    if "tests" not in skip:
        log("tests: pytest -m cuda")
        check.record("tests", cuda_tests(check, clock))
    if "speed" not in skip:
        data = load_dataset(check.args.speed_dataset, data_dir=check.args.data_dir, cache_dir=check.args.cache_dir,
                            progress=False)
        train, speed = LeaveOneOutSplit(data).train(), {}
        for model_name in SPEED_MODELS:
            for precision in PRECISIONS:
                if not clock.may_start("speed"):
                    speed[f"{model_name} {precision}"] = {"skipped": f"{clock.left():.0f} s left"}
                    continue
                log(f"speed: {model_name} {precision}")
                speed[f"{model_name} {precision}"] = training_speed(check, model_name, precision, data, train)
                check.record("speed", speed)
    if "ranking" not in skip:
        ranking = {}
        check.preparing.join(max(0.0, clock.left() - clock.share(RESERVE_SHARE["ranking"])))
        for dataset in check.args.ranking_datasets:
            log(f"ranking: {dataset}")
            ranking[dataset] = (ranking_speed(check, dataset) if clock.may_start("ranking")
                                else {"skipped": f"{clock.left():.0f} s left"})
            check.record("ranking", ranking)
    if "bert4rec" not in skip:
        precision, why = faster_precision(check.summary["pieces"].get("speed") or {})
        log(f"bert4rec: ML-1m, converge profile, {precision} ({why}), {clock.left():.0f} s left")
        check.record("bert4rec", {"precision_chosen": precision, "why": why,
                                  **bert4rec_run(check, clock, precision)})


def main(argv=None) -> int:
    args = parse_args(argv)
    clock = Clock(args.minutes)
    check = Check(args)
    check.preparing.start()

    def time_up(signum, frame):
        raise TimeUp

    previous = signal.signal(signal.SIGALRM, time_up)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, clock.left()))
    status = 0
    try:
        run_pieces(check, clock)
    except TimeUp:
        log("time is up: the archive holds what was done")
        check.summary["stopped"], status = "time up", 3
    except Exception as error:  # whatever fails, the archive keeps what was done and says what failed
        log(f"failed: {type(error).__name__}: {error}")
        check.summary["stopped"], status = f"{type(error).__name__}: {error}", 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        check.preparing.terminate()
    check.summary["seconds"] = round(time.monotonic() - clock.started, 1)
    check.record("end", {"status": status})
    log(f"written: {check.out / 'gpu_check.tar.gz'} and gpu_check.json (exit status {status})")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
