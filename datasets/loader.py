"""``load_dataset``: find or download a dataset's file, prepare it once, and serve it from the cache after.

Lookup order for a paper dataset with ``source="auto"``: each source kind in the registry's preference
order (authors' file, then third-party sequences, then raw upstream file) in the data directory, then in
the download cache; only when no kind is on disk is anything downloaded, again in preference order.
Prepared datasets are cached as ``<cache>/prepared/<name>-<kind>-<key>.npz``, where the key hashes the
file's sha256, the zip member, the format and the preprocessing settings; a cache hit skips parsing.

``load_log`` prepares a log of the user's own (``logs.py``: a CSV/TSV file or a DataFrame) the same way; a file's
preparation is cached as ``<cache>/prepared/log-<name>-<key>.npz``, the key hashing its sha256 and format.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
import zipfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from recbench.datasets.download import download as fetch, sha256_of
from recbench.datasets.errors import ChecksumError, DownloadError, MissingDataError
from recbench.datasets.logs import InteractionLog, frame_interactions, read_log
from recbench.datasets.preprocess import prepare
from recbench.datasets.readers import describe, find_member, read_interactions
from recbench.datasets.registry import DatasetSpec, Source, SyntheticSpec, get_spec
from recbench.datasets.sequences import SequenceData
from recbench.datasets.splits import without_times
from recbench.datasets.synthetic import GENERATOR_VERSION, generate

logger = logging.getLogger(__name__)

DATA_DIR_ENV = "RECBENCH_DATA_DIR"
CACHE_DIR_ENV = "RECBENCH_CACHE_DIR"
DEFAULT_CACHE_DIR = Path("~/.cache/recbench")


@dataclass(frozen=True)
class Located:
    """A source's file found on disk, with the zip member to read (``None`` for text files)."""

    source: Source
    path: Path
    member: str | None


def resolve_data_dir(data_dir: str | Path | None = None) -> Path | None:
    """The argument, else ``$RECBENCH_DATA_DIR``, else none (download only)."""
    chosen = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV) or None
    return Path(chosen).expanduser() if chosen is not None else None


def resolve_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """The argument, else ``$RECBENCH_CACHE_DIR``, else ``~/.cache/recbench``."""
    chosen = cache_dir if cache_dir is not None else os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR
    return Path(chosen).expanduser()


def load_dataset(name: str, data_dir: str | Path | None = None, cache_dir: str | Path | None = None,
                 source: str = "auto", download: bool = True, progress: bool = True,
                 timed: bool = False) -> SequenceData:
    """Load dataset ``name`` (see ``DATASET_NAMES``) as time-ordered sequences, preparing it on first use.

    ``source`` is ``"auto"`` or one of the dataset's source kinds (``"authors"``, ``"sequences"``,
    ``"raw"``). With ``download=False`` a missing file raises :class:`MissingDataError` naming the files
    to put in the data directory instead of going to the network. ``timed``: only sources whose files keep each
    interaction's time (the temporal split's); a dataset without one, or whose only file on disk has no times
    and none with times can be downloaded, is refused in one line that names the file with times.
    """
    spec = get_spec(name)
    cache = resolve_cache_dir(cache_dir)
    if isinstance(spec, SyntheticSpec):
        if timed:
            raise ValueError(without_times(name, "is generated without interaction times"))
        if source not in ("auto", "synthetic"):
            raise ValueError(f"dataset {name!r} is generated; source must be 'auto', not {source!r}")
        return _load_synthetic(spec, cache, progress)
    kinds = [s.kind for s in spec.sources]
    if source != "auto" and source not in kinds:
        raise ValueError(f"dataset {name!r} has no source {source!r}; choose 'auto' or one of {kinds}")
    sources = [s for s in spec.sources if source in ("auto", s.kind) and (s.timed or not timed)]
    if not sources:
        files = ", ".join(f"{s.files[0]} ({s.description})" for s in spec.sources if source in ("auto", s.kind))
        raise ValueError(without_times(name, f"has no file with interaction times (only each user's order, in "
                                             f"{files})"))
    root = resolve_data_dir(data_dir)
    located = next(filter(None, (_find(spec, s, root, cache) for s in sources)), None)
    if located is None:
        untimed = timed and next(filter(None, (_find(spec, s, root, cache) for s in spec.sources)), None)
        explain = partial(_untimed_message, untimed) if untimed else _missing_message
        located = _download(spec, sources, root, cache, download, progress, explain)
    return _prepare_cached(spec, located, cache, progress)


def _untimed_message(untimed: Located, spec: DatasetSpec, sources: list[Source], root: Path | None, allowed: bool,
                     failures: list[str]) -> str:
    """One line: the file on disk (``untimed``) keeps no times; which file with times to put where (and why none
    was downloaded)."""
    wanted = " or ".join(f"{' or '.join(s.files)} ({s.description}, source {s.kind!r}"
                         + (f", from {spec.url(s)})" if spec.url(s) else ")") for s in sources)
    return (f"dataset {spec.name!r}: the temporal split needs interaction times, and the file found, "
            f"{untimed.path.name} ({untimed.source.description}), keeps only each user's order; put {wanted} into "
            f"{root if root is not None else 'the data directory (--data-dir)'}"
            + (f" (downloading it failed: {'; '.join(failures)})" if failures else ""))


def dataset_on_disk(name: str, data_dir: str | Path | None = None, cache_dir: str | Path | None = None,
                    timed: bool = False) -> bool:
    """Whether ``name`` loads without a download: it is generated, or a file of one of its sources (with
    ``timed``, of one that keeps interaction times) is in the data directory or the download cache. Reads no file,
    so a grid can check all its datasets in a moment."""
    spec = get_spec(name)
    if isinstance(spec, SyntheticSpec):
        return True
    root, cache = resolve_data_dir(data_dir), resolve_cache_dir(cache_dir)
    return any(_find(spec, source, root, cache) is not None for source in spec.sources if source.timed or not timed)


def _download_path(spec: DatasetSpec, source: Source, cache: Path) -> Path | None:
    """Where ``source``'s download goes (``None`` when it has no URL); one folder per dataset and kind,
    because the authors' and GroupLens' ML-20m archives are both called ``ml-20m.zip``."""
    url = spec.url(source)
    return cache / "downloads" / f"{spec.name}-{source.kind}" / url.rsplit("/", 1)[-1] if url else None


def _candidates(spec: DatasetSpec, source: Source, root: Path | None, cache: Path) -> list[Path]:
    names = [n for name in source.files
             for n in ((name,) if name.endswith(".zip") else (name, name + ".gz"))]
    paths = [root / name for name in names] if root is not None else []
    downloaded = _download_path(spec, source, cache)
    return paths + [downloaded] if downloaded else paths


def _find(spec: DatasetSpec, source: Source, root: Path | None, cache: Path) -> Located | None:
    """The first of ``source``'s files on disk; a zip must hold the source's member (the authors' ML-20m
    zip holds a ``.txt``, GroupLens' a ``ratings.csv``)."""
    for path in _candidates(spec, source, root, cache):
        if not path.is_file():
            continue
        if path.suffix != ".zip":
            return Located(source, path, None)
        member = find_member(path, source.members)
        if member is not None:
            return Located(source, path, member)
        logger.info("%s holds no member matching %s; not the %s file", path, source.members, source.kind)
    return None


def _download(spec: DatasetSpec, sources: list[Source], root: Path | None, cache: Path, allowed: bool,
              progress: bool, explain) -> Located:
    """Download the first source that can be fetched, or raise :class:`MissingDataError` saying what to do:
    ``explain(spec, sources, root, allowed, failures)`` (:func:`_missing_message`, or one line for a file on disk
    without the times asked for)."""
    failures = []
    for source in sources:
        url, dest = spec.url(source), _download_path(spec, source, cache)
        if not allowed or not url:
            continue
        try:
            path = fetch(url, dest, sha256=source.sha256, progress=progress)
        except ChecksumError:
            raise
        except DownloadError as exc:
            failures.append(str(exc))
            continue
        located = _find(spec, source, None, cache)
        if located is None:
            raise MissingDataError(f"{path} was downloaded from {url} but holds no member matching "
                                   f"{list(source.members)}; the upstream file may have changed")
        return located
    raise MissingDataError(explain(spec, sources, root, allowed, failures))


def _missing_message(spec: DatasetSpec, sources: list[Source], root: Path | None, allowed: bool,
                     failures: list[str]) -> str:
    where = (f"the data directory {root}" + ("" if root.is_dir() else " (which does not exist)")
             if root is not None else "a data directory")
    lines = [f"dataset {spec.name!r}: no file found, and "
             + ("downloading failed." if allowed else "downloading is off (download=False)."),
             f"Put one of these files into {where}, chosen with data_dir=..., the --data-dir flag of "
             f"run_all.py, or the {DATA_DIR_ENV} environment variable:"]
    lines += [f"  - {line}" for line in spec.accepted_files(sources)]
    lines += [f"Download error: {failure}" for failure in failures]
    return "\n".join(lines)


def _prepare_cached(spec: DatasetSpec, located: Located, cache: Path, progress: bool) -> SequenceData:
    source, path, member = located.source, located.path, located.member
    file_sha256 = sha256_of(path)
    settings = source.preprocessing.describe()
    # A file with times keeps them in its prepared data (SequenceData.times): a preparation cached before they
    # were kept has another name, so it is prepared again once instead of being read back without them.
    times = {"times_kept": True} if source.timed else {}
    key = hashlib.sha256(json.dumps({"file_sha256": file_sha256, "member": member, "format": source.fmt,
                                     "preprocessing": settings, **times}, sort_keys=True).encode()).hexdigest()
    cached = cache / "prepared" / f"{spec.name}-{source.kind}-{key[:16]}.npz"
    data = _load_cache(cached)
    if data is not None:
        logger.info("%s: cache hit %s", spec.name, cached)
        return data
    started = time.perf_counter()
    url = spec.url(source)
    provenance = {
        "dataset": spec.name,
        "source": source.kind,
        "description": source.description,
        "format": source.fmt,
        "file": str(path),
        "member": member,
        "file_sha256": file_sha256,
        "upstream_url": url,
        "upstream_sha256": source.sha256,
        # Only comparable when the file on disk is the published file itself (not a .gz copy of it).
        "matches_upstream_sha256": (file_sha256 == source.sha256
                                    if source.sha256 and url and path.name == url.rsplit("/", 1)[-1] else None),
    }
    if provenance["matches_upstream_sha256"] is False:
        logger.warning("%s differs from the published file (sha256 %s, published %s); using it anyway",
                       path, file_sha256, source.sha256)
    _status(progress, f"{spec.name}: preparing from {describe(path, member)} (once; later runs read the cache)")
    interactions = read_interactions(path, source.fmt, member, progress=progress)
    _status(progress, f"{spec.name}: {len(interactions):,} interactions read; filtering, ordering and renumbering")
    data = prepare(interactions, source.preprocessing, spec.name, provenance)
    data.save(cached)
    _status(progress, f"{spec.name}: prepared in {time.perf_counter() - started:.1f}s: {_dropped_and_left(data)}; "
                      f"cached at {cached}")
    return data


def _dropped_and_left(data: SequenceData) -> str:
    """What preprocessing dropped, step by step, and what is left, from the counts ``prepare`` recorded."""
    counts, settings = data.provenance["counts"], data.provenance["preprocessing"]
    steps = [f"{counts['rows'] - counts['after_duplicates']:,} repeated (user, item) row(s)"]
    if settings["min_item_interactions"]:
        steps.append(f"{counts['after_duplicates'] - counts['after_item_filter']:,} row(s) of items with fewer than "
                     f"min_item_interactions={settings['min_item_interactions']}")
    if settings["min_user_interactions"]:
        users = counts["users_before_user_filter"] - data.n_users
        steps.append(f"{users:,} user(s) with fewer than min_user_interactions={settings['min_user_interactions']} "
                     f"({counts['after_item_filter'] - counts['after_user_filter']:,} row(s))")
    tied = counts.get("users_with_a_tied_test_item")
    ties = (f"; {tied:,} user(s) ({tied / data.n_users:.0%}) have a test item with the same time as the item before "
            f"it, and the file's order chose which is last (PROTOCOL.md, \"Split\")" if tied else "")
    return (f"{counts['rows']:,} rows; dropped {', '.join(steps)}; left {data.n_users:,} users, {data.n_items:,} "
            f"items, {data.n_actions:,} interactions{ties}")


def _status(progress: bool, message: str) -> None:
    """One line about a step that may take a while, on stderr (through tqdm, so bars stay intact)."""
    logger.info(message)
    if progress:
        tqdm.write(message, file=sys.stderr)


def load_log(log: InteractionLog, name: str, cache_dir: str | Path | None = None,
             progress: bool = True) -> SequenceData:
    """A log of the user's own, named ``name``, prepared as the registry's datasets are (``logs.py``)."""
    fmt = log.format
    if isinstance(log.source, pd.DataFrame):
        provenance = {"dataset": name, "source": "DataFrame", "rows": len(log.source), "format": fmt.describe()}
        data = prepare(frame_interactions(log.source, fmt, name), fmt.preprocessing, name, provenance)
        _status(progress, f"{name}: {_dropped_and_left(data)}")
        return data
    path = Path(log.source).expanduser()
    if not path.is_file():
        raise MissingDataError(f"dataset {name!r}: {path}: no such file")
    file_sha256 = sha256_of(path)
    key = hashlib.sha256(json.dumps({"file_sha256": file_sha256, "format": fmt.describe(),
                                     "preprocessing": fmt.preprocessing.describe(), "times_kept": True},
                                    sort_keys=True).encode())
    cached = resolve_cache_dir(cache_dir) / "prepared" / f"log-{name}-{key.hexdigest()[:16]}.npz"
    data = _load_cache(cached)
    if data is not None:
        return data
    _status(progress, f"{name}: preparing from {path} (once; later runs read the cache)")
    provenance = {"dataset": name, "source": "file", "file": str(path.resolve()), "file_sha256": file_sha256,
                  "format": fmt.describe()}
    data = prepare(read_log(path, fmt), fmt.preprocessing, name, provenance)
    data.save(cached)
    _status(progress, f"{name}: {_dropped_and_left(data)}; cached at {cached}")
    return data


def _load_synthetic(spec: SyntheticSpec, cache: Path, progress: bool) -> SequenceData:
    key = hashlib.sha256(json.dumps({**spec.params, "version": GENERATOR_VERSION},
                                    sort_keys=True).encode()).hexdigest()
    cached = cache / "prepared" / f"{spec.name}-{key[:16]}.npz"
    data = _load_cache(cached)
    if data is None:
        data = generate(**spec.params, name=spec.name, progress=progress)
        data.save(cached)
    return data


def _load_cache(path: Path) -> SequenceData | None:
    """The cached dataset, or ``None`` when absent or unreadable (it is then rebuilt and overwritten)."""
    if not path.is_file():
        return None
    try:
        return SequenceData.load(path)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        logger.warning("ignoring unreadable cache file %s (%s); rebuilding it", path, exc)
        return None
