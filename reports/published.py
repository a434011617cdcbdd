"""The paper's published numbers (``reports/published.csv``), the one place this package holds them.

Lines starting with ``# source:`` name where the numbers come from; that text travels into the comparison
table's notes. Other ``#`` lines are comments.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

PUBLISHED_CSV = Path(__file__).resolve().parent / "published.csv"
# The paper measured everything with popularity-sampled negatives; only such results are comparable.
PUBLISHED_PROTOCOL = "pop100"


@dataclass(frozen=True)
class Published:
    table: str  # the paper's table, e.g. "Table 2"
    dataset: str
    model: str
    variant: str | None  # ablation row label (Table 5), None for Table 2
    metric: str
    value: float


def load_published(path: Path = PUBLISHED_CSV) -> tuple[list[Published], str]:
    """The published values and the source text from the file's comment header."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    source = " ".join(line[len("# source:"):].strip() for line in lines if line.startswith("# source:"))
    data = [(number, line) for number, line in enumerate(lines, start=1)
            if line.strip() and not line.startswith("#")]
    header = next(csv.reader([data[0][1]]))
    entries = []
    for number, line in data[1:]:
        record = dict(zip(header, next(csv.reader([line]))))
        try:
            entries.append(Published(record["table"], record["dataset"], record["model"],
                                     record["variant"] or None, record["metric"], float(record["value"])))
        except (KeyError, ValueError) as error:
            raise ValueError(f"{path}, line {number}: {error!r}; expected columns {header}") from None
    return entries, source
