"""Progress bars for the steps that may take a while (reading files, generating data, sampling negatives,
evaluating): one place decides how they look and how long a step runs before its bar appears, so quick steps
print nothing."""
from tqdm.auto import tqdm

PROGRESS_DELAY_S = 2.0  # a bar appears only once its step has run this long


def progress_bar(total: int, desc: str, enabled: bool = True, **options) -> tqdm:
    """A bar on stderr counting ``total`` units, cleared when done; ``options`` go to ``tqdm`` (``unit``...)."""
    return tqdm(total=total, desc=desc, disable=not enabled, delay=PROGRESS_DELAY_S, leave=False,
                dynamic_ncols=True, **options)


def counted_reads(stream, total: int, desc: str):
    """``stream`` wrapped so that a bar counts the bytes read from it, as ``progress_bar`` shows them."""
    return tqdm.wrapattr(stream, "read", total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                         leave=False, delay=PROGRESS_DELAY_S, dynamic_ncols=True)
