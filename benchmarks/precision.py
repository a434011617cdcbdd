"""bf16 autocast: whether a device computes bf16 natively, whether a run trains under it, and whether it did.

A run asks for ``precision = "bf16"`` (``TrainSettings``); it trains under bf16 autocast only where the device
computes bf16 natively (:func:`native_bf16`), and only where autocast really runs some operation of its step in bf16
(:class:`Bf16Watch`); otherwise it trains in fp32, says so in one line, and its rows record fp32.
"""
from __future__ import annotations

import sys

import torch
from tqdm.auto import tqdm

from recbench.benchmarks.provenance import BF16_CPU_FLAGS, bf16_units


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 matrix products natively: a CUDA GPU that supports bf16, or a CPU with
    one of :data:`~benchmarks.provenance.BF16_CPU_FLAGS` (the units a CPU row's device names)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(bf16_units())


def trains_in_bf16(settings, device: torch.device) -> bool:
    """Whether training with ``settings`` (a ``TrainSettings``) on ``device`` runs under bf16 autocast: asked for,
    and native there."""
    return settings.precision == "bf16" and native_bf16(device)


def uses_bf16(settings, model) -> bool:
    """Whether ``model``'s run with ``settings`` trains under bf16 autocast (:func:`trains_in_bf16` on its device);
    where bf16 was asked for and is not native, one line says that it trains in fp32 (and its rows record fp32)."""
    if trains_in_bf16(settings, model.device):
        return True
    if settings.precision == "bf16":
        tqdm.write(f"{model.name}: precision=bf16 asked for, but {model.device.type} has no native bf16 "
                   f"({' or '.join(BF16_CPU_FLAGS)} on a CPU), so it trains in fp32 and its rows say fp32",
                   file=sys.stderr)
    return False


def no_bf16_operation(model) -> None:
    """The line that says a run asked for bf16 trains in fp32 in fact: no operation of its first step under
    autocast ran in bf16 (autocast casts matrix products and convolutions; BPR-MF's scores are elementwise)."""
    tqdm.write(f"{model.name}: precision=bf16 asked for, but no operation of its training step runs in "
               f"bf16 under autocast (autocast casts matrix products, not elementwise scores), so it trains in "
               f"fp32 and its rows say fp32", file=sys.stderr)


class Bf16Watch(torch.overrides.TorchFunctionMode):
    """While active, notes whether any torch function returned a bf16 tensor: under bf16 autocast, whether
    autocast ran some operation in bf16."""

    seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.seen:
            self.seen = any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
                            for t in (out if isinstance(out, (tuple, list)) else (out,)))
        return out
