"""The layering of ARCHITECTURE.md, checked on the production code's import graph: data flows one way, datasets →
models → harness core → tuning → commands, and reports beside them, with no circle between files. Each module's layer
is its folder; nothing here lists modules by hand. Every production module outside the lab keeps its functions
short, says why an import waits inside a function, and uses Optuna through its public API only; ARCHITECTURE.md's
module map lists the harness's modules in import order. Imports inside functions count like any other."""
from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("datasets", "models", "benchmarks", "reports")
LAB = ROOT / "benchmarks" / "experiments"  # run from the checkout as benchmarks.experiments, never installed
# The folders of the harness that are layers of their own; the other modules of benchmarks/ are its core.
SUBLAYERS = {"commands": "commands", "tuning": "tuning", "experiments": "lab"}
ALLOWED = {
    "datasets": {"datasets"},
    "models": {"datasets", "models"},
    "core": {"datasets", "models", "core"},
    "tuning": {"datasets", "models", "core", "tuning"},
    "reports": {"reports"},
    "commands": {"datasets", "models", "core", "tuning", "reports", "commands"},
    "lab": {"datasets", "models", "core", "tuning", "reports", "commands", "lab"},
}
# ARCHITECTURE.md's diagram from the bottom up, one layer a folder (the harness core is benchmarks/ without its
# subfolders); the layers of one entry stand side by side and import nothing of each other.
DIAGRAM = [("datasets",), ("models",), ("core",), ("tuning", "reports"), ("commands",), ("lab",)]
# What reports may take from the harness: the metrics from rank counts (and the sampled metrics they determine), and
# the store's files (read and written atomically, and the names of the tuning results).
REPORTS_MAY_IMPORT = {"recbench.benchmarks.metrics", "recbench.benchmarks.sampled_metrics", "recbench.benchmarks.store"}
MAX_LINES, MAX_PARAMETERS = 60, 8
# The check for Optuna's private API: a private module or name, its storage or a trial's id.
OPTUNA_PRIVATE = re.compile(r"optuna\.(_|[a-z_]+\._)|\._storage\b|\._trial_id\b")


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if path.is_relative_to(LAB):
        return ".".join(parts)  # the lab is imported from the checkout, not from the installed package
    return "recbench." + ".".join(parts) if parts[0] in PACKAGES else ".".join(parts)


def production_files() -> dict[str, Path]:
    files = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    files["run_all"] = ROOT / "run_all.py"
    return files


def outside_the_lab() -> dict[str, Path]:
    return {module: path for module, path in production_files().items() if not path.is_relative_to(LAB)}


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


def is_launcher(path: Path) -> bool:
    """A documented name of a command kept one folder up (``python -m benchmarks.tune``): a docstring, imports
    from ``benchmarks/commands/``, ``import sys``, ``__all__`` and a ``__main__`` guard, nothing else."""
    body = ast.parse(path.read_text()).body
    commands = [node for node in body if isinstance(node, ast.ImportFrom)]
    rest = [node for node in body if node not in commands and not (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)  # the docstring
        or isinstance(node, ast.Import) and [alias.name for alias in node.names] == ["sys"]
        or isinstance(node, ast.Assign) and [ast.unparse(target) for target in node.targets] == ["__all__"]
        or isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'")]
    return bool(commands) and not rest and all(
        node.module.startswith("recbench.benchmarks.commands.") for node in commands)


def layer(module: str, path: Path) -> str:
    """The module's layer, from its folder: datasets, models, reports; in benchmarks/ the core, tuning, commands
    or the lab; run_all.py and the launchers of benchmarks/ are commands."""
    parts = path.relative_to(ROOT).parts
    if len(parts) == 1 or parts[0] == "benchmarks" and len(parts) == 2 and is_launcher(path):
        return "commands"
    if parts[0] != "benchmarks":
        return parts[0]
    return SUBLAYERS.get(parts[1], "core") if len(parts) > 2 else "core"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = production_files()
    return {module: imports_of(path, set(files)) for module, path in files.items()}


def test_imports_follow_the_layers(graph):
    files = production_files()
    wrong = []
    for module, imported in graph.items():
        own = layer(module, files[module])
        allowed = ALLOWED[own] | (REPORTS_MAY_IMPORT if own == "reports" else set())
        for target in sorted(imported):
            if layer(target, files[target]) not in allowed and target not in allowed:
                wrong.append(f"{module} ({own}) imports {target} ({layer(target, files[target])})")
    assert not wrong, "\n".join(wrong)


def test_the_folders_draw_the_diagram_with_no_arrow_back_up(graph):
    """The import graph at folder scale (each layer's folder one node: benchmarks/commands/, benchmarks/tuning/ and
    the lab apart from the core in benchmarks/; run_all.py and the launchers with the commands): every arrow between
    two folders runs down ARCHITECTURE.md's diagram, none back up and none between folders side by side. The commands
    stand above the reports, which read the core's metrics and store: benchmarks/ -> reports/ -> benchmarks/ only
    when benchmarks/commands/ is drawn inside benchmarks/, which the fixed top level makes it."""
    files = production_files()
    level = {name: number for number, names in enumerate(DIAGRAM) for name in names}
    arrows = {(layer(module, files[module]), layer(target, files[target]))
              for module, targets in graph.items() for target in targets}
    assert {folder for arrow in arrows for folder in arrow} == set(level)
    back_up = sorted(f"{importer} -> {imported}" for importer, imported in arrows
                     if importer != imported and level[imported] >= level[importer])
    assert not back_up, back_up
    assert ("commands", "reports") in arrows and ("reports", "core") in arrows  # the two arrows the rule is about


def test_the_layers_are_the_folders():
    """The launchers are found by their shape, and they are the documented names (README.md) of the commands."""
    files = production_files()
    launchers = {module for module, path in files.items() if path.parent == ROOT / "benchmarks" and is_launcher(path)}
    assert launchers == {"recbench.benchmarks.tune", "recbench.benchmarks.studies", "recbench.benchmarks.check_model",
                         "recbench.benchmarks.api", "recbench.benchmarks.gpu_check"}
    assert layer("recbench.benchmarks.trainer", files["recbench.benchmarks.trainer"]) == "core"
    assert layer("run_all", files["run_all"]) == "commands"
    assert {layer(module, path) for module, path in files.items()} == set(ALLOWED)


def test_nothing_imports_the_lab_through_the_installed_package(graph):
    """The lab is not installed (pyproject.toml), so ``recbench.benchmarks.experiments`` exists only in an editable
    install; its scripts and the tests import it as ``benchmarks.experiments`` from the checkout."""
    named = [path for path in [*production_files().values(), *(ROOT / "tests").rglob("*.py")]
             if path != Path(__file__) and "recbench.benchmarks.experiments" in path.read_text()]
    assert not named, named


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


def test_the_checker_sees_planted_violations(tmp_path):
    """The graph builder finds a function-level import and the layer rule rejects a model importing the harness;
    a launcher with more than a name is no launcher; the size and import rules see what they look for."""
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from recbench.benchmarks.trainer import Trainer\n")
    imported = imports_of(planted, {"recbench.benchmarks.trainer", "recbench.benchmarks"})
    assert imported == {"recbench.benchmarks.trainer"}
    files = production_files()
    assert layer("recbench.benchmarks.trainer", files["recbench.benchmarks.trainer"]) not in ALLOWED["models"]
    assert unexplained_imports(planted) == ["planted.py:2: from recbench.benchmarks.trainer import Trainer"]
    planted.write_text("def f():\n    # a cycle: trainer imports this module\n"
                       "    from recbench.benchmarks import trainer\n")
    assert unexplained_imports(planted) == []
    launcher = tmp_path / "launcher.py"
    launcher.write_text('"""A name."""\nfrom recbench.benchmarks.commands.tune import main\nX = 1\n')
    assert not is_launcher(launcher)
    planted.write_text("def f(" + ", ".join(f"a{i}" for i in range(9)) + "):\n" + "    pass\n" * 60)
    assert oversized(planted) == ["planted.py:1 f: 61 lines, 9 parameters"]


def oversized(path: Path) -> list[str]:
    """The functions of ``path`` over :data:`MAX_LINES` lines or :data:`MAX_PARAMETERS` parameters."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            arguments = node.args
            parameters = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)
                          if a.arg not in ("self", "cls")]
            if lines > MAX_LINES or len(parameters) > MAX_PARAMETERS:
                found.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines, {len(parameters)} parameters")
    return found


def unexplained_imports(path: Path) -> list[str]:
    """The imports inside a function of ``path`` that no comment explains (why they wait: an optional dependency,
    start-up time, a cycle they avoid): none on their line, on a line of the block of imports they stand in, or on
    the line above that block."""
    lines = path.read_text().splitlines()
    found = []
    for function in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                first = node.lineno - 1
                while first > 0 and lines[first - 1].strip().startswith(("import ", "from ")):
                    first -= 1
                block = lines[first:node.end_lineno]
                if not any("#" in line for line in block) and not lines[first - 1].strip().startswith("#"):
                    found.append(f"{path.name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_functions_are_short_outside_the_lab():
    long = [text for path in outside_the_lab().values() for text in oversized(path)]
    assert not long, "\n".join(long)


def test_an_import_inside_a_function_says_why():
    unexplained = [text for path in production_files().values() for text in unexplained_imports(path)]
    assert not unexplained, "\n".join(unexplained)


def test_optuna_is_used_through_its_public_api_only():
    """The issue's ``grep -rnE`` over benchmarks/ (and the tests): no private module, no study._storage, no
    trial._trial_id."""
    sources = [*(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    private = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
               for path in sources if path != Path(__file__)
               for number, line in enumerate(path.read_text().splitlines(), start=1) if OPTUNA_PRIVATE.search(line)]
    assert not private, "\n".join(private)


def test_the_installed_packages_are_the_folders_but_the_lab():
    """pyproject.toml installs every package folder of the suite, each where it lies, and not the lab."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {module_name(path.parent): path.parent.relative_to(ROOT).as_posix()
               for package in PACKAGES for path in (ROOT / package).rglob("__init__.py")
               if not path.is_relative_to(LAB)}
    assert sorted(setuptools["packages"]) == sorted(folders)
    assert setuptools["package-dir"] == folders


def module_map() -> list[str]:
    """The modules ARCHITECTURE.md's module map lists, in its order (the first column of its tables)."""
    text = (ROOT / "ARCHITECTURE.md").read_text().split("## Module map", 1)[1]
    return re.findall(r"^\| `([\w/.]+\.py)` \|", text, flags=re.MULTILINE)


def test_the_module_map_lists_every_module_of_the_harness_in_import_order(graph):
    """Every module of benchmarks/ outside the lab (package files hold no code the order depends on) and run_all.py,
    each importing only modules listed above it."""
    files = {path.relative_to(ROOT).as_posix(): module for module, path in outside_the_lab().items()
             if path.is_relative_to(ROOT / "benchmarks") or module == "run_all"}
    packages = {name for name in files if name.endswith("__init__.py")}
    assert all(not graph[files[name]] for name in packages)
    listed = module_map()
    assert sorted(listed) == sorted(set(files) - packages), "the map and benchmarks/ differ"
    above: set[str] = set()
    wrong = []
    for name in listed:
        later = {target for target in graph[files[name]] if target in files.values()} - above - {
            files[package] for package in packages}
        wrong += [f"{name} imports {target}, listed below it" for target in sorted(later)]
        above.add(files[name])
    assert not wrong, "\n".join(wrong)


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
