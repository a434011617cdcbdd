"""Carrying :mod:`benchmarks.experiments.gpu_check`'s work from one device call to the next.

Each call of the device tool runs on a bare machine over a copy of the checkout, and only a few files under
``$OUT`` come back: at most 8, each at most 16 MiB (64 MiB together), no more than two folders down, named in
letters, digits, '.', '_' and '-'. So every invocation packs its whole output folder into one archive under
``$OUT`` (:func:`pack`), the lead copies it into a git-ignored folder of the checkout that the next call carries
(:func:`prepare_carry`, which also puts the data files and the commit there), and the next invocation unpacks
it (:func:`unpack`) before it looks at what is done.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from recbench.benchmarks.provenance import git_commit
from recbench.datasets import load_dataset
from recbench.datasets.registry import SyntheticSpec, get_spec

ARCHIVE = "gpu_check.tar.gz"
SUMMARY = "gpu_check.json"
COMMIT_FILE = "commit"  # the checkout's commit when the carried folder was prepared (the device copy has no .git)
DATA_FOLDER = "data"
MiB = 2**20
# What comes back from $OUT (the device tool's limits).
RETURN_FILES, RETURN_FILE_BYTES, RETURN_TOTAL_BYTES, RETURN_DEPTH = 8, 16 * MiB, 64 * MiB, 2
CARRY_BYTES = 64 * MiB  # the working tree that travels, carried folders included
NAME = re.compile(r"[A-Za-z0-9._-]+")
DROPPED_FIRST = "checkpoints"  # an archive too large to come back is packed again without training checkpoints


def unpack(archive: Path, out: Path, log) -> bool:
    """The carried archive's files into ``out``, when ``out`` holds nothing yet (a bare machine); False when
    there is no archive or ``out`` already holds work (then that work goes on, the archive is left alone)."""
    if not archive.is_file():
        return False
    if out.is_dir() and any(out.iterdir()):
        log(f"carry: {out} already holds work; {archive} is not unpacked over it")
        return False
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(out, filter="data")  # refuses absolute paths and members outside ``out``
    log(f"carry: unpacked {archive} ({archive.stat().st_size / MiB:.1f} MiB) into {out}")
    return True


def pack(out: Path, dest: Path, log) -> Path:
    """The whole of ``out`` as ``dest/ARCHIVE`` and its summary beside it, within the limits of what comes back.
    An archive over the per-file limit is packed again without training checkpoints (the next call then
    restarts that training), since a file over the limit would not come back at all."""
    dest.mkdir(parents=True, exist_ok=True)
    files = sorted(path for path in out.rglob("*") if path.is_file() and not path.name.endswith(".tmp"))
    archive = _write_archive(out, files, dest / ARCHIVE)
    if archive.stat().st_size > RETURN_FILE_BYTES:
        kept = [path for path in files if DROPPED_FIRST not in path.relative_to(out).parts]
        log(f"carry: the archive is {archive.stat().st_size / MiB:.1f} MiB, over the {RETURN_FILE_BYTES // MiB} "
            f"MiB that come back; packed again without {len(files) - len(kept)} training checkpoint(s)")
        archive = _write_archive(out, kept, archive)
    if (out / SUMMARY).is_file():
        shutil.copyfile(out / SUMMARY, dest / SUMMARY)
    for problem in return_problems(dest):
        log(f"carry: WARNING {problem}")
    log(f"carry: packed {out} into {archive} ({archive.stat().st_size / MiB:.2f} MiB)")
    return archive


def _write_archive(out: Path, files: list[Path], archive: Path) -> Path:
    tmp = archive.with_name(archive.name + ".part")
    with tarfile.open(tmp, "w:gz") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(out)), recursive=False)
    tmp.replace(archive)
    return archive


def return_problems(folder: Path) -> list[str]:
    """Each way in which the files under ``folder`` break the limits on what comes back from ``$OUT``."""
    files = [path for path in folder.rglob("*") if path.is_file()]
    problems = [] if len(files) <= RETURN_FILES else [f"{len(files)} files under {folder}, more than "
                                                      f"{RETURN_FILES} come back"]
    for path in files:
        parts = path.relative_to(folder).parts
        if len(parts) - 1 > RETURN_DEPTH:
            problems.append(f"{path} is {len(parts) - 1} folders down; at most {RETURN_DEPTH} come back")
        if not all(NAME.fullmatch(part) for part in parts):
            problems.append(f"{path}: only letters, digits, '.', '_' and '-' come back")
        if path.stat().st_size > RETURN_FILE_BYTES:
            problems.append(f"{path} is {path.stat().st_size / MiB:.1f} MiB; at most {RETURN_FILE_BYTES // MiB} "
                            f"MiB a file come back")
    total = sum(path.stat().st_size for path in files)
    if total > RETURN_TOTAL_BYTES:
        problems.append(f"{total / MiB:.1f} MiB under {folder}; at most {RETURN_TOTAL_BYTES // MiB} MiB come back")
    return problems


def prepare_carry(carry: Path, root: Path, data_dir: str | None, datasets, archive: str | None, log) -> None:
    """Fill the carried folder of the checkout ``root`` for the next call: the data files ``datasets`` load
    from (the files themselves, found through the dataset registry in ``data_dir``), the commit, and the archive
    that came back from the last call, if any. The folder must be ignored by git, so that it travels only when
    a call names it in ``carry``."""
    ignored = subprocess.run(["git", "check-ignore", "-q", str(carry)], cwd=root, capture_output=True)
    if ignored.returncode != 0:
        raise SystemExit(f"--carry {carry}: not a folder git ignores; name one under .cache/ or add it to "
                         f".git/info/exclude")
    (carry / DATA_FOLDER).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as fresh:  # a fresh cache: the data is read from its file, which is named
        for name in datasets:
            if isinstance(get_spec(name), SyntheticSpec):
                continue  # generated on the device
            source = Path(load_dataset(name, data_dir=data_dir, cache_dir=fresh, download=False,
                                       progress=False).provenance["file"])
            shutil.copyfile(source, carry / DATA_FOLDER / source.name)
            log(f"carry: {name}: {source} -> {carry / DATA_FOLDER / source.name}")
    (carry / COMMIT_FILE).write_text(git_commit() + "\n")
    if archive:
        with tarfile.open(archive, "r:gz") as tar:  # refuse a file that is not the archive before replacing it
            tar.getmembers()
        shutil.copyfile(archive, carry / ARCHIVE)
        log(f"carry: {archive} -> {carry / ARCHIVE}")
    elif (carry / ARCHIVE).is_file():
        log(f"carry: {carry / ARCHIVE} from an earlier call stays and will be resumed; delete it to start afresh")
    size = sum(path.stat().st_size for path in carry.rglob("*") if path.is_file())
    log(f"carry: {carry} holds {size / MiB:.1f} MiB (with the working tree, at most {CARRY_BYTES // MiB} MiB "
        f"travel)")
    if size > CARRY_BYTES:
        raise SystemExit(f"--carry {carry}: {size / MiB:.1f} MiB cannot travel (at most {CARRY_BYTES // MiB} MiB)")
