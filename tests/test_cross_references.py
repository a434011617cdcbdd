"""Every cross-reference resolves: what a docstring or a document points a reader to is there.

- Sphinx roles in the code's docstrings and comments (``:func:``, ``:class:``, ``:meth:``, ``:mod:``, ``:data:``,
  ``:attr:``, ``:exc:``): a target in the suite (``benchmarks.grid.run_jobs``, ``~benchmarks.jobs.GridError``, a
  name of the citing module or one it imports) must be a module, or a name a module defines or a class of it holds;
  targets outside the suite (``torch.nn.Module``) are not checked.
- Paths of the repository in backticks (``benchmarks/trainer.py``, `models/fidelity.md`,
  `models/transformer_fast.dropout_keep_mask`), in code and documents: a tracked file or folder, or a name its module
  defines (a name with a wildcard or a placeholder, ``<dataset>``, is a pattern, not a path). Under ``results/``,
  which runs fill, only the stored results a document cites (``results/reference/...`` in a ``.md``) are checked:
  code names there what it writes.
- Markdown links to files of the repository (``[text](path)``): a tracked file or folder; the sections a link to a
  Markdown file names (``#anchor``) are ``tests/test_docs.py``'s.

The code is read, not imported (its definitions from the syntax tree), so the check costs no start-up.
"""
import ast
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("datasets", "models", "benchmarks", "reports")
ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):`~?\.?([\w.]+)(?:\(\))?`")
PATH = re.compile(r"`{1,2}((?:datasets|models|benchmarks|reports|tests|results|\.ci)/[\w./-]*)`{1,2}")
PLACEHOLDER = re.compile(r"[*<>{}]|[A-Z]{3,}")  # a pattern or a name to fill in, not a path
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[\w-]+)?\)")
# Stored results keep the wording they were written with; this file plants broken references in its own tests.
NOT_SCANNED = ("results/reference/", "tests/test_cross_references.py")


def tracked(root: Path = ROOT) -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    return listed.splitlines()


def module_path(root: Path, dotted: str) -> Path | None:
    """The file of the suite's module ``dotted`` (``benchmarks.grid``, ``recbench.models.base``), or None."""
    parts = dotted.removeprefix("recbench.").split(".")
    if parts[0] not in PACKAGES:
        return None
    for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


@lru_cache(maxsize=None)
def definitions(path: Path) -> tuple[frozenset, dict]:
    """The names ``path`` defines or imports at its top level, and {class: the names its body defines}."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names, classes = set(), {}
    for node in tree.body:
        names |= bound_names(node)
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                members |= bound_names(item)
            for item in ast.walk(node):  # self.x = ... in its methods
                if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                    members.add(item.attr)
            classes[node.name] = frozenset(members)
    return frozenset(names), classes


def bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if isinstance(node, ast.Assign):
        return {name.id for target in node.targets for name in ast.walk(target) if isinstance(name, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, (ast.If, ast.Try)):
        return {name for child in node.body for name in bound_names(child)}
    return set()


def defined(path: Path, attributes: list[str]) -> bool:
    """Whether module ``path`` defines ``attributes[0]`` and, where it is a class, that class holds the rest."""
    names, classes = definitions(path)
    if not attributes:
        return True
    if attributes[0] not in names:
        return False
    return len(attributes) == 1 or attributes[0] not in classes or attributes[1] in classes[attributes[0]]


def resolves(root: Path, target: str, citing: Path) -> bool | None:
    """Whether a role's ``target`` cited in ``citing`` resolves; None where it names no module of the suite."""
    parts = target.removeprefix("recbench.").split(".")
    if parts[0] in PACKAGES:
        for cut in range(len(parts), 0, -1):
            path = module_path(root, ".".join(parts[:cut]))
            if path is not None:
                return defined(path, parts[cut:])
        return False
    if citing.suffix != ".py":
        return None
    names, classes = definitions(citing)
    if parts[0] in names:
        return defined(citing, parts)
    if len(parts) == 1:  # a method or attribute of the citing module's class, named bare
        return any(parts[0] in members for members in classes.values())
    return None  # a dotted name outside the suite (torch.nn.Module)


def names_a_definition(root: Path, path: str, known: set[str]) -> bool:
    """Whether ``path`` is a module's file and a name in it, ``models/transformer_fast.dropout_keep_mask``."""
    module, _, attributes = path.partition(".")
    return f"{module}.py" in known and bool(attributes) and defined(root / f"{module}.py", attributes.split("."))


def broken_references(root: Path, files: list[str]) -> list[str]:
    """One line per reference in ``files`` (tracked paths relative to ``root``) that does not resolve."""
    known = set(files) | {os.path.dirname(name) for name in files}
    known |= {os.path.dirname(name) for name in known}
    problems = []
    for name in files:
        if name.startswith(NOT_SCANNED) or not name.endswith((".py", ".md")) or not (root / name).is_file():
            continue
        text = (root / name).read_text(encoding="utf-8")

        def where(offset: int) -> str:
            return f"{name}:{text.count(chr(10), 0, offset) + 1}"

        for match in ROLE.finditer(text):
            if resolves(root, match.group(1), root / name) is False:
                problems.append(f"{where(match.start())}: {match.group()} names nothing in the suite")
        for match in PATH.finditer(text):
            path = match.group(1).rstrip("/.")
            if path.startswith("results/") and not (name.endswith(".md") and path.startswith("results/reference/")):
                continue
            if not PLACEHOLDER.search(path) and path not in known and not names_a_definition(root, path, known):
                problems.append(f"{where(match.start())}: {match.group(1)} is not in the repository")
        if name.endswith(".md"):
            for match in LINK.finditer(text):
                link = match.group(1)
                if re.match(r"[a-z]+:", link):
                    continue
                path = os.path.normpath(os.path.join(os.path.dirname(name), link)).rstrip("/")
                if path not in known:
                    problems.append(f"{where(match.start())}: links to {link}, which is not in the repository")
    return problems


def test_every_cross_reference_resolves():
    problems = broken_references(ROOT, tracked())
    assert not problems, "\n".join(problems)


PLANTED = '''"""The :func:`run` of :class:`Box` (:meth:`Box.open`, :meth:`open`); :func:`models.mod.run`,
:mod:`models.mod`, :class:`~models.mod.Box`, :data:`LIMIT`, :func:`torch.nn.functional.relu`; ``models/mod.py``,
`models/mod.run`, ``models/``, ``results/<name>/table.md``, ``results/somewhere/out.json``."""
LIMIT = 3


class Box:
    def open(self):
        self.lid = 1


def run():
    pass
'''


def planted(tmp_path, extra: str) -> list[str]:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mod.py").write_text(PLANTED + extra)
    (tmp_path / "GUIDE.md").write_text("# Guide\n\nSee [the module](models/mod.py) and [the box](models/mod.py#box).\n")
    return broken_references(tmp_path, ["models/mod.py", "GUIDE.md"])


def test_references_that_resolve_pass(tmp_path):
    assert planted(tmp_path, "") == []


def test_a_reference_that_does_not_resolve_is_named_with_its_file_and_line(tmp_path):
    extra = ('"""Gone: :func:`walk`, :meth:`Box.close`, :func:`models.mod.walk`, :mod:`models.other`,\n'
             '``models/other.py``, `models/mod.walk`."""\n')
    problems = planted(tmp_path, extra)
    line = PLANTED.count("\n") + 1
    assert problems == [f"models/mod.py:{line}: :func:`walk` names nothing in the suite",
                        f"models/mod.py:{line}: :meth:`Box.close` names nothing in the suite",
                        f"models/mod.py:{line}: :func:`models.mod.walk` names nothing in the suite",
                        f"models/mod.py:{line}: :mod:`models.other` names nothing in the suite",
                        f"models/mod.py:{line + 1}: models/other.py is not in the repository",
                        f"models/mod.py:{line + 1}: models/mod.walk is not in the repository"]
    (tmp_path / "GUIDE.md").write_text("# Guide\n\n[gone](models/gone.py), [away](https://example.org/x.py)\n")
    guide = "GUIDE.md"
    assert broken_references(tmp_path, ["models/mod.py", guide])[-1] == (
        f"{guide}:3: links to models/gone.py, which is not in the repository")
