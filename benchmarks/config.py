"""Hyper-parameters per (model, dataset, profile), read from ``benchmarks/configs/<model>.toml`` and from the
user's ``--config`` files.

A model's file has a ``[model]`` table (fields of the model's ``Config`` dataclass) and a ``[train]`` table (fields
of :class:`benchmarks.trainer.TrainSettings`); a sub-table named after a dataset (``[model.ml-1m]``) overrides
values for that dataset, and a profile's tables, ``[smoke.model]`` / ``[smoke.train]`` or ``[converge.model]`` /
``[converge.train]`` (with their own dataset sub-tables), override them for that profile (:data:`PROFILES`).
Every value in the suite's files carries a comment naming its source.

A ``--config`` file holds the same tables for several models, each under the model's name, e.g.::

    [sasrec.model.ml-1m]
    hidden = 128
    [sasrec.train]
    lr = 5e-4

A model from outside the suite (an import path ``mypkg.mymodel:MyRec`` or an entry point, ``models/__init__.py``)
has the same kind of file beside its module, named after the class (``mypkg/mymodel.MyRec.toml``) or, when there is
none, after the module (``mypkg/mymodel.toml``); without either its settings are its ``Config`` defaults. Its file is
checked like a ``--config`` file. A ``--config`` file names it by its import path, quoted
(``["mypkg.mymodel:MyRec".model]``); ``--set`` by its import path or its class name (``--set MyRec:hidden=32``).

Resolution order, last wins: dataclass default < the model's file (< its dataset sub-table < its profile
table) < each ``--config`` file in the order given (the same layers) < ``--set`` overrides. The resolved values
are what the run records, so nobody has to guess which value a run used.
"""
from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from recbench.benchmarks.trainer import TrainSettings
from recbench.datasets.errors import unknown
from recbench.models import is_registered, model_class, model_origin, short_name
from recbench.models.base import NeuralRecommender, setting_error, show

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
# "paper": the authors' settings and schedule, as written in [model] and [train]. "converge": the same models and
# data, trained on the schedule the published replications use, until early stopping ends each run (hours, not the
# authors' weeks on a CPU); its [converge.*] tables change schedule settings only (models/fidelity.md). "smoke":
# seconds per model, an installation check.
PROFILES = ("smoke", "converge", "paper")
PROFILE_TABLES = ("smoke", "converge")  # the profiles written as tables over the paper's values
# The epochs of a trained model under "smoke" when no smoke table of its own sets them (a model of one's own whose
# file has none): the suite's models take 2 to 5 outside the default run, and 200 would be no installation check.
SMOKE_MAX_EPOCHS = 3
# The tables of a model's configuration: "search" is its tuning space (benchmarks.tuning.space), "tuned_from" names the
# tuning study that chose a --config file's settings (written by benchmarks.tune, carried into the result rows).
SECTIONS = ("model", "train", *PROFILE_TABLES, "search", "tuned_from")
TRAIN_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainSettings))  # what a [train] table may set


@dataclass
class ResolvedConfig:
    model: object  # the model's Config dataclass instance
    train: TrainSettings
    tuned_from: dict | None = None  # the tuning study behind these settings (a --config file's [tuned_from] table)

    def as_dict(self) -> dict:
        values = {"hyperparameters": dataclasses.asdict(self.model), "train_settings": dataclasses.asdict(self.train)}
        return {**values, "tuned_from": self.tuned_from} if self.tuned_from else values


class ConfigError(ValueError):
    """A setting a job cannot run with, in one line: ``<model>: <field>=<value> must <rule>``."""


def parse_override(text: str) -> tuple[str | None, str, object]:
    """``[model:]field=value`` from ``--set``; the value is read as TOML (``128``, ``0.2``, ``true``, ``"adam"``),
    falling back to a bare string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected FIELD=VALUE or MODEL:FIELD=VALUE, e.g. hidden=128")
    key, raw = text.split("=", 1)
    model, _, field = key.rpartition(":")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return (model or None), field.strip(), value


def toml_value(value) -> str:
    """``value`` as TOML text (``--set``, ``--space`` and the tuned config file): ``none`` for None (the suite's
    way to unset an optional field), lists for tuples."""
    if value is None:
        return '"none"'
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return show(value)


def read_toml(path: Path) -> dict:
    """A TOML file's tables; a syntax error names the file and line."""
    try:
        return tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: {error}") from None
    except OSError as error:
        raise ConfigError(f"--config {path}: cannot read it ({error.strerror})") from None


def model_tables(model_name: str) -> dict:
    """The tables of the model's own file (:func:`config_file`; none for a model without one). The file of a model
    from outside the suite is checked like a ``--config`` file: known sections and fields only."""
    path = config_file(model_name)
    if path is None or not path.exists():
        return {}
    tables = read_toml(path)
    if not is_registered(model_name):
        for section in tables:
            if section not in SECTIONS:
                raise ConfigError(f"{path}: {unknown('section', section, SECTIONS)}")
        _check_fields(tables, *fields_of(model_name), f"{path}: [")
    return tables


def config_file(model_name: str) -> Path | None:
    """``benchmarks/configs/<name>.toml`` for a registered model; beside the module of a model from outside the
    suite, ``<module>.<Class>.toml`` if it exists, else ``<module>.toml`` (module docstring); None for a class
    without a file."""
    if is_registered(model_name):
        return CONFIG_DIR / f"{model_name}.toml"
    origin = model_origin(model_name)
    if origin["file"] is None:
        return None
    module = Path(origin["file"])
    own = module.with_name(f"{module.stem}.{short_name(origin['import_path'])}.toml")
    return own if own.exists() else module.with_suffix(".toml")


def addressed(prefix: str, model_name: str) -> bool:
    """Whether a ``--set`` prefix names ``model_name``: its name, or the class name of its import path."""
    return prefix == model_name or (":" in model_name and not is_registered(prefix)
                                    and prefix == short_name(model_name))


def read_overlay(path: Path, known_models) -> dict[str, dict]:
    """A ``--config`` file: model name -> its tables. Unknown model names and sections are one-line errors."""
    tables = read_toml(path)
    for name, sections in tables.items():
        if name not in known_models:
            try:
                model_class(name)  # a model of the user's own, by its import path
            except ValueError as error:
                raise ConfigError(f"{path}: {error}") from None
        if not isinstance(sections, dict):
            raise ConfigError(f"{path}: {name} = {sections!r} must be a table, e.g. [{name}.model]")
        for section in sections:
            if section not in SECTIONS:
                raise ConfigError(f"{path}: [{name}]: {unknown('section', section, SECTIONS)}")
        _check_fields(sections, *fields_of(name), f"{path}: [{name}")
    return tables


def _check_fields(tables: dict, model_fields: set, train_fields: set, where: str) -> None:
    """Every value of a model's ``[model]`` / ``[train]`` tables (dataset sub-tables and the profiles' tables
    included) names a field of the model or the trainer."""
    for section, fields in (("model", model_fields), ("train", train_fields)):
        scopes = [("", tables.get(section, {}))] + [(f"{profile}.", tables.get(profile, {}).get(section, {}))
                                                    for profile in PROFILE_TABLES]
        for scope, table in scopes:
            for key, value in table.items():
                for field in (value if isinstance(value, dict) else {key: value}):
                    if field not in fields:
                        table = f"{where}{'' if where.endswith('[') else '.'}{scope}{section}]"
                        raise ConfigError(f"{table}: {unknown('field', field, sorted(fields))}")


def _layer(table: dict, dataset: str) -> dict:
    """The plain values of a table, then the dataset's sub-table over them."""
    values = {key: value for key, value in table.items() if not isinstance(value, dict)}
    values.update(table.get(dataset, {}))
    return values


def _layered_values(tables: dict, dataset: str, profile: str) -> tuple[dict, dict]:
    """(model values, train values) of one model's tables for a dataset and profile."""
    model_values = _layer(tables.get("model", {}), dataset)
    train_values = _layer(tables.get("train", {}), dataset)
    if profile in PROFILE_TABLES:
        own = tables.get(profile, {})
        model_values.update(_layer(own.get("model", {}), dataset))
        train_values.update(_layer(own.get("train", {}), dataset))
    return model_values, train_values


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               tuple: "a list, e.g. [0.9, 0.999]"}


def _coerce(name: str, value, annotation):
    """``value`` as the type ``annotation`` names (int, float, bool, str, tuple, or one of them | None), or a
    setting error in the shape ``hidden='abc' must be an integer``. An int is a valid float; a bool is never a
    number; ``"none"`` unsets an optional field (TOML has no null)."""
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
    raise setting_error(name, value, f"be {_TYPE_NAMES.get(kind, kind.__name__)}{optional}")


def _build(kind, values: dict, origin: str):
    """The dataclass ``kind`` from ``values``, every value checked against its field's type first; its own
    ``__post_init__`` then checks ranges. Errors name the field and the rule."""
    hints = typing.get_type_hints(kind)
    for name in values:
        if name not in hints:
            raise ValueError(f"{origin}: {unknown('field', name, sorted(hints))}")
    return kind(**{name: _coerce(name, value, hints[name]) for name, value in values.items()})


def fields_of(model_name: str) -> tuple[set[str], set[str]]:
    """(model fields, trainer fields) a setting of ``model_name`` may name."""
    return {f.name for f in dataclasses.fields(model_class(model_name).Config)}, set(TRAIN_FIELDS)


def resolve(model_name: str, dataset: str, profile: str = "paper", overrides: list[str] | tuple = (),
            overlays: list[dict] | tuple = ()) -> ResolvedConfig:
    """The settings of ``model_name`` on ``dataset`` under ``profile``: defaults, the model's file, the
    ``overlays`` (``--config`` files read by :func:`read_overlay`), then ``overrides`` (``--set`` strings)."""
    if profile not in PROFILES:
        raise unknown("profile", profile, PROFILES)
    tables = model_tables(model_name)
    model_values, train_values = _layered_values(tables, dataset, profile)
    if profile == "smoke" and issubclass(model_class(model_name), NeuralRecommender) and not any(
            "max_epochs" in _layer(layers.get("smoke", {}).get("train", {}), dataset)
            for layers in (tables, *(overlay.get(model_name, {}) for overlay in overlays))):
        train_values["max_epochs"] = min(train_values.get("max_epochs", TrainSettings.max_epochs), SMOKE_MAX_EPOCHS)
    tuned_from = None
    for overlay in overlays:
        more_model, more_train = _layered_values(overlay.get(model_name, {}), dataset, profile)
        model_values.update(more_model)
        train_values.update(more_train)
        tuned_from = _layer(overlay.get(model_name, {}).get("tuned_from", {}), dataset) or tuned_from
    model_fields, train_fields = fields_of(model_name)
    for text in overrides:
        target, field, value = parse_override(text)
        if target is not None and not addressed(target, model_name):
            continue
        if field in model_fields:
            model_values[field] = value
        elif field in train_fields:
            train_values[field] = value
        elif target is not None:
            raise ConfigError(f"{model_name}: --set {text!r}: "
                              f"{unknown('field', field, sorted(model_fields | train_fields))}")
    origin = config_file(model_name) or f"{model_name} (its Config)"
    try:
        return ResolvedConfig(_build(model_class(model_name).Config, model_values, f"{origin} [model]"),
                              _build(TrainSettings, train_values, f"{origin} [train]"), tuned_from)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{model_name}: {error}") from None


def check_overrides(overrides, model_names: list[str]) -> list[str]:
    """Fail early on a ``--set`` whose model prefix is not a model, or whose field no selected model and no
    trainer setting has. Returns notes for overrides that apply to none of the selected models."""
    known = set()
    for name in model_names:
        model_fields, train_fields = fields_of(name)
        known |= model_fields | train_fields
    known |= TRAIN_FIELDS
    notes = []
    for text in overrides:
        target, field, _ = parse_override(text)
        if target is not None:
            target = _prefixed_model(text, target, model_names)
            if target is None:
                notes.append(f"--set {text!r} applies to no selected model ({', '.join(model_names)})")
                continue
        fields = known if target is None else set().union(*fields_of(target))
        if field not in fields:
            raise ConfigError(f"--set {text!r}: {unknown('field', field, sorted(fields))}")
        if target is not None and field in TRAIN_FIELDS and not issubclass(model_class(target), NeuralRecommender):
            # Only a prefixed one: an unprefixed trainer setting, meant for the grid's trained models, still enters
            # POP's settings and job key as before, so no key of an earlier run changes.
            raise ConfigError(f"--set {text!r}: {target} is fitted without gradient training, so the trainer "
                              f"setting {field!r} would change nothing; drop it")
    return notes


def _prefixed_model(text: str, prefix: str, model_names: list[str]) -> str | None:
    """The selected model a ``--set`` prefix names (:func:`addressed`), or None for a model that is not selected;
    an unknown or ambiguous prefix is an error."""
    if prefix in model_names:
        return prefix
    chosen = [name for name in model_names if addressed(prefix, name)]
    if len(chosen) == 1:
        return chosen[0]
    if chosen:
        raise ConfigError(f"--set {text!r}: {prefix!r} names {len(chosen)} selected models ({', '.join(chosen)}); "
                          f"write the import path instead")
    try:
        model_class(prefix)
    except ValueError as error:
        raise ConfigError(f"--set {text!r}: {error}") from None
    return None
