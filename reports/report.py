"""``generate_report``: every table and figure of a results folder, and ``report.md`` linking them.

The report states how the results were produced (protocols, tie policy, seeds, device, commit, library
versions, dataset hashes) from the rows themselves and from ``config.json`` when present, and says which tables
and figures were skipped and why.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

from recbench.benchmarks.store import ResultStore, implausible, read_tuning_studies, write_atomic
from recbench.reports import claims, figures, losses, names, sampled, splits, tables, time_to_quality, tuning
from recbench.reports.published import PUBLISHED_PROTOCOL, load_published
from recbench.reports.render import Table, latex_document, to_markdown, write_table
from recbench.reports.results import CONVERGE_ADVICE, SMOKE_LABEL, ResultSet, load_results
from recbench.reports.stats import PerUser

MAX_LISTED_PROBLEMS = 10  # per-user problems listed in the report before "and N more"
MAX_LISTED_JOBS = 10  # unfinished jobs listed before "and N more"


def _build_tables(results: ResultSet, protocols: list[str], alpha: float,
                  beyond: Table | None) -> tuple[list[Table], list[str]]:
    """The tables in the report's order: Table 2's accuracy per protocol first, ``beyond`` (the beyond-accuracy
    metrics of the top-k lists) beneath them, then the paper's other tables."""
    built, notes = [], []
    per_user = PerUser(results.folder)
    built.append(tables.dataset_table(results))
    main = [tables.main_table(results, protocol, per_user, alpha) for protocol in protocols]
    built += [*main, beyond]
    if not any(main):
        notes.append("Table 2 skipped: no main-grid ranking results (study == \"main\").")
    published, source = load_published()
    comparison = tables.published_table(results, published, source) if PUBLISHED_PROTOCOL in protocols else None
    built.append(comparison)
    if comparison is not None:  # the main grid's models in one line each: ours, the paper's and their ratio
        built.append(tables.ratio_table(tables.model_groups(results), published))
    if comparison is None:
        smoke = any(results.is_smoke(r) for r in results.select(task=tables.RANKING, protocol=PUBLISHED_PROTOCOL))
        notes.append(f"Comparison with the published values skipped: no {PUBLISHED_PROTOCOL} result (the "
                     f"paper's protocol) of a model and dataset the paper reports"
                     + (", other than smoke-profile results, which are never compared with the paper's."
                        if smoke else "."))
    cloze = [tables.cloze_table(results, p) for p in protocols]
    ablation = [tables.ablation_table(results, p, published=published, per_user=per_user, alpha=alpha)
                for p in protocols]
    relevance_protocols = sorted(results.values("protocol", results.select(task="relevance")))
    relevance = [tables.relevance_table(results, p) for p in relevance_protocols]
    for found, what in ((cloze, "Table 3 (Cloze study)"), (ablation, "Table 5 (ablation)"),
                        (relevance, "Relevance-prediction table")):
        built += found
        if not any(found):
            notes.append(f"{what} skipped: no matching rows.")
    built += tuning.tuning_tables(results, protocols, per_user, alpha)
    built += [losses.loss_table(results, p, per_user, alpha) for p in protocols]
    built.append(time_to_quality.time_to_quality_table(results))  # every trained folder, any study
    notes += _problems(per_user)
    return [t for t in built if t is not None], notes


def _unfinished(results: ResultSet) -> list[str]:
    """A note naming the jobs the latest run into the folder planned that have no rows yet (still running,
    interrupted or failed), so that a table read mid-study says which of its rows are missing and not only what
    it shows; nothing when every planned job has its rows."""
    store = ResultStore(results.folder)
    try:
        plan, failures = store.latest_plan(), store.failures
    except ValueError as error:  # a line cut short by a killed driver: the tables stand without this note
        return [f"Jobs without rows not listed: {error}."]
    if plan is None:
        return []
    have = {row.get("key") for row in results.rows}
    missing = [job for job in plan["jobs"] if job["key"] not in have]
    if not missing:
        return []
    failed = {failure["key"] for failure in failures}
    listed = [job["run_id"] + (" (failed: failed.jsonl)" if job["key"] in failed else "")
              for job in missing[:MAX_LISTED_JOBS]]
    more = f" and {len(missing) - MAX_LISTED_JOBS} more" if len(missing) > MAX_LISTED_JOBS else ""
    return [f"{len(missing)} of the {len(plan['jobs'])} jobs of the latest run into this folder (started "
            f"{plan['time']}, `manifest.jsonl`) have no rows yet, so their cells are missing from the tables: "
            f"{', '.join(listed)}{more}. Rerun its command with --resume to finish them (an interrupted job "
            f"continues from its checkpoint)."]


def _problems(per_user: PerUser) -> list[str]:
    """A note naming the per-user files that were unavailable for the paired tests (nothing when none was)."""
    if not per_user.problems:
        return []
    problems = sorted(per_user.problems)
    more = len(problems) - MAX_LISTED_PROBLEMS
    return ["Significance not tested where per-user values were unavailable: "
            + "; ".join(problems[:MAX_LISTED_PROBLEMS]) + (f"; and {more} more" if more > 0 else "") + "."]


def _distinct(rows, key: str) -> list[str]:
    return sorted({str(r.get(key, "not recorded")) for r in rows})


def _versions(rows) -> list[str]:
    """Each library with every version the rows recorded (several versions are worth a warning)."""
    seen = {}
    for row in rows:
        for library, version in (row.get("versions") or {}).items():
            seen.setdefault(library, set()).add(str(version))
    return [f"{library} {' / '.join(sorted(v))}" for library, v in sorted(seen.items())]


def _model_sources(rows) -> list[str]:
    """One line per model from outside the suite: its source file, the sha256 of that source and the commit of
    the checkout it lives in (``model_source`` of the rows; results/README.md)."""
    sources = {}
    for row in rows:
        if row.get("model_source"):
            sources.setdefault(row.get("model"), []).append(row.get("model_source"))
    lines = ["- Models from outside the suite:"] if sources else []
    for model, found in sorted(sources.items()):
        hashes = sorted({source.get("sha256", "not recorded") for source in found})
        commits = sorted({str(source.get("commit")) for source in found if source.get("commit")})
        warning = " **(rows disagree: different code!)**" if len(hashes) > 1 else ""
        lines.append(f"  - `{model}`: `{found[0].get('file') or 'defined in a notebook or script'}`, sha256 "
                     f"{', '.join(f'`{h[:12]}`' for h in hashes)}{warning}"
                     + (f"; commit {', '.join(f'`{c}`' for c in commits)}" if commits else "; not in a git checkout"))
    return lines


def _provenance(results: ResultSet) -> list[str]:
    rows = results.rows
    lines = [f"- Results folder: `{results.folder}` ({len(rows)} results"
             + (f"; {results.superseded} earlier duplicates superseded by later lines" if results.superseded
                else "") + ")."]
    for change in results.changes:
        lines.append(f"- {change.label}: results from several settings are in `results.jsonl`; the newest is "
                     f"shown. It differs from the earlier in: {'; '.join(change.differences)}.")
    for reason, count in sorted(results.ignored.items()):
        lines.append(f"- Ignored {count} row(s) with {reason} (not a study or task this report knows).")
    profiles = Counter(results.profile(r) or "not recorded" for r in rows)
    lines.append("- Profiles: " + ", ".join(f"{p} ({n} rows)" for p, n in sorted(profiles.items())) + ".")
    studies = Counter(r.study for r in rows)
    lines.append("- Studies: " + ", ".join(f"{s} ({n} rows)" for s, n in sorted(studies.items())) + ".")
    protocols = names.order_protocols(results.values("protocol"))
    lines.append("- Protocols: " + ", ".join(f"{p} ({names.PROTOCOL_NAMES.get(p, 'not described')})"
                                             for p in protocols) + ".")
    split_rows = Counter(r.split for r in rows)
    lines.append(f"- Tie policy: {', '.join(_distinct(rows, 'tie_policy'))}; split: "
                 + ", ".join(f"{names.split_name(s)} ({split_rows[s]} rows)"
                             for s in names.order_splits(split_rows)) + ".")
    lines.append(f"- Seeds: {', '.join(map(str, sorted(results.values('seed'))))}.")
    lines.append(f"- Device: {'; '.join(_distinct(rows, 'device'))}.")
    commits = _distinct(rows, "commit")
    dirty = " (a `-dirty` commit had uncommitted changes)" if any(c.endswith("-dirty") for c in commits) else ""
    lines.append(f"- Commit: {', '.join(f'`{c}`' for c in commits)}{dirty}.")
    lines += _model_sources(rows)
    versions = _versions(rows)
    lines.append(f"- Library versions: {', '.join(versions) if versions else 'not recorded'}.")
    created = sorted(str(r.get("created")) for r in rows if r.get("created"))
    if created:
        lines.append(f"- Written between {created[0]} and {created[-1]} (UTC).")
    resumed = sorted({f"{r.get('run_id', r.model)} (from epoch {r.get('resumed_from_epoch')})" for r in rows
                      if r.get("resumed_from_epoch")})
    if resumed:  # a resumed run's draws after its checkpoint are its own: a reader may want to know which
        lines.append(f"- Resumed from a checkpoint after an interruption: {', '.join(resumed)}.")
    lines.append("- Datasets:")
    for dataset in names.order_datasets(results.values("dataset")):
        infos = [r.get("dataset_info") or {} for r in results.select(dataset=dataset)]
        hashes = sorted({str(i.get("sha256", "not recorded")) for i in infos})
        warning = " **(rows disagree: different data!)**" if len(hashes) > 1 else ""
        source = next((i.get("provenance") for i in infos if i.get("provenance")), None)
        lines.append(f"  - {names.dataset_name(dataset)}: sha256 {', '.join(f'`{h}`' for h in hashes)}{warning}"
                     + (f"; provenance `{json.dumps(source, sort_keys=True)}`" if source else ""))
    if results.config is not None:
        config = results.config
        shown = {k: config[k] for k in ("profile", "protocols", "device", "data_dir", "seeds") if k in config}
        # The number of jobs in words: as `"jobs": 3` it read like the --jobs option (parallel workers).
        planned = (f"{len(config['jobs'])} job(s) were planned into this folder: each one's " if
                   isinstance(config.get("jobs"), list) else "every job's ")
        lines.append(f"- Run configuration (`config.json`): `{json.dumps(shown, sort_keys=True)}`; {planned}"
                     f"resolved hyper-parameters are in `config.json` and in each row of `results.jsonl`.")
        lines += _common_overrides(results)
    else:
        lines.append("- No `config.json` in this folder; each row of `results.jsonl` records its own "
                     "hyper-parameters and trainer settings.")
    return lines


def _common_overrides(results: ResultSet) -> list[str]:
    """A line naming the settings every job behind the rows was given beside its profile's (``--set``, or the
    Python API's overrides; ``config.json``): Table 5's ablation at dropout 0.1 reads as the paper's settings unless
    the report says so, since a row's label names only what its variant changes."""
    keys = {row.get("key") for row in results.rows}
    jobs = [job for job in (results.config or {}).get("jobs", []) if isinstance(job, dict) and job.get("key") in keys]
    common = set.intersection(*(set(job.get("overrides") or ()) for job in jobs)) if jobs else set()
    if not common:
        return []
    return [f"- Settings every job here was given beside its profile's (`--set`): "
            f"{', '.join(f'`{setting}`' for setting in sorted(common))}."]


def _smoke_banner(results: ResultSet) -> list[str]:
    """A warning under the title when any result comes from the smoke profile (nothing otherwise)."""
    smoke = sum(results.is_smoke(r) for r in results.rows)
    if not smoke:
        return []
    which = "All" if smoke == len(results.rows) else f"{smoke} of {len(results.rows)}"
    return [f"> **{SMOKE_LABEL[0].upper()}{SMOKE_LABEL[1:]}.** {which} results come from `--profile smoke`: "
            f"short training with settings chosen for speed, to check that everything runs. Their tables are "
            f"labelled, give no Improv. column and are not compared with the paper's numbers. Run "
            f"{CONVERGE_ADVICE[0].upper()}{CONVERGE_ADVICE[1:]}.", ""]


def _implausible(results: ResultSet) -> list[str]:
    """A warning under the title for each row whose figures are implausible for its data
    (:func:`benchmarks.store.implausible`); the tables still show them."""
    lines = [f"> **Implausible figures.** {row.get('run_id', row.model)} ({row.protocol}): {why}."
             for row in results.rows if (why := implausible(row)) is not None]
    return [*lines, ""] if lines else []


def _paper_split(results: ResultSet) -> tuple[ResultSet, list[str]]:
    """The rows the paper's tables and figures show: those of one split, leave-one-out's when present (the paper's),
    so that no cell averages results of two splits; and a note when rows of another split were set aside."""
    present = names.order_splits(results.values("split"))
    if len(present) < 2:
        return results, []
    shown, others = present[0], present[1:]
    return replace(results, rows=[r for r in results.rows if r.split == shown]), [
        f"The paper's tables and figures show the {names.split_name(shown)} split; the rows of the "
        f"{' and '.join(map(names.split_name, others))} split appear in the section \"{SPLIT_SECTION}\" only."]


SPLIT_SECTION = "Under both splits: order and popularity"


def _split_section(results: ResultSet, table_dir: Path, figure_dir: Path,
                   alpha: float) -> tuple[list[str], list[Table], list[str]]:
    """The lines of the section that sets the models side by side under both splits (``reports.splits``), the
    tables it wrote, and notes for "Skipped or incomplete" when it has nothing to show."""
    per_user = PerUser(results.folder)
    built, notes = splits.split_tables(results, per_user, alpha)
    if not splits.section_rows(results):
        return [], [], notes
    for table in built:
        write_table(table, table_dir)
    with figures.house_style():
        drawn = figures.popularity_figures(results, figure_dir)
    notes += drawn.notes + _problems(per_user)
    lines = [f"## {SPLIT_SECTION}", "",
             "The main grid's models under full ranking, split by leave-one-out (the paper's: each user's last "
             "interaction is the test target) and by global cut times (PROTOCOL.md): does their order hold, and how "
             "popular are the items they list?", "", *(f"- {note}" for note in notes), *([""] if notes else [])]
    for table in built:
        lines += [f"### [{table.heading}](tables/{table.name}.md) ([LaTeX](tables/{table.name}.tex))", "",
                  to_markdown(table, title=False), ""]
    for figure in drawn.figures:
        lines += [f"- [{figure.name}](figures/{figure.name}.png) ([PDF](figures/{figure.name}.pdf)): "
                  f"{figure.caption}", "", f"  ![{figure.caption}](figures/{figure.name}.png)", ""]
    return lines, built, []


def generate_report(results_dir: Path, protocols: list[str] | None = None, user: int | None = None,
                    alpha: float = 0.01) -> Path:
    """Write ``tables/``, ``figures/`` and ``report.md`` into ``results_dir``; return the path of report.md.

    ``protocols`` restricts the ranking tables and figures (default: every protocol present); ``user`` picks
    the user of the attention heat maps; ``alpha`` is the significance threshold of the paired tests."""
    results_dir = Path(results_dir)
    results = load_results(results_dir)
    notes = []
    unfinished = _unfinished(results)  # before the tables' choice of protocols and split sets rows aside
    present = names.order_protocols(results.values("protocol", results.select(task=tables.RANKING)))
    if protocols:
        notes += [f"Requested protocol {p} has no ranking results." for p in protocols if p not in present]
        present = [p for p in present if p in protocols]
        results = replace(results, rows=[r for r in results.rows
                                         if r.task != tables.RANKING or r.protocol in present])
    table_dir, figure_dir = results_dir / "tables", results_dir / "figures"
    paper, split_notes = _paper_split(results)
    notes += split_notes
    built, table_notes = _build_tables(paper, present, alpha, splits.beyond_accuracy_table(results))
    notes += table_notes + unfinished
    for table in built:
        write_table(table, table_dir)
    section, section_tables, section_notes = _split_section(results, table_dir, figure_dir, alpha)
    notes += section_notes
    expectations = sampled.Expectations(PerUser(results.folder))  # both sections read the expected sampled values
    for extra in (sampled.section(results, table_dir, expectations=expectations),
                  claims.section(results, table_dir, figure_dir, alpha, expectations)):
        section, section_tables, notes = section + extra.lines, section_tables + extra.tables, notes + extra.notes
    write_atomic(table_dir / "all_tables.tex", latex_document([t.name for t in built + section_tables]))

    with figures.house_style():
        outcomes = [figures.sensitivity_figures(paper, figure_dir), figures.curve_figures(paper, figure_dir),
                    figures.ablation_curve_figures(paper, figure_dir),
                    figures.quality_time_figures(paper, figure_dir),
                    losses.loss_figures(paper, figure_dir),
                    figures.attention_figures(paper, figure_dir, user=user),
                    figures.bar_figures(paper, figure_dir, present),
                    figures.tuning_figures(read_tuning_studies(results_dir), figure_dir)]
    drawn = [f for outcome in outcomes for f in outcome.figures]
    notes += [note for outcome in outcomes for note in outcome.notes]

    lines = [f"# Results report: {results_dir.name}", "", *_smoke_banner(results), *_implausible(results),
             "## How these results were produced", "",
             *_provenance(results), "", "## Tables", "",
             "Each table as Markdown (below and in `tables/`) and LaTeX (booktabs); `tables/all_tables.tex` "
             "compiles them all.", ""]
    for table in built:
        lines += [f"### [{table.heading}](tables/{table.name}.md) ([LaTeX](tables/{table.name}.tex))", "",
                  to_markdown(table, title=False), ""]
    lines += ["## Figures", ""]
    for figure in drawn:
        lines += [f"- [{figure.name}](figures/{figure.name}.png) ([PDF](figures/{figure.name}.pdf)): "
                  f"{figure.caption}", "", f"  ![{figure.caption}](figures/{figure.name}.png)", ""]
    lines += section
    if notes:
        lines += ["## Skipped or incomplete", "", *(f"- {note}" for note in notes), ""]
    report = results_dir / "report.md"
    write_atomic(report, "\n".join(lines))
    return report
