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
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from datasets.errors import DatasetFormatError


@dataclass(frozen=True)
class Interactions:
    """Raw interactions in file order (parallel ``int64`` arrays)."""

    where: str  # the file, and the zip member if any, for messages
    user: np.ndarray
    item: np.ndarray
    time: np.ndarray  # unix seconds, days for Steam, or the row index where the file has no time
    first_line: int  # 1-based line number of row 0; rows are consecutive lines

    def __len__(self) -> int:
        return len(self.user)


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
def open_binary(path: Path, member: str | None = None) -> Iterator[BinaryIO]:
    """Open a plain file, a ``.gz`` file, or ``member`` of a zip archive, for reading bytes."""
    path = Path(path)
    if member is not None:
        with zipfile.ZipFile(path) as archive, archive.open(member) as stream:
            yield stream
    elif path.suffix == ".gz":
        with gzip.open(path, "rb") as stream:
            yield stream
    else:
        with open(path, "rb") as stream:
            yield stream


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
    """Parse ``path`` (or its zip ``member``) in format ``fmt``, one of :data:`FORMATS`."""
    path = Path(path)
    where = describe(path, member)
    if fmt not in FORMATS:
        raise DatasetFormatError(where, None, f"a known format ({', '.join(FORMATS)})", found=fmt)
    try:
        if fmt == STEAM_FORMAT:
            return _read_steam(path, member, where, progress)
        return _read_layout(path, member, where, LAYOUTS[fmt])
    except FileNotFoundError:
        raise
    except (OSError, EOFError, zipfile.BadZipFile) as exc:  # e.g. a .gz that is not gzip, a broken zip
        raise DatasetFormatError(where, None, "a readable file (plain, .gz or zip)", found=str(exc)) from exc


def _read_layout(path: Path, member: str | None, where: str, layout: TextLayout) -> Interactions:
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
    try:
        frame = _parse_with_pandas(path, member, layout, header_lines)
    except (ValueError, OverflowError) as exc:  # pandas' ParserError is a ValueError
        raise _first_bad_line(path, member, where, layout, header_lines) or DatasetFormatError(
            where, None, f"lines of {layout.description}", found=str(exc)) from exc
    # Integer columns cannot hold NaN (pandas raised above); a short line or empty field shows up here.
    if any(frame[name].isna().any() for name, kind in zip(layout.columns, layout.kinds) if kind != "int"):
        raise _first_bad_line(path, member, where, layout, header_lines) or DatasetFormatError(
            where, None, f"lines of {layout.description} with no empty field")
    time = (frame["timestamp"].to_numpy(np.int64) if "timestamp" in frame
            else np.arange(len(frame), dtype=np.int64))
    return Interactions(where, _keys(frame["user"]), _keys(frame["item"]), time, 1 + header_lines)


def _parse_with_pandas(path: Path, member: str | None, layout: TextLayout, header_lines: int) -> pd.DataFrame:
    options = dict(header=None, names=list(layout.columns), index_col=False, skiprows=header_lines,
                   dtype={c: _PANDAS_DTYPES[k] for c, k in zip(layout.columns, layout.kinds)},
                   skip_blank_lines=False, keep_default_na=False, na_values=[""], quoting=csv.QUOTE_NONE,
                   encoding="latin-1", engine="c")
    with open_binary(path, member) as stream:
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


def _first_bad_line(path: Path, member: str | None, where: str, layout: TextLayout,
                    header_lines: int) -> DatasetFormatError | None:
    """Scan the file line by line for the first line that breaks ``layout`` (only run after a failure)."""
    with open_binary(path, member) as stream:
        text = io.TextIOWrapper(stream, encoding="latin-1", newline=None)
        for number, line in enumerate(text, 1):
            if number <= header_lines:
                continue
            line = line.rstrip("\n")
            fields = line.split(layout.sep)
            if len(fields) != len(layout.columns):
                return DatasetFormatError(where, number, f"{len(layout.columns)} fields: {layout.description}",
                                          found=line[:120])
            for field, name, kind in zip(fields, layout.columns, layout.kinds):
                if not _valid(field, kind):
                    what = {"int": "a 64-bit integer", "float": "a number", "str": "a non-empty id"}[kind]
                    return DatasetFormatError(where, number, f"{what} for {name} in {layout.description}",
                                              found=line[:120])
    return None


def _valid(field: str, kind: str) -> bool:
    if not _KIND_PATTERNS[kind].fullmatch(field):
        return False
    return kind != "int" or _INT64_MIN <= int(field) <= _INT64_MAX


_STEAM_EXPECTED = "a Python-literal dict with string 'username', 'product_id' and 'date' ('YYYY-MM-DD')"


def _read_steam(path: Path, member: str | None, where: str, progress: bool) -> Interactions:
    """Stream Kang & McAuley's ``steam_reviews.json.gz``: one Python-literal dict per line."""
    user_codes: dict[str, int] = {}
    item_codes: dict[str, int] = {}
    day_of: dict[str, int] = {}
    users, items, days = array("q"), array("q"), array("q")
    with open_binary(path, member) as stream, \
            tqdm(desc=f"parsing {Path(path).name}", unit=" reviews", unit_scale=True,
                 disable=not progress) as bar:
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace")
        number = 0
        for number, line in enumerate(text, 1):
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
            if number % 65536 == 0:
                bar.update(65536)
        bar.update(number % 65536)
    if not number:
        raise DatasetFormatError(where, None, f"lines of {_STEAM_EXPECTED}", found="an empty file")
    return Interactions(where, _sorted_codes(user_codes, users), _sorted_codes(item_codes, items),
                        np.frombuffer(days, dtype=np.int64).copy(), 1)


def _sorted_codes(codes: dict[str, int], values: array) -> np.ndarray:
    """Turn first-appearance codes into codes in sorted order of the strings."""
    labels = np.array(list(codes), dtype=object)
    rank = np.empty(len(labels), dtype=np.int64)
    rank[np.argsort(labels, kind="stable")] = np.arange(len(labels), dtype=np.int64)
    return rank[np.frombuffer(values, dtype=np.int64)]
