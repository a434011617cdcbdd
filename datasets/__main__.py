"""``python -m datasets [NAME ...]``: prepare datasets and print their Table 1 statistics.

``--help`` lists every dataset with the files it accepts in the data directory and their download addresses.
"""
from __future__ import annotations

import argparse
import time

from recbench.datasets.loader import CACHE_DIR_ENV, DATA_DIR_ENV, load_dataset
from recbench.datasets.registry import DATASET_NAMES, REGISTRY, DatasetSpec


def _accepted_files() -> str:
    lines = ["datasets and the files accepted in the data directory (tried top to bottom):"]
    for name, spec in REGISTRY.items():
        lines.append(f"  {name}: {spec.description}")
        if isinstance(spec, DatasetSpec):
            lines += [f"      {line}" for line in spec.accepted_files()]
        else:
            lines.append(f"      generated: {spec.params}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m datasets", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=_accepted_files())
    parser.add_argument("names", nargs="*", default=["synthetic"], choices=DATASET_NAMES, metavar="NAME",
                        help="datasets to prepare (default: synthetic)")
    parser.add_argument("--data-dir", help=f"folder with local dataset files (else ${DATA_DIR_ENV})")
    parser.add_argument("--cache-dir", help=f"where prepared datasets and downloads go (else ${CACHE_DIR_ENV}, "
                                            "else ~/.cache/recbench)")
    parser.add_argument("--source", default="auto", help="auto, authors, sequences or raw (default: auto)")
    parser.add_argument("--no-download", action="store_true", help="never use the network")
    args = parser.parse_args(argv)

    print("| dataset | source | users | items | actions | avg len | density | avg len* | density* | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.names:
        started = time.perf_counter()
        data = load_dataset(name, args.data_dir, args.cache_dir, source=args.source,
                            download=not args.no_download)
        seconds = time.perf_counter() - started
        whole, paper = data.stats(), data.stats(holdout=2)
        print(f"| {name} | {data.provenance.get('source')} | {whole['users']:,} | {whole['items']:,} | "
              f"{whole['actions']:,} | {whole['avg_length']:.1f} | {100 * whole['density']:.2f}% | "
              f"{paper['avg_length']:.1f} | {100 * paper['density']:.2f}% | {seconds:.2f} |")
    print("\n* without each user's last two items (the variant of Table 1's ML-1m row)")


if __name__ == "__main__":
    main()
