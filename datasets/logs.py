"""Interaction logs of the user's own: a CSV/TSV file or a pandas DataFrame, one interaction per row.

A log has a user column and an item column, and optionally a time column (numbers, e.g. unix seconds, or ISO 8601
dates) and a rating column. :class:`LogFormat` says which column holds what (by default the columns named
``user``, ``item``, ``time`` or ``timestamp``, and ``rating``) and which rows count: every row is implicit
feedback 1, as in the registry's datasets, unless ``min_rating`` keeps only the rows rated at least that. Then the
registry's preprocessing follows (``preprocess.py``: stable time sort within each user, so that rows of equal time,
or every row of a log without a time column, keep their order in the log; repeated pairs dropped; the k-core
filters ``min_item_interactions`` then ``min_user_interactions``; ids renumbered in sorted order). A file and a
DataFrame with the same rows give the same prepared data, hence the same content hash.

A file is read whole before anything is prepared, and every fault is one line naming the file, the line and the
column, and quoting the cell (``clicks.csv: line 7: expected a time (...) in column 'ts'; found 'yesterday'``); a
DataFrame's faults name its row.

On the command line a log is named by its path (its name is the file's stem: ``clicks`` for ``data/clicks.csv``)
or as ``NAME=PATH``, with ``--columns user=uid item=iid time=ts`` and ``--filters min_rating=4``
(:func:`log_format`).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from recbench.datasets.errors import DatasetFormatError, MissingDataError, unknown
from recbench.datasets.preprocess import Preprocessing
from recbench.datasets.readers import Interactions, open_binary
from recbench.datasets.registry import DATASET_NAMES

ROLES = ("user", "item", "time", "rating")
DEFAULT_COLUMNS = {"time": ("time", "timestamp"), "rating": ("rating",)}  # looked for when not named
FILTERS = ("min_rating", "min_item_interactions", "min_user_interactions")
LOG_SUFFIXES = (".csv", ".tsv", ".tab", ".txt", ".dat")
NAME = re.compile(r"[A-Za-z0-9_.+-]+")
_INTEGER = re.compile(r"[+-]?\d{1,18}")  # fits int64
_EXTRA = "\0more fields"  # the name of the column past the header's last


@dataclass(frozen=True)
class LogFormat:
    """Which column of a log holds what, and which rows count (module docstring)."""

    user: str = "user"
    item: str = "item"
    time: str | None = None  # None: "time" or "timestamp" if the log has one, else the order of its rows
    rating: str | None = None  # None: "rating" if the log has one (read when min_rating is set)
    sep: str | None = None  # a file's separator; None: tab for .tsv and .tab files, else a comma
    min_rating: float | None = None  # keep rows rated at least this; None: every row is an interaction
    min_item_interactions: int = 0  # the registry's default filters (preprocess.Preprocessing)
    min_user_interactions: int = 5

    def __post_init__(self):
        Preprocessing(self.min_item_interactions, self.min_user_interactions)  # checks the thresholds

    @property
    def preprocessing(self) -> Preprocessing:
        return Preprocessing(self.min_item_interactions, self.min_user_interactions)

    def describe(self) -> dict:
        """The format as recorded in a dataset's provenance and a prepared file's cache key."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class InteractionLog:
    """A log of the user's own: a file's path or a DataFrame, read as ``format`` says."""

    source: str | Path | pd.DataFrame
    format: LogFormat = LogFormat()


def log_format(columns: list[str] = (), filters: list[str] = ()) -> LogFormat:
    """The :class:`LogFormat` of ``--columns ROLE=COLUMN ...`` (roles user, item, time, rating; and sep=) and
    ``--filters NAME=VALUE ...`` (min_rating, min_item_interactions, min_user_interactions)."""
    values = {}
    for option, texts, keys, example in (("--columns", columns, (*ROLES, "sep"), "user=uid"),
                                         ("--filters", filters, FILTERS, "min_rating=4")):
        for text in texts:
            key, equals, value = text.partition("=")
            if not equals or not value:
                raise ValueError(f"{option} {text!r}: expected KEY=VALUE, e.g. {example}")
            if key not in keys:
                raise ValueError(f"{option} {text!r}: {unknown('key', key, keys)}")
            values[key] = _filter_value(option, text, key, value) if option == "--filters" else value
    if values.get("sep") in ("\\t", "tab"):
        values["sep"] = "\t"
    try:
        return LogFormat(**values)
    except ValueError as error:
        raise ValueError(f"--filters: {error}") from None


def _filter_value(option: str, text: str, key: str, value: str):
    try:
        return float(value) if key == "min_rating" else int(value)
    except ValueError:
        kind = "a number" if key == "min_rating" else "an integer"
        raise ValueError(f"{option} {text!r}: {key} must be {kind}") from None


def log_entries(entries: list[str], fmt: LogFormat) -> tuple[list[str], dict[str, InteractionLog]]:
    """``--datasets`` entries as dataset names, and the logs of the user's own among them by name: a registry
    name stays itself; ``NAME=PATH`` or a file's path (named by its stem) is a log."""
    names, logs = [], {}
    for entry in entries:
        if entry in DATASET_NAMES:
            names.append(entry)
            continue
        name, equals, path = entry.partition("=")
        if not equals:
            name, path = _stem(entry), entry
            if name is None:
                raise unknown("dataset", entry, [*DATASET_NAMES, "PATH.csv or NAME=PATH (a log of your own)"])
        check_log_name(name, path)
        if name in logs and Path(logs[name].source) != Path(path):
            raise ValueError(f"--datasets: two logs are named {name!r} ({logs[name].source}, {path}); name them, "
                             f"e.g. {name}2={path}")
        names.append(name)
        logs[name] = InteractionLog(Path(path), fmt)
    return names, logs


def check_log_name(name: str, source) -> None:
    """A log's name must not be a registry dataset's (its rows would pass for that dataset's) and must be fit
    for file names."""
    if name in DATASET_NAMES:
        raise ValueError(f"dataset name {name!r} (of {source}) is a registered dataset's; give the log another "
                         f"name, e.g. --datasets my-{name}={source}")
    if not NAME.fullmatch(name):
        raise ValueError(f"dataset name {name!r} (of {source}): use letters, digits and _ . + - only")


def _stem(entry: str) -> str | None:
    """A file's name without its suffixes (``clicks`` for ``data/clicks.csv.gz``) when ``entry`` names a file
    (it exists, has a path separator or a log's suffix), else None."""
    path = Path(entry)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    suffix = Path(name).suffix
    if not (path.exists() or "/" in entry or suffix in LOG_SUFFIXES):
        return None
    return name[:-len(suffix)] if suffix else name


# ------------------------------------------------------------------------------------------------ reading

def read_log(path: str | Path, fmt: LogFormat) -> Interactions:
    """A CSV/TSV log (plain or .gz) with a header line, read whole; every fault names the file, line and
    column."""
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(f"{path}: no such file")
    where, sep = str(path), fmt.sep or ("\t" if path.name.removesuffix(".gz").endswith((".tsv", ".tab")) else ",")
    try:
        with open_binary(path) as stream:  # utf-8-sig: a spreadsheet's byte-order mark is not part of a name
            header = next(csv.reader([io.TextIOWrapper(stream, encoding="utf-8-sig").readline()], delimiter=sep), [])
        if not any(header) or len(set(header)) < len(header):
            raise DatasetFormatError(where, 1, "a header line naming the columns, each once",
                                     found=sep.join(header) or "an empty line")
        _check_separator(header, sep, where)
        roles = _roles(fmt, header, where, f"the header (separator {sep!r})")
        with open_binary(path) as stream:  # one more column than the header names: it catches longer lines
            frame = pd.read_csv(stream, sep=sep, header=None, names=[*header, _EXTRA], skiprows=1, dtype=str,
                                keep_default_na=False, skip_blank_lines=False, index_col=False,
                                encoding="utf-8-sig", engine="c")[[*roles.values(), _EXTRA]]
    except pd.errors.ParserError as error:
        raise _parser_error(where, error, len(header)) from None
    except (UnicodeDecodeError, OSError, EOFError, zlib.error) as error:
        raise DatasetFormatError(where, None, "a readable UTF-8 text file (plain or .gz)", found=str(error)) from None
    frame, rows = _without_trailing_blank_rows(frame), _FileRows(path, 2)
    if not len(frame):
        raise DatasetFormatError(where, None, "lines of interactions after the header", found="none")
    longer = np.flatnonzero(frame[_EXTRA].to_numpy(dtype=object) != "")
    if len(longer):
        raise rows.fault(int(longer[0]), f"{len(header)} fields, as many as the header names")
    return _interactions(frame.drop(columns=_EXTRA), roles, fmt, rows)


def frame_interactions(frame: pd.DataFrame, fmt: LogFormat, name: str) -> Interactions:
    """A DataFrame's rows as interactions, in its row order; every fault names its row and column."""
    where = f"DataFrame {name!r}"
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"{where}: expected a pandas DataFrame, got {type(frame).__name__}")
    columns = {str(column): column for column in frame.columns}
    roles = _roles(fmt, list(columns), where, "its columns")
    if not len(frame):
        raise DatasetFormatError(where, None, "rows of interactions", found="none")
    chosen = frame[[columns[name] for name in roles.values()]].set_axis(list(roles.values()), axis=1)
    return _interactions(chosen.reset_index(drop=True), roles, fmt, _FrameRows(where))


def _check_separator(header: list[str], sep: str, where: str) -> None:
    """A header that is one column when split at ``sep`` but several at another separator (a ';'-separated file
    read with the comma) is an error that names the separator to give, not the columns to name."""
    other = next((s for s in (";", "\t", ",", "|") if s != sep and len(header) == 1 and s in header[0]), None)
    if other is not None:
        option = "sep=tab" if other == "\t" else f"sep={other}"
        raise ValueError(f"{where}: line 1: the header {header[0]!r} is one column when split at {sep!r}, but its "
                         f"names are separated by {other!r}; read the file with --columns '{option}'")


def _roles(fmt: LogFormat, columns: list[str], where: str, what: str) -> dict[str, str]:
    """Role -> column: the format's names, which must be present, and the optional roles' default names."""
    roles = {}
    for role in ROLES:
        named = getattr(fmt, role)
        if named is None:
            named = next((c for c in DEFAULT_COLUMNS.get(role, ()) if c in columns), None)
            if named is None:
                continue
        elif named not in columns:
            location = f"{where}: line 1" if what.startswith("the header") else where
            raise ValueError(f"{location}: no column {named!r} for the {role} in {what} ({', '.join(columns)}); "
                             f"name it with --columns {role}=COLUMN")
        roles[role] = named
    if fmt.min_rating is not None and "rating" not in roles:
        raise ValueError(f"{where}: min_rating={fmt.min_rating:g} needs a rating column; name it with --columns "
                         f"rating=COLUMN")
    if fmt.min_rating is None:
        roles.pop("rating", None)  # ratings are not read: every row counts
    return roles


def _without_trailing_blank_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Blank lines at the end of a file are accepted (editors leave them); a blank line before more data is a
    fault found later, with its line."""
    blank = (frame == "").all(axis=1).to_numpy()
    end = len(blank)
    while end and blank[end - 1]:
        end -= 1
    return frame.iloc[:end]


def _parser_error(where: str, error: Exception, fields: int) -> DatasetFormatError:
    found = re.search(r"Expected \d+ fields in line (\d+), saw (\d+)", str(error))
    if found is None:
        return DatasetFormatError(where, None, "a delimited text file", found=str(error).strip())
    return DatasetFormatError(where, int(found.group(1)), f"{fields} fields, as many as the header names",
                              found=f"{found.group(2)} fields")


class _FileRows:
    """Where row ``r`` of a file's frame is: line ``first_line + r``, shown with its text."""

    def __init__(self, path: Path, first_line: int):
        self.path, self.first_line, self.where, self.unit = path, first_line, str(path), "line"

    def error(self, row: int, column: pd.Series, expected: str) -> DatasetFormatError:
        """The fault of one cell, quoted: the cell says what is wrong, where the whole line would hide it."""
        return DatasetFormatError(self.where, self.first_line + row, f"{expected} in column {column.name!r}",
                                  found=str(column.iloc[row])[:120])

    def fault(self, row: int, expected: str) -> DatasetFormatError:
        line, found = self.first_line + row, ""
        with open_binary(self.path) as stream:
            for number, text in enumerate(io.TextIOWrapper(stream, encoding="utf-8", errors="replace"), 1):
                if number == line:
                    found = text.rstrip("\r\n")
                    break
        return DatasetFormatError(self.where, line, expected, found=found[:120])


class _FrameRows:
    """Where row ``r`` of a DataFrame is: its position (counted from 0)."""

    def __init__(self, where: str):
        self.where, self.first_line, self.unit = where, 0, "row"

    def error(self, row: int, column: pd.Series, expected: str) -> DatasetFormatError:
        """The fault of one cell, quoted unless it is missing (None, NaN)."""
        cell = column.iloc[row]
        return DatasetFormatError(self.where, row, f"{expected} in column {column.name!r}",
                                  found=None if pd.isna(cell) else str(cell)[:120], unit="row")


def _interactions(frame: pd.DataFrame, roles: dict, fmt: LogFormat, rows) -> Interactions:
    """Validated, typed interactions of ``frame`` (one column per role), rows below ``min_rating`` left out."""
    user = _ids(frame[roles["user"]], "a user id", rows)
    item = _ids(frame[roles["item"]], "an item id", rows)
    time = _times(frame[roles["time"]], rows) if "time" in roles else np.arange(len(frame), dtype=np.int64)
    lines = rows.first_line + np.arange(len(frame), dtype=np.int64)
    if "rating" in roles:
        keep = _numbers(frame[roles["rating"]], "a numeric rating", rows) >= fmt.min_rating
        user, item, time, lines = user[keep], item[keep], time[keep], lines[keep]
        if not len(user):
            raise DatasetFormatError(rows.where, None, f"rows rated at least min_rating={fmt.min_rating:g}",
                                     found="none")
    return Interactions(rows.where, user, item, time, rows.first_line, lines=lines, unit=rows.unit,
                        timed="time" in roles)


def _ids(column: pd.Series, what: str, rows) -> np.ndarray:
    """Integer ids as they are, any other ids as codes in sorted order of their text, as the registry's readers
    keep them; the same values give the same codes from a file and from a DataFrame."""
    if pd.api.types.is_integer_dtype(column.dtype) and not pd.api.types.is_bool_dtype(column.dtype):
        return column.to_numpy(np.int64)
    text = column.astype(str).str.strip().to_numpy(dtype=object)
    missing = column.isna().to_numpy() | (text == "")
    if missing.any():
        raise rows.error(int(np.flatnonzero(missing)[0]), column, what)
    if pd.api.types.is_float_dtype(column.dtype):
        values = column.to_numpy(np.float64)
        if np.all(values == np.round(values)):
            return values.astype(np.int64)
        text = column.astype(str).to_numpy(dtype=object)
    integers = pd.Series(text).str.fullmatch(_INTEGER.pattern).to_numpy(dtype=bool)
    if integers.all():
        return text.astype(np.int64)
    return pd.factorize(text, sort=True)[0].astype(np.int64)


def _numbers(column: pd.Series, what: str, rows) -> np.ndarray:
    values = pd.to_numeric(column, errors="coerce").to_numpy(np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        raise rows.error(int(np.flatnonzero(bad)[0]), column, what)
    return values


def _times(column: pd.Series, rows) -> np.ndarray:
    """An order key per row: integer times as they are, other numbers by rank, dates and times in nanoseconds
    (UTC; a time without a zone is taken as UTC). Only the order matters: preprocessing sorts by it."""
    what = "a time (a number, e.g. unix seconds, or an ISO 8601 date)"
    if pd.api.types.is_datetime64_any_dtype(column.dtype):
        stamps = pd.to_datetime(column, utc=True)
        if stamps.isna().any():
            raise rows.error(int(np.flatnonzero(stamps.isna().to_numpy())[0]), column, what)
        return _nanoseconds(stamps)
    numbers = pd.to_numeric(column, errors="coerce").to_numpy(np.float64)
    if np.isfinite(numbers).all():
        integers = numbers == np.round(numbers)
        return (numbers.astype(np.int64) if integers.all() and np.abs(numbers).max() < 2 ** 53
                else np.unique(numbers, return_inverse=True)[1].astype(np.int64))
    if pd.api.types.is_numeric_dtype(column.dtype) or np.isfinite(numbers[0]):  # a column of numbers, but not all
        raise rows.error(int(np.flatnonzero(~np.isfinite(numbers))[0]), column, what)
    stamps = pd.to_datetime(column.astype(str), utc=True, errors="coerce", format="ISO8601")
    if stamps.isna().any():
        raise rows.error(int(np.flatnonzero(stamps.isna().to_numpy())[0]), column, what)
    return _nanoseconds(stamps)


def _nanoseconds(stamps: pd.Series) -> np.ndarray:
    """UTC times as int64 nanoseconds, whatever resolution pandas parsed them in."""
    return stamps.dt.tz_convert(None).to_numpy("datetime64[ns]").astype(np.int64)
