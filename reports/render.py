"""One table model rendered two ways: GitHub Markdown (tabulate) and LaTeX (booktabs), written atomically.

Cells carry plain text plus emphasis flags, so each format applies its own markup and escaping: Markdown marks
the best value ``**bold**`` and the second ``<ins>underlined</ins>`` (Markdown itself has no underline and
GitHub keeps ``<ins>``); LaTeX uses ``\\textbf`` and ``\\underline`` and escapes every special character.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from recbench.benchmarks.store import write_atomic

GAP = "–"  # what a missing result shows


@dataclass
class Cell:
    """A table entry: its text, the number it stands for (to rank cells) and its emphasis."""

    text: str = GAP
    value: float | None = None
    bold: bool = False
    underline: bool = False
    marks: str = ""  # significance marks, placed after the emphasised text


@dataclass
class Table:
    """A captioned table; ``breaks`` are row indices that start a new group (a rule in LaTeX)."""

    name: str
    title: str
    header: list[str]
    rows: list[list[Cell]]
    notes: list[str] = field(default_factory=list)
    align: str | None = None  # one of "l"/"r"/"c" per column; default: first columns left, numbers right
    breaks: set[int] = field(default_factory=set)
    paper: str | None = None  # the paper's table this one reproduces, e.g. "Table 2"

    @property
    def heading(self) -> str:
        return f"{self.paper}: {self.title}" if self.paper else self.title

    def alignment(self) -> str:
        if self.align:
            return self.align
        return "".join("l" if all(_is_label(row[i]) for row in self.rows) else "r"
                       for i in range(len(self.header)))


def _is_label(cell: Cell) -> bool:
    return cell.value is None and cell.text != GAP


def fmt(value: float | None, digits: int = 4) -> str:
    return GAP if value is None else f"{value:.{digits}f}"


# ---------------------------------------------------------------------------------------------------- Markdown

def _markdown_cell(cell: Cell) -> str:
    text = cell.text.replace("|", "\\|")  # a bare pipe would split the column
    if cell.bold:
        text = f"**{text}**"
    if cell.underline:
        text = f"<ins>{text}</ins>"
    return text + cell.marks


def to_markdown(table: Table, title: bool = True) -> str:
    """The table as a GitHub Markdown block: title line (unless ``title`` is False), table, notes."""
    align = {"l": "left", "r": "right", "c": "center"}
    body = tabulate([[_markdown_cell(cell) for cell in row] for row in table.rows],
                    headers=[h.replace("|", "\\|") for h in table.header], tablefmt="github",
                    disable_numparse=True, colalign=[align[a] for a in table.alignment()])
    notes = "".join(f"\n{note}  " for note in table.notes)
    heading = f"**{table.heading}**\n\n" if title else ""
    return f"{heading}{body}\n{notes}\n"


# ---------------------------------------------------------------------------------------------------- LaTeX

_LATEX = {
    "\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#",
    "$": r"\$", "^": r"\^{}", "~": r"\~{}", "<": r"$<$", ">": r"$>$", "|": r"$|$",
    # Characters outside the default fonts' reach become the commands that draw them.
    "±": r"$\pm$", "↓": r"$\downarrow$", "↑": r"$\uparrow$", "†": r"$^{\dagger}$", "‡": r"$^{\ddagger}$",
    "–": "--", "—": "---", "ρ": r"$\rho$", "×": r"$\times$", "Δ": r"$\Delta$", "≥": r"$\geq$",
    "≤": r"$\leq$", "·": r"$\cdot$", "≈": r"$\approx$", "−": "-", "τ": r"$\tau$", "ℓ": r"$\ell$", "§": r"\S{}",
}


def latex_escape(text: str) -> str:
    """``text`` safe for LaTeX text mode; one pass, so a replacement is never escaped again."""
    return "".join(_LATEX.get(char, char) for char in text)


def _latex_cell(cell: Cell) -> str:
    text = latex_escape(cell.text)
    if cell.bold:
        text = rf"\textbf{{{text}}}"
    if cell.underline:
        text = rf"\underline{{{text}}}"
    return text + latex_escape(cell.marks)


def to_latex(table: Table) -> str:
    """The table as a ``table`` float with a booktabs ``tabular``; needs only ``\\usepackage{booktabs}``."""
    # LaTeX numbers the float itself, so the paper's table number goes into the caption's text.
    caption = f"{table.title} (as in the paper's {table.paper})" if table.paper else table.title
    lines = [r"\begin{table}[htbp]", r"\centering",
             rf"\caption{{{latex_escape(caption)}}}", rf"\label{{tab:{table.name}}}",
             # Wide tables (all models, mean ± std) still fit a landscape page at this size.
             r"\small" if len(table.header) <= 8 else r"\scriptsize",
             r"\setlength{\tabcolsep}{4pt}",
             rf"\begin{{tabular}}{{{table.alignment()}}}", r"\toprule",
             " & ".join(latex_escape(h) for h in table.header) + r" \\", r"\midrule"]
    for index, row in enumerate(table.rows):
        if index in table.breaks and index > 0:
            lines.append(r"\midrule")
        lines.append(" & ".join(_latex_cell(cell) for cell in row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.notes:
        lines.append(r"\par\smallskip")
        lines.append(r"\parbox{\linewidth}{\footnotesize\raggedright "
                     + r" \\ ".join(latex_escape(note) for note in table.notes) + "}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def latex_document(inputs: list[str]) -> str:
    """A standalone document that ``\\input``s the table files (compile it inside ``tables/``)."""
    body = "\n".join(rf"\input{{{name}}}" for name in inputs)
    return ("% Every table of this report; compile with: cd tables && pdflatex all_tables.tex\n"
            "\\documentclass{article}\n"
            "\\usepackage[a4paper,landscape,margin=1cm]{geometry}\n"
            "\\usepackage{booktabs}\n"
            "\\begin{document}\n"
            f"{body}\n"
            "\\end{document}\n")


# ---------------------------------------------------------------------------------------------------- files

def write_table(table: Table, folder: Path) -> tuple[Path, Path]:
    """``folder/<name>.md`` and ``folder/<name>.tex``."""
    md, tex = folder / f"{table.name}.md", folder / f"{table.name}.tex"
    write_atomic(md, to_markdown(table))
    write_atomic(tex, to_latex(table))
    return md, tex
