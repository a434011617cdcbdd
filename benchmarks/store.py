"""A results folder, written by one driver and safe beside other runs (``results/README.md``).

- ``results.jsonl``: one row per test evaluation. A job's rows carry its key; a finished job's rows replace
  only the rows of the same key, atomically, after the job has finished, so no later run deletes a finished
  result and no setting is ever mislabelled.
- ``per_user/``, ``attention/``, ``weights/``: arrays behind the rows, named by the job's key, written before
  the rows that point at them.
- ``failed.jsonl``: the jobs whose last attempt failed, with their key and error (removed when the key later
  finishes).
- ``manifest.jsonl``: every invocation, appended and never rewritten: command, time, commit, options, every
  planned job with its key, and at the end what became of them.
- ``config.json``: every job ever planned into the folder, by key, with its resolved settings (accumulated,
  never losing earlier jobs), and the latest invocation's options.
- ``checkpoints/``: the resumable training state of each job while it runs, named by the job's file stem.
- ``tuning.json``: the studies of ``python -m benchmarks.tune`` (:data:`TUNING_FILE`), whose jobs are labelled by
  :data:`TUNING_STUDY` and its variants; the report reads them by the same names.

Every change re-reads the files under an exclusive lock (``results.jsonl.lock``), so that runs sharing a folder
(two processes, or a rerun beside a running job) keep each other's rows. A job being run holds a claim beside its
checkpoint (:func:`claimed`), so that a second run never trains the same job at the same time, from the same
checkpoint file.
"""
from __future__ import annotations

import fcntl
import io
import json
import os
import re
import socket
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from recbench.datasets.splits import LEAVE_ONE_OUT

# The tuning results of a folder, as the search writes them and the report reads them.
TUNING_FILE = "tuning.json"  # every study: its trials, the best one, each parameter's importance
TUNING_STUDY = "tuning"  # the study label of a search's jobs; their variants: a trial, and the final runs of the
TRIAL, TUNED, DEFAULT = "trial", "tuned", "default"  # chosen settings and of the model's own


def split_scheme(row: dict) -> str:
    """A result row's split scheme, ``leave-one-out`` or ``temporal`` (field ``split_scheme``); rows written before
    the field existed were all split by leave-one-out. (``split`` is another field: the part evaluated, ``test``.)"""
    return row.get("split_scheme") or LEAVE_ONE_OUT


def row_threads(row: dict) -> int | None:
    """The torch CPU threads a row was trained with, read from its recorded device (``cpu (2 threads, ...)``); None
    for a row trained on a GPU or recording no device. Seeds repeat a CPU run only at the same thread count: the
    same job's metrics differ in the fourth decimal between 1 and 2 threads, under one key."""
    found = re.match(r"cpu \((\d+) threads?\b", str(row.get("device") or ""))
    return int(found.group(1)) if found else None


# Figures no model learns from the data (issue 70: a model that found the dataset through the garbage collector
# scored HR@1 1.0000, in bold, without a word): a row past either bound is flagged, never dropped.
IMPLAUSIBLE_HR1 = 0.9  # nearly every user's held-out item ranked first
IMPLAUSIBLE_OVER_VALIDATION = (1.5, 0.1)  # test at least 1.5 times the best validation figure and 0.1 above it


def implausible(row) -> str | None:
    """Why a ranking row's figures are implausible for its data, in words (None when they are not): HR@1 near 1,
    or a test figure far above the best validation figure of the same metric and protocol. Such figures come from
    a model that sees the held-out target, or from data in which the target is given away; check_model tests a
    model for the first."""
    metrics, found = row.get("metrics") or {}, []
    if metrics.get("HR@1", 0.0) >= IMPLAUSIBLE_HR1:
        found.append(f"HR@1 {metrics['HR@1']:.4f}: nearly every user's held-out item ranked first")
    metric, _, protocol = str(row.get("valid_metric") or "").partition(" under ")
    valid, test = row.get("best_valid"), metrics.get(metric)
    ratio, gap = IMPLAUSIBLE_OVER_VALIDATION
    if protocol == row.get("protocol") and valid is not None and test is not None and test >= ratio * valid \
            and test - valid >= gap:
        found.append(f"test {metric} {test:.4f} against {valid:.4f} at the best validation")
    if not found:
        return None
    return (f"{'; '.join(found)}: figures no model learns from these data; a model that reads the held-out target "
            f"gives them (python -m recbench.benchmarks.check_model MODEL tests for it)")


def thread_count_line(job: str, recorded: int, threads: int) -> str:
    """What a resumed run says of a job whose rows were trained on ``recorded`` CPU threads when it uses
    ``threads``: it trains the job again, on its own count, rather than mix the two under one key."""
    return (f"{job}: its rows in results.jsonl were trained on {recorded} CPU thread(s), this run uses {threads}; "
            f"the same seed gives other metrics on another count, so it trains again and its rows replace those "
            f"(rerun with --threads {recorded} to keep them)")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_results(path: Path) -> list[dict]:
    """The rows of a ``results.jsonl``; a line that is not JSON is an error naming the file and line."""
    return _read_jsonl(path, "rerun with --resume")


def _read_jsonl(path: Path, remedy: str) -> list[dict]:
    rows = []
    if not Path(path).exists():
        return rows
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg}); fix or delete that line "
                             f"and {remedy}") from None
    return rows


def write_atomic(path: Path, content: bytes | str) -> None:
    """Write a whole file so that a reader (or a crash) never sees half of it: a temporary file in the same
    folder, named uniquely per process, then renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(content, str):
        tmp.write_text(content, encoding="utf-8")
    else:
        tmp.write_bytes(content)
    tmp.replace(path)


class ClaimedElsewhere(OSError):
    """Another live process holds the claim on a job (:func:`claimed`): it is running that job now."""


# How long a claim held by another process is retried before the job is refused: a process killed a moment ago
# keeps its lock until the last of its threads has exited, which can lag its main thread (a grid that resubmits
# the job of a killed worker, a --resume right after kill -9).
CLAIM_PATIENCE_S = 3.0


@contextmanager
def claimed(path: Path, holder: str, patience_s: float = CLAIM_PATIENCE_S):
    """Hold the claim file ``path`` exclusively while the block runs, with ``holder`` (who runs the job) written
    in it; raise :class:`ClaimedElsewhere` with the text of the process that holds it after ``patience_s``. The
    lock belongs to the open file, so the kernel frees it when its process ends, however it ends (kill -9
    included): a claim never outlives its process, and a resumed run takes it over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + patience_s
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            text = handle.read().strip() or "another process"
            handle.close()
            if time.monotonic() >= deadline:
                raise ClaimedElsewhere(text) from None
            time.sleep(0.1)
            continue
        if path.exists() and os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
            break
        handle.close()  # its last holder removed the file after this process opened it: claim the new one
    try:
        handle.truncate(0)
        handle.write(holder)
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # while locked: a process that opened it meanwhile sees it gone and retries
        handle.close()


def write_json(path: Path, payload) -> None:
    write_atomic(path, json.dumps(payload, indent=2, default=str) + "\n")


def read_tuning_studies(folder: Path) -> list[dict]:
    """The studies of a folder's ``tuning.json`` (none when the folder holds no search)."""
    path = Path(folder) / TUNING_FILE
    if not path.is_file():
        return []
    try:
        return list(json.loads(path.read_text(encoding="utf-8")).get("studies", []))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line {error.lineno}: not valid JSON ({error.msg})") from None


def record_tuning_studies(folder: Path, studies: list[dict]) -> None:
    """``tuning.json`` with ``studies`` in place of the earlier studies of the same names (the others kept)."""
    known = {study["study"]: study for study in read_tuning_studies(folder)}
    known.update({study["study"]: study for study in studies})
    write_json(Path(folder) / TUNING_FILE, {"studies": list(known.values())})


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


class ResultStore:
    """The files of one results folder (see the module docstring)."""

    def __init__(self, folder: Path, threads: int | None = None):
        """``threads``: the torch threads of each job of the run that reads the folder, where it trains on the CPU
        (:meth:`benchmarks.options.RunOptions.cpu_threads_per_job`): rows of another count are not its results."""
        self.folder = Path(folder)
        self.threads = threads
        self.path = self.folder / "results.jsonl"
        self.failures_path = self.folder / "failed.jsonl"
        self.manifest_path = self.folder / "manifest.jsonl"
        self.config_path = self.folder / "config.json"
        self.invocation_id: str | None = None

    @contextmanager
    def locked(self):
        """The folder's exclusive lock, held while a change re-reads and rewrites its files."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "results.jsonl.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @property
    def rows(self) -> list[dict]:
        return read_results(self.path)

    def checkpoint(self, file_stem: str) -> Path:
        """Where the job with this file stem keeps its resumable training state while it runs."""
        return self.folder / "checkpoints" / f"{file_stem}.pt"

    def finished(self, jobs, rows: list[dict] | None = None) -> frozenset[str]:
        """The keys of ``jobs`` (each with ``key`` and ``protocols``) whose every protocol's row is in
        ``results.jsonl``, read once for all of them (or in ``rows``, where the caller has read them). Where the
        store has ``threads``, rows trained on the CPU with another count do not count (:meth:`other_threads`)."""
        have: dict[str, set[str]] = {}
        for row in self.rows if rows is None else rows:
            if self.threads is None or row_threads(row) in (None, self.threads):
                have.setdefault(row.get("key"), set()).add(row["protocol"])
        return frozenset(job.key for job in jobs if set(job.protocols) <= have.get(job.key, set()))

    def other_threads(self, jobs, rows: list[dict]) -> dict[str, int]:
        """{key: the thread count its rows were trained with} of the ``jobs`` whose rows were trained on the CPU
        with another count than the store's ``threads``: a resumed run trains them again rather than mix them."""
        if self.threads is None:
            return {}
        keys = {job.key for job in jobs}
        return {row["key"]: row_threads(row) for row in rows
                if row.get("key") in keys and row_threads(row) not in (None, self.threads)}

    def commit(self, key: str, rows: list[dict], files: dict) -> None:
        """Record a finished job: its files first, then its rows in place of any earlier rows of the same key
        (the newest at the end of the file), in one atomic rewrite."""
        with self.locked():
            for relative, content in files.items():
                write_atomic(self.folder / relative, npz_bytes(content) if isinstance(content, dict) else content)
            kept = [row for row in read_results(self.path) if row.get("key") != key]
            write_atomic(self.path, "".join(json.dumps(row) + "\n" for row in [*kept, *rows]))
            self._rewrite_failures(lambda failure: failure["key"] != key)

    def record_failure(self, outcome) -> None:
        """Record the failed last attempt of a job (replacing an earlier failure of the same key)."""
        failure = {"key": outcome.key, "run_id": outcome.run_id, "error_type": outcome.error_type,
                   "error": outcome.error, "traceback": outcome.traceback, "seconds": outcome.seconds,
                   "invocation": self.invocation_id, "created": now()}
        with self.locked():
            self._rewrite_failures(lambda old: old["key"] != outcome.key, failure)

    @property
    def failures(self) -> list[dict]:
        return _read_jsonl(self.failures_path, "rerun")

    def _rewrite_failures(self, keep, new: dict | None = None) -> None:
        failures = [f for f in _read_jsonl(self.failures_path, "rerun") if keep(f)] + ([new] if new else [])
        if failures or self.failures_path.exists():
            write_atomic(self.failures_path, "".join(json.dumps(f) + "\n" for f in failures))

    @contextmanager
    def filling(self, description: str):
        """Mark the folder as being filled by this process while the block runs: a lock file under ``running/``
        named by its pid, holding ``description`` (:func:`claimed`: the kernel frees it however the process ends),
        which :meth:`others_filling` reads."""
        name = f"{socket.gethostname()}-{os.getpid()}-{time.monotonic_ns()}.lock"  # one per run, even in one process
        new_folder = not self.folder.exists()
        try:
            with claimed(self.folder / "running" / name, description):
                yield
        finally:  # a run that wrote nothing (refused before planning ended) leaves no folder behind
            for folder in (self.folder / "running", *([self.folder] if new_folder else [])):
                try:
                    folder.rmdir()
                except OSError:  # not empty (results, another run's lock), or gone
                    pass

    def others_filling(self) -> list[str]:
        """The descriptions of the other live runs filling this folder (:meth:`filling`); a lock file its process
        left behind (killed before it could remove it) is removed."""
        found = []
        for path in sorted((self.folder / "running").glob("*.lock")):
            with open(path, "a+") as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.seek(0)
                    found.append(handle.read().strip() or path.stem)
                    continue
                path.unlink(missing_ok=True)  # no process holds it: a run that ended without removing it
        return found

    def latest_plan(self) -> dict | None:
        """The latest invocation's start entry of ``manifest.jsonl`` (its ``time``, ``command`` and ``jobs``: each
        planned job's key, run id and action), None in a folder no run has started in."""
        starts = [entry for entry in _read_jsonl(self.manifest_path, "rerun") if entry.get("event") == "start"]
        return starts[-1] if starts else None

    def start_invocation(self, invocation: dict, planned: list, pending: set[str], reused=frozenset()) -> None:
        """Append this invocation to ``manifest.jsonl`` and merge its jobs into ``config.json``; each job's action
        is ``run`` (``pending``), ``reuse`` (``reused``: rows copied from another folder) or ``skip``."""
        self.invocation_id = f"{now()}-{socket.gethostname()}-{os.getpid()}"
        jobs = [job.describe() for job in planned]
        with self.locked():
            self.append_manifest({"event": "start", "invocation": self.invocation_id, "time": now(),
                                  **invocation, "jobs": [{"key": job["key"], "run_id": job["run_id"],
                                                          "action": "run" if job["key"] in pending else
                                                          "reuse" if job["key"] in reused else "skip"}
                                                         for job in jobs]})
            config = json.loads(self.config_path.read_text()) if self.config_path.exists() else {}
            known = {job.get("key"): job for job in config.get("jobs", []) if isinstance(job, dict)}
            known.update({job["key"]: job for job in jobs})
            latest = {name: invocation[name] for name in ("profile", "protocols", "device", "data_dir")}
            write_json(self.config_path, {**latest, "seeds": sorted({job["seed"] for job in jobs}),
                                          "invocations": config.get("invocations", 0) + 1,
                                          "jobs": list(known.values())})

    def end_invocation(self, result) -> None:
        """Append what became of the invocation's jobs to ``manifest.jsonl``."""
        with self.locked():
            self.append_manifest({"event": "end", "invocation": self.invocation_id, "time": now(),
                                  "finished": [o.key for o in result.finished],
                                  "failed": [o.key for o in result.failed],
                                  "skipped": [job.key for job in result.skipped],
                                  "interrupted": result.interrupted})

    def append_manifest(self, entry: dict) -> None:
        """Append ``entry`` to ``manifest.jsonl`` (under :meth:`locked`, which the caller holds)."""
        with open(self.manifest_path, "a") as manifest:
            manifest.write(json.dumps(entry, default=str) + "\n")
            manifest.flush()
            os.fsync(manifest.fileno())
