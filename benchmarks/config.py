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
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from recbench.benchmarks.trainer import TrainSettings
from recbench.models import model_class
from recbench.models.base import show

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
PROFILES = ("smoke", "paper")


@dataclass
class ResolvedConfig:
    model: object  # the model's Config dataclass instance
    train: TrainSettings

    def as_dict(self) -> dict:
        return {"hyperparameters": dataclasses.asdict(self.model), "train_settings": dataclasses.asdict(self.train)}


class ConfigError(ValueError):
    """A setting a job cannot run with, in one line: ``<model>: <field>=<value> must <rule>``."""


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


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               tuple: "a list, e.g. [0.9, 0.999]"}


def _coerce(name: str, value, annotation):
    """``value`` as the type ``annotation`` names (int, float, bool, str, tuple, or one of them | None), or a
    :class:`ValueError` in the shape ``hidden='abc' must be an integer``. An int is a valid float; a bool is
    never a number; ``"none"`` unsets an optional field (TOML has no null)."""
    kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if type(None) in kinds and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
        return None
    kind = next(k for k in kinds if k is not type(None))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is tuple and isinstance(value, list):
        value = tuple(value)
    if kind is tuple and isinstance(value, tuple) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return value
    if kind is not tuple and isinstance(value, kind) and not (kind is not bool and isinstance(value, bool)):
        return value
    optional = " or none" if type(None) in kinds else ""
    raise ValueError(f"{name}={show(value)} must be {_TYPE_NAMES.get(kind, kind.__name__)}{optional}")


def _build(kind, values: dict, origin: str):
    """The dataclass ``kind`` from ``values``, every value checked against its field's type first; its own
    ``__post_init__`` then checks ranges. Errors are :class:`ValueError` naming the field and the rule."""
    hints = typing.get_type_hints(kind)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise ValueError(f"{origin}: unknown field(s) {unknown} for {kind.__name__}; valid: {sorted(hints)}")
    return kind(**{name: _coerce(name, value, hints[name]) for name, value in values.items()})


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
            raise ConfigError(f"{model_name}: --set {text!r}: no field {field!r}; model fields: "
                              f"{sorted(model_fields)}; trainer fields: {sorted(train_fields)}")
    try:
        return ResolvedConfig(_build(config_class, model_values, f"{path} [model]"),
                              _build(TrainSettings, train_values, f"{path} [train]"))
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{model_name}: {error}") from None


def check_overrides(overrides, model_names: list[str]) -> list[str]:
    """Fail early on a ``--set`` whose model prefix is not a model, or whose field no selected model and no
    trainer setting has. Returns notes for overrides that apply to none of the selected models."""
    from recbench.models import model_names as registered

    train_fields = {f.name for f in dataclasses.fields(TrainSettings)}
    known = set(train_fields)
    for name in model_names:
        known |= {f.name for f in dataclasses.fields(model_class(name).Config)}
    notes = []
    for text in overrides:
        target, field, _ = parse_override(text)
        if target is not None and target not in registered():
            raise ConfigError(f"--set {text!r}: {target!r} is not a model; valid prefixes: "
                              f"{', '.join(registered())}")
        if target is not None and target not in model_names:
            notes.append(f"--set {text!r} applies to no selected model ({', '.join(model_names)})")
            continue
        fields = known if target is None else (
            train_fields | {f.name for f in dataclasses.fields(model_class(target).Config)})
        if field not in fields:
            raise ConfigError(f"--set {text!r}: no {'selected model' if target is None else target} or trainer "
                              f"setting has a field {field!r}")
    return notes
