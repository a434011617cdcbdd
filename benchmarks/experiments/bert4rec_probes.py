"""BERT4Rec on ML-1m under the converge profile, one setting changed at a time: which of the settings in which the
published replications differ from the authors' configuration closes the gap to Table 5 (models/fidelity.md,
"BERT4Rec"), and whether bf16 trains as well as fp32 on the same device.

    python -m benchmarks.experiments.bert4rec_probes --data-dir DATA --out DIR --device cuda --budget-s 450

Every probe is one ``run_all.py --profile converge`` of its own, in ``DIR/<probe>``, all of them at once (on a GPU
they share the device; on a CPU give each ``--threads``), each job stopped by early stopping or by ``--budget-s`` of
training, whichever comes first; a row records which. The probes (:data:`PROBES`):

- ``fp32`` and ``bf16``, seeds 0 and 1: the profile as it is, in each precision on the same device, for
  ``python -m benchmarks.experiments.precision_quality DIR/fp32 DIR/bf16``;
- ``dropout-0.1``, ``cloze-only``, ``positions-end``, ``no-overlap``, ``no-weight-decay``: the five settings of
  Klenitskiy & Vasilev's replication, which run together reached full NDCG@10 .1589 against the profile's .1445
  (``results/reference/bert4rec-probes-ml-1m.json``), one at a time;
- ``linear-decay``: the authors' learning rate decaying linearly to 0, with the horizon at 20,000 steps (the
  profile's seed 0 stopped at 19,964), instead of the profile's constant rate;
- ``copies-10``: the authors' ten Cloze copies of every window an epoch (masks still fresh), the patience shortened
  to 2 epochs so that it spans about as many steps as the profile's 20;
- ``wo-rc`` and ``wo-rc-lr1e-4``: Table 5's w/o RC at the ablation's dropout 0.1, at the profile's learning rate and
  at the authors' 1e-4. On 2 CPU cores the first gave every user one list by epoch 17 and ended with POP's figures
  (``results/reference/representation-collapse-ablation-ml-1m-dropout.json``) where the paper loses 2.4%; the
  second kept its users apart (``representation-collapse-probe-ml-1m-wo-rc-lr1e-4.json``) and climbed off the
  plateau, slowly (validation .0453 at epoch 51, stopped by hand), as the default does at 1e-4 (models/fidelity.md):
  how far the authors' rate trains it needs more epochs than a CPU gives it;
- ``batch-64``: batches of 64, Petrov & Macdonald's (RecSys 2022: pop100 NDCG@10 .4751, full .1516 on ML-1m), at the
  dropout 0.1 that validation chose for the profile's best row (.4618, two seeds): whether the batch closes the rest of
  the gap to Table 5's .4759. An epoch is twice the steps of batch 128, and the patience stays 20 epochs.

All probes start at once. On one H200 a single ML-1m run trained 87.5 steps a second alone and four at once 38.6 each
(``results/reference/gpu-h200-ablation/``), so a call whose runs are to reach early stopping takes one probe and seed.

The runs themselves (results folders, checkpoints, caches, logs) go to ``--work-dir``, a fresh temporary folder
unless named; ``DIR`` receives two files and nothing else, since a lent device returns at most 8 (its first call
here, which wrote the run folders into ``DIR``, brought back 8 of the logs and neither summary). ``DIR/probes.json``
holds, per probe and seed, what was changed, how the run ended (epochs, best epoch, steps, seconds) and its test
NDCG@10 and HR@10 under pop100 and full ranking, with the device, commit and command; ``DIR/probes.tar.gz`` holds each
run's ``results.jsonl``, ``manifest.jsonl`` and log. The same figures are printed, one line per probe and seed, so
that a command's output alone carries them. ``--dry-run`` checks every probe's settings against the profile and
prints the commands; ``--dataset synthetic --device cpu --budget-s 2`` rehearses the whole of it in a minute.
``--only`` picks probes, ``--seeds`` gives each of them these seeds, ``--dataset beauty`` asks the same of Beauty.

On a lent GPU (the device tool), with ``ml-1m_seq_full.txt.gz`` copied into the checkout's git-ignored ``.cache/gpu``
and that folder carried, one call of about 9 minutes (an offline ``pip install -e .`` there can end without error and
still leave ``recbench`` unimportable, hence the links, named as pyproject.toml maps the folders)::

    python -c "import recbench.benchmarks" 2>/dev/null || { mkdir -p /tmp/rb/recbench; for d in datasets models \
        benchmarks reports; do ln -sfn "$PWD/$d" /tmp/rb/recbench/$d; done; export PYTHONPATH=/tmp/rb; }; \
        python -m benchmarks.experiments.bert4rec_probes --data-dir .cache/gpu --out $OUT --budget-s 420
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from recbench.benchmarks.config import ConfigError, resolve
from recbench.benchmarks.provenance import git_commit
from recbench.benchmarks.store import now, write_atomic
from recbench.reports import names
from recbench.reports.results import ResultsError, load_results
from recbench.reports.stats import measure

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = ("pop100", "full")
METRICS = ("NDCG@10", "HR@10")


@dataclass(frozen=True)
class Probe:
    name: str
    what: str
    settings: tuple[str, ...]  # --set values, each prefixed with the model so that a misspelt field is refused
    seeds: tuple[int, ...] = (0,)


PROBES = (
    Probe("fp32", "the converge profile as it is, fp32", (), (0, 1)),
    Probe("bf16", "the converge profile under bf16 autocast", ("bert4rec:precision=\"bf16\"",), (0, 1)),
    Probe("dropout-0.1", "dropout and attention dropout 0.1 (authors 0.2)",
          ("bert4rec:dropout=0.1", "bert4rec:attention_dropout=0.1")),
    Probe("cloze-only", "Cloze masks only, no copy with the last item masked", ("bert4rec:mask_last=false",)),
    Probe("positions-end", "positions counted from the window's end", ("bert4rec:positions=\"end\"",)),
    Probe("no-overlap", "windows that do not overlap (authors: half-overlapping)", ("bert4rec:window_step=1.0",)),
    Probe("no-weight-decay", "AdamW without weight decay (authors 0.01)", ("bert4rec:weight_decay=0.0",)),
    Probe("linear-decay", "learning rate decaying linearly to 0 at step 20,000 after the warm-up",
          ("bert4rec:decay=\"linear\"", "bert4rec:max_steps=20000")),
    Probe("copies-10", "ten Cloze copies of every window an epoch, patience 2 epochs",
          ("bert4rec:dupe_factor=10", "bert4rec:patience=2")),
    Probe("wo-rc", "Table 5's w/o RC at dropout 0.1: no residual connection in any block",
          ("bert4rec:use_residual=false", "bert4rec:dropout=0.1", "bert4rec:attention_dropout=0.1")),
    Probe("wo-rc-lr1e-4", "w/o RC at dropout 0.1 and the authors' learning rate 1e-4",
          ("bert4rec:use_residual=false", "bert4rec:dropout=0.1", "bert4rec:attention_dropout=0.1",
           "bert4rec:lr=0.0001")),
    Probe("batch-64", "batches of 64 (Petrov & Macdonald) at dropout 0.1",
          ("bert4rec:batch_size=64", "bert4rec:dropout=0.1", "bert4rec:attention_dropout=0.1")),
)


def changed(probe: Probe, dataset: str) -> dict:
    """The settings ``probe`` changes, each with the profile's value and the probe's; refuses (ConfigError) a setting
    that does not exist or that leaves the profile's value as it is."""
    def flat(overrides) -> dict:
        resolved = resolve("bert4rec", dataset, "converge", overrides).as_dict()
        return {name: value for group in resolved.values() for name, value in group.items()}

    profile = flat([])
    for setting in probe.settings:
        if flat([setting]) == profile:
            raise ConfigError(f"probe {probe.name}: {setting} leaves the profile's value as it is")
    return {name: {"profile": profile[name], "probe": value} for name, value in flat(list(probe.settings)).items()
            if profile[name] != value}


def command(probe: Probe, args) -> list[str]:
    seeds = args.seeds or probe.seeds
    return [sys.executable, str(ROOT / "run_all.py"), "--datasets", args.dataset, "--models", "bert4rec", "--profile",
            "converge", "--seeds", *map(str, seeds), "--jobs", str(len(seeds)), "--device", args.device,
            "--threads", str(args.threads), *(["--data-dir", str(args.data_dir)] if args.data_dir else []),
            "--cache-dir", str(args.work_dir / "cache" / probe.name), "--output", str(args.work_dir / probe.name),
            "--resume", "--no-report", "--quiet", "--set", f"time_budget_s={args.budget_s}",
            *[part for setting in probe.settings for part in ("--set", setting)]]


def readout(probe: Probe, folder: Path) -> list[dict]:
    """One entry per seed the folder holds: how the run ended and its test metrics."""
    try:
        result = load_results(folder)
    except ResultsError as error:
        return [{"error": str(error)}]
    entries = []
    for seed in sorted(result.values("seed")):
        rows = {row.protocol: row for row in result.select(seed=seed)}
        full = rows.get("full") or next(iter(rows.values()))
        entry = {"seed": seed, **{name: full.get(name) for name in (
            "precision", "stopped_by", "epochs_run", "best_epoch", "steps_run", "train_seconds", "device")}}
        for protocol in PROTOCOLS:
            for metric in METRICS:
                entry[f"{protocol} {metric}"] = measure(rows[protocol], metric) if protocol in rows else None
        entries.append(entry)
    return entries


def summary(entry: dict) -> str:
    """One printed line for one seed's readout."""
    if "error" in entry:
        return entry["error"]
    ended = (f"seed {entry['seed']}, {entry['stopped_by']} after {entry['epochs_run']} epochs (best "
             f"{entry['best_epoch']}, {entry['steps_run']} steps, {round(entry['train_seconds'] or 0)} s, "
             f"{entry['precision']})")
    figures = ", ".join(f"{protocol} {metric} {entry[f'{protocol} {metric}']:.4f}" for protocol in PROTOCOLS
                        for metric in METRICS if entry[f"{protocol} {metric}"] is not None)
    return f"{ended}: {figures}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, help="the folder with the dataset's file (ml-1m_seq_full.txt.gz, "
                                                      "beauty.txt.gz)")
    parser.add_argument("--dataset", default="ml-1m", help="ml-1m (default), where the questions are, or beauty; "
                                                           "synthetic rehearses")
    parser.add_argument("--out", type=Path, required=True, help="where probes.json and probes.tar.gz are written")
    parser.add_argument("--work-dir", type=Path, help="the runs' folders (default: a new temporary folder)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=int, default=450, help="training seconds per job at most")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per job")
    parser.add_argument("--only", nargs="+", choices=[probe.name for probe in PROBES], metavar="PROBE")
    parser.add_argument("--seeds", nargs="+", type=int, metavar="N",
                        help="the seeds of every probe run (default: fp32 and bf16 0 and 1, the others 0)")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if not args.work_dir:
        args.work_dir = Path("WORK_DIR") if args.dry_run else Path(tempfile.mkdtemp(prefix="bert4rec-probes-"))
    probes = [probe for probe in PROBES if not args.only or probe.name in args.only]
    try:
        settings = {probe.name: changed(probe, args.dataset) for probe in probes}
    except ConfigError as error:
        sys.exit(str(error))
    commands = {probe.name: command(probe, args) for probe in probes}
    if args.dry_run:
        for probe in probes:
            print(f"{probe.name}: {settings[probe.name] or 'the profile'}\n  {' '.join(commands[probe.name][1:])}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    running = {}
    for probe in probes:
        log = open(args.work_dir / f"{probe.name}.log", "w")
        running[probe.name] = (subprocess.Popen(commands[probe.name], stdout=log, stderr=subprocess.STDOUT,
                                                cwd=ROOT), log)
    print(f"{len(running)} probes started in {args.work_dir}, each job stopped by early stopping or {args.budget_s} s "
          "of training")
    exits = {}
    for name, (process, log) in running.items():
        exits[name] = process.wait()
        log.close()
        print(f"{name}: exit {exits[name]}")
    loadavg = Path("/proc/loadavg")
    what = " ".join(__doc__.split("\n\n")[0].split()).replace("on ML-1m", f"on {names.dataset_name(args.dataset)}", 1)
    report = {"what": what, "dataset": args.dataset, "profile": "converge",
              "time": now(), "commit": git_commit(), "device": args.device, "budget_s": args.budget_s,
              "loadavg_after": loadavg.read_text().split()[:3] if loadavg.exists() else None,
              "probes": [{"name": probe.name, "what": probe.what, "changed": settings[probe.name],
                          "command": " ".join(["python", *commands[probe.name][1:]]), "exit": exits[probe.name],
                          "seeds": readout(probe, args.work_dir / probe.name)} for probe in probes]}
    write_atomic(args.out / "probes.json", json.dumps(report, indent=1) + "\n")
    with tarfile.open(args.out / "probes.tar.gz", "w:gz") as archive:
        for probe in probes:
            for name in ("results.jsonl", "manifest.jsonl"):
                if (args.work_dir / probe.name / name).exists():
                    archive.add(args.work_dir / probe.name / name, arcname=f"{probe.name}/{name}")
            archive.add(args.work_dir / f"{probe.name}.log", arcname=f"{probe.name}.log")
    for probe in report["probes"]:
        for entry in probe["seeds"]:
            print(f"{probe['name']}: {summary(entry)}")
    print(f"written: {args.out / 'probes.json'}, {args.out / 'probes.tar.gz'}")
    return 0 if not any(exits.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
