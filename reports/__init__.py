"""Paper-style tables and figures from a results folder (schema: ``results/README.md``).

    python -m reports results/<name> [--protocols pop100 full] [--user N] [--alpha 0.01]
    from recbench.reports import generate_report; generate_report(Path("results/<name>"))  # -> path of report.md

Writes into the folder:
- ``tables/``: Table 1 (datasets), Table 2 per protocol, the comparison with the paper's published numbers
  (``reports/published.csv``), Table 3 (Cloze), Table 5 (ablation), the relevance task, each as ``.md`` and
  ``.tex`` (booktabs), plus ``all_tables.tex`` that compiles them all;
- ``figures/``: sensitivity sweeps, training curves, quality against training time, attention heat maps and
  Table 2 as bars, each as ``.png`` and ``.pdf``;
- ``report.md``: how the results were produced, every table and figure with a caption, and what was skipped.
Whatever the folder lacks (a model, a dataset, a study) becomes a "–" cell or a skipped figure with a note.
"""
from recbench.reports.report import generate_report

__all__ = ["generate_report"]
