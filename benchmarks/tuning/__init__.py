"""Tuning (``python -m benchmarks.tune``), in import order: ``space`` (what a study searches: ranges beside the
defaults, the paper's tied settings), ``pruning`` (a trial's reports to its study, in whichever process trains it),
``chosen`` (what a search chose: ``tuned.toml``, ``tuning.json``, the final runs) and ``study`` (the search: one
Optuna study per (dataset, model), its trials run as jobs). Only the tuning command imports them, but for ``space``,
whose paper's ties the studies take and which needs no Optuna, so a grid runs without Optuna."""
