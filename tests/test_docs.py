"""Every document the repository cites is in the repository: a user who clones it can read the protocol, the
architecture and the fidelity record that its code, configs and README point to.

The scan reads the tracked text files (``git ls-files``: ``.py``, ``.toml``, ``.md`` and ``.ci/run``; the stored
results under ``results/reference/`` keep the wording they were written with) and finds

- Markdown documents they name (``PROTOCOL.md``, ``models/fidelity.md``), which must be tracked files, relative to
  the repository's root or to the citing file's folder; a section cited beside one (``PROTOCOL.md, "Candidates"``,
  or a link's ``#anchor``) must be one of its headings;
- paths into ``../shared``, a folder beside the checkout that a clone does not have.

A name quoted on its own (``"table.md"``) is a file the code reads or writes, not a citation, and so are the
Markdown files a run writes into its results folder.
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

SCANNED_SUFFIXES = (".py", ".toml", ".md")
SCANNED_FILES = (".ci/run",)
# Stored results keep the wording they were written with; this file plants bad citations in its own tests.
NOT_SCANNED = ("results/reference/", "tests/test_docs.py")
WRITTEN_BY_RUNS = {"report.md", "table.md"}  # results/README.md: what a run writes into results/<name>/

DOCUMENT = re.compile(r"(?<![\w./-])([\w./-]*\w\.md)(#[\w-]+)?(?![\w-])")
SECTION = re.compile(r"\A`*\)?[,;]?\s*\(?[\"“]([^\"”]{1,80})[\"”]")  # right after the name: , "Section" or ("Section"
OUTSIDE = re.compile(r"\.\./shared\b")


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return listed.splitlines()


def scanned(files: list[str]) -> list[str]:
    return [name for name in files if (name.endswith(SCANNED_SUFFIXES) or name in SCANNED_FILES)
            and not name.startswith(NOT_SCANNED)]


def headings(text: str) -> set[str]:
    """A Markdown file's headings as written (without ``#`` and backticks) and as GitHub anchors."""
    titles = {line.lstrip("#").strip().replace("`", "") for line in text.splitlines() if re.match(r"#+ ", line)}
    return titles | {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in titles}


def quoted_alone(text: str, start: int, end: int) -> bool:
    """Whether the name at ``text[start:end]`` is a string literal of its own, e.g. ``"table.md"``: its word
    (the text between white space around it) has a quote before the name and one after it."""
    before = re.search(r"\S*\Z", text[:start]).group()
    after = re.match(r"\S*", text[end:]).group()
    return any(quote in before for quote in "\"'") and any(quote in after for quote in "\"'")


def resolve(name: str, citing: str, files: set[str]) -> str | None:
    """The tracked file ``name`` names, relative to the root or to the citing file's folder, or None."""
    for base in ("", os.path.dirname(citing)):
        path = os.path.normpath(os.path.join(base, name))
        if path in files:
            return path
    return None


def broken_citations(root: Path, files: list[str]) -> list[str]:
    """One line per citation in the scanned ``files`` (paths relative to ``root``) that does not resolve."""
    tracked, problems = set(files), []
    for citing in scanned(files):
        text = (root / citing).read_text(encoding="utf-8")

        def where(offset: int) -> str:
            return f"{citing}:{text.count(chr(10), 0, offset) + 1}"

        for match in OUTSIDE.finditer(text):
            problems.append(f"{where(match.start())}: {match.group()} is outside the repository; a clone has no "
                            f"such folder")
        for match in DOCUMENT.finditer(text):
            name, anchor = match.group(1), match.group(2)
            if os.path.basename(name) in WRITTEN_BY_RUNS or quoted_alone(text, match.start(), match.end()):
                continue
            target = resolve(name, citing, tracked)
            if target is None:
                problems.append(f"{where(match.start())}: cites {name}, which is not in the repository")
                continue
            section = SECTION.match(text[match.end():])
            title = section and re.sub(r"\s*\n\s*#?\s*", " ", section.group(1))  # a title may wrap, also in a comment
            wanted = [part for part in (anchor and anchor[1:], title) if part]
            available = headings((root / target).read_text(encoding="utf-8"))
            problems += [f"{where(match.start())}: cites section {part!r} of {target}, which has no such heading"
                         for part in wanted if part not in available]
    return problems


def test_every_cited_document_is_in_the_repository():
    problems = broken_citations(ROOT, tracked_files())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("line, problem", [
    ('"""Scored as ``protocol.md``, "Candidates", says."""', "cites protocol.md, which is not in the repository"),
    ("# see docs/GUIDE.md for the rules", "cites docs/GUIDE.md, which is not in the repository"),
    ("python run_all.py --data-dir ../shared/data", "../shared is outside the repository"),
    ('"""As ``REAL.md``, "No such section" says."""', "cites section 'No such section' of REAL.md"),
    ("# as REAL.md, \"Candidates\n# wrapped\" says", "cites section 'Candidates wrapped' of REAL.md"),
    ("[the rules](REAL.md#nowhere)", "cites section 'nowhere' of REAL.md"),
])
def test_a_citation_that_does_not_resolve_is_named_with_its_file_and_line(tmp_path, line, problem):
    (tmp_path / "REAL.md").write_text("# Real\n\n## Candidates\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(f"import os\n{line}\n")
    (problems,) = broken_citations(tmp_path, ["REAL.md", "pkg/mod.py"])
    assert problems.startswith("pkg/mod.py:2: ") and problem in problems


@pytest.mark.parametrize("line", [
    '"""Scored as ``REAL.md``, "Candidates", says; so does [REAL.md](REAL.md#candidates)."""',
    '"""Ranked as ``REAL.md``, "Rank and\n    ties" says."""',
    "# ``../REAL.md`` from this folder, ``fidelity.md`` beside this file",
    'path = folder / "tables" / "table2_pop100.md"  # a file the code writes',
    '"""Writes ``report.md`` and ``table.md`` into the results folder."""',
])
def test_citations_that_resolve_and_file_names_pass(tmp_path, line):
    (tmp_path / "REAL.md").write_text("# Real\n\n## Candidates\n\n## Rank and ties\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "fidelity.md").write_text("# Fidelity\n")
    (tmp_path / "pkg" / "mod.py").write_text(f"{line}\n")
    assert broken_citations(tmp_path, ["REAL.md", "pkg/fidelity.md", "pkg/mod.py"]) == []


WILDCARD = re.compile(r"(\*|<[^>]+>|\{[^}]*\})")


def name_pattern(name: str) -> re.Pattern:
    """A name as results/README.md writes it, as a pattern: ``*`` and ``<folder>`` stand for any text, ``{json,csv}``
    for one of its alternatives, the rest for itself (a folder's trailing ``/`` dropped)."""
    parts = []
    for index, part in enumerate(WILDCARD.split(name.rstrip("/"))):  # literal text at even places, wildcards between
        if index % 2 == 0:
            parts.append(re.escape(part))
        elif part.startswith("{"):
            parts.append("(" + "|".join(map(re.escape, part[1:-1].split(","))) + ")")
        else:
            parts.append(".+")
    return re.compile("".join(parts))


def described_patterns(readme: str) -> list[re.Pattern]:
    """The names in the first column of ``results/README.md``'s tables, as patterns (:func:`name_pattern`)."""
    return [name_pattern(name) for line in readme.splitlines() if line.startswith("| `")
            for name in re.findall(r"`([^`]+)`", line.split("|")[1])]


def undescribed(names: list[str], readme: str) -> list[str]:
    patterns = described_patterns(readme)
    return [name for name in names if not any(pattern.fullmatch(name) for pattern in patterns)]


def test_every_stored_reference_result_has_a_line_in_results_readme():
    """A user reading ``results/reference/`` finds each file and folder there in results/README.md's list, with
    what it holds and the command that wrote it."""
    entries = sorted({name.split("/")[2] for name in tracked_files() if name.startswith("results/reference/")})
    missing = undescribed(entries, (ROOT / "results" / "README.md").read_text(encoding="utf-8"))
    assert not missing, f"results/reference/ holds {missing}, which results/README.md does not describe"


def test_a_reference_file_no_line_describes_is_named():
    readme = ("| file | holds | written by |\n|---|---|---|\n| `rows-<folder>.json` | rows | keep |\n"
              "| `base-ml-1m.{json,csv}`, `gpu/` | both | runs |\n| `grid-*.json` | grids | grid |\n")
    names = ["rows-probe.json", "base-ml-1m.csv", "base-ml-1m.json", "gpu", "grid-8.json",
             "base-ml-1m.txt", "rows.json"]
    assert undescribed(names, readme) == ["base-ml-1m.txt", "rows.json"]


README_LIMIT = 250  # lines: README.md is the guide of the person who runs the suite; the rest is on linked pages
MAIN_JOB = "pip install torch==2.13.0 && pip install -e . && python run_all.py"
TEST_JOB = 'pip install torch==2.13.0 && pip install -e ".[dev]" && python -m pytest'
TABLE2 = "python run_all.py --datasets ml-1m beauty --models table2 --profile converge --seeds 0 1 --resume"


def test_the_readme_is_a_short_guide_with_the_two_set_up_commands_and_the_papers_comparison_early():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_LIMIT, f"README.md has {len(lines)} lines; move detail to a page it links to"
    blocks = re.findall(r"```bash\n(.*?)```", "\n".join(lines), re.S)
    assert blocks[:2] == [MAIN_JOB + "\n", TEST_JOB + "\n"]  # the set-up section's two commands, as CI runs them
    first = next(number for number, line in enumerate(lines, start=1) if line.startswith(TABLE2))
    assert first <= 60, f"the paper's comparison is on line {first}; a newcomer should meet it in the first 60"


def test_ci_installs_and_tests_as_the_readme_says():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "torch==2.13.0" in ci and '-e ".[dev]"' in ci and "python -m pytest" in ci
