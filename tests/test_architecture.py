"""The layering of ARCHITECTURE.md, checked on the production code's import graph: data flows one way,
datasets → models → harness core → entry points and reports, with no circle between files; the harness core's
functions stay short enough to read at once. Imports inside functions count like any other."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("datasets", "models", "benchmarks", "reports")
# Modules a user runs (command lines, the Python API): they may import every layer.
ENTRY_POINTS = {"run_all", "recbench.benchmarks.commands.cli", "recbench.benchmarks.commands.studies",
                "recbench.benchmarks.commands.check_model", "recbench.benchmarks.commands.api",
                "recbench.benchmarks.commands.tune", "recbench.benchmarks.tune", "recbench.benchmarks.studies",
                "recbench.benchmarks.check_model", "recbench.benchmarks.api"}
EXPERIMENTS = "recbench.benchmarks.experiments"
# What reports may take from the harness: the metrics from rank counts, and the atomic writes of the store.
REPORTS_MAY_IMPORT = {"recbench.benchmarks.metrics", "recbench.benchmarks.store"}
MAX_LINES, MAX_PARAMETERS = 60, 8


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return "recbench." + ".".join(parts) if parts[0] in PACKAGES else ".".join(parts)


def production_files() -> dict[str, Path]:
    files = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    files["run_all"] = ROOT / "run_all.py"
    return files


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The project's modules that ``path`` imports (a ``from package import name`` of a submodule counts as
    that submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            found |= submodules
            if len(submodules) < len(node.names):  # some names come from the module itself
                found.add(node.module)
    return {name for name in found if name in known}


def layer(module: str) -> str:
    if module in ENTRY_POINTS:
        return "entry point"
    if module.startswith(EXPERIMENTS):
        return "experiments"
    return module.split(".")[1]  # datasets, models, benchmarks (the harness core), reports


ALLOWED = {
    "datasets": {"datasets"},
    "models": {"datasets", "models"},
    "benchmarks": {"datasets", "models", "benchmarks"},
    "reports": {"reports"},
    "entry point": {"datasets", "models", "benchmarks", "reports", "entry point"},
    "experiments": {"datasets", "models", "benchmarks", "reports", "entry point", "experiments"},
}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = production_files()
    return {module: imports_of(path, set(files)) for module, path in files.items()}


def test_imports_follow_the_layers(graph):
    wrong = []
    for module, imported in graph.items():
        for target in sorted(imported):
            allowed = ALLOWED[layer(module)] | (REPORTS_MAY_IMPORT if layer(module) == "reports" else set())
            if layer(target) not in allowed and target not in allowed:
                wrong.append(f"{module} ({layer(module)}) imports {target} ({layer(target)})")
    assert not wrong, "\n".join(wrong)


def test_no_circle_between_files(graph):
    """A depth-first search for a back edge; package __init__ files that re-export their submodules are
    nodes like any other, so `from recbench.datasets import x` inside datasets/ would show up as a circle."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    circles = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not circles, "\n".join(circles)


def test_the_checker_sees_a_planted_violation(tmp_path):
    """The graph builder finds a function-level import and the layer rule rejects a model importing the harness."""
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from recbench.benchmarks.trainer import Trainer\n")
    imported = imports_of(planted, {"recbench.benchmarks.trainer", "recbench.benchmarks"})
    assert imported == {"recbench.benchmarks.trainer"}
    assert layer("recbench.benchmarks.trainer") not in ALLOWED[layer("recbench.models.sasrec")]


def harness_core_functions():
    for module, path in sorted(production_files().items()):
        if layer(module) != "benchmarks":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{module}.{node.name}", node


def test_harness_core_functions_are_short():
    long = []
    for name, node in harness_core_functions():
        lines = node.end_lineno - node.lineno + 1
        arguments = node.args
        parameters = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)
                      if a.arg not in ("self", "cls")]
        if lines > MAX_LINES or len(parameters) > MAX_PARAMETERS:
            long.append(f"{name}: {lines} lines, {len(parameters)} parameters")
    assert not long, "\n".join(long)


OUTSIDE_SCRIPT = """
import importlib.util, json, sys
from recbench.models.base import NeuralRecommender, Recommender
from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.jobs import Job
from recbench.benchmarks.options import RunOptions
from recbench.datasets import generate

data = generate(n_users=60, n_items=300, mean_length=8.0, seed=0, name="tiny")
options = RunOptions(output=sys.argv[1], protocols=("pop100",), device="cpu", cache_dir=sys.argv[1] + "-cache",
                     progress=False)
rows = run_jobs([Job("tiny", "pop", 0)], options, preloaded={"tiny": data}, log=lambda *_: None).rows
spec = importlib.util.find_spec("datasets")
print(json.dumps({"ndcg": rows[0]["metrics"]["NDCG@10"],
                  "datasets": spec.origin if spec else None}))
"""


def test_the_installed_suite_is_importable_from_any_directory(tmp_path):
    """After `pip install -e .`, a script outside the checkout imports the model base classes and the run API and
    runs a grid; the suite adds no top-level `datasets` (or `models`, ...) that would hide another package."""
    import json
    import os
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", OUTSIDE_SCRIPT, str(tmp_path / "out")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert 0 < result["ndcg"] < 1
    assert result["datasets"] is None or not result["datasets"].startswith(str(ROOT))
