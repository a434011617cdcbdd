"""Training speed in bf16 against fp32 on this machine, interleaved, and where a BERT4Rec step's time goes:

    python -m benchmarks.experiments.precision_speed --data-dir DIR --threads 2 --rounds 3 --batches 6
    python -m benchmarks.experiments.precision_speed --data-dir DIR --profile-step    # one step, by operator
    python -m benchmarks.experiments.precision_speed --data-dir DIR --profile-step --set heads=8   # a Table 5 variant
    python -m benchmarks.experiments.precision_speed --data-dir DIR --profile-step --dataset beauty

Each (model, d) on ML-1m under the converge profile (BERT4Rec: one fresh Cloze copy per window; SASRec-CE: its
training sequences) is timed in rounds; a round trains ``--batches`` batches of randomly chosen users from the same
initial weights once in each precision, the order alternating between rounds, so that both precisions see the
same machine load. The figure per round is training sequences per second and the ratio bf16 / fp32 (above 1:
bf16 is faster), with the load average before and after. bf16 here is the trainer's ``precision=bf16``: autocast
to bf16 where the CPU has native bf16 (``benchmarks.precision.native_bf16``); the loss's softmax stays in fp32.

``--profile-step`` times the phases of BERT4Rec's training step apart (Cloze inputs and encoder, output layer and
softmax loss, backward, optimiser) on one batch of 128 windows, and lists the operators that take the most CPU
time under ``torch.profiler``, so that speed work goes where the time is; ``--set`` profiles another setting of
the model, such as one of Table 5's variants (the ablation's longest jobs are h = 8 and L = 4), and ``--dataset``
another dataset with its own settings (Beauty: N = 50, 54k items, ρ = 0.6).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.experiments.speed_transformers import interleaved_rounds, load_average, write_report
from recbench.benchmarks.config import resolve
from recbench.benchmarks.device import fused_adam
from recbench.benchmarks.precision import native_bf16
from recbench.benchmarks.provenance import git_commit
from recbench.benchmarks.trainer import Trainer, TrainRun
from recbench.datasets import load_dataset
from recbench.datasets.sequences import PAD, LeaveOneOutSplit
from recbench.models import model_class
from recbench.models.transformer_fast import softmax_cross_entropy

ROOT = Path(__file__).resolve().parents[2]
CASES = (("bert4rec", 64), ("bert4rec", 256), ("sasrec-ce", 64), ("sasrec-ce", 256))
HEADS = {64: 2, 256: 8}  # BERT4Rec §4.3: 32 dimensions per head; SASRec-CE keeps the same shape for comparison


def timed_fit(model_name: str, hidden: int, precision: str, data, timed, seed: int) -> tuple[float, int]:
    """Seconds and training sequences of one pass over ``timed`` in ``precision``, from the seed's weights."""
    overrides = (f"hidden={hidden}", f"heads={HEADS[hidden]}", f"precision={precision}", "max_epochs=1",
                 "warmup_steps=0", "max_steps=none")
    config = resolve(model_name, "ml-1m", "converge", overrides)
    torch.manual_seed(seed)
    model = model_class(model_name)(data.n_users, data.n_items, config.model)
    run = TrainRun(seed=seed, progress=False)
    warm = timed.subset(np.arange(min(len(timed), config.train.batch_size)))
    Trainer(config.train, run).fit(model, warm, None)  # kernels and allocator warm-up
    rows = len(next(iter(model.training_examples(timed).values())))
    report = Trainer(config.train, run).fit(model, timed, None)
    return report.train_seconds, rows


def speed_rounds(args, data, train) -> list[dict]:
    rng = np.random.default_rng(args.seed)
    results = []
    for model_name, hidden in CASES:
        batch = resolve(model_name, "ml-1m", "converge").train.batch_size
        timed = train.subset(np.sort(rng.choice(len(train), args.batches * batch, replace=False)))
        def fit(precision):  # called within this iteration: the closure sees this case
            return timed_fit(model_name, hidden, precision, data, timed, args.seed)

        for number, order, measured, before, after in interleaved_rounds(args.rounds, ("fp32", "bf16"), fit):
            speed = {precision: rows / seconds for precision, (seconds, rows) in measured.items()}
            row = {"model": model_name, "hidden": hidden, "round": number, "order": list(order),
                   "fp32_sequences_per_s": round(speed["fp32"], 1), "bf16_sequences_per_s": round(speed["bf16"], 1),
                   "bf16_over_fp32": round(speed["bf16"] / speed["fp32"], 3), "load_before": before,
                   "load_after": after}
            results.append(row)
            print(f"{model_name:>9} d={hidden:<3} round {number}: fp32 {row['fp32_sequences_per_s']:6.1f}, "
                  f"bf16 {row['bf16_sequences_per_s']:6.1f} seq/s, ratio {row['bf16_over_fp32']:.3f} "
                  f"(load {before} -> {after})", flush=True)
    return results


def summary(results: list[dict]) -> list[dict]:
    """The median ratio and its range per (model, d)."""
    out = []
    for model_name, hidden in CASES:
        ratios = [r["bf16_over_fp32"] for r in results if r["model"] == model_name and r["hidden"] == hidden]
        if ratios:
            out.append({"model": model_name, "hidden": hidden, "median_bf16_over_fp32": statistics.median(ratios),
                        "min": min(ratios), "max": max(ratios), "rounds": len(ratios)})
    return out


PHASES = ("inputs and encoder", "output layer and softmax loss", "backward", "optimizer")


def phase_seconds(model, batch: dict, optimizer, generator, steps: int) -> dict:
    """Seconds per step in each of :data:`PHASES` of a BERT4Rec training step, measured apart: the Cloze inputs
    and the encoder's forward, the output layer and softmax loss (eq. 7-8), the backward pass, the optimiser."""
    totals = dict.fromkeys(PHASES, 0.0)
    for _ in range(steps):
        laps = [time.perf_counter()]
        items, masked, inputs = model.masked_inputs(batch, generator)
        hidden, _ = model.encoder(inputs)
        laps.append(time.perf_counter())
        weight, bias, offset = model.softmax_classes()
        loss = softmax_cross_entropy(model.transform(hidden[masked[items != PAD]]), weight, items[masked] - offset,
                                     bias)
        laps.append(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        laps.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        laps.append(time.perf_counter())
        for name, begin, end in zip(PHASES, laps, laps[1:]):
            totals[name] += end - begin
    return {name: round(seconds / steps, 4) for name, seconds in totals.items()}


def profile_step(args, data, train) -> dict:
    """Where BERT4Rec's training step (d = 64, ``args.dataset``, converge profile, fp32, with ``args.set``) spends
    its time: seconds per phase (:func:`phase_seconds`) and the operators with the most self CPU time over
    ``args.batches`` steps."""
    config = resolve("bert4rec", args.dataset, "converge", ("max_epochs=1", "warmup_steps=0", *args.set))
    torch.manual_seed(args.seed)
    model = model_class("bert4rec")(data.n_users, data.n_items, config.model)
    examples = model.training_examples(train)
    rows = torch.from_numpy(np.random.default_rng(args.seed).choice(len(examples["window"]),
                                                                    config.train.batch_size, replace=False))
    batch = {key: value[rows] for key, value in examples.items()}
    optimizer = torch.optim.AdamW(model.parameter_groups(), lr=config.train.lr, eps=config.train.eps,
                                  fused=fused_adam(model.device))  # as the trainer's
    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    phase_seconds(model, batch, optimizer, generator, 1)  # warm-up
    phases = phase_seconds(model, batch, optimizer, generator, args.batches)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        phase_seconds(model, batch, optimizer, generator, args.batches)
    events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    top = [{"operator": e.key, "self_cpu_ms_per_step": round(e.self_cpu_time_total / 1000 / args.batches, 2),
            "share": round(e.self_cpu_time_total / total, 3), "calls_per_step": e.count // args.batches}
           for e in events[:20]]
    step = sum(phases.values())
    for name, seconds in phases.items():
        print(f"{seconds / step:6.1%} {seconds * 1000:8.1f} ms  {name}")
    for row in top:
        print(f"{row['share']:6.1%} {row['self_cpu_ms_per_step']:8.1f} ms {row['calls_per_step']:4d}x  "
              f"{row['operator']}")
    return {"dataset": args.dataset, "steps": args.batches, "batch_size": config.train.batch_size,
            "settings": list(args.set), "seconds_per_step": round(step, 4),
            "phase_seconds_per_step": phases, "top_operators": top, "load_average": load_average()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None, help="folder with the dataset (else $RECBENCH_DATA_DIR)")
    parser.add_argument("--dataset", default="ml-1m", help="with --profile-step: the dataset whose BERT4Rec step "
                                                           "is profiled (the speed rounds time ML-1m)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=6, help="timed training batches per measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile-step", action="store_true", help="profile BERT4Rec's steps instead")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="with --profile-step: a BERT4Rec setting to profile instead of the profile's")
    parser.add_argument("--output", default=None, help="default: results/reference/precision-speed-cpu.json "
                                                       "(or step-profile-bert4rec-cpu.json)")
    args = parser.parse_args(argv)
    if args.set and not args.profile_step:
        parser.error("--set goes with --profile-step (the speed rounds time the profile's own settings)")
    if args.dataset != "ml-1m" and not args.profile_step:
        parser.error("--dataset goes with --profile-step (the speed rounds time ML-1m)")
    torch.set_num_threads(args.threads)
    data = load_dataset(args.dataset, data_dir=args.data_dir, download=False, progress=False)
    train = LeaveOneOutSplit(data).train()
    extra = {"commit": git_commit(), "native_bf16": native_bf16(torch.device("cpu"))}
    if args.profile_step:
        output = args.output or ROOT / "results" / "reference" / "step-profile-bert4rec-cpu.json"
        write_report(output, "precision_speed", argv, args.threads, [profile_step(args, data, train)], **extra)
        return 0
    results = speed_rounds(args, data, train)
    output = args.output or ROOT / "results" / "reference" / "precision-speed-cpu.json"
    write_report(output, "precision_speed", argv, args.threads, results, summary=summary(results), **extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
