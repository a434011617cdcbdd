"""BERT4Rec's training plan on the device for :mod:`benchmarks.experiments.gpu_check` (issue 22).

The authors train 400,000 steps (``run_<data>.sh``: num_train_steps) with BERT's learning rate decaying linearly
to 0 over them (``optimization.py``); that is hours even on one GPU, and a session lends 30 minutes of device
time. A run cut by a time budget would stop at a high learning rate, so ``max_steps``, the decay's horizon
(:class:`benchmarks.trainer.TrainSettings`), is set from the training steps/s measured on the device, such that
the decay completes within the training budget that remains. The plan is made once, when the training first
starts, and kept beside the results: a changed setting is a different job, which would not resume. It records
its inputs and the deviation from the authors' schedule.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

SAFETY = 0.9  # share of the budget planned as steps: checkpoint writes, loss checks, a sustained rate below a burst's
CALL_START_S = 60.0  # a later call's training starts this long after the call's program (imports, data, negatives,
# model) and loses its partial epoch at the stop
FINAL_S = 30.0  # after training: the test evaluation and the result files


def training_budget_s(device_minutes: float, overhead_minutes: float, max_minutes: float,
                      earlier_minutes: list[float], elapsed_s: float, left_s: float,
                      margin_s: float) -> tuple[float, dict]:
    """The training seconds that remain of ``device_minutes`` of device time, with their arithmetic.

    Each call costs ``overhead_minutes`` of device time outside this program (the machine's start, transfers,
    the install, the idle wait after it) and runs the program for at most ``max_minutes``, of which the last
    ``margin_s`` stop it. The earlier calls ran ``earlier_minutes``; this one has run ``elapsed_s`` and has
    ``left_s`` for work. What remains after this call goes to further calls of ``max_minutes`` (the last one
    shorter), each losing ``CALL_START_S`` and ``margin_s`` of training, less ``FINAL_S`` once for the test
    evaluation."""
    spent = sum(earlier_minutes) + overhead_minutes * (len(earlier_minutes) + 1) + elapsed_s / 60
    after_this = max(0.0, device_minutes - spent - (max_minutes - elapsed_s / 60))
    full_calls, rest = divmod(after_this, max_minutes + overhead_minutes)
    last_call = rest - overhead_minutes  # a shorter last call, where it would train at all
    last_call = last_call if 60 * last_call > CALL_START_S + margin_s else 0.0
    further_calls = int(full_calls) + (last_call > 0)
    further_s = 60 * (full_calls * max_minutes + last_call) - further_calls * (CALL_START_S + margin_s)
    seconds = max(0.0, left_s + max(0.0, further_s) - FINAL_S)
    return seconds, {"device_minutes": device_minutes, "call_overhead_minutes": overhead_minutes,
                     "max_minutes_per_call": max_minutes, "earlier_calls_minutes": [round(m, 2) for m in
                                                                                    earlier_minutes],
                     "this_call_elapsed_s": round(elapsed_s, 1), "this_call_left_s": round(left_s, 1),
                     "further_calls": further_calls, "further_training_s": round(max(0.0, further_s), 1)}


def max_steps_for(budget_s: float, steps_per_s: float, validation_s: float, batches_per_epoch: int,
                  valid_every: int, authors_steps: int) -> int:
    """The most steps whose training and validations fit ``SAFETY`` of ``budget_s``: a step costs
    ``1 / steps_per_s``, each epoch of ``batches_per_epoch`` steps adds a validation of ``validation_s`` every
    ``valid_every`` epochs. Never more than the authors' schedule."""
    step_s = 1 / steps_per_s + validation_s / (batches_per_epoch * valid_every)
    return max(1, min(authors_steps, math.floor(SAFETY * budget_s / step_s)))


def make_plan(dataset: str, speed: dict, speed_file: str, batches_per_epoch: int, train, authors_steps: int,
              budget: tuple[float, str, dict]) -> dict:
    """The plan of one dataset's training: ``speed`` is the device's speed row of BERT4Rec on ``dataset`` in
    float32 (``speed_file``), ``train`` the resolved trainer settings before the plan, ``budget`` the training
    seconds with where they come from and their arithmetic."""
    seconds, source, arithmetic = budget
    valid_fraction = (min(train.valid_users, speed["users"]) / speed["users"]) if train.valid_users else 1.0
    validation_s = speed["full_eval_seconds_all_users"] * valid_fraction
    steps = max_steps_for(seconds, speed["train_steps_per_s"], validation_s, batches_per_epoch, train.valid_every,
                          authors_steps)
    authors_s = authors_steps * (1 / speed["train_steps_per_s"]
                                 + validation_s / (batches_per_epoch * train.valid_every))
    return {
        "dataset": dataset, "device": speed["device"], "measured_in": speed_file,
        "steps_per_s": speed["train_steps_per_s"], "validation_s": round(validation_s, 3),
        "batches_per_epoch": batches_per_epoch, "valid_every": train.valid_every,
        "train_budget_s": round(seconds, 1), "budget_from": source, "budget_arithmetic": arithmetic,
        "safety": SAFETY, "max_steps": steps, "authors_max_steps": authors_steps, "precision": "fp32",
        "projected_hours_for_authors_schedule": round(authors_s / 3600, 2),
        "why": (f"the authors' {authors_steps:,} steps (run_<data>.sh num_train_steps) take about "
                f"{authors_s / 3600:.1f} h at the {speed['train_steps_per_s']:g} steps/s measured on "
                f"{speed['device']}, " + (
                    f"within the {seconds / 60:.1f}-minute training budget" if steps == authors_steps else
                    f"beyond the {seconds / 60:.1f}-minute training budget; max_steps={steps:,} lets BERT's linear "
                    f"decay reach 0 within it, where a run cut by time would stop at a high learning rate")
                + ". Trained in fp32, the authors' precision."),
        # the time budget stops the run only where the device is slower than measured
        "overrides": [f"max_steps={steps}", f"time_budget_s={max(1, round(seconds))}", "precision=fp32"],
    }


def steps_run(row: dict, plan: dict) -> dict:
    """How many optimiser steps a finished run took, from its result row: exact when it stopped at an epoch's
    end, a range when the time budget cut an epoch."""
    max_steps, batches = row["train_settings"]["max_steps"], plan["batches_per_epoch"]
    if row["stopped_by"] == "max steps":
        return {"steps_run": max_steps}
    if row["stopped_by"] == "time budget":
        return {"steps_run_at_least": (row["epochs_run"] - 1) * batches + 1,
                "steps_run_at_most": min(max_steps or math.inf, row["epochs_run"] * batches)}
    return {"steps_run": row["epochs_run"] * batches}


def progress(checkpoint: Path, plan: dict) -> dict:
    """How far an unfinished training got (its last checkpoint) and the projected time to finish it and to run
    the authors' schedule at its own rate."""
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state, steps = saved["state"], saved["schedule"]["last_epoch"]
    step_s = state["train_seconds"] / max(steps, 1)
    return {"state": "training unfinished", "epochs": state["epoch"], "steps": steps, "max_steps": plan["max_steps"],
            "train_seconds": round(state["train_seconds"], 1),
            "best_valid": state["best_metric"] if math.isfinite(state["best_metric"]) else None,
            "best_epoch": state["best_epoch"],
            "projected_minutes_to_max_steps": round((plan["max_steps"] - steps) * step_s / 60, 1),
            "projected_hours_for_authors_schedule": round(plan["authors_max_steps"] * step_s / 3600, 2)}
