"""Progress bars for the steps that may take a while (reading files, generating data, sampling negatives,
evaluating, downloading): one place decides how they look, how long a step runs before its bar appears, so quick
steps print nothing, and what a log file gets where stderr is one rather than a terminal (a background run's
``> run.log 2>&1``): there a redraw cannot overwrite the last one, so a bar writes a line at most once a minute and
its final state as a last line, and a step shorter than a minute writes nothing."""
import sys

from tqdm import autonotebook, std
from tqdm.auto import tqdm

PROGRESS_DELAY_S = 2.0  # a bar appears only once its step has run this long
LOG_REFRESH_S = 60.0  # where bars cannot redraw in place, they redraw at most this often (else 10 times a second)


def bars_redraw_in_place() -> bool:
    """Whether a bar redraws in place: stderr is a terminal, or ``tqdm.auto`` chose a notebook's widget bars;
    elsewhere (a log file) each redraw adds to what was written."""
    return sys.stderr.isatty() or autonotebook.tqdm is not std.tqdm  # autonotebook: std's bar outside notebooks


class _LogLines:
    """stderr as a log file keeps it: tqdm draws a bar as ``\\r`` and the bar's text, which a terminal overwrites
    and a file strings into one ever longer line; here each drawing becomes a line of its own and the blank drawing
    that clears a bar is dropped."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        for piece in text.replace("\x1b[A", "").split("\n"):  # \x1b[A: tqdm's cursor-up between stacked bars
            if line := piece.replace("\r", "").rstrip():
                self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _look() -> dict:
    """The options every bar here shares: shown after the delay; on a terminal cleared when done and redrawn 10
    times a second; in a log file a line a minute at most and the final state kept (:class:`_LogLines`)."""
    if bars_redraw_in_place():
        return {"leave": False, "delay": PROGRESS_DELAY_S, "dynamic_ncols": True, "mininterval": 0.1}
    return {"leave": True, "delay": PROGRESS_DELAY_S, "mininterval": LOG_REFRESH_S, "file": _LogLines(sys.stderr)}


def progress_bar(total: int, desc: str, enabled: bool = True, **options) -> tqdm:
    """A bar on stderr counting ``total`` units (None: unknown), as :func:`_look` draws it; ``options`` go to
    ``tqdm`` (``unit``, ``initial``...)."""
    return tqdm(total=total, desc=desc, disable=not enabled, **_look(), **options)


def counted_reads(stream, total: int, desc: str):
    """``stream`` wrapped so that a bar counts the bytes read from it, as ``progress_bar`` shows them."""
    return tqdm.wrapattr(stream, "read", total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                         **_look())
