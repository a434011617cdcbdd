"""Result files: ``results.jsonl`` (one row per test evaluation, ``results/README.md``) and JSON written
atomically."""
from __future__ import annotations

import fcntl
import json
from pathlib import Path


class ResultStore:
    """``results.jsonl`` in an output folder, rewritten atomically on every change.

    Every change re-reads the file under an exclusive lock, so that runs sharing one folder (two processes
    on one machine, or a rerun beside a running job) keep each other's rows instead of overwriting them.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / "results.jsonl"
        self.rows = read_results(self.path) if self.path.exists() else []

    def done(self, run_id: str, protocols) -> bool:
        have = {row["protocol"] for row in self.rows if row["run_id"] == run_id}
        return set(protocols) <= have

    def drop(self, run_id: str) -> None:
        self._update(lambda row: row["run_id"] != run_id)

    def append(self, row: dict) -> None:
        key = (row["run_id"], row["protocol"])
        self._update(lambda kept: (kept["run_id"], kept["protocol"]) != key, row)

    def _update(self, keep, new_row: dict | None = None) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "results.jsonl.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            rows = read_results(self.path) if self.path.exists() else []
            self.rows = [row for row in rows if keep(row)] + ([new_row] if new_row is not None else [])
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(json.dumps(row) + "\n" for row in self.rows))
            tmp.replace(self.path)


def read_results(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg}); fix or delete that line "
                             f"and rerun with --resume") from None
    return rows


def write_json(path: Path, payload) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    tmp.replace(path)
