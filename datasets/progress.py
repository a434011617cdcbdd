"""Progress bars for the steps that may take a while (reading files, generating data, sampling negatives,
evaluating): one place decides how they look, how long a step runs before its bar appears, so quick steps
print nothing, and how often a bar redraws where stderr is a log file rather than a terminal (a background run's
``> run.log 2>&1``), where every redraw stays in the file."""
import sys

from tqdm import autonotebook, std
from tqdm.auto import tqdm

PROGRESS_DELAY_S = 2.0  # a bar appears only once its step has run this long
LOG_REFRESH_S = 60.0  # where bars cannot redraw in place, they redraw at most this often (else 10 times a second)


def bars_redraw_in_place() -> bool:
    """Whether a bar redraws in place: stderr is a terminal, or ``tqdm.auto`` chose a notebook's widget bars;
    elsewhere (a log file) each redraw adds to what was written."""
    return sys.stderr.isatty() or autonotebook.tqdm is not std.tqdm  # autonotebook: std's bar outside notebooks


def _look() -> dict:
    """The options every bar here shares: cleared when done, shown after the delay, redrawn as often as suits."""
    return {"leave": False, "delay": PROGRESS_DELAY_S, "dynamic_ncols": True,
            "mininterval": 0.1 if bars_redraw_in_place() else LOG_REFRESH_S}


def progress_bar(total: int, desc: str, enabled: bool = True, **options) -> tqdm:
    """A bar on stderr counting ``total`` units, cleared when done; ``options`` go to ``tqdm`` (``unit``...)."""
    return tqdm(total=total, desc=desc, disable=not enabled, **_look(), **options)


def counted_reads(stream, total: int, desc: str):
    """``stream`` wrapped so that a bar counts the bytes read from it, as ``progress_bar`` shows them."""
    return tqdm.wrapattr(stream, "read", total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                         **_look())
