"""The jobs-against-threads measurement (benchmarks/experiments/parallel_grid.py): the serial grid gets the threads
the parallel jobs share, both grids run the same data, profile and settings, and the difference between the modes'
metrics is taken by hand."""
import argparse
import math
from pathlib import Path

import pytest

from benchmarks.experiments import parallel_grid


def commands(monkeypatch, **given):
    args = argparse.Namespace(**{"dataset": None, "data_dir": None, "profile": "smoke", "set": [],
                                 "models": ["pop", "bert4rec"], "seeds": [0, 1], **given})
    seen = []
    monkeypatch.setattr(parallel_grid.subprocess, "run", lambda command, **_: seen.append(command))
    parallel_grid.grid(args, 1, 2, Path("serial"), Path("cache"))
    parallel_grid.grid(args, 2, 1, Path("parallel"), Path("cache"))
    return seen


def value(command, flag):
    return command[command.index(flag) + 1]


def test_both_modes_use_the_same_cores_and_the_same_work(monkeypatch):
    serial, parallel = commands(monkeypatch, dataset="ml-1m", data_dir="/data", profile="converge",
                                set=["max_steps=300"])
    assert (value(serial, "--jobs"), value(serial, "--threads")) == ("1", "2")
    assert (value(parallel, "--jobs"), value(parallel, "--threads")) == ("2", "1")
    for command in (serial, parallel):
        assert value(command, "--datasets") == "ml-1m" and value(command, "--data-dir") == "/data"
        assert value(command, "--profile") == "converge"
        assert "max_steps=300" in command and "time_budget_s=none" in command


def test_without_a_dataset_the_grids_run_the_built_in_data(monkeypatch):
    for command in commands(monkeypatch):
        assert "--datasets" not in command and value(command, "--profile") == "smoke"


def test_the_largest_difference_between_the_modes_by_hand():
    first = {"pop/seed0/full": {"NDCG@10": 0.25, "HR@10": 0.5, "Personalization@10": math.nan}}
    second = {"pop/seed0/full": {"NDCG@10": 0.2501, "HR@10": 0.4, "Personalization@10": math.nan}}
    assert parallel_grid.largest_difference(first, second) == pytest.approx(0.1)
    assert parallel_grid.largest_difference(first, first) == 0.0


def test_a_dataset_without_its_folder_is_refused(capsys):
    with pytest.raises(SystemExit):
        parallel_grid.main(["--dataset", "ml-1m"])
    assert "--dataset needs --data-dir" in capsys.readouterr().err
