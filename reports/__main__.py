"""``python -m reports RESULTS_DIR [--protocols ...] [--user N]``: regenerate a results folder's report."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recbench.reports.report import generate_report
from recbench.reports.results import ResultsError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports",
                                     description="Write tables/, figures/ and report.md into a results folder.")
    parser.add_argument("results_dir", type=Path, help="a folder holding results.jsonl, e.g. results/<name>")
    parser.add_argument("--protocols", nargs="+", metavar="PROTOCOL",
                        help="ranking protocols to report (full, pop100, uni100); default: all present")
    parser.add_argument("--user", type=int,
                        help="draw only the attention maps stored for this user row (each attention file holds "
                             "one user); default: every main run's map")
    parser.add_argument("--alpha", type=float, default=0.01,
                        help="significance threshold of the paired tests (default: 0.01)")
    args = parser.parse_args(argv)
    try:
        report = generate_report(args.results_dir, protocols=args.protocols, user=args.user, alpha=args.alpha)
    except ResultsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
