"""The Python API: run a grid from a notebook or a script and get its results as a pandas DataFrame.

    from recbench.benchmarks.api import run

    results = run(datasets=["ml-1m", "data/clicks.csv"], models=["pop", "sasrec", "mypkg.mymodel:MyRec"],
                  log_format={"user": "uid", "item": "iid", "time": "ts"}, output="results/mine",
                  data_dir="/path/to/files", resume=True)
    results.pivot_table(index="model", columns=["dataset", "protocol"], values="NDCG@10")

It runs the grid exactly as ``run_all.py`` does (:func:`benchmarks.grid.run_jobs`): the same checks before
training, the same output folder, keys and resume, so a grid started here can be resumed from the command line
and the other way round. It works from any directory once the suite is installed (``pip install -e .``).

- ``datasets``: registry names; paths of CSV/TSV logs of the user's own (named by their file's stem); and dicts
  that name logs: name -> a path, a pandas DataFrame or a :class:`~datasets.InteractionLog`, e.g.
  ``["ml-1m", {"clicks": frame}]``. ``log_format`` (a :class:`~datasets.LogFormat` or a dict of its fields:
  ``user``, ``item``, ``time``, ``rating``, ``sep``, ``min_rating``, ``min_item_interactions``,
  ``min_user_interactions``) says how to read the logs. A CSV file and a DataFrame with the same rows, under the
  same name, give the same keys and metrics.
- ``models``: names (registered, entry points, import paths ``package.module:Class``) or model classes. A class
  that its import path reaches runs anywhere; one defined in a notebook or a script's ``__main__`` runs in this
  process only: with ``n_jobs`` > 1 or a Dask cluster the grid is refused before it starts, with a sentence
  saying to move the class into a module.
- ``settings``: ``--set`` strings (``"hidden=128"``, ``"MyRec:lr=1e-3"``).
- the fields of :class:`~benchmarks.options.RunOptions` (``profile``, ``protocols``, ``device``, ``data_dir``,
  ``cache_dir``, ``config_files``, ``resume``, ``n_jobs``, ``threads``, ``dask_scheduler``, ``keep_checkpoints``,
  ``compile``, ``progress``, ``split``, ``track``) as keywords of their own, which ``help(run)`` lists with their
  defaults; a keyword ``run`` does not take is one line naming those it does. ``split="temporal"`` runs the global
  temporal split at the default cuts; ``split=SplitSpec("temporal", quantiles=(0.7, 0.85))`` or ``cut_times=(t1,
  t2)`` at others (``datasets.splits``); its rows, like the command line's, name it in ``split_scheme``.

It returns one row per line of ``results.jsonl`` that belongs to the grid (rows kept by ``resume`` included), in
the order of the jobs: every field of the line as a column (results/README.md), and each metric as a column of its
own. Tables and figures: ``recbench.reports.generate_report(output)``, or ``python -m reports OUTPUT``.
:class:`~benchmarks.jobs.GridError` is raised before any training when the grid cannot run, :class:`JobsFailed`
(holding the finished rows) after it when some jobs failed.
"""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pandas as pd

from recbench.benchmarks.commands.check_model import ModelCheckError, check_model
from recbench.benchmarks.grid import run_jobs
from recbench.benchmarks.jobs import TASKS, GridError, Job
from recbench.benchmarks.negatives import PAIRS
from recbench.benchmarks.options import RunOptions, output_suffix
from recbench.benchmarks.relevance import TASK as RELEVANCE
from recbench.benchmarks.store import ResultStore
from recbench.datasets import InteractionLog, LogFormat, log_entries
from recbench.datasets.errors import unknown
from recbench.datasets.logs import check_log_name
from recbench.datasets.splits import SplitSpec
from recbench.models import model_name_of

__all__ = ["run", "JobsFailed", "GridError", "check_model", "ModelCheckError", "InteractionLog", "LogFormat",
           "SplitSpec"]


class JobsFailed(RuntimeError):
    """Some jobs of the grid failed (each is in ``failed.jsonl`` with its error); ``results`` holds the rows of
    the others. Fix the cause and run again with ``resume=True``: finished jobs are kept."""

    def __init__(self, message: str, results: pd.DataFrame):
        super().__init__(message)
        self.results = results


def run(datasets="synthetic", models=("pop", "bprmf", "sasrec", "bert4rec"), *, seeds=(0,), task="next-item",
        settings=(), log_format: LogFormat | dict | None = None, output=None, log=print,
        **options) -> pd.DataFrame:
    """Run the grid ``datasets`` × ``models`` × ``seeds`` as ``run_all.py`` does and return its results: one row per
    line of ``results.jsonl`` that belongs to the grid, every field a column and each metric a column of its own.

    What is computed:

    - ``datasets``: a registry name, a path of a CSV/TSV log of your own, a dict that names logs (name -> a path, a
      pandas DataFrame or an ``InteractionLog``), or a list of them.
    - ``models``: a registered name, an entry point, an import path ``package.module:Class``, a model class, or a
      list of them.
    - ``seeds``: the seeds, one job each.
    - ``task``: ``"next-item"`` (rank the test item) or ``"relevance"`` (judge each user's test pair).
    - ``settings``: ``--set`` strings, e.g. ``["hidden=128", "MyRec:lr=1e-3"]``.
    - ``log_format``: how to read the logs of your own, a ``LogFormat`` or a dict of its fields (``user``,
      ``item``, ``time``, ``rating``, ``sep``, ``min_rating``, ``min_item_interactions``,
      ``min_user_interactions``).
    - ``profile``: ``"smoke"`` (default: seconds per model, checks that everything runs), ``"converge"`` (trained
      to early stopping in hours) or ``"paper"`` (the paper's settings and the authors' schedules).
    - ``protocols``: the test protocols, of ``"full"``, ``"pop100"``, ``"uni100"`` (default: full and pop100; the
      relevance task: its pairs).
    - ``config_files``: ``--config`` TOML files, applied in order over the suite's configs.
    - ``split``: ``"leave-one-out"`` (default, the paper's) or ``"temporal"`` (the global temporal split at the
      80% and 90% quantiles of the interaction times), or a ``SplitSpec`` with other cuts (``datasets.splits``).

    Where and how it runs:

    - ``output``: the results folder (default ``results/<datasets>[-relevance]-<profile>``).
    - ``data_dir``: the folder of local dataset files (else ``$RECBENCH_DATA_DIR``, else download).
    - ``cache_dir``: prepared datasets and negatives (else ``$RECBENCH_CACHE_DIR``, else ``~/.cache/recbench``).
    - ``resume``: keep the jobs already in ``results.jsonl`` with the same key and continue interrupted training
      from its checkpoint.
    - ``device``: ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    - ``n_jobs``: jobs at once in worker processes; ``threads``: torch CPU threads per job (default: the cores
      divided by ``n_jobs``); ``dask_scheduler``: the address of a Dask cluster to run the jobs on instead.
    - ``keep_checkpoints``: keep each job's selected weights (``weights/``); ``compile``: ``torch.compile`` each step.
    - ``progress``: progress bars (``False``: none); ``log``: where the console lines go (``print``).
    - ``track``: ``"tensorboard"`` or ``"mlflow"``, where each job's epochs, figures and settings go too (``.[track]``).

    Raises ``GridError`` before any training when the grid cannot run (every problem, one line each),
    ``JobsFailed`` (holding the finished rows) after it when some jobs failed, ``TypeError`` for a keyword ``run``
    does not take (naming those it does)."""
    options = _options(options, task)
    fmt = LogFormat(**log_format) if isinstance(log_format, dict) else (log_format or LogFormat())
    names, logs = _datasets(datasets, fmt)
    model_names = [model if isinstance(model, str) else model_name_of(model) for model in _listed(models)]
    output = Path(output or default_output(names, task, options))
    command = ["recbench.benchmarks.api.run", f"datasets={names}", f"models={model_names}", f"seeds={list(seeds)}",
               f"task={task}", *(f"--set {text}" for text in settings)]
    run_options = RunOptions(output=output, logs=logs, command=command, **options)
    jobs = [Job(dataset, model, seed, overrides=tuple(settings), task=task)
            for dataset in names for model in model_names for seed in seeds]
    result = run_jobs(jobs, run_options, log=log)
    results = _frame(result.planned, output)
    if result.failed:
        raise JobsFailed(f"{len(result.failed)} of {len(result.planned)} job(s) failed (details in "
                         f"{output / 'failed.jsonl'}): "
                         + "; ".join(f"{outcome.run_id}: {outcome.error}" for outcome in result.failed), results)
    return results


def default_output(names: list[str], task: str, options: dict) -> Path:
    """``results/<datasets>[-relevance]-<profile>[-<split>]``, the split named where it is not leave-one-out."""
    split = options["split"]
    return Path("results") / (f"{'-'.join(names)}{'-relevance' if task == RELEVANCE else ''}-{options['profile']}"
                              f"{output_suffix(split if isinstance(split, str) else split.scheme)}")


# The fields of RunOptions that run takes as keywords, with their defaults (protocols: None, chosen by the task); run
# sets output, the logs and the command itself.
RUN_OPTIONS = {item.name: None if item.name == "protocols" else item.default for item in dataclasses.fields(RunOptions)
               if item.name not in ("output", "logs", "command")}


def _options(given: dict, task: str) -> dict:
    """Every field of :data:`RUN_OPTIONS`, the given ones over the defaults, the protocols by the task; a keyword
    that is none of run's parameters is one line naming them."""
    wrong = [name for name in given if name not in RUN_OPTIONS]
    if wrong:
        raise TypeError(f"run(): {unknown('keyword argument', wrong[0], list(inspect.signature(run).parameters))}")
    if task not in TASKS:
        raise unknown("task", task, TASKS)
    options = {**RUN_OPTIONS, **given}
    if options["protocols"] is None:
        options["protocols"] = (PAIRS,) if task == RELEVANCE else ("full", "pop100")
    return options


def _signature_with_options() -> inspect.Signature:
    """``run``'s signature as ``help(run)`` and ``inspect`` show it: its own parameters, then those of
    :data:`RUN_OPTIONS`, keyword-only (run's definition takes them as ``**options``: the project keeps a function's
    own parameters to eight)."""
    own = inspect.signature(run)
    return own.replace(parameters=[
        *(parameter for parameter in own.parameters.values() if parameter.kind != inspect.Parameter.VAR_KEYWORD),
        *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
          for name, default in RUN_OPTIONS.items())])


run.__signature__ = _signature_with_options()


def _listed(value) -> list:
    """A single dataset or model, or several."""
    return [value] if isinstance(value, (str, Path, pd.DataFrame, dict, type)) else list(value)


def _datasets(datasets, fmt: LogFormat) -> tuple[list[str], dict[str, InteractionLog]]:
    """Dataset names and the logs of the user's own among them, by name."""
    names, logs = [], {}
    for entry in _listed(datasets):
        if isinstance(entry, pd.DataFrame):
            raise TypeError("name each DataFrame: datasets={'mine': frame}")
        found = _named_logs(entry, fmt) if isinstance(entry, dict) else log_entries([str(entry)], fmt)[1]
        names += list(found) or [str(entry)]
        logs.update(found)
    if len(set(names)) < len(names):
        raise ValueError(f"datasets: a name is given twice ({', '.join(names)})")
    return names, logs


def _named_logs(entries: dict, fmt: LogFormat) -> dict[str, InteractionLog]:
    logs = {}
    for name, source in entries.items():
        check_log_name(name, "a DataFrame" if isinstance(source, pd.DataFrame) else source)
        if isinstance(source, InteractionLog):
            logs[name] = source
        elif isinstance(source, (pd.DataFrame, str, Path)):
            logs[name] = InteractionLog(source if isinstance(source, pd.DataFrame) else Path(source), fmt)
        else:
            raise TypeError(f"datasets[{name!r}]: expected a path, a DataFrame or an InteractionLog, got "
                            f"{type(source).__name__}")
    return logs


def _frame(planned: list, output: Path) -> pd.DataFrame:
    """The rows of ``results.jsonl`` that belong to the planned jobs, in their order; each metric a column."""
    order = {job.key: number for number, job in enumerate(planned)}
    rows = sorted((row for row in ResultStore(output).rows if row.get("key") in order),
                  key=lambda row: order[row["key"]])
    frame = pd.DataFrame(rows)
    if not rows:
        return frame
    return pd.concat([frame, pd.DataFrame([row["metrics"] for row in rows], index=frame.index)], axis=1)
