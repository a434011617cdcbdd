"""Parsers for the interaction files the suite reads, each in its exact upstream layout.

Every reader returns :class:`Interactions`: one row per rating, review or action, in file order; row ``r``
comes from line ``first_line + r``, so problems found after filtering can still point at the file. Text
layouts are parsed by pandas' C parser in one pass; only when that fails is the file scanned line by line,
to say exactly which line is wrong and why. Steam reviews are Python literals and are parsed one line at a
time with ``ast.literal_eval`` (never ``eval``), streaming.

Ids are kept as sortable integer keys: the original numeric ids where the file has them, else codes in
sorted order of the original strings. Preprocessing only sorts, counts and renumbers them.
"""
from __future__ import annotations

import ast
import csv
import datetime
import gzip
import io
import re
import zipfile
from array import array
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
import pandas as pd

from recbench.datasets.errors import DatasetFormatError
from recbench.datasets.progress import counted_reads


@dataclass(frozen=True)
class Interactions:
    """Raw interactions in file order (parallel ``int64`` arrays)."""

    where: str  # the file, and the zip member if any, for messages
    user: np.ndarray
    item: np.ndarray
    time: np.ndarray  # unix seconds, days for Steam, or the row index where the file has no time
    first_line: int  # 1-based line number of row 0; rows are consecutive lines (unless ``lines`` says)
    lines: np.ndarray | None = None  # the line of each row, where rows were left out (a log's min_rating)
    unit: str = "line"  # what a position counts: "line" of a file, or "row" of a DataFrame
    timed: bool = True  # whether ``time`` holds the interactions' times (False: only the file's order)

    def __len__(self) -> int:
        return len(self.user)

    def line(self, row: int) -> int:
        """Where row ``row`` came from, for messages."""
        return int(self.lines[row]) if self.lines is not None else self.first_line + row


@dataclass(frozen=True)
class TextLayout:
    """A delimited text layout: separator, columns and their kinds (``int``, ``float`` or ``str``)."""

    description: str
    sep: str
    columns: tuple[str, ...]
    kinds: tuple[str, ...]
    header: str | None = None


_RATING_COLUMNS = ("user", "item", "rating", "timestamp")
LAYOUTS = {
    # The BERT4Rec/SASRec authors' files: time-ordered within each user, no timestamps.
    "user-item": TextLayout("'user item' (two integer ids separated by one space)", " ",
                            ("user", "item"), ("int", "int")),
    # GroupLens ML-1M ratings.dat.
    "ml-dat": TextLayout("'UserID::MovieID::Rating::Timestamp' (integers)", "::",
                         _RATING_COLUMNS, ("int", "int", "float", "int")),
    # GroupLens ratings.csv of ML-20M and ml-latest(-small).
    "ml-csv": TextLayout("'userId,movieId,rating,timestamp' (integer ids, numeric rating, integer time)", ",",
                         _RATING_COLUMNS, ("int", "int", "float", "int"),
                         header="userId,movieId,rating,timestamp"),
    # GroupLens ML-100K u.data.
    "udata": TextLayout("'user<TAB>item<TAB>rating<TAB>timestamp' (integers)", "\t",
                        _RATING_COLUMNS, ("int", "int", "float", "int")),
    # Amazon 2014 ratings-only CSV (string ids, no header).
    "amazon-csv": TextLayout("'user,item,rating,timestamp' (string ids, numeric rating, integer time)", ",",
                             _RATING_COLUMNS, ("str", "str", "float", "int")),
}
STEAM_FORMAT = "steam-json"
FORMATS = (*LAYOUTS, STEAM_FORMAT)
# The formats whose files carry each interaction's time (the others only order each user's interactions).
TIMED_FORMATS = tuple(name for name, layout in LAYOUTS.items() if "timestamp" in layout.columns) + (STEAM_FORMAT,)

_KIND_PATTERNS = {
    "int": re.compile(r"[+-]?\d+"),
    "float": re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?"),
    "str": re.compile(r"\S+"),
}
_INT64_MIN, _INT64_MAX = -2 ** 63, 2 ** 63 - 1
_PANDAS_DTYPES = {"int": "int64", "float": "float64", "str": "object"}


def describe(path: Path, member: str | None) -> str:
    return f"{path}[{member}]" if member else str(path)


@contextmanager
def open_binary(path: Path, member: str | None = None, progress: str | None = None) -> Iterator[BinaryIO]:
    """Open a plain file, a ``.gz`` file, or ``member`` of a zip archive, for reading bytes.

    With ``progress`` (a description), a bar counts the bytes read (of the compressed file, for a ``.gz``)
    once reading has taken a few seconds."""
    path = Path(path)
    with ExitStack() as stack:
        def counted(stream: BinaryIO, total: int) -> BinaryIO:
            if progress is None:
                return stream
            return stack.enter_context(counted_reads(stream, total, progress))
        if member is not None:
            archive = stack.enter_context(zipfile.ZipFile(path))
            yield counted(stack.enter_context(archive.open(member)), archive.getinfo(member).file_size)
        elif path.suffix == ".gz":
            raw = counted(stack.enter_context(open(path, "rb")), path.stat().st_size)
            yield stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
        else:
            yield counted(stack.enter_context(open(path, "rb")), path.stat().st_size)


def find_member(path: Path, patterns: tuple[str, ...]) -> str | None:
    """The one data member of a zip archive that matches ``patterns`` (READMEs ignored), else ``None``."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile as exc:
        raise DatasetFormatError(str(path), None, "a zip archive", found=str(exc)) from exc
    matches = [name for name in names
               if not name.endswith("/") and not name.startswith("__MACOSX/")
               and not Path(name).name.upper().startswith("README")
               and any(fnmatch(name, pattern) for pattern in patterns)]
    if len(matches) > 1:
        raise DatasetFormatError(str(path), None, f"exactly one member matching {list(patterns)}",
                                 found=", ".join(matches))
    return matches[0] if matches else None


def read_interactions(path: str | Path, fmt: str, member: str | None = None,
                      progress: bool = False) -> Interactions:
    """Parse ``path`` (or its zip ``member``) in format ``fmt``, one of :data:`FORMATS`; with ``progress``, a
    bar shows the bytes read when reading takes more than a few seconds."""
    path = Path(path)
    where = describe(path, member)
    reading = f"reading {Path(member or path).name}" if progress else None
    if fmt not in FORMATS:
        raise DatasetFormatError(where, None, f"a known format ({', '.join(FORMATS)})", found=fmt)
    try:
        if fmt == STEAM_FORMAT:
            return _read_steam(path, member, where, reading)
        return _read_layout(path, member, where, LAYOUTS[fmt], reading)
    except FileNotFoundError:
        raise
    except (OSError, EOFError, zipfile.BadZipFile) as exc:  # e.g. a .gz that is not gzip, a broken zip
        raise DatasetFormatError(where, None, "a readable file (plain, .gz or zip)", found=str(exc)) from exc


def _read_layout(path: Path, member: str | None, where: str, layout: TextLayout,
                 progress: str | None) -> Interactions:
    with open_binary(path, member) as stream:
        first = stream.readline()
        second = stream.readline() if layout.header else b""
    if not first:
        raise DatasetFormatError(where, None, f"lines of {layout.description}", found="an empty file")
    header_lines = 1 if layout.header else 0
    if layout.header:
        if first.decode("latin-1").rstrip("\r\n") != layout.header:
            raise DatasetFormatError(where, 1, f"the header {layout.header!r}",
                                     found=first.decode("latin-1").rstrip("\r\n"))
        if not second:
            raise DatasetFormatError(where, None, f"data lines of {layout.description} after the header",
                                     found="only the header")
    frame, problem = _try_pandas(path, member, layout, header_lines, progress=progress)
    if frame is None:  # a bad line, or blank lines at the end of the file: find out which, line by line
        error, data_lines = _scan_lines(path, member, where, layout, header_lines)
        if error is not None:
            raise error
        if data_lines == 0:
            raise DatasetFormatError(where, None, f"lines of {layout.description}", found="only blank lines")
        frame, problem = _try_pandas(path, member, layout, header_lines, rows=data_lines)
        if frame is None:  # the line-by-line scan found no fault that pandas did: report pandas' words
            raise DatasetFormatError(where, None, f"lines of {layout.description}", found=problem)
    timed = "timestamp" in frame
    time = frame["timestamp"].to_numpy(np.int64) if timed else np.arange(len(frame), dtype=np.int64)
    return Interactions(where, _keys(frame["user"]), _keys(frame["item"]), time, 1 + header_lines, timed=timed)


def _try_pandas(path: Path, member: str | None, layout: TextLayout, header_lines: int,
                rows: int | None = None, progress: str | None = None) -> tuple[pd.DataFrame | None, str | None]:
    """The file (its first ``rows`` data lines) parsed by pandas, or ``(None, what pandas found)`` when a
    line breaks the layout."""
    try:
        frame = _parse_with_pandas(path, member, layout, header_lines, rows, progress)
    except (ValueError, OverflowError) as exc:  # pandas' ParserError is a ValueError
        return None, str(exc)
    # Integer columns cannot hold NaN (pandas raised above); a short line or empty field shows up here.
    if any(frame[name].isna().any() for name, kind in zip(layout.columns, layout.kinds) if kind != "int"):
        return None, "an empty field"
    return frame, None


def _parse_with_pandas(path: Path, member: str | None, layout: TextLayout, header_lines: int,
                       rows: int | None = None, progress: str | None = None) -> pd.DataFrame:
    options = dict(header=None, names=list(layout.columns), index_col=False, skiprows=header_lines, nrows=rows,
                   dtype={c: _PANDAS_DTYPES[k] for c, k in zip(layout.columns, layout.kinds)},
                   skip_blank_lines=False, keep_default_na=False, na_values=[""], quoting=csv.QUOTE_NONE,
                   encoding="latin-1", engine="c")
    with open_binary(path, member, progress) as stream:
        if len(layout.sep) == 1:
            return pd.read_csv(stream, sep=layout.sep, **options)
        # The C parser takes one-character separators only; '::' files are small (ML-1M: 24 MB).
        return pd.read_csv(io.BytesIO(stream.read().replace(layout.sep.encode(), b"\t")), sep="\t", **options)


def _keys(column: pd.Series) -> np.ndarray:
    """Integer ids as they are; strings as codes in their sorted order."""
    if column.dtype == object:
        codes, _ = pd.factorize(column, sort=True)
        return codes.astype(np.int64)
    return column.to_numpy(np.int64)


def _scan_lines(path: Path, member: str | None, where: str, layout: TextLayout,
                header_lines: int) -> tuple[DatasetFormatError | None, int]:
    """Scan the file line by line (only run after pandas failed): the first line that breaks ``layout``
    (``None`` if none), and the number of data lines before the blank lines that end the file, if any.

    Blank lines at the end of a file are accepted (editors and ``echo >>`` leave them); a blank line
    followed by more data is an error, since it would shift every later line number."""
    data_lines, blank_since = 0, None  # blank_since: line number of the first blank line of the current run
    with open_binary(path, member) as stream:
        text = io.TextIOWrapper(stream, encoding="latin-1", newline=None)
        for number, line in enumerate(text, 1):
            if number <= header_lines:
                continue
            line = line.rstrip("\n")
            if not line.strip():
                blank_since = number if blank_since is None else blank_since
                continue
            if blank_since is not None:
                return DatasetFormatError(where, blank_since, f"{len(layout.columns)} fields: "
                                          f"{layout.description} (blank lines only at the end of the file)",
                                          found=""), data_lines
            data_lines += 1
            fields = line.split(layout.sep)
            if len(fields) != len(layout.columns):
                return DatasetFormatError(where, number, f"{len(layout.columns)} fields: {layout.description}",
                                          found=line[:120]), data_lines
            for field, name, kind in zip(fields, layout.columns, layout.kinds):
                if not _valid(field, kind):
                    what = {"int": "a 64-bit integer", "float": "a number", "str": "a non-empty id"}[kind]
                    return DatasetFormatError(where, number, f"{what} for {name} in {layout.description}",
                                              found=line[:120]), data_lines
    return None, data_lines


def _valid(field: str, kind: str) -> bool:
    if not _KIND_PATTERNS[kind].fullmatch(field):
        return False
    return kind != "int" or _INT64_MIN <= int(field) <= _INT64_MAX


_STEAM_EXPECTED = "a Python-literal dict with string 'username', 'product_id' and 'date' ('YYYY-MM-DD')"


def _read_steam(path: Path, member: str | None, where: str, progress: str | None) -> Interactions:
    """Stream Kang & McAuley's ``steam_reviews.json.gz``: one Python-literal dict per line."""
    user_codes: dict[str, int] = {}
    item_codes: dict[str, int] = {}
    day_of: dict[str, int] = {}
    users, items, days = array("q"), array("q"), array("q")
    with open_binary(path, member, progress) as stream:
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace")
        number, blank_since = 0, None  # blank lines are accepted at the end of the file only
        for number, line in enumerate(text, 1):
            if not line.strip():
                blank_since = number if blank_since is None else blank_since
                continue
            if blank_since is not None:
                raise DatasetFormatError(where, blank_since, f"{_STEAM_EXPECTED} (blank lines only at the end "
                                         f"of the file)", found="")
            try:
                record = ast.literal_eval(line)
                user, item, date = record["username"], record["product_id"], record["date"]
                if not (isinstance(user, str) and isinstance(item, str) and isinstance(date, str)):
                    raise TypeError("non-string field")
                day = day_of.get(date)
                if day is None:
                    day = day_of[date] = datetime.date.fromisoformat(date).toordinal()
            except (ValueError, SyntaxError, TypeError, KeyError, MemoryError, RecursionError) as exc:
                raise DatasetFormatError(where, number, _STEAM_EXPECTED, found=line.strip()[:120]) from exc
            users.append(user_codes.setdefault(user, len(user_codes)))
            items.append(item_codes.setdefault(item, len(item_codes)))
            days.append(day)
    if not users:
        raise DatasetFormatError(where, None, f"lines of {_STEAM_EXPECTED}",
                                 found="an empty file" if not number else "only blank lines")
    return Interactions(where, _sorted_codes(user_codes, users), _sorted_codes(item_codes, items),
                        np.frombuffer(days, dtype=np.int64).copy(), 1)


def _sorted_codes(codes: dict[str, int], values: array) -> np.ndarray:
    """Turn first-appearance codes into codes in sorted order of the strings."""
    labels = np.array(list(codes), dtype=object)
    rank = np.empty(len(labels), dtype=np.int64)
    rank[np.argsort(labels, kind="stable")] = np.arange(len(labels), dtype=np.int64)
    return rank[np.frombuffer(values, dtype=np.int64)]
