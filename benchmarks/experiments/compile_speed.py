"""Training speed under ``--compile`` (``torch.compile`` of the model's loss) against eager, interleaved:

    python -m benchmarks.experiments.compile_speed --data-dir DIR --threads 2 --rounds 3 --batches 20
    python -m benchmarks.experiments.compile_speed --data-dir DIR --device cuda --rounds 3 --batches 200

Each model of ``--models`` on ML-1m, built as the converge profile builds it, trains ``--batches`` batches of randomly
chosen users from the same initial weights once eagerly and once compiled, the order alternating between rounds so
that both see the same load (recorded before and after). Each measurement trains a fresh model over the timed users
twice, one epoch each: the first pass pays for compiling (dynamo's in-memory cache is emptied before it; inductor's
cache on disk, a fresh folder for the run, stays, so the first round compiles cold, as a user's first job does, and
later ones warm, as the jobs after it), the second is the steady state in which a long run spends its epochs. The
figures per round: training sequences per second in each mode's second pass, the ratio compiled / eager (above 1:
compiling is faster), and the seconds of compiling, the price paid once per job: how much longer the compiled first
pass took than its second, less the same excess of the eager passes (warm-up).

This measures ``--compile`` as it trains: with attention dropout on the CPU the compiled step takes PyTorch's plain
attention kernel, where the eager step recomputes attention slice by slice (``models.transformer_fast``), so the ratio
is of the two steps a user gets, not of inductor against the same kernels. The README's ``--compile`` row quotes the
file this writes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.experiments.speed_transformers import interleaved_rounds, write_report
from recbench.benchmarks.config import resolve
from recbench.benchmarks.device import resolve_device
from recbench.benchmarks.provenance import describe_device, git_commit
from recbench.benchmarks.trainer import Trainer, TrainRun
from recbench.datasets import load_dataset
from recbench.datasets.sequences import LeaveOneOutSplit
from recbench.models import model_class

ROOT = Path(__file__).resolve().parents[2]
MODES = ("eager", "compiled")


def two_passes(model_name: str, mode: str, data, timed, device: torch.device, seed: int) -> tuple[float, float, int]:
    """Seconds of the first and of the second pass over ``timed`` of a fresh model (the seed's weights) in ``mode``,
    and the training sequences of one pass."""
    config = resolve(model_name, "ml-1m", "converge", ("max_epochs=1", "warmup_steps=0", "max_steps=none"))
    torch.manual_seed(seed)
    model = model_class(model_name)(data.n_users, data.n_items, config.model)
    model.to(device)
    if mode == "compiled":
        torch._dynamo.reset()  # every measurement compiles afresh, and fresh models never reach the recompile limit
    run = TrainRun(seed=seed, progress=False, compile=mode == "compiled")
    first = Trainer(config.train, run).fit(model, timed, None).train_seconds
    second = Trainer(config.train, run).fit(model, timed, None).train_seconds
    return first, second, len(next(iter(model.training_examples(timed).values())))


def speed_rounds(args, data, train, device: torch.device) -> list[dict]:
    rng = np.random.default_rng(args.seed)
    results = []
    for model_name in args.models:
        batch = resolve(model_name, "ml-1m", "converge").train.batch_size
        timed = train.subset(np.sort(rng.choice(len(train), min(len(train), args.batches * batch), replace=False)))
        def passes(mode):  # called within this iteration: the closure sees this model
            return two_passes(model_name, mode, data, timed, device, args.seed)

        for number, order, measured, before, after in interleaved_rounds(args.rounds, MODES, passes):
            first = {mode: seconds[0] for mode, seconds in measured.items()}
            second = {mode: seconds[1] for mode, seconds in measured.items()}
            speed = {mode: rows / second[mode] for mode, (_, _, rows) in measured.items()}
            row = {"model": model_name, "round": number, "order": list(order),
                   "eager_sequences_per_s": round(speed["eager"], 1),
                   "compiled_sequences_per_s": round(speed["compiled"], 1),
                   "compiled_over_eager": round(speed["compiled"] / speed["eager"], 3),
                   "compile_seconds": round((first["compiled"] - second["compiled"])
                                            - (first["eager"] - second["eager"]), 1),
                   "pass_seconds": {mode: [round(first[mode], 2), round(second[mode], 2)] for mode in MODES},
                   "load_before": before, "load_after": after}
            results.append(row)
            print(f"{model_name:>9} round {row['round']}: eager {row['eager_sequences_per_s']:8.1f}, compiled "
                  f"{row['compiled_sequences_per_s']:8.1f} seq/s, ratio {row['compiled_over_eager']:.3f}, compiling "
                  f"{row['compile_seconds']:.1f} s (load {before} -> {row['load_after']})", flush=True)
    return results


def summary(results: list[dict], models) -> list[dict]:
    """Per model: the median ratio and its range, and the compile seconds of the first round (cold: a user's first
    job) apart from the median of the later ones (warm: inductor's disk cache filled), since a median over both
    describes neither."""
    out = []
    for model_name in models:
        rows = sorted((r for r in results if r["model"] == model_name), key=lambda r: r["round"])
        ratios = [r["compiled_over_eager"] for r in rows]
        warm = [r["compile_seconds"] for r in rows[1:]]
        out.append({"model": model_name, "median_compiled_over_eager": statistics.median(ratios),
                    "min": min(ratios), "max": max(ratios), "rounds": len(rows),
                    "cold_compile_seconds": rows[0]["compile_seconds"],
                    "median_warm_compile_seconds": statistics.median(warm) if warm else None})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None, help="folder with the dataset (else $RECBENCH_DATA_DIR)")
    parser.add_argument("--models", nargs="+", default=["bert4rec", "sasrec-ce"])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20, help="training batches in each timed pass")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="default: results/reference/compile-speed-<device type>.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile-speed-")  # round 1 compiles cold
    device = resolve_device(args.device)
    data = load_dataset("ml-1m", data_dir=args.data_dir, download=False, progress=False)
    train = LeaveOneOutSplit(data).train()
    results = speed_rounds(args, data, train, device)
    output = args.output or ROOT / "results" / "reference" / f"compile-speed-{device.type}.json"
    write_report(output, "compile_speed", argv, args.threads, results, summary=summary(results, args.models),
                 device=describe_device(device), torch=torch.__version__, commit=git_commit())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
