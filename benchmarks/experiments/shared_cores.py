"""What a CPU run loses when another process takes one of the cores its torch threads run on.

    python -m benchmarks.experiments.shared_cores --data-dir DIR                  # BERT4Rec on ML-1m, 2 threads
    python -m benchmarks.experiments.shared_cores --data-dir DIR --model sasrec --rounds 3

The model's training speed is measured as ``speed_transformers`` measures it (one fresh process each, ``--batches``
timed batches of the paper's ML-1m shape) with ``--threads`` threads, alone and beside a competitor: a process that
keeps one core busy with a one-thread torch matrix product, as a second run started with ``--threads 1`` would. The
two conditions alternate (alone, beside, alone, ...) so that a change of load hits both alike, and the load average
is recorded with each. torch's CPU threads meet at the end of every operation; when one of them waits for a core,
the others wait for it, which is why the suite warns, before it trains, when a run's threads do not fit beside the
cores other processes keep busy (``benchmarks.execution.shared_cores_warning``). The figures go to
``results/reference/shared-cores-cpu.json``.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from benchmarks.experiments.speed_transformers import ROOT, load_average, measure_in_fresh_process, write_report

# One core kept busy by a one-thread torch process, as a second training run would keep it.
COMPETITOR = ("import torch\ntorch.set_num_threads(1)\nx = torch.randn(384, 384)\n"
              "while True:\n    x = torch.tanh(x @ x)\n")


def timed(model: str, dataset: str, batches: int, data_dir: str, threads: int) -> dict:
    return measure_in_fresh_process(model, dataset, batches, "cpu", data_dir, generated=False, threads=threads)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert4rec")
    parser.add_argument("--dataset", default="ml-1m")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "results" / "reference" / "shared-cores-cpu.json"))
    args = parser.parse_args(argv)
    timed(args.model, args.dataset, 1, args.data_dir, args.threads)  # prepares the data's cache first
    results = []
    for round_ in range(args.rounds):
        for beside in (False, True):
            competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR]) if beside else None
            try:
                row = timed(args.model, args.dataset, args.batches, args.data_dir, args.threads)
            finally:
                if competitor:
                    competitor.kill()
                    competitor.wait()
            row.update(round=round_, beside_a_busy_core=beside)
            results.append(row)
            print(f"round {round_}, {'beside a busy core' if beside else 'alone':>18}: "
                  f"{row['train_steps_per_s']:.3g} steps/s, {row['train_sequences_per_s']:.1f} sequences/s "
                  f"(load {row['load_average']})", flush=True)
    alone = statistics.median(r["train_sequences_per_s"] for r in results if not r["beside_a_busy_core"])
    beside = statistics.median(r["train_sequences_per_s"] for r in results if r["beside_a_busy_core"])
    print(f"{args.model} on {args.dataset}, {args.threads} threads: {alone:.1f} sequences/s alone, {beside:.1f} "
          f"beside one busy core: {alone / beside:.1f} times as long; load at the end {load_average()}")
    write_report(args.output, "shared_cores", argv, args.threads, results,
                 median_sequences_per_s_alone=alone, median_sequences_per_s_beside_a_busy_core=beside,
                 slowdown=round(alone / beside, 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
