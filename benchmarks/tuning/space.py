"""Search spaces for tuning (:mod:`benchmarks.tuning`), declared beside the defaults.

A model's config file (``benchmarks/configs/<model>.toml``) may hold a ``[search]`` table: each field a list of
values to choose from (``hidden = [16, 32, 64, 128, 256]``), or a range (``lr = {low = 1e-4, high = 1e-2, log =
true}``, with an optional ``step``); a dataset sub-table (``[search.ml-1m]``) replaces fields for that dataset, and
``[search.tied]`` names settings that follow searched ones by a rule of :data:`TIED_RULES` (BERT4Rec's heads follow
d). Every range carries a comment naming its source, as every default does.

A user narrows or extends a space with ``[<model>.search]`` tables in a ``--config`` file, or on the command line
with ``--space [MODEL:]FIELD=VALUES`` (``--space 'hidden=[32, 64]'``, ``--space 'lr={low=1e-4, high=1e-2,
log=true}'``; ``--space reg=none`` takes the field out of the search). A later layer replaces a field's whole range.

:func:`space_problems` finds every problem of a space before any trial, one line each: an unknown field, a field
the model lacks, an empty range, a value outside a field's valid range, a field both searched and ``--set``.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field

from recbench.benchmarks.config import (
    ConfigError,
    ResolvedConfig,
    fields_of,
    model_tables,
    parse_override,
    resolve,
    toml_value,
)
from recbench.benchmarks.trainer import TrainSettings
from recbench.datasets.errors import unknown
from recbench.models import model_class, model_names
from recbench.models.base import show

RANGE_KEYS = ("low", "high", "log", "step")
TIED = "tied"  # the sub-table of [search] that ties settings to searched ones
REMOVE = "none"  # --space FIELD=none: the field is not searched
HEAD_SIZE = 32  # BERT4Rec §4.3: d/h = 32 dimensions per head, one head below d = 32


def paper_heads(hidden: int) -> int:
    """BERT4Rec §4.3: the heads of a d = ``hidden`` model, 32 dimensions per head and at least one."""
    return max(1, hidden // HEAD_SIZE)


def cloze_cap(rho: float, length: int) -> int:
    """BERT4Rec §4.6: a sequence's masked items are ρ of its N, so the cap on them is ⌈ρ·N⌉, rounded first so that
    0.3·200 = 60.000000000000007 is 60."""
    return math.ceil(round(rho * length, 9))


# Settings tied to a searched one (the paper's rules above, which the studies' sweeps follow too). A config file
# names a rule by its text; the text is looked up here, never evaluated.
TIED_RULES: dict[str, tuple[tuple[str, ...], typing.Callable[[dict], object]]] = {
    "max(1, hidden // 32)": (("hidden",), lambda v: paper_heads(v["hidden"])),
    "ceil(mask_proportion * max_len)": (("mask_proportion", "max_len"),
                                        lambda v: cloze_cap(v["mask_proportion"], v["max_len"])),
    "dropout": (("dropout",), lambda v: v["dropout"]),  # SASRec's code: one dropout rate, the attention's too
    "[8 * factors, 4 * factors, 2 * factors, factors]": (("factors",), lambda v: tuple(
        k * v["factors"] for k in (8, 4, 2, 1))),  # the NCF code's README: factors 8, MLP layers [64, 32, 16, 8]
}


class SpaceError(ValueError):
    """A search space that cannot be searched, one line per problem."""


@dataclass(frozen=True)
class Dimension:
    """One searched field: a list of ``choices``, or a range from ``low`` to ``high`` (``log``: sampled on a log
    scale; ``step``: on a grid of that step)."""

    name: str
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    origin: str = "--space"  # where it was declared, for messages

    @property
    def text(self) -> str:
        """The range as declared: ``hidden=[16, 32]`` or ``lr={low=0.0001, high=0.01, log=true}``."""
        if self.choices is not None:
            return f"{self.name}={toml_value(self.choices)}"
        parts = [f"low={show(self.low)}", f"high={show(self.high)}"] + (["log=true"] if self.log else []) + (
            [f"step={show(self.step)}"] if self.step is not None else [])
        return f"{self.name}={{{', '.join(parts)}}}"

    def bounds(self) -> tuple:
        """The values to check against the field's rules: every choice, or both ends of the range."""
        return self.choices if self.choices is not None else (self.low, self.high)

    def grid(self) -> tuple | None:
        """Every value of the dimension, or None for a continuous range (no step)."""
        if self.choices is not None:
            return self.choices
        if self.step is None:
            return None
        count = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        return tuple(self.low + i * self.step for i in range(count))

    def contains(self, value) -> bool:
        if self.choices is not None:
            return value in self.choices
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high


def dimension(name: str, value, origin: str) -> Dimension:
    """A :class:`Dimension` from its TOML form (a list, a range table, or one value that fixes the field)."""
    where = origin if origin.startswith("--space") else f"{origin}: {name}"
    if isinstance(value, list):
        return Dimension(name, tuple(tuple(v) if isinstance(v, list) else v for v in value), origin=origin)
    if isinstance(value, dict):
        extra = sorted(set(value) - set(RANGE_KEYS))
        if extra or "low" not in value or "high" not in value:
            raise SpaceError(f"{where}: a range is {{low = ..., high = ...}}, optionally with log = true or a "
                             f"step" + (f" (not {', '.join(extra)})" if extra else ""))
        numbers = [value[k] for k in ("low", "high", "step") if k in value]
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers):
            raise SpaceError(f"{where}: low, high and step must be numbers")
        return Dimension(name, None, value["low"], value["high"], bool(value.get("log", False)), value.get("step"),
                         origin)
    return Dimension(name, (value,), origin=origin)


def _is_range(value) -> bool:
    return isinstance(value, dict) and bool(value) and set(value) <= set(RANGE_KEYS)


def _layer(table: dict, dataset: str, origin: str) -> tuple[dict, dict]:
    """(field -> raw range, tied rules) of one [search] table for ``dataset``: its plain fields, then the
    dataset's sub-table over them."""
    def plain(part: dict) -> dict:
        return {k: v for k, v in part.items() if k != TIED and (_is_range(v) or not isinstance(v, dict))}

    fields = plain(table)
    fields.update(plain(table.get(dataset, {})))
    tied = dict(table.get(TIED, {}))
    return {name: (value, origin) for name, value in fields.items()}, tied


@dataclass
class Space:
    """The search space of one model on one dataset."""

    model: str
    dataset: str
    dimensions: dict[str, Dimension] = field(default_factory=dict)
    tied: dict[str, str] = field(default_factory=dict)  # field -> a rule of TIED_RULES
    notes: list[str] = field(default_factory=list)

    def distributions(self) -> dict:
        """Optuna's distributions of the dimensions."""
        # optional here: the studies import this module for the paper's tied rules, and a grid runs without Optuna
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        found = {}
        for name, dim in self.dimensions.items():
            if dim.choices is not None:
                found[name] = CategoricalDistribution([_encode(c) for c in dim.choices])
            elif _kind(self.model, name) is int:
                found[name] = IntDistribution(int(dim.low), int(dim.high), log=dim.log, step=int(dim.step or 1))
            else:
                found[name] = FloatDistribution(float(dim.low), float(dim.high), log=dim.log, step=dim.step)
        return found

    def values(self, params: dict) -> dict:
        """Optuna's parameters as setting values (a list-valued choice is passed to Optuna as its TOML text)."""
        decoded = {}
        for name, value in params.items():
            dim = self.dimensions.get(name)
            choices = {_encode(c): c for c in dim.choices} if dim is not None and dim.choices is not None else {}
            decoded[name] = choices.get(value, value)
        return decoded

    def encoded(self, values: dict) -> dict:
        """Setting values as Optuna's parameters (the inverse of :meth:`values`)."""
        return {name: _encode(value) for name, value in values.items()}

    def overrides(self, values: dict, base: ResolvedConfig, fixed: set[str] = frozenset()) -> tuple[str, ...]:
        """``field=value`` strings of one point of the space, with the settings tied to it (a tied setting the user
        fixed, in ``fixed``, or searched is left alone)."""
        texts = [f"{name}={toml_value(value)}" for name, value in values.items()]
        current = {**dataclasses.asdict(base.model), **dataclasses.asdict(base.train), **values}
        for target, rule in self.tied.items():
            inputs, compute = TIED_RULES[rule]
            if target not in values and target not in fixed and any(name in values for name in inputs):
                texts.append(f"{target}={toml_value(compute(current))}")
        return tuple(texts)

    def grid(self) -> dict | None:
        """Every dimension's values (the grid sampler's space), or None when a dimension is continuous."""
        grids = {name: dim.grid() for name, dim in self.dimensions.items()}
        if any(values is None for values in grids.values()):
            return None
        return {name: [_encode(v) for v in values] for name, values in grids.items()}


def _encode(value):
    return toml_value(value) if isinstance(value, tuple) else value


def _kind(model: str, name: str):
    """The Python type of a model's or the trainer's field (int, float, bool, str or tuple; ``int | None`` is
    int), None for no such field."""
    for settings in (model_class(model).Config, TrainSettings):
        annotation = typing.get_type_hints(settings).get(name)
        if annotation is not None:
            kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
            return next(kind for kind in kinds if kind is not type(None))
    return None


def declared_space(model: str, dataset: str, overlays=(), specs=(), config_files=()) -> Space:
    """The space of ``model`` on ``dataset``: its config file's [search] table, the ``--config`` files' (read
    by :func:`benchmarks.config.read_overlay`, named by ``config_files`` in messages), then the ``--space``
    strings. Raises :class:`SpaceError` for a malformed range."""
    raw, tied = _layer(model_tables(model).get("search", {}), dataset, f"benchmarks/configs/{model}.toml [search]")
    for overlay, path in zip(overlays, list(config_files) or ["--config"] * len(overlays)):
        more, more_tied = _layer(overlay.get(model, {}).get("search", {}), dataset, f"{path} [{model}.search]")
        raw.update(more)
        tied.update(more_tied)
    space = Space(model, dataset, tied=tied)
    for text in specs:
        target, name, value = parse_override(text)
        if target is None or target == model:
            raw[name] = (value, f"--space {text!r}")
    for name, (value, origin) in raw.items():
        if isinstance(value, str) and value.lower() == REMOVE:
            continue
        space.dimensions[name] = dimension(name, value, origin)
    return space


def spec_problems(specs, models: list[str]) -> list[str]:
    """``--space`` strings that name no selected model's field, or a model that is not selected; one line each."""
    problems = []
    for text in specs:
        if "=" not in text:
            problems.append(f"--space {text!r}: expected [MODEL:]FIELD=VALUES, e.g. hidden=[16, 32, 64] or "
                            f"lr={{low=1e-4, high=1e-2, log=true}}")
            continue
        target, name, _ = parse_override(text)
        if target is not None and target not in models:
            problems.append(f"--space {text!r}: {unknown('model', target, models)} (the models being tuned)")
            continue
        chosen = [target] if target else models
        if any(name in set().union(*fields_of(m)) for m in chosen):
            continue
        if name in _any_field():
            problems.append(f"--space {text!r}: {', '.join(chosen)} {'has' if len(chosen) == 1 else 'have'} no "
                            f"field {name!r} to search")
        else:
            every = sorted(set().union(*(set().union(*fields_of(m)) for m in chosen)))
            problems.append(f"--space {text!r}: {unknown('field', name, every)}")
    return problems


def _any_field() -> set[str]:
    """Every field of any registered model or the trainer (to tell a field a model lacks from a typo)."""
    return set().union(*(set().union(*fields_of(name)) for name in model_names()))


def space_problems(space: Space, profile: str, overrides=(), overlays=(), budget=()) -> list[str]:
    """Every problem of ``space`` under ``profile`` with the user's ``--set`` ``overrides`` and the trial
    ``budget`` (more ``field=value`` strings), one line each; empty when the space can be searched."""
    prefix = f"{space.model}: "
    fields = set().union(*fields_of(space.model))
    fixed = (*budget, *overrides)
    problems = [prefix + line for line in _tied_problems(space, fields)]
    try:
        base = resolve(space.model, space.dataset, profile, fixed, overlays)
    except ConfigError as error:
        return problems + [str(error)]
    budget_fields = {parse_override(text)[1] for text in budget}
    for name, dim in space.dimensions.items():
        where = prefix + (dim.origin if dim.origin.startswith("--space") else f"{dim.origin}: {dim.text}")
        if name not in fields:
            lacks = f"{space.model} has no field {name!r} to search" if name in _any_field() else str(
                unknown("field", name, sorted(fields)))
            problems.append(f"{where}: {lacks}")
        elif name in {parse_override(text)[1] for text in fixed}:
            by = "the trial budget" if name in budget_fields else "--set"
            problems.append(f"{where}: {name} is also fixed by {by}; search it or fix it, not both")
        else:
            problems += [f"{where}: {text}" for text in _range_problems(space, dim, base, profile, fixed, overlays)]
    return problems


def _tied_problems(space: Space, fields: set[str]) -> list[str]:
    problems = []
    for target, rule in space.tied.items():
        if rule not in TIED_RULES:
            problems.append(f"[search.tied] {target} = {rule!r}: {unknown('rule', rule, list(TIED_RULES))}")
        elif target not in fields:
            problems.append(f"[search.tied] {target}: no such field of {space.model}")
    return problems


def _range_problems(space: Space, dim: Dimension, base: ResolvedConfig, profile, overrides, overlays) -> list[str]:
    """What is wrong with one dimension: an empty range, a range over a field that is not a number, a bound or a
    choice its field's rules refuse (each value checked with its tied settings and the model built on a toy
    size)."""
    if dim.choices is not None and not dim.choices:
        return ["an empty range; give at least one value"]
    if dim.choices is None:
        if _kind(space.model, dim.name) not in (int, float):
            return [f"a range needs a numeric field ({dim.name} is not a number); give a list of values"]
        if dim.low > dim.high:
            return [f"an empty range (low {show(dim.low)} > high {show(dim.high)})"]
        if dim.log and dim.low <= 0:
            return ["a log range needs low > 0"]
        if dim.log and dim.step is not None:
            return ["log and step exclude each other"]
        if dim.step is not None and dim.step <= 0:
            return ["step must be > 0"]
    problems = []
    for value in dim.bounds():
        texts = space.overrides({dim.name: value}, base, {parse_override(t)[1] for t in overrides})
        try:
            config = resolve(space.model, space.dataset, profile, (*overrides, *texts), overlays)
            model_class(space.model)(4, 8, config.model)
        except (ConfigError, ValueError, TypeError, RuntimeError) as error:
            problems.append(str(error).removeprefix(f"{space.model}: "))
    return list(dict.fromkeys(problems))
