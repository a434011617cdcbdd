"""Hyper-parameters per (model, dataset, profile), read from ``benchmarks/configs/<model>.toml``.

Each file has a ``[model]`` table (fields of the model's ``Config`` dataclass) and a ``[train]`` table (fields of
:class:`benchmarks.trainer.TrainSettings`); a sub-table named after a dataset (``[model.ml-1m]``) overrides
values for that dataset, and ``[smoke.model]`` / ``[smoke.train]`` (with their own dataset sub-tables) override
them for the ``smoke`` profile. Every value in the files carries a comment naming its source. Resolution order,
last wins: dataclass default < file < dataset sub-table < profile < ``--set`` overrides. The resolved values are
what the run records, so nobody has to guess which value a run used.
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

from benchmarks.trainer import TrainSettings
from models import model_class

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
PROFILES = ("smoke", "paper")


@dataclass
class ResolvedConfig:
    model: object  # the model's Config dataclass instance
    train: TrainSettings

    def as_dict(self) -> dict:
        return {"hyperparameters": dataclasses.asdict(self.model), "train_settings": dataclasses.asdict(self.train)}


def parse_override(text: str) -> tuple[str | None, str, object]:
    """``[model:]field=value`` from ``--set``; the value is read as TOML (``128``, ``0.2``, ``true``, ``"adam"``),
    falling back to a bare string."""
    if "=" not in text:
        raise ValueError(f"--set {text!r}: expected FIELD=VALUE or MODEL:FIELD=VALUE, e.g. hidden=128")
    key, raw = text.split("=", 1)
    model, _, field = key.rpartition(":")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return (model or None), field.strip(), value


def _layer(table: dict, dataset: str) -> dict:
    """The plain values of a table, then the dataset's sub-table over them."""
    values = {key: value for key, value in table.items() if not isinstance(value, dict)}
    values.update(table.get(dataset, {}))
    return values


def _build(kind, values: dict, origin: str):
    fields = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{origin}: unknown field(s) {unknown} for {kind.__name__}; valid: {sorted(fields)}")
    return kind(**values)


def resolve(model_name: str, dataset: str, profile: str = "paper",
            overrides: list[str] | tuple = ()) -> ResolvedConfig:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {PROFILES}")
    config_class = model_class(model_name).Config
    path = CONFIG_DIR / f"{model_name}.toml"
    tables = {}
    if path.exists():
        try:
            tables = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path}: {error}") from None
    model_values = _layer(tables.get("model", {}), dataset)
    train_values = _layer(tables.get("train", {}), dataset)
    if profile == "smoke":
        smoke = tables.get("smoke", {})
        model_values.update(_layer(smoke.get("model", {}), dataset))
        train_values.update(_layer(smoke.get("train", {}), dataset))
    model_fields = {f.name for f in dataclasses.fields(config_class)}
    train_fields = {f.name for f in dataclasses.fields(TrainSettings)}
    for text in overrides:
        target, field, value = parse_override(text)
        if target is not None and target != model_name:
            continue
        if field in model_fields:
            model_values[field] = value
        elif field in train_fields:
            train_values[field] = value
        elif target is not None:
            raise ValueError(f"--set {text!r}: {model_name} has no field {field!r}; model fields: "
                             f"{sorted(model_fields)}; trainer fields: {sorted(train_fields)}")
    return ResolvedConfig(_build(config_class, model_values, f"{path} [model]"),
                          _build(TrainSettings, train_values, f"{path} [train]"))


def check_overrides(overrides, model_names: list[str]) -> None:
    """Fail early on a ``--set`` field that no selected model and no trainer setting has."""
    train_fields = {f.name for f in dataclasses.fields(TrainSettings)}
    known = set(train_fields)
    for name in model_names:
        known |= {f.name for f in dataclasses.fields(model_class(name).Config)}
    for text in overrides:
        _, field, _ = parse_override(text)
        if field not in known:
            raise ValueError(f"--set {text!r}: no selected model or trainer setting has a field {field!r}")
