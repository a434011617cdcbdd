"""The model registry: every name ``run_all.py --models`` accepts is resolved here and nowhere else.

A model is named in one of four ways:

- a **registered name** (``pop``, ``sasrec``, ...): one file under ``models/`` each, in the table below;
- an **import path** ``package.module:Class`` of the user's own code, importable from ``PYTHONPATH`` or the
  current directory;
- an **entry point** of an installed package, in the group :data:`ENTRY_POINT_GROUP` (``recbench.models``), e.g.
  ``myrec = "mypkg.mymodel:MyRec"`` under ``[project.entry-points."recbench.models"]`` of its pyproject.toml;
  a name that collides with a registered one is an error;
- a class handed over **in this process** (the Python API given a class that no import path reaches, e.g. one
  defined in a notebook): it is named ``module:Class`` and only this process can build it.

Classes are imported on first use so that listing names or running POP never imports every model. A model from
outside the suite has an **origin** (:func:`model_origin`): its import path, source file and the sha256 of that
file when this process first imported it, which the harness puts into the job's key, so that a result of edited
code is never reused.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import inspect
import os
import re
import sys

from recbench.datasets.errors import unknown

_REGISTRY = {
    "pop": "recbench.models.pop:Pop",
    "bprmf": "recbench.models.bprmf:BPRMF",
    "sasrec": "recbench.models.sasrec:SASRec",
    "sasrec-ce": "recbench.models.sasrec:SASRecCE",
    "gsasrec": "recbench.models.sasrec_losses:GSASRec",
    "sasrec-ss": "recbench.models.sasrec_losses:SASRecSampledSoftmax",
    "bert4rec": "recbench.models.bert4rec:BERT4Rec",
    "bert4rec-1mask": "recbench.models.bert4rec:BERT4Rec1Mask",
    "bert4rec-1mask-random": "recbench.models.bert4rec:BERT4Rec1MaskRandom",
    "gbert4rec": "recbench.models.bert4rec_losses:GBERT4Rec",
    "ncf": "recbench.models.ncf:NCF",
    "fpmc": "recbench.models.fpmc:FPMC",
    "gru4rec": "recbench.models.gru4rec:GRU4Rec",
    "gru4rec+": "recbench.models.gru4rec_plus:GRU4RecPlus",
    "caser": "recbench.models.caser:Caser",
    "lstm": "recbench.models.lstm:LSTM",
    "lstm-rel": "recbench.models.lstm_relevance:LSTMRelevance",
    "bert4rec-rel": "recbench.models.bert4rec_relevance:BERT4RecRelevance",
}
ENTRY_POINT_GROUP = "recbench.models"
IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_IN_PROCESS: dict[str, type] = {}  # name -> a class handed over by the Python API that no import path reaches
_ORIGINS: dict[str, tuple[type, dict]] = {}  # name -> (class, its origin when this process first resolved it)


def model_names() -> list[str]:
    """The registered names, then the entry points' names of the installed packages."""
    return [*_REGISTRY, *_entry_points()]


def is_registered(name: str) -> bool:
    """Whether ``name`` is one of the suite's own models (whose code the suite's commit covers)."""
    return name in _REGISTRY


def model_class(name: str, source_sha256: str | None = None):
    """The class of model ``name`` (module docstring). With ``source_sha256`` (the origin a grid was planned
    with), a model from outside the suite whose module this process imported from other code is re-imported
    once, and a remaining difference is an error: the code that runs must be the code the job's key hashes."""
    if name in _REGISTRY:
        return _import(_REGISTRY[name], name)
    if name in _IN_PROCESS:
        cls = _IN_PROCESS[name]
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.append(os.getcwd())  # as `python -m` does, but last: never shadows an installed package
        cls = _import(_outside_path(name), name)
        if name not in _ORIGINS or _ORIGINS[name][0] is not cls:  # first seen, or its module was reloaded
            _ORIGINS[name] = (cls, _origin(name, cls))
    if source_sha256 is not None and _ORIGINS[name][1]["sha256"] != source_sha256:
        cls = _reimport(name, source_sha256)
    return cls


def model_origin(name: str) -> dict | None:
    """None for a registered model; else ``import_path``, ``file`` (None when the class has no file) and the
    ``sha256`` of its source as this process imported it (``in_process``: only this process can build it)."""
    if name in _REGISTRY:
        return None
    model_class(name)
    return dict(_ORIGINS[name][1])


def changed_source(name: str) -> str | None:
    """For a model from outside the suite: a sentence when its source file differs from what this process
    imported (the file was edited since), else None."""
    origin = model_origin(name)
    if origin is None or origin["file"] is None or origin["sha256"] == _file_sha256(origin["file"]):
        return None
    module = origin["import_path"].split(":")[0]
    return (f"{origin['file']} changed after this process imported it, so the code that would run is not the "
            f"code on disk: reload it (importlib.reload({module})) or start a new process")


def model_name_of(cls: type) -> str:
    """The name under which the Python API runs class ``cls``: a registered name, else its import path when
    that path imports ``cls`` itself, else ``module:Class`` for this process only (:data:`_IN_PROCESS`)."""
    for name, path in _REGISTRY.items():
        if f"{cls.__module__}:{cls.__qualname__}" == path:
            return name
    _check_model_class(cls, cls.__qualname__)
    name = f"{cls.__module__}:{cls.__qualname__}"
    if cls.__module__ != "__main__" and "<locals>" not in cls.__qualname__:
        try:
            found = _import(name, name)
        except ValueError:
            found = None
        if found is cls:
            return name
        if found is not None:
            raise ValueError(f"model class {cls.__qualname__} is not the class that {name} imports now (was its "
                             f"module reloaded?); pass the name {name!r} or the class the module holds now")
    _IN_PROCESS[name] = cls
    _ORIGINS[name] = (cls, _origin(name, cls))
    return name


def short_name(name: str) -> str:
    """The class name of an import path (``MyRec`` for ``mypkg.mymodel:MyRec``), else the name itself: what
    ``--set MyRec:field=value`` may call it."""
    return name.rsplit(":", 1)[1].rsplit(".", 1)[-1] if ":" in name else name


# ------------------------------------------------------------------------------------------------ resolving

def _entry_points() -> dict[str, str]:
    """Entry point name -> import path, for the installed packages' models; a name that collides with a
    registered model or another package's is an error."""
    found: dict[str, str] = {}
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        package = point.dist.name if point.dist is not None else "an installed package"
        if point.name in _REGISTRY:
            raise ValueError(f"model {point.name!r}: the entry point of {package} ({point.value}, group "
                             f"{ENTRY_POINT_GROUP}) collides with the registered model {point.name!r}; rename "
                             f"the entry point")
        if point.name in found and found[point.name] != point.value:
            raise ValueError(f"model {point.name!r}: two entry points of group {ENTRY_POINT_GROUP} have this name "
                             f"({found[point.name]}, {point.value}); rename one of them")
        found[point.name] = point.value
    return found


def _outside_path(name: str) -> str:
    """The import path of a model that is not registered: the name itself, or its entry point's value."""
    if IMPORT_PATH.fullmatch(name):
        return name
    points = _entry_points()
    if name in points:
        return points[name]
    raise unknown("model", name, [*_REGISTRY, *points, "package.module:Class (a class of your own)"])


def _import(path: str, name: str):
    """The class at ``path`` (``module:Class``); failures are one line that says what to fix."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"model {name!r}: cannot import {module_name} ({error}); put the folder that holds it "
                         f"on PYTHONPATH or run from that folder") from None
    except Exception as error:  # noqa: BLE001  (the user's module failed while it ran)
        raise ValueError(f"model {name!r}: importing {module_name} failed: {type(error).__name__}: {error}") from None
    cls = module
    for part in attribute.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            raise ValueError(f"model {name!r}: module {module_name} ({getattr(module, '__file__', '?')}) has no "
                             f"{attribute}")
    _check_model_class(cls, name)
    return cls


def _check_model_class(cls, name: str) -> None:
    from recbench.models import base  # start-up time: the registry lists names without importing torch

    if not (isinstance(cls, type) and issubclass(cls, base.Recommender)):
        twin = _imported_twice(cls, base)
        if twin is not None:
            raise ValueError(f"model {name!r}: {cls.__qualname__} derives from {twin}.Recommender, and {twin} is "
                             f"the suite's models/base.py imported a second time under another name (the checkout's "
                             f"folder on sys.path), which Python takes for other classes; import them as "
                             f"`from recbench.models.base import NeuralRecommender` (or Recommender)")
        raise ValueError(f"model {name!r}: {cls!r} is not a model class; derive it from "
                         f"recbench.models.base.NeuralRecommender (or Recommender for a model without gradient "
                         f"training)")
    if not dataclasses.is_dataclass(getattr(cls, "Config", None)):
        raise ValueError(f"model {name!r}: {cls.__qualname__}.Config must be a dataclass of its hyper-parameters "
                         f"(an empty @dataclass class when it has none)")


def _imported_twice(cls, base) -> str | None:
    """The name of a module among ``cls``'s bases that is the file of ``base`` imported under another name
    (``models.base`` from the checkout, beside ``recbench.models.base``), else None."""
    for parent in getattr(cls, "__mro__", ()):
        module = sys.modules.get(parent.__module__)
        file = getattr(module, "__file__", None)
        if module is not base and file and os.path.exists(file) and os.path.samefile(file, base.__file__):
            return parent.__module__
    return None


def _origin(name: str, cls: type) -> dict:
    """Where ``cls`` comes from and the sha256 of its source file now (of its source text when it has no file)."""
    try:
        file = inspect.getsourcefile(cls)
    except TypeError:  # a class of no file
        file = None
    if file is not None and os.path.isfile(file):
        file, sha256 = os.path.abspath(file), _file_sha256(file)
    else:
        try:
            file, sha256 = None, hashlib.sha256(inspect.getsource(cls).encode()).hexdigest()
        except (OSError, TypeError):
            raise ValueError(f"model {name!r}: the source of {cls.__qualname__} cannot be read, so results of "
                             f"edited code could not be told apart; define it in a module file") from None
    return {"import_path": name if ":" in name else _outside_path(name), "file": file, "sha256": sha256,
            "in_process": name in _IN_PROCESS}


def _file_sha256(path: str) -> str:
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def _reimport(name: str, source_sha256: str):
    """Import the module of ``name`` again (its file was edited since this process imported it); an error when
    its source still differs from ``source_sha256``."""
    origin = _ORIGINS[name][1]
    if not origin["in_process"] and origin["file"] is not None and _file_sha256(origin["file"]) == source_sha256:
        importlib.reload(sys.modules[origin["import_path"].split(":")[0]])
        cls = _import(origin["import_path"], name)
        _ORIGINS[name] = (cls, _origin(name, cls))
        return cls
    raise ValueError(f"model {name!r}: its source ({origin['file'] or 'in process'}, sha256 {origin['sha256'][:12]}) "
                     f"differs from the source the grid was planned with (sha256 {source_sha256[:12]}); run every "
                     f"process from the same code and rerun the command")
