"""The tables a grid prints when it ends and writes to ``table.md``: per dataset, one table of the accuracy metrics
per protocol (metrics × models, mean ± sample standard deviation over seeds, as in the report) of the main grid's
rows, the answer a run is for, and beneath them one table of the beyond-accuracy metrics of the top-k lists
(Coverage, Gini, ARP, APLT, Novelty, Personalization), which describe the lists rather than the target's rank. The
full report (``reports.report``) builds the paper's tables from the same rows."""
from __future__ import annotations

from tabulate import tabulate

from recbench.benchmarks.metrics import is_list_metric
from recbench.benchmarks.store import LEAVE_ONE_OUT, split_scheme
from recbench.reports.results import CONVERGE_ADVICE
from recbench.reports.splits import coarse_steps
from recbench.reports.stats import seed_summary

SMOKE_NOTE = ("> **Smoke profile: installation check, not the paper's settings.** These models were trained for "
              "seconds on small budgets; their numbers say that everything runs, not how the models compare. "
              f"{CONVERGE_ADVICE[0].upper()}{CONVERGE_ADVICE[1:]}.")


def main_tables(rows: list[dict]) -> str:
    """Paper-style tables (metrics × models) in Markdown: per dataset, the accuracy metrics of each protocol, then
    the beyond-accuracy metrics beneath them; smoke-profile results say that they only check the installation."""
    blocks = [SMOKE_NOTE] if any(row.get("profile") == "smoke" for row in rows) else []
    for dataset in dict.fromkeys(row["dataset"] for row in rows):
        chosen = {protocol: [r for r in rows if r["dataset"] == dataset and r["protocol"] == protocol
                             and r["study"] == "main"]
                  for protocol in dict.fromkeys(row["protocol"] for row in rows if row["dataset"] == dataset)}
        for beyond in (False, True):  # accuracy first, for every protocol; the lists' metrics beneath
            blocks += [table for protocol, found in chosen.items() if found
                       and (table := _table(dataset, protocol, found, beyond))]
    return "\n\n".join(blocks) + "\n"


def _table(dataset: str, protocol: str, rows: list[dict], beyond: bool) -> str | None:
    """The accuracy metrics of ``rows`` (``beyond`` False) or their beyond-accuracy metrics (True); None where the
    rows have none of them (the sampled protocols have no beyond-accuracy metrics)."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    # Every metric any row has: rows written before a metric existed (a resumed folder) leave its cell a gap.
    metrics = [metric for metric in dict.fromkeys(metric for r in rows for metric in r["metrics"])
               if is_list_metric(metric) == beyond]
    if not metrics:
        return None
    table = []
    for metric in metrics:
        cells = [metric]
        for name in models:
            values = [r["metrics"][metric] for r in rows if r["model"] == name and metric in r["metrics"]]
            summary = seed_summary(values) if values else None
            cells.append("–" if summary is None else f"{summary.mean:.4f}"
                         + ("" if summary.std is None else f" ± {summary.std:.4f}"))
        table.append(cells)
    seeds = len({r["seed"] for r in rows})
    temporal, coarse = "", None
    if any(split_scheme(r) != LEAVE_ONE_OUT for r in rows):  # a temporal split tests the users active after its cut
        users = min((r["users_evaluated"] for r in rows if r.get("users_evaluated") is not None), default=None)
        temporal = ", temporal split" + (f", {users:,} users evaluated" if users is not None else "")
        coarse = users is not None and coarse_steps(dataset, "temporal", users)
    spread = f"{seeds} seeds, mean ± sample std" if seeds > 1 else "1 seed"
    what = " — beyond accuracy: the users' top-k lists" if beyond else ""
    title = f"### {dataset} — protocol `{protocol}`{what} ({spread}, test split{temporal})"
    return title + "\n\n" + tabulate(table, headers=["metric", *models], tablefmt="github", disable_numparse=True,
                                     colalign=("left",) + ("right",) * len(models)) + (
        f"\n\n> {coarse}" if coarse else "")
