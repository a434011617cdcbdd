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
# The setting each table's numbers were measured at (paper §4.3, §4.5, Table 3's caption), for every comparison to
# say which published row it used.
TABLE_SETTINGS = {"Table 2": "best settings", "Table 3": "d = 256", "Table 4": "d = 64", "Table 5": "d = 64"}


@dataclass(frozen=True)
class Published:
    table: str  # the paper's table, e.g. "Table 2"
    dataset: str
    model: str
    variant: str | None  # the row's setting within its table: Table 5's label, Table 4's "N=50"; None otherwise
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


# Paper Table 1: each dataset's default N and ρ, where Table 4's column and Table 5's default row were measured.
PAPER_DEFAULTS = {"beauty": {"max_len": 50, "mask_proportion": 0.6}, "steam": {"max_len": 50, "mask_proportion": 0.4},
                  "ml-1m": {"max_len": 200, "mask_proportion": 0.2},
                  "ml-20m": {"max_len": 200, "mask_proportion": 0.2}}


def _value(published: list[Published], table: str, dataset: str, model: str, variant: str | None,
           metric: str) -> float | None:
    return next((e.value for e in published if (e.table, e.dataset, e.model, e.variant, e.metric)
                 == (table, dataset, model, variant, metric)), None)


def default_row(published: list[Published], dataset: str, model: str, metric: str) -> tuple[float | None, str]:
    """BERT4Rec's default configuration on ``dataset`` (d = 64, the dataset's N and ρ) as published, with where it
    comes from: Table 5's default row, which gives NDCG@10 only, else Table 4's column at the dataset's N, the same
    configuration (its NDCG@10 equals Table 5's default row's on both datasets Table 4 covers), which gives HR@10
    too. (None, "") where neither has ``metric``."""
    value = _value(published, "Table 5", dataset, model, "default", metric)
    if value is not None:
        return value, "Table 5 (default)"
    column = default_column(dataset)
    value = _value(published, "Table 4", dataset, model, column, metric) if column else None
    return (value, f"Table 4 ({column})") if value is not None else (None, "")


def default_column(dataset: str) -> str | None:
    """Table 4's column of the dataset's default N ("N=200"), where Table 5's default row was measured."""
    defaults = PAPER_DEFAULTS.get(dataset)
    return f"N={defaults['max_len']}" if defaults else None


def sweep_points(published: list[Published], param: str, dataset: str, model: str,
                 metric: str) -> list[tuple[float, float, str]]:
    """The paper's values on a sensitivity sweep's axis, as (x, value, source): Table 4's N for BERT4Rec; the
    default configuration (d = 64, the dataset's N and ρ: Table 5's default row, or Table 4's column at that N)
    on the d and ρ axes; Table 3's SASRec and BERT4Rec at d = 256. Figs. 3 and 4 are drawn, not tabulated, in the
    paper: their other points are not known."""
    points = []
    defaults = PAPER_DEFAULTS.get(dataset)
    default = default_row(published, dataset, model, metric)[0] if model == "bert4rec" and defaults else None
    if param == "max_len" and model == "bert4rec":
        points += [(float(e.variant[2:]), e.value, "Table 4") for e in published
                   if (e.table, e.dataset, e.model, e.metric) == ("Table 4", dataset, model, metric)]
    if param == "hidden":
        if default is not None:
            points.append((64.0, default, "default row"))
        at_256 = _value(published, "Table 3", dataset, model, None, metric)
        if at_256 is not None:
            points.append((256.0, at_256, "Table 3"))
    if param == "mask_proportion" and default is not None:
        points.append((defaults["mask_proportion"], default, "default row"))
    return points
