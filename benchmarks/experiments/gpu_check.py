"""One command that checks the suite on a CUDA GPU and measures it there (issues 12 and 22), in calls of at most
9 minutes, each of which may start on a bare machine:

    python -m benchmarks.experiments.gpu_check --out results/gpu-check --data-dir DIR

Its work, in order, each piece skipped when the output folder shows it done:

1. ``tests``: the ``cuda`` tests (``pytest -m cuda``); output and summary under ``OUT/tests/``.
2. ``speed``: SASRec, SASRec-CE and BERT4Rec on ML-1m and Beauty, each trained in fp32 and in bf16 (training
   steps/s and sequences/s, epoch seconds, full-ranking evaluation of all users, peak GPU memory), and on
   ``synthetic-ml-20m`` (its full-ranking evaluation, in fp32);
   :func:`benchmarks.experiments.speed_transformers.measure`, one fresh process and one
   ``OUT/speed/<dataset>__<model>__<precision>.json`` each. BERT4Rec in fp32 on each training dataset comes
   first: its steps/s plans the training.
3. ``bert4rec``: BERT4Rec under the paper profile on ML-1m (``--train-datasets``) through ``run_jobs``
   (``OUT/bert4rec/``, ``resume=True``), in fp32 as the authors' code. The authors' 400k steps do not fit the
   device time, so the first training invocation fixes ``max_steps`` such that the learning-rate decay ends
   within the training budget that remains (:mod:`benchmarks.experiments.gpu_plan`; ``OUT/plans.json`` keeps
   the plan, its arithmetic and the deviation from the authors' schedule). The budget is ``--train-minutes``
   or, by default, what remains of ``--device-minutes`` after the calls so far (``OUT/invocations.json``).

An invocation starts a piece only when enough of ``--max-minutes`` (default 9) is left for it, and interrupts
training at the limit: training runs in a child process that checkpoints after every epoch, so the next
invocation resumes from the last epoch (at most one epoch is redone, and the training-time budget counts only
the epochs kept). Run the same command again until it exits with status 0; status 3 means work is left.

On the device tool every call starts bare and only 8 files under ``$OUT`` come back, so each invocation packs
its whole output folder into ``$OUT/gpu_check.tar.gz`` (``--pack-to``; :mod:`benchmarks.experiments.gpu_carry`)
and the next one unpacks it from the carried folder ``.cache/gpu-check/`` (``--carry``), which also holds the
data files and the commit. In the checkout, before the first call and after each call:

    python -m benchmarks.experiments.gpu_check --prepare-carry --data-dir DIR [--archive FILE]

(``FILE``: the ``gpu_check.tar.gz`` that came back), then one call with carry [".cache/gpu-check"],
timeout_s 600 and this command (``--print-device-command`` prints it; add ``--device-minutes M`` to its
gpu_check where less than 30 minutes of device time are left before the first call, the same in every call):

    set -o pipefail; export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 RECBENCH_COMMIT="$(cat .cache/gpu-check/commit 2>/dev/null)"; { python3 -m pip install -q --no-index --no-deps --no-build-isolation --root-user-action=ignore -e . || { echo "pip install failed: recbench imported through links in /tmp/rb"; mkdir -p /tmp/rb/recbench; for d in datasets models benchmarks reports; do ln -sfn "$PWD/$d" /tmp/rb/recbench/$d; done; export PYTHONPATH=/tmp/rb; }; python3 -m benchmarks.experiments.gpu_check --carry .cache/gpu-check --out /tmp/gpu-check --cache-dir /tmp/recbench-cache --pack-to "$OUT" --max-minutes 9; } 2>&1 | tee "$OUT/gpu_check.log"

``OUT/gpu_check.json`` (also under ``$OUT``), rewritten after every piece: the device, torch and CUDA versions,
the commit, every figure, the training plan, and the issue's targets beside the figures they concern, with how
far a run that stopped short got and the projected time to reach its goal. Copy it into ``results/reference/``
with the device in its name.
"""
from __future__ import annotations

import argparse
import json
import math
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

from benchmarks.experiments import gpu_carry, gpu_plan
from benchmarks.experiments.speed_transformers import measure
from recbench.benchmarks.config import resolve
from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.jobs import Job
from recbench.benchmarks.options import RunOptions
from recbench.benchmarks.provenance import describe_device, git_commit, library_versions
from recbench.benchmarks.trainer import resolve_device
from recbench.datasets import LeaveOneOutSplit, load_dataset
from recbench.models import model_class

ROOT = Path(__file__).resolve().parents[2]
SPEED_MODELS = ("sasrec", "sasrec-ce", "bert4rec")
SPEED_DATASETS = ("ml-1m", "beauty", "synthetic-ml-20m")
SPEED_PRECISIONS = ("fp32", "bf16")
TRAIN_DATASETS = ("ml-1m",)
TRAIN_PRECISION = "fp32"  # the authors' code trains in float32; the plan's steps/s is measured so
MORE_WORK = 3  # exit status when pieces are left for the next invocation
ATTEMPTS = 2  # a piece cut off by the time limit this often is recorded as failed and skipped
MARGIN_S = 20.0  # kept free at the end of an invocation (stopping a child, writing the summary, packing)
SPEED_NEEDS_S = 120.0  # least time left to start one speed measurement
SPEED_NEEDS_S_GENERATED = 180.0  # ... on synthetic-ml-20m: generated first where no cache holds it, 2.9M BERT4Rec rows
TRAIN_NEEDS_S = 90.0  # least time left to start or resume one training
DEVICE_MINUTES = 30.0  # a session's device time
CALL_OVERHEAD_MINUTES = 2.0  # a call's device time outside this program: start, transfers, install, idle wait
CARRY = ".cache/gpu-check"
# BERT4Rec paper, Table 5, default row (NDCG@10, pop100): the d = 64 configuration that the paper profile builds
# (the authors' bert_config_*_64.json); Table 2's .4818 / .1862 are best settings, d = 256 (PAPER.md, "Settings
# of the published tables").
TABLE5 = {"ml-1m": 0.4759, "beauty": 0.1832}
TABLE5_SOURCE = "BERT4Rec paper, Table 5, default row (d = 64, L = 2, h = 2)"
FULL_NDCG_BOUND = 0.15  # ML-1m full ranking; later work on the same data reports 0.152-0.154 (PAPER.md)
# One device call: install the checkout offline (where pip cannot, import it through links named as pyproject.toml
# maps the folders), run one invocation, keep its log under $OUT. Exit status: the invocation's (3: work is left).
DEVICE_COMMAND = (
    'set -o pipefail; export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 '
    f'RECBENCH_COMMIT="$(cat {CARRY}/{gpu_carry.COMMIT_FILE} 2>/dev/null)"; '
    '{ python3 -m pip install -q --no-index --no-deps --no-build-isolation --root-user-action=ignore -e . || '
    '{ echo "pip install failed: recbench imported through links in /tmp/rb"; mkdir -p /tmp/rb/recbench; '
    'for d in datasets models benchmarks reports; do ln -sfn "$PWD/$d" /tmp/rb/recbench/$d; done; '
    'export PYTHONPATH=/tmp/rb; }; '
    f'python3 -m benchmarks.experiments.gpu_check --carry {CARRY} --out /tmp/gpu-check '
    '--cache-dir /tmp/recbench-cache --pack-to "$OUT" --max-minutes 9; } 2>&1 | tee "$OUT/gpu_check.log"')


class Deadline:
    """The end of this invocation's time (``--max-minutes``, less ``MARGIN_S``)."""

    def __init__(self, minutes: float):
        self.started = time.monotonic()
        self.end = self.started + minutes * 60.0 - MARGIN_S

    def left(self) -> float:
        return self.end - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

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


def give_up(out: Path, piece: str) -> None:
    write_json(out / "attempts.json", {**attempts(out), piece: ATTEMPTS})


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
def _measure_child(call: dict) -> None:
    try:
        row = measure(call["model"], call["dataset"], call["batches"], call["device"], call["data_dir"],
                      generated=False, threads=call["threads"], cache_dir=call["cache_dir"],
                      overrides=tuple(call["overrides"]))
        write_json(Path(call["path"]), row)
    except KeyboardInterrupt:
        print(f"speed: {call['model']} on {call['dataset']} interrupted", flush=True)


def speed_pieces(args) -> list[tuple[str, str, str]]:
    """(dataset, model, precision) of every speed measurement; BERT4Rec in fp32 on each training dataset first,
    since its steps/s plans the training. ``synthetic-*`` datasets time the full-ranking evaluation, which runs
    in float32 whatever the training precision, so they are measured in fp32 only."""
    planning = [(d, "bert4rec", TRAIN_PRECISION) for d in args.train_datasets] if "bert4rec" in args.steps else []
    chosen = [(d, m, p) for d in args.speed_datasets for m in args.speed_models
              for p in ((TRAIN_PRECISION,) if d.startswith("synthetic-") else args.speed_precisions)]
    return list(dict.fromkeys(planning + (chosen if "speed" in args.steps else [])))


def speed_name(dataset: str, model: str, precision: str) -> str:
    return f"{dataset}__{model}__{precision}"


def run_speed(out: Path, args, deadline: Deadline) -> bool:
    """Every speed measurement not yet stored; False when time ran out first."""
    context = multiprocessing.get_context("spawn")
    for dataset, model, precision in speed_pieces(args):
        piece = f"speed__{speed_name(dataset, model, precision)}"
        if is_done(out, piece) or given_up(out, piece):
            continue
        if deadline.left() < (SPEED_NEEDS_S_GENERATED if dataset.startswith("synthetic-") else SPEED_NEEDS_S):
            return False
        count_attempt(out, piece)
        log(f"speed: {model} on {dataset}, {precision}")
        path = out / "speed" / f"{speed_name(dataset, model, precision)}.json"
        # BERT4Rec's --set values apply to its measurements too, so that the rate is that of the planned training
        overrides = [f"precision={precision}", *(args.set if model == "bert4rec" else ())]
        child = context.Process(target=_measure_child, args=(dict(
            path=str(path), model=model, dataset=dataset, batches=args.speed_batches, device=args.device,
            data_dir=args.data_dir, cache_dir=args.cache_dir, threads=args.threads, overrides=overrides),))
        child.start()
        child.join(max(deadline.left(), 1))
        if child.is_alive():
            stop(child)
            log(f"speed: {model} on {dataset}, {precision} cut off by the time limit")
            return False
        if child.exitcode == 0 and path.is_file():
            mark_done(out, piece)
            row = read_json(path)
            log(f"speed: {model} on {dataset}, {precision}: {row['train_steps_per_s']} steps/s, epoch "
                f"{row['epoch_seconds']} s, full-ranking evaluation of all users "
                f"{row['full_eval_seconds_all_users']} s, peak {row['peak_memory_mb']} MB")
        else:
            log(f"speed: {model} on {dataset}, {precision} failed (exit status {child.exitcode}); see the output "
                f"above")
    return True


def stop(child) -> None:
    """Interrupt a child (KeyboardInterrupt: its atomic writes finish or never happen), then end it."""
    os.kill(child.pid, signal.SIGINT)
    child.join(30)
    if child.is_alive():
        child.kill()
        child.join()


# ---------------------------------------------------------------------------------------------- training
def _train_child(call: dict) -> None:
    if call["threads"]:
        torch.set_num_threads(call["threads"])
    try:
        plan, data = training_plan(call)
        overrides = (*plan["overrides"], *call["set"])  # the user's --set last: it wins
        print(f"bert4rec: {call['dataset']}: {plan['why']} (overrides {' '.join(overrides)})", flush=True)
        options = RunOptions(output=Path(call["out"]) / "bert4rec", protocols=("full", "pop100"), profile="paper",
                             device=call["device"], data_dir=call["data_dir"], cache_dir=call["cache_dir"],
                             resume=True, progress=call["progress"])
        run_jobs([Job(call["dataset"], "bert4rec", call["seed"], overrides=overrides)], options,
                 preloaded={call["dataset"]: data}, log=lambda message: print(message, flush=True))
    except KeyboardInterrupt:
        print(f"bert4rec: {call['dataset']} interrupted", flush=True)


def training_plan(call: dict) -> tuple[dict, object]:
    """The dataset's plan from ``OUT/plans.json``, or a new one made from the device's steps/s, and the data."""
    out, dataset = Path(call["out"]), call["dataset"]
    data = load_dataset(dataset, data_dir=call["data_dir"], cache_dir=call["cache_dir"], progress=False)
    plans = read_json(out / "plans.json", {})
    if dataset in plans:
        return plans[dataset], data
    speed_file = f"speed/{speed_name(dataset, 'bert4rec', TRAIN_PRECISION)}.json"
    speed = read_json(out / speed_file)
    if speed is None:
        raise SystemExit(f"bert4rec: {dataset}: no steps/s measured ({speed_file}); the speed step measures it")
    config = resolve("bert4rec", dataset, "paper", (f"precision={TRAIN_PRECISION}", *call["set"]))
    model = model_class("bert4rec")(data.n_users, data.n_items, config.model)
    examples = len(next(iter(model.training_examples(LeaveOneOutSplit(data).train()).values())))
    authors_steps = resolve("bert4rec", dataset, "paper", ()).train.max_steps
    if call["train_minutes"] is not None:
        budget = (call["train_minutes"] * 60, "--train-minutes", {})
    else:
        seconds, arithmetic = gpu_plan.training_budget_s(margin_s=MARGIN_S, **call["budget"])
        budget = (seconds / call["datasets_left"], f"device time left (--device-minutes), shared by "
                                                   f"{call['datasets_left']} training(s)", arithmetic)
    plan = gpu_plan.make_plan(dataset, speed, speed_file, math.ceil(examples / config.train.batch_size),
                              config.train, authors_steps, budget)
    plan["user_overrides"] = list(call["set"])
    write_json(out / "plans.json", {**plans, dataset: plan})
    return plan, data


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
        planning = f"speed__{speed_name(dataset, 'bert4rec', TRAIN_PRECISION)}"
        if not is_done(out, planning):
            log(f"bert4rec: {dataset} skipped: its steps/s measurement, which plans the training, failed")
            if given_up(out, planning):
                give_up(out, piece)
            continue
        if deadline.left() < TRAIN_NEEDS_S:
            return False
        log(f"bert4rec: {dataset} (paper profile, {TRAIN_PRECISION}), {deadline.left() / 60:.1f} min of this "
            f"invocation left")
        child = context.Process(target=_train_child, args=(train_call(out, args, dataset, deadline),))
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


def train_call(out: Path, args, dataset: str, deadline: Deadline) -> dict:
    """What the training child needs, with the inputs of the budget in case it makes the plan."""
    planned = read_json(out / "plans.json", {})
    left = [d for d in args.train_datasets if d not in planned and not is_done(out, f"bert4rec__{d}")]
    budget = dict(device_minutes=args.device_minutes, overhead_minutes=args.call_overhead_minutes,
                  max_minutes=args.max_minutes, earlier_minutes=[i["minutes"] for i in invocations(out)],
                  elapsed_s=deadline.elapsed(), left_s=deadline.left())
    return dict(out=str(out), dataset=dataset, seed=args.seed, set=list(args.set), device=args.device,
                data_dir=args.data_dir, cache_dir=args.cache_dir, progress=args.progress, threads=args.threads,
                train_minutes=args.train_minutes.get(dataset), budget=budget, datasets_left=max(1, len(left)))


# ----------------------------------------------------------------------------------------------- summary
def invocations(out: Path) -> list[dict]:
    """The invocations so far, one entry each: when, how long, on which device, what was done after it."""
    return read_json(out / "invocations.json", [])


def record_invocation(out: Path, args, deadline: Deadline, started: datetime) -> None:
    entry = {"started": started.isoformat(timespec="seconds"), "minutes": round(deadline.elapsed() / 60, 2),
             "max_minutes": args.max_minutes, "device": describe(args.device),
             "done": sorted(p.name for p in (out / "done").glob("*"))}
    write_json(out / "invocations.json", [*invocations(out), entry])


def target(what: str, value, bound: float, kind: str, **context) -> dict:
    met = None if value is None else (value >= bound if kind == "min" else value <= bound)
    return {"target": what, "value": value, "bound": f"{'>=' if kind == 'min' else '<='} {bound}", "met": met,
            **context}


def describe(device: str) -> str:
    return describe_device(resolve_device(device))


def environment(device: str) -> dict:
    resolved = resolve_device(device)
    about = {"device": describe(device), "torch": torch.__version__, "cuda": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
             "commit": git_commit(), "versions": library_versions(), "cpu_cores": os.cpu_count(),
             "host": platform.node()}
    if resolved.type == "cuda":
        properties = torch.cuda.get_device_properties(resolved)
        about.update(gpu=properties.name, gpu_memory_gb=round(properties.total_memory / 2**30, 1),
                     compute_capability=f"{properties.major}.{properties.minor}")
    return about


def training_summary(out: Path, dataset: str, seed: int) -> dict | None:
    """BERT4Rec's rows on ``dataset`` with their schedule against the authors', or how far an unfinished
    training got; None before it started."""
    rows, plan = result_rows(out, dataset, seed), read_json(out / "plans.json", {}).get(dataset)
    if not rows:
        checkpoints = sorted((out / "bert4rec" / "checkpoints").glob(f"{dataset}__bert4rec__seed{seed}__*.pt"))
        return {"plan": plan, "progress": gpu_plan.progress(checkpoints[-1], plan)} if checkpoints and plan else (
            {"plan": plan, "progress": {"state": "no epoch finished yet"}} if plan else None)
    row = next(iter(rows.values()))
    settings = row["train_settings"]
    schedule = {"authors_max_steps": plan and plan["authors_max_steps"], "max_steps": settings["max_steps"],
                "time_budget_s": settings["time_budget_s"], "stopped_by": row["stopped_by"],
                **(gpu_plan.steps_run(row, plan) if plan else {}), "why": plan and plan["why"]}
    return {"metrics": {protocol: r["metrics"] for protocol, r in rows.items()}, "device": row["device"],
            "precision": settings["precision"], "schedule": schedule, "train_seconds": row["train_seconds"],
            "epochs_run": row["epochs_run"], "best_epoch": row["best_epoch"], "best_valid": row["best_valid"],
            "train_settings": settings, "plan": plan, "curve": row["curve"]}


def bert4rec_targets(dataset: str, training: dict | None) -> list[dict]:
    """The issue's BERT4Rec targets on ``dataset``; one that is not met says how far the run got and the
    projected time of the authors' schedule at its rate."""
    ndcg = {protocol: metrics["NDCG@10"] for protocol, metrics in (training or {}).get("metrics", {}).items()}
    context = {"device": (training or {}).get("device"), "precision": TRAIN_PRECISION}
    if training and "metrics" in training:
        context["how_far"] = {**training["schedule"], "train_seconds": round(training["train_seconds"], 1),
                              "projected_hours_for_authors_schedule":
                                  training["plan"] and training["plan"]["projected_hours_for_authors_schedule"]}
    elif training:
        context["how_far"] = training["progress"]
    rows = [target(f"BERT4Rec {dataset} pop100 NDCG@10, paper profile (d = 64)", ndcg.get("pop100"),
                   TABLE5[dataset], "min", paper=TABLE5[dataset], paper_source=TABLE5_SOURCE, **context)]
    if dataset == "ml-1m":
        rows.append(target("BERT4Rec ml-1m full NDCG@10, paper profile (d = 64)", ndcg.get("full"), FULL_NDCG_BOUND,
                           "min", reference="later work on the same data: 0.152-0.154", **context))
    for row in rows:
        if row["met"]:
            row.pop("how_far", None)  # nothing to project
    return rows


def speed_targets(speed: dict, args) -> list[dict]:
    rows = []
    for precision in args.speed_precisions:
        row = speed.get(speed_name("ml-1m", "sasrec-ce", precision))
        if "ml-1m" in args.speed_datasets and "sasrec-ce" in args.speed_models:
            rows.append(target(f"SASRec-CE ml-1m training epoch seconds ({precision})",
                               row and row["epoch_seconds"], 1.0, "max", device=row and row["device"]))
    for dataset, bound in (("ml-1m", 0.5), ("synthetic-ml-20m", 10.0)):
        for model in args.speed_models if dataset in args.speed_datasets else ():
            row = speed.get(speed_name(dataset, model, TRAIN_PRECISION))
            rows.append(target(f"{model} full-ranking evaluation of all {dataset} users, seconds",
                               row and row["full_eval_seconds_all_users"], bound, "max", device=row and row["device"]))
    return rows


def summarize(out: Path, args) -> dict:
    speed = {speed_name(*piece): read_json(out / "speed" / f"{speed_name(*piece)}.json") for piece in
             speed_pieces(args)}
    speed = {key: row for key, row in speed.items() if row}
    training = {dataset: training_summary(out, dataset, args.seed) for dataset in args.train_datasets}
    targets = [row for dataset in args.train_datasets if dataset in TABLE5
               for row in bert4rec_targets(dataset, training[dataset])]
    return {"command": "python -m benchmarks.experiments.gpu_check " + " ".join(args.argv),
            "environment": environment(args.device),
            "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "finished": all_done(out, args), "done": [p for p in pieces(args) if is_done(out, p)],
            "attempts": attempts(out), "invocations": invocations(out),
            "tests": read_json(out / "tests" / "summary.json"), "speed": speed,
            "bert4rec": {dataset: row for dataset, row in training.items() if row},
            "targets": targets + speed_targets(speed, args)}


def pieces(args) -> list[str]:
    """Every piece of work of the chosen ``--steps``."""
    return ((["tests"] if "tests" in args.steps else [])
            + [f"speed__{speed_name(*piece)}" for piece in speed_pieces(args)]
            + ([f"bert4rec__{d}" for d in args.train_datasets] if "bert4rec" in args.steps else []))


def all_done(out: Path, args) -> bool:
    return all(is_done(out, piece) or given_up(out, piece) for piece in pieces(args))


# ---------------------------------------------------------------------------------------------------- main
def parse_minutes(pairs: list[str]) -> dict:
    minutes = {}
    for pair in pairs:
        dataset, _, value = pair.partition("=")
        try:
            minutes[dataset] = float(value)
        except ValueError:
            raise SystemExit(f"--train-minutes {pair!r}: expected DATASET=MINUTES, e.g. ml-1m=15") from None
    return minutes


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="output folder; carry it from one invocation to the next")
    parser.add_argument("--data-dir", default=None, help="folder with the dataset files (else CARRY/data with "
                                                         "--carry, else $RECBENCH_DATA_DIR)")
    parser.add_argument("--cache-dir", default=None, help="prepared data and negatives (else $RECBENCH_CACHE_DIR, "
                                                          "else ~/.cache/recbench); not needed between invocations")
    parser.add_argument("--carry", default=None, metavar="FOLDER",
                        help=f"git-ignored folder of the checkout that travels to the device ({CARRY}): unpack its "
                             f"{gpu_carry.ARCHIVE} into --out first when --out is empty")
    parser.add_argument("--pack-to", default=None, metavar="FOLDER",
                        help=f"at the end, pack --out into FOLDER/{gpu_carry.ARCHIVE} with the summary beside it "
                             f"(on the device: $OUT)")
    parser.add_argument("--prepare-carry", action="store_true",
                        help=f"fill the carried folder (--carry, default {CARRY}) for the next call: data files from "
                             f"--data-dir, the commit, --archive; then print the device command")
    parser.add_argument("--archive", default=None, help="with --prepare-carry: the archive that came back")
    parser.add_argument("--print-device-command", action="store_true",
                        help="print the command line of one device call, and exit")
    parser.add_argument("--device", default="cuda", help="cuda (default), cpu or auto; cpu only tests the steps")
    parser.add_argument("--max-minutes", type=float, default=9.0, help="time this invocation may take")
    parser.add_argument("--steps", nargs="+", default=["tests", "speed", "bert4rec"],
                        choices=["tests", "speed", "bert4rec"])
    parser.add_argument("--speed-datasets", nargs="+", default=list(SPEED_DATASETS))
    parser.add_argument("--speed-models", nargs="+", default=list(SPEED_MODELS))
    parser.add_argument("--speed-precisions", nargs="+", default=list(SPEED_PRECISIONS), choices=SPEED_PRECISIONS)
    parser.add_argument("--speed-batches", type=int, default=50, help="timed training batches per measurement")
    parser.add_argument("--train-datasets", nargs="+", default=list(TRAIN_DATASETS))
    parser.add_argument("--train-minutes", nargs="+", default=[], metavar="DATASET=MINUTES",
                        help="training budget per dataset (default: what remains of --device-minutes)")
    parser.add_argument("--device-minutes", type=float, default=DEVICE_MINUTES,
                        help="device time for the whole sequence of calls, which plans the training budget")
    parser.add_argument("--call-overhead-minutes", type=float, default=CALL_OVERHEAD_MINUTES,
                        help="device time of a call outside this program (machine start, transfers, install)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override for the BERT4Rec jobs and BERT4Rec's speed measurements, as run_all.py "
                             "--set (keep it the same across invocations: a changed setting does not resume)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads of the speed and training "
                                                                  "processes (default: torch's choice)")
    parser.add_argument("--progress", action="store_true", help="progress bars of the training runs")
    args = parser.parse_args(argv)
    args.argv, args.train_minutes = argv, parse_minutes(args.train_minutes)
    if args.carry and args.data_dir is None:
        args.data_dir = str(Path(args.carry) / gpu_carry.DATA_FOLDER)
    if not (args.out or args.print_device_command or args.prepare_carry):
        parser.error("--out is required: the output folder")
    return args


def print_device_command() -> None:
    print(f'device call: carry [\"{CARRY}\"], timeout_s 600, command ({len(DEVICE_COMMAND)} characters):')
    print(DEVICE_COMMAND)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.print_device_command:
        print_device_command()
        return 0
    if args.prepare_carry:
        datasets = [d for d in dict.fromkeys([*args.train_datasets, *args.speed_datasets])]
        gpu_carry.prepare_carry(ROOT / (args.carry or CARRY), ROOT, args.data_dir, datasets, args.archive, log)
        print_device_command()
        return 0
    started, deadline, out = datetime.now(timezone.utc), Deadline(args.max_minutes), Path(args.out)
    if args.carry:
        gpu_carry.unpack(Path(args.carry) / gpu_carry.ARCHIVE, out, log)
    out.mkdir(parents=True, exist_ok=True)
    set_aside_other_device(out, resolve_device(args.device).type)  # a clear error first if CUDA is absent
    log(f"output {out}, {args.max_minutes:g} min for this invocation, {len(invocations(out))} before it, done so "
        f"far: {sorted(p.name for p in (out / 'done').glob('*')) or 'nothing'}")
    try:
        run_pieces(out, args, deadline)
    finally:
        record_invocation(out, args, deadline, started)
        try:
            summary = summarize(out, args)
            write_json(out / gpu_carry.SUMMARY, summary)
        finally:
            if args.pack_to:
                gpu_carry.pack(out, Path(args.pack_to), log)
    for row in summary["targets"]:
        state = {True: "met", False: "NOT met", None: "not measured yet"}[row["met"]]
        log(f"target {row['target']} {row['bound']}: {row['value']} ({state})")
    if summary["finished"]:
        log(f"all done; {out / gpu_carry.SUMMARY} can be copied into results/reference/")
        return 0
    log("work is left: run the same command again (the output folder, or its archive, carries the work)")
    return MORE_WORK


def set_aside_other_device(out: Path, kind: str) -> None:
    """Move work done on another kind of device (a CPU rehearsal's archive carried to the GPU) out of the way,
    so that pieces done there are not taken as done here."""
    others = sorted({entry["device"] for entry in invocations(out) if not entry["device"].startswith(kind)})
    if others:
        aside = out.with_name(f"{out.name}-{others[0].split()[0].split(':')[0]}-{int(time.time())}")
        out.rename(aside)
        out.mkdir()
        log(f"carry: {out} held work done on {', '.join(others)}, not on {kind}: moved to {aside}; starting afresh")


def run_pieces(out: Path, args, deadline: Deadline) -> None:
    """Tests, then speed, then training, each only once the one before has nothing left for now."""
    finished = True
    if "tests" in args.steps and not is_done(out, "tests") and not given_up(out, "tests"):
        finished = run_tests(out, deadline)
        write_json(out / gpu_carry.SUMMARY, summarize(out, args))
    if finished and speed_pieces(args):
        finished = run_speed(out, args, deadline)
        write_json(out / gpu_carry.SUMMARY, summarize(out, args))
    if finished and "bert4rec" in args.steps:
        run_training(out, args, deadline)


if __name__ == "__main__":
    raise SystemExit(main())
