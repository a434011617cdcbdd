"""The studies' result reuse: a study job whose computation another folder already holds (the same study job run
elsewhere, or the main grid's job with the same model, dataset, settings, seed, protocols and profile, only the
study's labels differing) takes that job's rows instead of training (``--reuse``; the ablation's default row is the
main grid's job).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from recbench.benchmarks.jobs import PlannedJob
from recbench.benchmarks.store import ResultStore
from recbench.benchmarks.worker import JobOutcome


@dataclass(frozen=True)
class Twin:
    """A study job's computation already done in another folder: by the same study job (another machine, a GPU) or
    by a main-grid job with the same model, dataset, settings, seed, protocols and profile, only the study's labels
    differing (the ablation's default row is the main grid's job)."""

    folder: Path
    key: str
    rows: tuple

    @property
    def where(self) -> str:
        """The folder and key the twin's rows were computed under, as plans and logs name them."""
        return f"{self.folder} (key {self.key[:12]})"


def main_grid_key(job: PlannedJob) -> str:
    """The key ``job`` would have as a main-grid job (``run_all.py``): its identity without the study's labels."""
    return dataclasses.replace(job, job=dataclasses.replace(job.job, study="main", variant=None, sweep=None)).key


def reusable_twins(planned: list[PlannedJob], folders) -> dict[str, Twin]:
    """{key: twin} of the planned study jobs whose every result row a folder of ``folders`` already holds, under the
    job's own key (the same study job run elsewhere: another machine, a GPU) or under its main-grid key
    (:func:`main_grid_key`); the first folder that holds one counts."""
    twins = {}
    held = [(store.folder, store.rows) for store in (ResultStore(Path(folder).resolve()) for folder in folders)]
    for job in planned:
        if job.job.study == "main":
            continue
        candidates = ((folder, key, [row for row in folder_rows if row.get("key") == key])
                      for folder, folder_rows in held for key in (job.key, main_grid_key(job)))
        twin = next((Twin(folder, key, tuple(rows)) for folder, key, rows in candidates
                     if set(job.protocols) <= {row["protocol"] for row in rows}), None)
        if twin is not None:
            twins[job.key] = twin
    return twins


def reused_outcome(job: PlannedJob, twin: Twin) -> JobOutcome:
    """``twin``'s rows and per-user files as ``job``'s own: relabelled with the job's key, labels and file names,
    and ``reused_from`` naming the folder and key they were computed under."""
    rows, files = [], {}
    for row in twin.rows:
        # the files a row names, under the names the worker gives a job's files
        names = {"per_user_file": f"per_user/{job.file_stem}__{row['protocol']}.npz",
                 "attention_file": f"attention/{job.file_stem}.npz"}
        renamed = {column: names[column] for column in names if row.get(column)}
        for column, name in renamed.items():
            files[name] = (twin.folder / row[column]).read_bytes()
        rows.append({**row, **renamed, "key": job.key, "run_id": job.run_id, "study": job.job.study,
                     "variant": job.job.variant, "sweep": job.job.sweep,
                     "reused_from": {"folder": str(twin.folder), "key": twin.key, "run_id": row.get("run_id")}})
    return JobOutcome(job.key, job.run_id, "finished", rows, files)
