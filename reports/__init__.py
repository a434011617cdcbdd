"""Paper-style tables and figures from a results folder (schema: ``results/README.md``).

    python -m reports results/<name> [--protocols pop100 full] [--user N] [--alpha 0.01]
    from recbench.reports import generate_report; generate_report(Path("results/<name>"))  # -> path of report.md

Writes into the folder:
- ``tables/``: Table 1 (datasets), Table 2 per protocol with the beyond-accuracy metrics of the top-k lists beneath
  it, the comparison with the paper's published numbers (``reports/published.csv``) at length and as one line per
  model with the ratio, Table 3 (Cloze), Table 5 (ablation), the relevance task, each as ``.md`` and ``.tex``
  (booktabs), plus ``all_tables.tex`` that compiles them all;
- ``figures/``: sensitivity sweeps, training curves, quality against training time, attention heat maps and
  Table 2 as bars, each as ``.png`` and ``.pdf``;
- ``report.md``: how the results were produced, every table and figure with a caption, and what was skipped.
Whatever the folder lacks (a model, a dataset, a study) becomes a "–" cell or a skipped figure with a note.

    python -m reports --reproduction [--check]

writes the same tables from ``results/reference/`` into README.md and results/REPRODUCTION.md
(``reports.reproduction``).
"""
from recbench.reports.report import generate_report

__all__ = ["generate_report"]
