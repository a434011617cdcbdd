"""``python -m reports RESULTS_DIR [--protocols ...] [--user N]``: regenerate a results folder's report.
``python -m reports --reproduction [--check]``: rewrite (or check) the generated blocks of README.md and
results/REPRODUCTION.md from ``results/reference/`` (``reports.reproduction``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recbench.reports.report import generate_report
from recbench.reports.reproduction import update_documents
from recbench.reports.results import ResultsError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports",
                                     description="Write tables/, figures/ and report.md into a results folder.")
    parser.add_argument("results_dir", type=Path, nargs="?",
                        help="a folder holding results.jsonl, e.g. results/<name>")
    parser.add_argument("--protocols", nargs="+", metavar="PROTOCOL",
                        help="ranking protocols to report (full, pop100, uni100); default: all present")
    parser.add_argument("--user", type=int,
                        help="draw only the attention maps stored for this user row (each attention file holds "
                             "one user); default: every main run's map")
    parser.add_argument("--alpha", type=float, default=0.01,
                        help="significance threshold of the paired tests (default: 0.01)")
    parser.add_argument("--reproduction", action="store_true",
                        help="instead of a folder's report: rewrite the tables and figures of README.md and "
                             "results/REPRODUCTION.md from the files of results/reference/")
    parser.add_argument("--check", action="store_true",
                        help="with --reproduction: write nothing, exit 1 naming each block that differs")
    args = parser.parse_args(argv)
    if args.reproduction or args.check:
        if args.results_dir is not None or not args.reproduction:
            parser.error("--reproduction takes no results folder (it reads results/reference/); --check needs it")
        return update_documents(check=args.check)
    if args.results_dir is None:
        parser.error("give a results folder (e.g. results/<name>) or --reproduction")
    try:
        report = generate_report(args.results_dir, protocols=args.protocols, user=args.user, alpha=args.alpha)
    except ResultsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
