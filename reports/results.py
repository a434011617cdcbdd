"""Reading a results folder (``results/README.md``, schema version 1) into validated rows.

A malformed line is an error that names the file and the line; rows of a study or task this package does not
know are set aside with a note (a newer version of the suite may write them), never an error. When a run is repeated or
resumed, a later line for the same (study, variant, sweep point, dataset, model, task, protocol, split, seed)
replaces the earlier one, so the tables show the latest result. When the earlier line came from other settings (another
job key), :attr:`ResultSet.changes` says which settings differ, so a report never mixes configurations silently.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from recbench.benchmarks.store import LEAVE_ONE_OUT, TUNING_STUDY, split_scheme

SCHEMA_VERSION = 1
# tuning: the final runs of benchmarks.tune; losses: python -m benchmarks.studies losses
STUDIES = ("main", "ablation", "sensitivity", "cloze", "losses", TUNING_STUDY)
TASKS = ("next-item", "relevance")
SMOKE = "smoke"  # the profile whose results only check an installation
SMOKE_LABEL = "smoke profile: installation check, not the paper's settings"
# Where numbers to report come from, with what the reproduction measured it to cost (results/reference/
# converge-ml-1m.json, one CPU thread a run; tests/test_command_line.py holds the figures to that file).
CONVERGE_ADVICE = ("`--profile converge` gives numbers to report: the paper's models and data, trained until early "
                   "stopping (on ML-1m and one CPU thread, 1-1.4 min a run for BPR-MF, 0.7-1.2 h for SASRec, "
                   "4.2-5.3 h for BERT4Rec)")
# Keys without which a row cannot be placed in any table; every other key is optional here.
REQUIRED = {"schema": int, "study": str, "dataset": str, "model": str, "task": str, "protocol": str,
            "seed": int, "metrics": dict}


class ResultsError(ValueError):
    """A results folder or one of its lines does not follow the result schema."""


@dataclass(frozen=True)
class Row:
    """One line of ``results.jsonl``: the fields reports use, plus the whole object as ``raw``."""

    line: int
    study: str
    variant: str | None
    sweep_param: str | None
    sweep_value: float | str | None
    dataset: str
    model: str
    task: str
    protocol: str
    seed: int
    metrics: dict
    raw: dict = field(repr=False, compare=False)
    split: str = LEAVE_ONE_OUT  # how the data was split into training and held-out interactions

    @property
    def key(self) -> tuple:
        """What identifies one result; a later row with the same key supersedes an earlier one (a row of the
        temporal split never supersedes one of leave-one-out)."""
        return (self.study, self.variant, self.sweep_param, self.sweep_value, self.dataset, self.model,
                self.task, self.protocol, self.split, self.seed)

    def get(self, name: str, default=None):
        value = self.raw.get(name)
        return default if value is None else value


@dataclass
class ResultSet:
    """All usable rows of a results folder and what was set aside while reading it."""

    folder: Path
    rows: list[Row]
    config: dict | None = None
    ignored: Counter = field(default_factory=Counter)  # reason -> number of rows
    superseded: int = 0
    changes: list["ConfigChange"] = field(default_factory=list)

    def select(self, **conditions) -> list[Row]:
        """Rows whose attributes equal the given values; a tuple/set value means "one of"."""
        def matches(row: Row) -> bool:
            for name, wanted in conditions.items():
                value = getattr(row, name)
                if isinstance(wanted, (tuple, set, frozenset, list)):
                    if value not in wanted:
                        return False
                elif value != wanted:
                    return False
            return True
        return [row for row in self.rows if matches(row)]

    def values(self, name: str, rows: list[Row] | None = None) -> set:
        return {getattr(row, name) for row in (self.rows if rows is None else rows)}

    def profile(self, row: Row) -> str | None:
        """The training profile of ``row``: its own ``profile`` key, else ``config.json``'s, else None."""
        return row.get("profile") or (self.config or {}).get("profile")

    def is_smoke(self, row: Row) -> bool:
        """Whether ``row`` was trained with the smoke profile (a row of unknown profile is not)."""
        return self.profile(row) == SMOKE


@dataclass(frozen=True)
class ConfigChange:
    """A result shown from newer settings than an earlier result of the same (study, variant, dataset, model,
    seed): which settings differ, as ``field: earlier -> newest``."""

    label: str  # e.g. "synthetic/bprmf seed 0"
    differences: tuple[str, ...]


def row_settings(raw: dict) -> dict:
    """The settings a row was produced with, flat: hyper-parameters, trainer settings, profile and protocol (and
    the source hash of a model from outside the suite).
    Rows of job-key version 1 also held how their training ran (checkpoint, progress, seed, compile), left out."""
    flat = dict(raw.get("hyperparameters") or {})
    train = raw.get("train_settings") or {}
    flat.update({name: value for name, value in train.items()
                 if name not in ("checkpoint", "progress", "seed", "compile")})
    flat["profile"] = raw.get("profile")
    source = raw.get("model_source") or {}
    if source.get("sha256"):  # a model from outside the suite: an edit of its source is a change of settings
        flat["model source sha256"] = source["sha256"][:12]
    return flat


def settings_differing(raw: dict, config) -> list[str]:
    """The model and trainer settings of the row ``raw`` that differ from those of ``config`` (a resolved
    configuration); a setting the row predates is not counted."""
    expected = {**asdict(config.model), **asdict(config.train)}
    recorded = row_settings(raw)
    return sorted(name for name, value in expected.items()
                  if name in recorded and recorded[name] != (list(value) if isinstance(value, tuple) else value))


def _difference(earlier: Row, newest: Row) -> ConfigChange | None:
    if earlier.raw.get("key") == newest.raw.get("key"):
        return None
    old, new = row_settings(earlier.raw), row_settings(newest.raw)
    fields = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))
    if not fields:  # same settings, another dataset hash or code version
        fields_text = ("dataset_info",) if earlier.raw.get("dataset_info") != newest.raw.get("dataset_info") else ()
        return ConfigChange(_label(newest), fields_text or ("(same settings, another run)",))
    return ConfigChange(_label(newest), tuple(f"{name}: {old.get(name)!r} -> {new.get(name)!r}" for name in fields))


def _label(row: Row) -> str:
    variant = f" ({row.variant})" if row.variant else ""
    return f"{row.dataset}/{row.model}{variant} seed {row.seed}"


def _fail(path: Path, line: int, message: str):
    raise ResultsError(f"{path}, line {line}: {message}")


def _parse_row(path: Path, line: int, obj) -> Row:
    if not isinstance(obj, dict):
        _fail(path, line, f"expected a JSON object, got {type(obj).__name__}")
    missing = sorted(set(REQUIRED) - set(obj))
    if missing:
        _fail(path, line, f"missing key(s) {missing} (see results/README.md for the schema)")
    for name, kind in REQUIRED.items():
        # bool is an int subclass in Python; a seed of `true` is still a schema error.
        if not isinstance(obj[name], kind) or isinstance(obj[name], bool):
            _fail(path, line, f"key {name!r} should be {kind.__name__}, got {obj[name]!r}")
    if obj["schema"] != SCHEMA_VERSION:
        _fail(path, line, f"schema version {obj['schema']} is not supported (this reader knows "
                          f"version {SCHEMA_VERSION}); update reports/ to read it")
    metrics = {}
    for name, value in obj["metrics"].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(path, line, f"metric {name!r} should be a number, got {value!r}")
        if not math.isnan(value):  # NaN (a mean over no users) is no result: the cell stays a gap
            metrics[name] = float(value)
    sweep = obj.get("sweep")
    sweep_param = sweep_value = None
    if sweep is not None:
        if not isinstance(sweep, dict) or "param" not in sweep or "value" not in sweep:
            _fail(path, line, f"'sweep' should be {{\"param\": ..., \"value\": ...}}, got {sweep!r}")
        sweep_param, sweep_value = str(sweep["param"]), sweep["value"]
        if isinstance(sweep_value, bool) or not isinstance(sweep_value, (int, float, str)):
            _fail(path, line, f"sweep value should be a number or a string, got {sweep_value!r}")
    variant = obj.get("variant")
    return Row(line=line, study=obj["study"], variant=None if variant is None else str(variant),
               sweep_param=sweep_param, sweep_value=sweep_value, dataset=obj["dataset"], model=obj["model"],
               task=obj["task"], protocol=obj["protocol"], seed=obj["seed"], metrics=metrics, raw=obj,
               split=split_scheme(obj))


def load_results(folder: Path) -> ResultSet:
    """Read ``folder/results.jsonl`` (and ``config.json`` when present); errors name the file and line."""
    folder = Path(folder)
    path = folder / "results.jsonl"
    if not folder.is_dir():
        raise ResultsError(f"{folder} is not a folder; pass the results folder of a run, e.g. results/<name>")
    if not path.is_file():
        raise ResultsError(f"{path} does not exist; is {folder} the folder a run wrote?")
    latest: dict[tuple, Row] = {}
    ignored = Counter()
    superseded = 0
    changes: dict[str, ConfigChange] = {}
    with path.open(encoding="utf-8") as lines:
        for number, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as error:
                _fail(path, number, f"not valid JSON ({error.msg} at column {error.colno})")
            row = _parse_row(path, number, obj)
            if row.study not in STUDIES:
                ignored[f"unknown study {row.study!r}"] += 1
                continue
            if row.task not in TASKS:
                ignored[f"unknown task {row.task!r}"] += 1
                continue
            if row.key in latest:
                superseded += 1
                change = _difference(latest[row.key], row)
                if change is not None:
                    changes[change.label] = change
            latest[row.key] = row
    config = None
    config_path = folder / "config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ResultsError(f"{config_path}, line {error.lineno}: not valid JSON ({error.msg})") from None
    rows = sorted(latest.values(), key=lambda row: row.line)
    return ResultSet(folder=folder, rows=rows, config=config, ignored=ignored, superseded=superseded,
                     changes=list(changes.values()))


def reference_results(path: Path) -> ResultSet:
    """The result rows a reference file keeps (``results/reference/*.json`` with a ``rows`` list of
    ``results.jsonl`` lines; results/README.md), as a result set of the folder the file lies in. Where the file's
    per-user files were kept beside it (``per-user/<file's stem>/``), each row's ``per_user_file`` names its copy
    there, so that the paired tests of :class:`reports.stats.PerUser` read them from that folder."""
    path = Path(path)
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))["rows"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ResultsError(f"{path}: not a reference file with result rows ({type(error).__name__}: {error})") from None
    copies = Path("per-user") / path.stem
    rows = []
    for number, obj in enumerate(kept, start=1):
        name = obj.get("per_user_file") if isinstance(obj, dict) else None
        if name and (path.parent / copies / Path(name).name).is_file():
            obj = {**obj, "per_user_file": str(copies / Path(name).name)}
        row = _parse_row(path, number, obj)
        if row.study in STUDIES and row.task in TASKS:
            rows.append(row)
    return ResultSet(folder=path.parent, rows=rows)
