"""Fetch one file over HTTP(S): atomic, resumable, sha256-checked, with a progress bar.

The file is written to ``<dest>.part`` and renamed to ``dest`` only once complete and verified, so ``dest``
existing means a good file. An interrupted transfer leaves the ``.part`` behind; the next call asks the
server for the rest (HTTP ``Range``) and appends, or starts over when the server ignores the range.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path

from recbench.datasets.errors import ChecksumError, DownloadError
from recbench.datasets.progress import progress_bar

CHUNK = 1 << 20
USER_AGENT = "recbench-datasets (+https://github.com/FeiSun/BERT4Rec reproduction)"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str, dest: str | Path, sha256: str | None = None, progress: bool = True,
             timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` unless it is already there; return ``dest``.

    Raises :class:`DownloadError` on network or HTTP failure (keeping the partial file for a later resume)
    and :class:`ChecksumError` when ``sha256`` is given and does not match (removing the bad file).
    """
    dest = Path(dest)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        total = _transfer(url, part, dest.name, progress, timeout)
    except DownloadError:
        raise
    except urllib.error.HTTPError as exc:
        raise DownloadError(f"downloading {url} failed: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        arrived = part.stat().st_size if part.exists() else 0
        kept = (f"{part} keeps the {arrived:,} bytes that arrived and the next attempt resumes from it" if arrived
                else "nothing arrived (offline, or the server is down)")
        raise DownloadError(f"downloading {url} failed: {getattr(exc, 'reason', exc)}; {kept}") from exc
    size = part.stat().st_size
    if total is not None and size != total:
        raise DownloadError(f"downloading {url} stopped at {size} of {total} bytes; "
                            f"{part} is kept and the next attempt resumes from it")
    if sha256 is not None:
        actual = sha256_of(part)
        if actual != sha256:
            part.unlink()
            raise ChecksumError(f"{url}: sha256 {actual} does not match the published {sha256}; the "
                                f"downloaded file was removed. The server may be serving a different "
                                f"version; download it by hand and check it, or report the change.")
    os.replace(part, dest)
    return dest


def _transfer(url: str, part: Path, label: str, progress: bool, timeout: float) -> int | None:
    """Fetch ``url`` into ``part``, appending to what is there when the server honours a ``Range`` request.

    Returns the size the complete file should have, or ``None`` when the server does not say.
    """
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": USER_AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code != 416 or not have:
            raise
        part.unlink()  # the server knows no such range: our partial file is unusable, start over
        return _transfer(url, part, label, progress, timeout)
    with resp:
        resumed = have > 0 and resp.status == 206 and \
            resp.headers.get("Content-Range", "").startswith(f"bytes {have}-")
        if resp.status == 206 and not resumed:
            raise DownloadError(f"{url}: the server answered with a range we did not ask for "
                                f"({resp.headers.get('Content-Range')}); delete {part} and retry")
        start = have if resumed else 0  # a plain 200 answer: the server ignored the range, start over
        length = resp.headers.get("Content-Length")
        total = start + int(length) if length is not None else None
        with open(part, "ab" if resumed else "wb") as out, \
                progress_bar(total, f"downloading {label}", progress, initial=start, unit="B", unit_scale=True,
                             unit_divisor=1024) as bar:
            while chunk := resp.read(CHUNK):
                out.write(chunk)
                bar.update(len(chunk))
    return total
