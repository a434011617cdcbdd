"""One command that checks the suite on a CUDA GPU and measures it there (issue 12), in steps short enough for
GPU jobs of a few minutes each:

    python3 -m benchmarks.experiments.gpu_check --data-dir .cache/data --out results/gpu-check

Its work, in order, each piece skipped when the output folder shows it done:

1. ``tests``: the ``cuda`` tests (``pytest -m cuda``); output and summary under ``OUT/tests/``.
2. ``speed``: SASRec, SASRec-CE and BERT4Rec on ML-1m and Beauty (training steps/s and sequences/s, epoch
   seconds, full-ranking evaluation of all users, peak GPU memory) and on ``synthetic-ml-20m`` (its full-ranking
   evaluation); :func:`benchmarks.experiments.speed_transformers.measure`, one fresh process each, one
   ``OUT/speed/<dataset>__<model>.json`` each.
3. ``bert4rec``: BERT4Rec under the paper profile on ML-1m and Beauty through the runner (``OUT/bert4rec/``,
   ``resume=True``), each with a training-time budget (``--train-minutes``; the issue's ML-1m target is
   "within 10 minutes of training").

An invocation starts a piece only when enough of ``--max-minutes`` (default 9) is left for it, and interrupts
training at the limit: training runs in a child process that checkpoints after every epoch, so the next
invocation resumes from the last epoch (at most one epoch is redone, and the training-time budget counts only
the epochs kept). Run the same command again until it exits with status 0; status 3 means work is left. Only
the output folder needs to be carried from one invocation to the next (prepared data is cached outside it, see
``--cache-dir``, and rebuilt on a fresh machine in seconds).

``OUT/gpu_check.json``, rewritten after every piece: the device, torch and CUDA versions, the commit, every
figure, and the issue's targets beside the figures they concern. Copy it into ``results/reference/`` with the
device in its name.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SPEED_MODELS = ("sasrec", "sasrec-ce", "bert4rec")
SPEED_DATASETS = ("ml-1m", "beauty", "synthetic-ml-20m")
TRAIN_DATASETS = ("ml-1m", "beauty")
TRAIN_MINUTES = {"ml-1m": 10.0, "beauty": 10.0}
MORE_WORK = 3  # exit status when pieces are left for the next invocation
ATTEMPTS = 2  # a piece cut off by the time limit this often is recorded as failed and skipped
MARGIN_S = 20.0  # kept free at the end of an invocation (stopping a child, writing the summary)
SPEED_NEEDS_S = 120.0  # least time left to start one speed measurement
SPEED_NEEDS_S_GENERATED = 300.0  # ... on synthetic-ml-20m, generated first where no cache holds it (minutes)
TRAIN_NEEDS_S = 90.0  # least time left to start or resume one training
PAPER = "BERT4Rec paper, Table 2 (PAPER.md)"


class Deadline:
    """The end of this invocation's time (``--max-minutes``, less ``MARGIN_S``)."""

    def __init__(self, minutes: float):
        self.end = time.monotonic() + minutes * 60.0 - MARGIN_S

    def left(self) -> float:
        return self.end - time.monotonic()

    def passed(self) -> bool:
        return self.left() <= 0


def log(message: str) -> None:
    print(f"[gpu_check {datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)


def write_json(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    tmp.replace(path)


def read_json(path: Path, default=None):
    return json.loads(path.read_text()) if path.is_file() else default


# ----------------------------------------------------------------------------------------------- attempts
def attempts(out: Path) -> dict:
    return read_json(out / "attempts.json", {})


def count_attempt(out: Path, piece: str) -> None:
    """Record one more start (or failure) of ``piece``."""
    counts = attempts(out)
    write_json(out / "attempts.json", {**counts, piece: counts.get(piece, 0) + 1})


def given_up(out: Path, piece: str) -> bool:
    return attempts(out).get(piece, 0) >= ATTEMPTS and not (out / "done" / piece).exists()


def mark_done(out: Path, piece: str) -> None:
    (out / "done").mkdir(parents=True, exist_ok=True)
    (out / "done" / piece).touch()


def is_done(out: Path, piece: str) -> bool:
    return (out / "done" / piece).exists()


# ------------------------------------------------------------------------------------------------- tests
def run_tests(out: Path, deadline: Deadline) -> bool:
    """``pytest -m cuda`` in the repository; False when cut off by the time limit."""
    folder = out / "tests"
    folder.mkdir(parents=True, exist_ok=True)
    count_attempt(out, "tests")
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "-q", "-rs",
               f"--junitxml={folder / 'junit.xml'}", "tests/test_cuda.py"]
    log("tests: " + " ".join(command[1:]))
    started = time.perf_counter()
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=max(deadline.left(), 1))
    except subprocess.TimeoutExpired as stopped:  # its captured output is bytes whatever ``text`` says
        (folder / "pytest.txt").write_text(stopped.stdout.decode(errors="replace") if stopped.stdout else "")
        log("tests: cut off by the time limit")
        return False
    output = result.stdout + result.stderr
    (folder / "pytest.txt").write_text(output)
    lines = [line for line in output.splitlines() if line.strip()]
    summary = next((line.strip("= ") for line in reversed(lines)
                    if re.search(r"\d+ (passed|failed|skipped|errors?)", line)), lines[-1] if lines else "")
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    write_json(folder / "summary.json", {"command": " ".join(command[1:]), "exit_status": result.returncode,
                                         "summary": summary, "counts": counts, "failures": failures,
                                         "seconds": round(time.perf_counter() - started, 1)})
    for line in failures:
        log(f"tests: {line}")
    mark_done(out, "tests")
    log(f"tests: {summary} (exit status {result.returncode})")
    return True


# ------------------------------------------------------------------------------------------------- speed
def _measure_child(path: str, model: str, dataset: str, batches: int, device: str, data_dir, cache_dir,
                   threads: int | None) -> None:
    from recbench.benchmarks.experiments.speed_transformers import measure

    try:
        write_json(Path(path), measure(model, dataset, batches, device, data_dir, False, threads, cache_dir=cache_dir))
    except KeyboardInterrupt:
        print(f"speed: {model} on {dataset} interrupted", flush=True)


def speed_pieces(args) -> list[tuple[str, str]]:
    return [(dataset, model) for dataset in args.speed_datasets for model in args.speed_models]


def run_speed(out: Path, args, deadline: Deadline) -> bool:
    """Every (dataset, model) speed measurement not yet stored; False when time ran out first."""
    context = multiprocessing.get_context("spawn")
    for dataset, model in speed_pieces(args):
        piece = f"speed__{dataset}__{model}"
        if is_done(out, piece) or given_up(out, piece):
            continue
        if deadline.left() < (SPEED_NEEDS_S_GENERATED if dataset.startswith("synthetic-") else SPEED_NEEDS_S):
            return False
        count_attempt(out, piece)
        log(f"speed: {model} on {dataset}")
        path = out / "speed" / f"{dataset}__{model}.json"
        child = context.Process(target=_measure_child, args=(str(path), model, dataset, args.speed_batches,
                                                              args.device, args.data_dir, args.cache_dir,
                                                              args.threads))
        child.start()
        child.join(max(deadline.left(), 1))
        if child.is_alive():
            stop(child)
            log(f"speed: {model} on {dataset} cut off by the time limit")
            return False
        if child.exitcode == 0 and path.is_file():
            mark_done(out, piece)
            row = read_json(path)
            log(f"speed: {model} on {dataset}: {row['train_steps_per_s']} steps/s, epoch {row['epoch_seconds']} s, "
                f"full-ranking evaluation of all users {row['full_eval_seconds_all_users']} s, "
                f"peak {row['peak_memory_mb']} MB")
        else:
            log(f"speed: {model} on {dataset} failed (exit status {child.exitcode}); see the output above")
    return True


def stop(child) -> None:
    """Interrupt a child (KeyboardInterrupt: its atomic writes finish or never happen), then end it."""
    os.kill(child.pid, signal.SIGINT)
    child.join(30)
    if child.is_alive():
        child.kill()
        child.join()


# ---------------------------------------------------------------------------------------------- training
def train_overrides(args, dataset: str) -> tuple[str, ...]:
    minutes = args.train_minutes.get(dataset, TRAIN_MINUTES.get(dataset, 10.0))
    return (f"time_budget_s={minutes * 60:g}", *args.set)


def _train_child(out: str, dataset: str, seed: int, overrides: tuple, args_device: str, data_dir, cache_dir,
                 progress: bool, threads: int | None) -> None:
    from recbench.benchmarks.grid import run_jobs
    from recbench.benchmarks.jobs import Job
    from recbench.benchmarks.options import RunOptions

    if threads:
        torch.set_num_threads(threads)
    try:
        options = RunOptions(output=Path(out), protocols=("full", "pop100"), profile="paper", device=args_device,
                             data_dir=data_dir, cache_dir=cache_dir, resume=True, progress=progress)
        run_jobs([Job(dataset, "bert4rec", seed, overrides=overrides)], options,
                 log=lambda message: print(message, flush=True))
    except KeyboardInterrupt:
        print(f"bert4rec: {dataset} interrupted", flush=True)


def result_rows(out: Path, dataset: str, seed: int) -> dict:
    """The BERT4Rec test rows of ``dataset`` in ``OUT/bert4rec/results.jsonl``, by protocol."""
    path = out / "bert4rec" / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return {row["protocol"]: row for row in rows
            if row["dataset"] == dataset and row["model"] == "bert4rec" and row["seed"] == seed}


def run_training(out: Path, args, deadline: Deadline) -> bool:
    context = multiprocessing.get_context("spawn")
    for dataset in args.train_datasets:
        piece = f"bert4rec__{dataset}"
        if is_done(out, piece) or given_up(out, piece):
            continue
        if {"full", "pop100"} <= set(result_rows(out, dataset, args.seed)):
            mark_done(out, piece)
            continue
        if deadline.left() < TRAIN_NEEDS_S:
            return False
        log(f"bert4rec: {dataset} (paper profile, {' '.join(train_overrides(args, dataset))}), "
            f"{deadline.left() / 60:.1f} min of this invocation left")
        child = context.Process(target=_train_child, args=(str(out / "bert4rec"), dataset, args.seed,
                                                           train_overrides(args, dataset), args.device,
                                                           args.data_dir, args.cache_dir, args.progress,
                                                           args.threads))
        child.start()
        while child.is_alive() and not deadline.passed():
            child.join(0.1)
        if child.is_alive():
            stop(child)
            log(f"bert4rec: {dataset} interrupted at the time limit; the next invocation resumes from the "
                f"checkpoint of its last finished epoch, if any")
            return False
        if {"full", "pop100"} <= set(result_rows(out, dataset, args.seed)):
            mark_done(out, piece)
        else:
            log(f"bert4rec: {dataset} ended without results (exit status {child.exitcode}); see the output above")
            count_attempt(out, piece)
    return True


# ----------------------------------------------------------------------------------------------- summary
def target(what: str, value, bound: float, kind: str, **context) -> dict:
    met = None if value is None else (value >= bound if kind == "min" else value <= bound)
    return {"target": what, "value": value, "bound": f"{'>=' if kind == 'min' else '<='} {bound}", "met": met,
            **context}


def environment(device: str) -> dict:
    from recbench.benchmarks.provenance import describe_device, git_commit, library_versions
    from recbench.benchmarks.trainer import resolve_device

    resolved = resolve_device(device)
    about = {"device": describe_device(resolved), "torch": torch.__version__, "cuda": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
             "commit": git_commit(), "versions": library_versions(), "cpu_cores": os.cpu_count(),
             "host": platform.node()}
    if resolved.type == "cuda":
        properties = torch.cuda.get_device_properties(resolved)
        about.update(gpu=properties.name, gpu_memory_gb=round(properties.total_memory / 2**30, 1),
                     compute_capability=f"{properties.major}.{properties.minor}")
    return about


def summarize(out: Path, args) -> dict:
    speed = {f"{d}__{m}": read_json(out / "speed" / f"{d}__{m}.json") for d, m in speed_pieces(args)}
    speed = {key: row for key, row in speed.items() if row}
    training = {}
    targets = []
    for dataset in args.train_datasets:
        rows = result_rows(out, dataset, args.seed)
        if rows:
            any_row = next(iter(rows.values()))
            training[dataset] = {
                "metrics": {protocol: row["metrics"] for protocol, row in rows.items()},
                "train_seconds": any_row["train_seconds"], "epochs_run": any_row["epochs_run"],
                "best_epoch": any_row["best_epoch"], "best_valid": any_row["best_valid"],
                "train_settings": any_row["train_settings"], "overrides": list(train_overrides(args, dataset)),
                "curve": any_row["curve"]}
        ndcg = {protocol: row["metrics"]["NDCG@10"] for protocol, row in rows.items()}
        seconds = training.get(dataset, {}).get("train_seconds")
        if dataset == "ml-1m":
            targets.append(target("BERT4Rec ML-1m pop100 NDCG@10 within 10 min of training", ndcg.get("pop100"),
                                  0.47, "min", train_seconds=seconds, paper=0.4818, paper_source=PAPER))
            targets.append(target("BERT4Rec ML-1m full NDCG@10 within 10 min of training", ndcg.get("full"),
                                  0.15, "min", train_seconds=seconds))
        if dataset == "beauty":
            targets.append(target("BERT4Rec Beauty pop100 NDCG@10", ndcg.get("pop100"), 0.18, "min",
                                  train_seconds=seconds, paper=0.1862, paper_source=PAPER))
    if "ml-1m" in args.speed_datasets and "sasrec-ce" in args.speed_models:
        row = speed.get("ml-1m__sasrec-ce")
        targets.append(target("SASRec-CE ML-1m training epoch seconds", row and row["epoch_seconds"], 1.0, "max"))
    for dataset, bound in (("ml-1m", 0.5), ("synthetic-ml-20m", 10.0)):
        if dataset in args.speed_datasets:
            for model in args.speed_models:
                row = speed.get(f"{dataset}__{model}")
                targets.append(target(f"{model} full-ranking evaluation of all {dataset} users, seconds",
                                      row and row["full_eval_seconds_all_users"], bound, "max"))
    done = [piece for piece in pieces(args) if is_done(out, piece)]
    return {"command": "python -m benchmarks.experiments.gpu_check " + " ".join(args.argv),
            "environment": environment(args.device),
            "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "finished": all_done(out, args), "done": done, "attempts": attempts(out),
            "tests": read_json(out / "tests" / "summary.json"), "speed": speed, "bert4rec": training,
            "targets": targets}


def pieces(args) -> list[str]:
    """Every piece of work of the chosen ``--steps``."""
    return ((["tests"] if "tests" in args.steps else [])
            + ([f"speed__{d}__{m}" for d, m in speed_pieces(args)] if "speed" in args.steps else [])
            + ([f"bert4rec__{d}" for d in args.train_datasets] if "bert4rec" in args.steps else []))


def all_done(out: Path, args) -> bool:
    return all(is_done(out, piece) or given_up(out, piece) for piece in pieces(args))


# ---------------------------------------------------------------------------------------------------- main
def parse_minutes(pairs: list[str]) -> dict:
    minutes = {}
    for pair in pairs:
        dataset, _, value = pair.partition("=")
        if not value:
            raise SystemExit(f"--train-minutes {pair!r}: expected DATASET=MINUTES, e.g. ml-1m=10")
        minutes[dataset] = float(value)
    return minutes


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder; carry it from one invocation to the next")
    parser.add_argument("--data-dir", default=None, help="folder with the dataset files (else $RECBENCH_DATA_DIR)")
    parser.add_argument("--cache-dir", default=None, help="prepared data and negatives (else $RECBENCH_CACHE_DIR, "
                                                          "else ~/.cache/recbench); not needed between invocations")
    parser.add_argument("--device", default="cuda", help="cuda (default), cpu or auto; cpu only tests the steps")
    parser.add_argument("--max-minutes", type=float, default=9.0, help="time this invocation may take")
    parser.add_argument("--steps", nargs="+", default=["tests", "speed", "bert4rec"],
                        choices=["tests", "speed", "bert4rec"])
    parser.add_argument("--speed-datasets", nargs="+", default=list(SPEED_DATASETS))
    parser.add_argument("--speed-models", nargs="+", default=list(SPEED_MODELS))
    parser.add_argument("--speed-batches", type=int, default=50, help="timed training batches per measurement")
    parser.add_argument("--train-datasets", nargs="+", default=list(TRAIN_DATASETS))
    parser.add_argument("--train-minutes", nargs="+", default=[], metavar="DATASET=MINUTES",
                        help=f"training-time budget per dataset (default {TRAIN_MINUTES})")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override for the BERT4Rec jobs, as run_all.py --set (keep it the same across "
                             "invocations: a changed setting does not resume)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads of the speed and training "
                                                                  "processes (default: torch's choice)")
    parser.add_argument("--progress", action="store_true", help="progress bars of the training runs")
    args = parser.parse_args(argv)
    args.argv, args.train_minutes = argv, parse_minutes(args.train_minutes)
    deadline = Deadline(args.max_minutes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from recbench.benchmarks.trainer import resolve_device

    resolve_device(args.device)  # a clear error now if CUDA was asked for and is absent
    log(f"output {out}, {args.max_minutes:g} min for this invocation, done so far: "
        f"{sorted(p.name for p in (out / 'done').glob('*')) if (out / 'done').is_dir() else 'nothing'}")

    finished = True
    if "tests" in args.steps and not is_done(out, "tests") and not given_up(out, "tests"):
        finished = run_tests(out, deadline)
        write_json(out / "gpu_check.json", summarize(out, args))
    if finished and "speed" in args.steps:
        finished = run_speed(out, args, deadline)
        write_json(out / "gpu_check.json", summarize(out, args))
    if finished and "bert4rec" in args.steps:
        finished = run_training(out, args, deadline)
    summary = summarize(out, args)
    write_json(out / "gpu_check.json", summary)
    for row in summary["targets"]:
        state = {True: "met", False: "NOT met", None: "not measured yet"}[row["met"]]
        log(f"target {row['target']} {row['bound']}: {row['value']} ({state})")
    if summary["finished"]:
        log(f"all done; {out / 'gpu_check.json'} can be copied into results/reference/")
        return 0
    log("work is left: run the same command again (only the output folder needs to be kept)")
    return MORE_WORK


if __name__ == "__main__":
    raise SystemExit(main())
