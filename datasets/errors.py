"""The errors the data layer raises, each saying what to fix.

``DatasetFormatError`` is a ``ValueError`` (bad content), ``MissingDataError`` a ``FileNotFoundError``
(nothing to read, nothing downloadable), ``DownloadError`` an ``OSError`` (network or server trouble).
:func:`unknown` gives every layer of the suite one shape for a name it does not know (a dataset, a model, a
protocol, a field): ``unknown model 'x'; expected one of a, b, c``.
"""
from __future__ import annotations


class DatasetFormatError(ValueError):
    """A data file does not hold what its format promises.

    The message names the file, the 1-based line (when one line is at fault), what was expected there and
    what was found, e.g. ``ratings.dat: line 12: expected UserID::MovieID::Rating::Timestamp; found '1::2'``.
    For a DataFrame, ``unit="row"`` names the row's position instead.
    """

    def __init__(self, where: str, line: int | None, expected: str, found: str | None = None, unit: str = "line"):
        self.where, self.line, self.expected, self.found = where, line, expected, found
        location = f"{where}: {unit} {line}" if line is not None else where
        message = f"{location}: expected {expected}"
        if found is not None:
            message += f"; found {found!r}"
        super().__init__(message)


class MissingDataError(FileNotFoundError):
    """A dataset's files are not on disk and could not be downloaded; the message lists what to put where."""


class DownloadError(OSError):
    """A download failed (network, HTTP status, truncated transfer); a partial file is kept for resuming."""


class ChecksumError(DownloadError):
    """A downloaded file's sha256 differs from the published one; the bad file has been removed."""


class UnknownNameError(ValueError):
    """A name (dataset, model, protocol, field, ...) the suite does not know; the message lists the valid ones."""


def unknown(kind: str, name, valid) -> UnknownNameError:
    """The error for an unknown ``kind`` called ``name``, to raise: ``unknown model 'x'; expected one of a, b``."""
    return UnknownNameError(f"unknown {kind} {name!r}; expected one of {', '.join(map(str, valid))}")
