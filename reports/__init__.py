"""Paper-style tables (Markdown, LaTeX) and figures from a results folder; see ``generate_report``."""
from reports.report import generate_report

__all__ = ["generate_report"]
