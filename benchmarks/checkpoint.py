"""A training run's checkpoint: where the run stands (:class:`TrainState`) and everything an interrupted run needs to
go on as if it never stopped (weights, optimiser, schedule, the trainer's generator and PyTorch's global ones),
written atomically after every epoch and read back on resume (``--resume``) or by a plan (:func:`saved_progress`).
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from recbench.benchmarks.store import write_atomic

CHECKPOINT_VERSION = 2  # the layout of a training checkpoint (TrainState's fields)


@dataclass
class TrainState:
    """Where a run stands; written with every checkpoint, so an interrupted run resumes from it."""

    epoch: int = 0
    step: int = 0
    samples: int = 0  # training examples processed
    batch_seconds: float = 0.0  # time in the batch loop (validation excluded)
    train_seconds: float = 0.0  # time since the start, validation included, pauses not (benchmarks.clock)
    paused_seconds: float = 0.0  # time the process stood stopped while training (kill -STOP, a paused virtual machine)
    cpu_seconds: float = 0.0  # CPU time of the process since the start (all threads), validation included
    best_metric: float = -math.inf
    best_epoch: int = 0
    best_step: int = 0
    bad_validations: int = 0
    history: list = field(default_factory=list)  # one record per epoch: loss, seconds, validation metrics
    stopped_by: str | None = None  # why training ended: "max epochs", "max steps", "time budget", ...
    best_weights: dict | None = None
    threads: int | None = None  # the torch CPU threads that trained it (None on a GPU): a resume keeps the count


def global_generators(device: torch.device) -> dict:
    """The states of PyTorch's global generators, which dropout draws from (the CPU one, and the device's on
    CUDA): kept in every checkpoint, so that a resumed run draws the masks an uninterrupted run would have drawn.
    Without them a run resumed at epoch 24 left the uninterrupted run's path at epoch 25 (ML-1m BERT4Rec)."""
    states = {"cpu": torch.random.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def restore_global_generators(states: dict, device: torch.device) -> None:
    """Put back what :func:`global_generators` kept. Both setters take a CPU byte tensor, and a checkpoint is loaded
    onto the model's device, so the states come back to the CPU first (as :func:`restore_generator`'s)."""
    torch.random.set_rng_state(states["cpu"].cpu())
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"].cpu(), device)


def saved_progress(path: str | Path) -> TrainState | None:
    """Where the training checkpoint at ``path`` stands (its :class:`TrainState` without the weights), or None
    where there is none or it is of an older layout: what a plan shows of an interrupted run before resuming it."""
    if not Path(path).exists():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved.get("version") != CHECKPOINT_VERSION:
        return None
    return TrainState(**{**saved["state"], "best_weights": None})


def save_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, schedule,
                    generator: torch.Generator, state: TrainState) -> None:
    """Write the run's checkpoint to ``path``, atomically (a run killed while writing keeps the previous one)."""
    buffer = io.BytesIO()
    state.threads = torch.get_num_threads() if model.device.type == "cpu" else None
    torch.save({"version": CHECKPOINT_VERSION, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(), "generator": generator.get_state(),
                "generator_device": generator.device.type, "global_generators": global_generators(model.device),
                "state": dict(vars(state))}, buffer)
    write_atomic(Path(path), buffer.getvalue())


def restore_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, schedule,
                       generator: torch.Generator, seed: int) -> TrainState:
    """Load the checkpoint at ``path`` into the run's weights, optimiser, schedule and generators and return its
    state; a checkpoint of an older layout is refused in one line."""
    saved = torch.load(path, map_location=model.device, weights_only=False)
    if saved.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{path}: a training checkpoint of an older version of the suite; delete it to "
                         f"train afresh")
    model.load_state_dict(saved["model"])
    load_optimizer(optimizer, saved["optimizer"])
    schedule.load_state_dict(saved["schedule"])
    state = TrainState(**saved["state"])
    restore_generator(generator, saved, seed, state.epoch)
    if "global_generators" in saved:  # checkpoints written before it was kept continue from the seed's state
        restore_global_generators(saved["global_generators"], model.device)
    return state


def load_optimizer(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """The checkpoint's optimizer state, keeping the implementation chosen for this device (a fused CUDA
    Adam's checkpoint resumed on the CPU continues with the CPU's implementation)."""
    chosen = [{key: group[key] for key in ("fused", "foreach", "capturable") if key in group}
              for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, implementation in zip(optimizer.param_groups, chosen):
        group.update(implementation)


def restore_generator(generator: torch.Generator, saved: dict, seed: int, epoch: int) -> None:
    """The checkpoint's random state when it was written on this device type. CPU and CUDA generators have
    different states, so a checkpoint from the other type (a CUDA run resumed on the CPU) continues with a
    generator seeded by the seed and the epoch: its remaining draws differ from an uninterrupted run's, but
    are still fixed by the seed."""
    if saved.get("generator_device", generator.device.type) == generator.device.type:
        generator.set_state(saved["generator"].cpu())
    else:
        generator.manual_seed(seed * 1_000_003 + epoch)
